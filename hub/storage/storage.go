// Package storage gives the hub's API objects their Kubernetes semantics on
// top of a [store.Store]: encoding, metadata (uid, generateName,
// creationTimestamp, generation, resourceVersion), defaulting, validation and
// admission from hub/registry, the status/spec split, optimistic concurrency,
// no-op detection, managed fields and server-side apply, graceful deletion
// with finalizers and propagation policies, namespace lifecycle, dry runs,
// and watches with Kubernetes resourceVersion rules.
//
// Every error it returns is a Kubernetes API error (*apierrors.StatusError)
// with the upstream reason, code and message; the mapping from store error
// kinds to Status lives in one file, status.go.
//
// Objects passed in belong to the Storage for the duration of the call and
// may be modified; objects returned belong to the caller.
package storage

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
)

// Options modify a write.
type Options struct {
	// DryRun runs every step of the write but stores nothing (dryRun=All).
	DryRun bool
	// FieldManager names the manager recorded in managedFields; required
	// for Apply.
	FieldManager string
	// Force takes ownership of conflicting fields on Apply.
	Force bool
	// Subresource is "" for the main resource, "status" to write status
	// only, "finalize" (namespaces) to write spec.finalizers only, or one
	// of the kind's Subresources (pods/ephemeralcontainers), written with
	// its rules.
	Subresource string
}

// ListOptions select and page a list.
type ListOptions struct {
	Label labels.Selector
	Field fields.Selector
	// Limit and Continue page the list (0: everything).
	Limit    int64
	Continue string
	// ResourceVersion and ResourceVersionMatch follow the upstream rules:
	// unset, "0" and "not older than N" are all served from current state.
	ResourceVersion      string
	ResourceVersionMatch metav1.ResourceVersionMatch
}

// WatchOptions select a watch.
type WatchOptions struct {
	Label labels.Selector
	Field fields.Selector
	// ResourceVersion "" or "0": one synthetic ADDED event per current
	// object, then changes. "N": every change after N. Below the retained
	// change log: a single ERROR event (410 Expired), then the watch ends.
	// Above the current revision: an error (504, ResourceVersionTooLarge).
	ResourceVersion string
	// AllowBookmarks lets the watch send BOOKMARK events carrying only the
	// current resourceVersion.
	AllowBookmarks bool
	// SendInitialEvents, when set, decides whether the watch starts with
	// synthetic ADDED events whatever the ResourceVersion (a streaming
	// list): true sends the state as of a revision not older than
	// ResourceVersion ("" or "0": the current one), then, with
	// AllowBookmarks, a BOOKMARK at that revision annotated
	// k8s.io/initial-events-end; false starts from ResourceVersion, or
	// from the current revision if it is "" or "0", without them.
	SendInitialEvents *bool
	// Shared lets the objects of change events be shared with other
	// watches of the same kind that set Shared: each change is then
	// decoded once however many watches receive it. The caller must not
	// modify such objects; without Shared every event's object belongs to
	// the caller.
	Shared bool
}

// API is what the HTTP layer calls. *Storage implements it; the interface
// exists so the HTTP layer can be read without the implementation.
type API interface {
	// Get returns one object, NotFound if absent.
	Get(ctx context.Context, k *registry.Kind, namespace, name string) (runtime.Object, error)
	// List returns a typed list (e.g. *corev1.PodList) whose
	// metadata.resourceVersion is the store revision it reflects.
	List(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions) (runtime.Object, error)
	// Watch starts a watch whose events carry typed objects of the kind.
	Watch(ctx context.Context, k *registry.Kind, namespace string, opts WatchOptions) (watch.Interface, error)
	// Create stores a new object (namespace from the URL; "" for
	// cluster-scoped kinds) and returns it as stored.
	Create(ctx context.Context, k *registry.Kind, namespace string, obj runtime.Object, opts Options) (runtime.Object, error)
	// Update replaces an object (PUT). A non-empty metadata.resourceVersion
	// is a precondition (Conflict on mismatch). With Subresource "status"
	// only status changes are kept. Returns the stored object; an update
	// that changes nothing returns the current object untouched.
	Update(ctx context.Context, k *registry.Kind, namespace, name string, obj runtime.Object, opts Options) (runtime.Object, error)
	// GuaranteedUpdate reads the current object, passes a copy to
	// tryUpdate and stores the result, retrying on conflicts. If the
	// result carries a resourceVersion different from the one read, the
	// write fails with Conflict (clients that pin a resourceVersion in a
	// patch). Used for patches, /scale and /binding.
	GuaranteedUpdate(ctx context.Context, k *registry.Kind, namespace, name string, opts Options, tryUpdate func(current runtime.Object) (runtime.Object, error)) (runtime.Object, error)
	// Apply is server-side apply of an apply-patch (YAML or JSON) and
	// creates the object if absent. created reports which happened.
	Apply(ctx context.Context, k *registry.Kind, namespace, name string, patch []byte, opts Options) (obj runtime.Object, created bool, err error)
	// Delete deletes one object. deleted is false when the object only
	// got a deletionTimestamp (graceful deletion, finalizers); obj is then
	// the object as stored, else its last state.
	Delete(ctx context.Context, k *registry.Kind, namespace, name string, opts *metav1.DeleteOptions, dryRun bool) (obj runtime.Object, deleted bool, err error)
	// DeleteCollection deletes every object matching opts and returns the
	// typed list of what it deleted or marked for deletion.
	DeleteCollection(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions, del *metav1.DeleteOptions, dryRun bool) (runtime.Object, error)
	// Bind sets spec.nodeName of an unbound pod (pods/binding): Conflict
	// if it is already bound to a node.
	Bind(ctx context.Context, namespace string, b *corev1.Binding, opts Options) error
}
