// Package registry describes every kind the hub serves: its names for
// discovery, its defaults, its validation, its selectable fields, its
// server-side table columns and its update rules.
//
// The API server in hub/apiserver is generic; everything that differs from one
// kind to another lives here, one [Kind] value per served resource. A kind
// that is not in [All] is not served and does not appear in discovery.
//
// Hooks receive typed objects from k8s.io/api (for example *corev1.Pod); they
// may modify the object they are given but never the old object passed for
// comparison. Hooks are called concurrently and must not keep state between
// calls unless they guard it.
package registry

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Kind describes one served resource.
type Kind struct {
	// GVK is the kind's group, version and kind, e.g. apps/v1 Deployment.
	GVK schema.GroupVersionKind
	// Resource is the lower-case plural, e.g. "deployments".
	Resource string
	// Singular is the lower-case singular, e.g. "deployment".
	Singular string
	// Namespaced is true for namespace-scoped kinds.
	Namespaced bool
	// ShortNames and Categories go to discovery ("deploy"; "all").
	ShortNames []string
	Categories []string

	// HasStatus: the kind has a /status subresource. Writes to the main
	// resource then keep the stored status, writes to /status keep
	// everything but status (and metadata the kind does not let /status
	// change), and create clears status unless StatusOnCreate is set.
	HasStatus bool
	// StatusOnCreate keeps a status given on create (Events, Nodes keep
	// theirs upstream only for some fields; most kinds clear it).
	StatusOnCreate bool
	// HasSpec: the kind has metadata.generation, set to 1 on create and
	// bumped when spec changes (see GenerationChanged).
	HasSpec bool
	// Scale, when set, serves a /scale subresource (autoscaling/v1 Scale).
	Scale *ScaleAccess
	// Subresources are the subresources, beyond status and scale, whose
	// writes update the kind's objects with rules of their own, by name
	// (pods: "ephemeralcontainers"). Such a write runs the
	// subresource's PrepareForUpdate first, then Default, the
	// managedFields entry (with the subresource's name), generation and
	// the subresource's ValidateUpdate; not the kind's Mutate,
	// PrepareForUpdate, ValidateUpdate or the update admission.
	Subresources map[string]*SubresourceUpdate
	// Verbs lists the verbs served on the main resource; nil means all of
	// create, delete, deletecollection, get, list, patch, update, watch.
	Verbs []string
	// StoredAs, when set, makes this kind a view of another kind's objects,
	// as events.k8s.io/v1 Event is a view of core/v1 Event upstream: keys
	// use the stored kind's resource, objects are converted with ToStorage
	// before writing and with FromStorage after reading, and watches of
	// either kind see writes made through the other.
	StoredAs    schema.GroupVersionKind
	ToStorage   func(obj runtime.Object) (runtime.Object, error)
	FromStorage func(obj runtime.Object) (runtime.Object, error)
	// NotStored marks a kind the API answers creates of without keeping
	// anything (the access and token reviews): it is in discovery with
	// no storage version and storage never holds it. See ReviewKinds.
	NotStored bool
	// NotServed marks a kind that only holds objects for the kinds stored
	// as it: a custom resource's storage version with served: false. As
	// in kube-apiserver, it is not routed (404), not in discovery, the
	// OpenAPI documents or the Local APIServices. See Served.
	NotServed bool
	// DefaultGC is the propagation policy applied when a delete names none:
	// "" means Background (most kinds); batch/v1 Job uses Orphan.
	DefaultGC metav1.DeletionPropagation

	// Default sets defaults on an object about to be created or updated,
	// before validation, as upstream's SetObjectDefaults does.
	Default func(obj runtime.Object)
	// Mutate is the kind's mutating admission. It runs on create (old is
	// nil) and on every write of the main resource that updates a stored
	// object (old is the stored object), whether the write is a put, a
	// patch or an apply: after Default and after the writer's
	// managedFields entry is recorded, and before PrepareForCreate or
	// PrepareForUpdate and validation. As with upstream's admission
	// plugins, what it sets belongs to no field manager, and each
	// mutation decides for itself whether it applies on update. Lister
	// reads what is stored now.
	Mutate func(ctx context.Context, l Lister, obj, old runtime.Object) error
	// PrepareForCreate clears or sets server-owned fields on create beyond
	// what the generic code does (status, generation, uid, timestamps).
	PrepareForCreate func(obj runtime.Object)
	// PrepareForUpdate adjusts an update given the stored object, beyond the
	// generic status/spec split.
	PrepareForUpdate func(obj, old runtime.Object)
	// PrepareForStatusUpdate adjusts a write to /status given the stored
	// object, after the generic code kept everything but status.
	PrepareForStatusUpdate func(obj, old runtime.Object)
	// GenerationChanged reports whether an update bumps generation. If nil,
	// and HasSpec, generation bumps when the "spec" field differs.
	GenerationChanged func(obj, old runtime.Object) bool
	// Validate checks an object about to be created. ObjectMeta is already
	// checked by the generic code (name rules per NameRule, labels,
	// annotations); Validate checks the rest, with field paths rooted at
	// the object (field.NewPath("spec")...).
	Validate func(obj runtime.Object) field.ErrorList
	// ValidateUpdate checks an update against the stored object: immutable
	// fields and the same rules as Validate. If nil, Validate is used.
	ValidateUpdate func(obj, old runtime.Object) field.ErrorList
	// ValidateStatusUpdate checks a write to /status. If nil, nothing beyond
	// the generic metadata checks.
	ValidateStatusUpdate func(obj, old runtime.Object) field.ErrorList
	// NameRule validates metadata.name; nil means DNS subdomain (RFC 1123),
	// the upstream default. Return messages as upstream does.
	NameRule func(name string, prefix bool) []string
	// Admit runs after validation on create and update (old is nil on
	// create) and may change the object: allocating a Service's cluster IP
	// and node ports, for example. Lister reads what is stored now.
	Admit func(ctx context.Context, l Lister, obj, old runtime.Object) error
	// Release undoes what Admit reserved when the write does not happen or
	// the object is deleted. l is a Lister as Admit's. May be nil.
	Release func(ctx context.Context, l Lister, obj runtime.Object)

	// Fields returns the kind-specific selectable fields (field selectors),
	// e.g. "spec.nodeName" and "status.phase" for pods. metadata.name and
	// metadata.namespace are added by the generic code and need not be here.
	// Fields not in the returned set are rejected with
	// "field label not supported: X". May be nil.
	Fields func(obj runtime.Object) fields.Set
	// FieldLabels lists the keys Fields returns (for rejecting unsupported
	// labels before any object is read), plus aliases: a map from a
	// legacy label (e.g. "spec.host") to the field it stands for.
	FieldLabels  []string
	FieldAliases map[string]string

	// Columns and Cells make the server-side table kubectl prints. Exactly
	// one column has format "name" (usually the first; events show it last,
	// as a wide column, as upstream does); Cells returns one
	// value per column (string, int64, bool, float64 or
	// metav1.Time-rendered strings), computing ages against now.
	Columns []metav1.TableColumnDefinition
	Cells   func(obj runtime.Object, now time.Time) []any

	// GracefulDelete decides how long a delete waits. requested is the
	// gracePeriodSeconds the client asked for (nil: none). It returns the
	// grace period to use; graceful false means delete at once. Nil means
	// every delete is immediate (unless finalizers hold the object).
	GracefulDelete func(obj runtime.Object, requested *int64) (grace int64, graceful bool)

	// New returns an empty object of the kind with its type set; nil means
	// the scheme's type. Custom resources return *unstructured.Unstructured.
	New func() runtime.Object
	// TypeConverter converts the kind's objects for managedFields and
	// server-side apply; nil means the built-in kinds' converter.
	TypeConverter managedfields.TypeConverter
	// DefaultOnRead sets defaults on an object decoded from storage (CRD
	// structural defaulting on read); nil means none.
	DefaultOnRead func(obj runtime.Object)
	// PatchTypes lists the patch types served; nil means all four. Custom
	// resources leave out strategic merge (415, as upstream).
	PatchTypes []types.PatchType
	// NoProtobuf: the kind is not served as protobuf (custom resources).
	NoProtobuf bool
	// OpenAPIV2 and OpenAPIV3 return the kind's published schema documents;
	// nil means generated from the scheme.
	OpenAPIV2 func() (*spec.Swagger, error)
	OpenAPIV3 func() (*spec3.OpenAPI, error)
	// Deprecated marks a served version deprecated; DeprecationWarning is
	// the Warning header text (when empty, upstream's default
	// "<group>/<version> <Kind> is deprecated").
	Deprecated         bool
	DeprecationWarning string
	// Prune removes, from a decoded request body (after a patch is
	// applied, from the result), the fields the kind's schema does not
	// declare, and returns their paths ("spec.foo"), so that the API
	// server can refuse them under fieldValidation=Strict or warn under
	// Warn. nil means nothing to prune (built-ins).
	Prune func(obj runtime.Object) []string
}

// SubresourceUpdate holds the rules of a subresource that writes the
// kind's objects.
type SubresourceUpdate struct {
	// PrepareForUpdate keeps, in the written object, only what the
	// subresource may change of old, the stored object.
	PrepareForUpdate func(obj, old runtime.Object)
	// ValidateUpdate checks the result against old.
	ValidateUpdate func(obj, old runtime.Object) field.ErrorList
}

// ScaleAccess reads and writes the replica count behind /scale.
type ScaleAccess struct {
	// Replicas returns spec.replicas, status.replicas and the label
	// selector as a string (status.selector of autoscaling/v1 Scale).
	Get func(obj runtime.Object) (specReplicas, statusReplicas int32, selector string)
	// Set writes spec.replicas.
	Set func(obj runtime.Object, replicas int32)
}

// Lister reads stored objects for admission decisions.
type Lister interface {
	// List returns all objects of a group-qualified resource ("services",
	// "pods") in a namespace ("" for all), decoded.
	List(ctx context.Context, resource, namespace string) ([]runtime.Object, error)
}

// Claim is who holds an address, port or range an allocator handed out.
type Claim struct {
	// Owner is the UID of the object that holds it.
	Owner string `json:"owner"`
	// Object names the holder for people: "namespace/name" or "name".
	Object string `json:"object"`
	// Time is when the claim was made.
	Time time.Time `json:"time"`
}

// Claims records claims in the store every hub of a cluster shares, so
// that two hubs never hand out the same value. A Lister given to Admit and
// Release implements it, except in dry runs, which must store nothing.
type Claims interface {
	// Claim records c on name in pool. If another owner holds it, reclaim
	// (may be nil) decides whether that claim is stale and passes to c;
	// otherwise Claim returns the holder's claim and false.
	Claim(ctx context.Context, pool, name string, c Claim, reclaim func(held Claim) bool) (Claim, bool, error)
	// Unclaim deletes the claim on name in pool if owner holds it.
	Unclaim(ctx context.Context, pool, name, owner string) error
	// ListClaims returns the claims of a pool by name.
	ListClaims(ctx context.Context, pool string) (map[string]Claim, error)
}

// Served returns the kinds of kinds the API serves, leaving out those
// marked NotServed, in their order.
func Served(kinds []*Kind) []*Kind {
	out := make([]*Kind, 0, len(kinds))
	for _, k := range kinds {
		if !k.NotServed {
			out = append(out, k)
		}
	}
	return out
}

// QualifiedResource returns the group-qualified resource name the store
// keys on: "pods", "deployments.apps".
func (k *Kind) QualifiedResource() string {
	if k.GVK.Group == "" {
		return k.Resource
	}
	return k.Resource + "." + k.GVK.Group
}

// GroupResource returns the kind's group and resource.
func (k *Kind) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: k.GVK.Group, Resource: k.Resource}
}

// GroupVersionResource returns the kind's group, version and resource.
func (k *Kind) GroupVersionResource() schema.GroupVersionResource {
	return k.GVK.GroupVersion().WithResource(k.Resource)
}

// Config is the networks a registry's kinds allocate from and the kinds
// served beside the built-in ones. Zero fields mean the documented
// defaults.
type Config struct {
	// Services is where Service cluster IPs and node ports come from.
	Services ServiceNetwork
	// Cluster is where node pod CIDRs come from.
	Cluster ClusterNetwork
	// Extra are kinds served after the built-in ones for the registry's
	// whole life (CustomResourceDefinition, webhook configurations,
	// APIService).
	Extra []*Kind
}

// Registry is one hub's set of served kinds: fixed kinds (the built-in
// ones and Config.Extra) and custom kinds that come and go with the
// objects that define them (SetCustom). The Service and Node kinds keep
// state in it, the cluster IPs, node ports and pod CIDRs they gave out, so
// two hubs in one process share nothing. A Registry is safe for concurrent
// use.
type Registry struct {
	fixed []*Kind

	// mu serialises SetCustom; readers only load cur.
	mu  sync.Mutex
	cur atomic.Pointer[snapshot]
}

// snapshot is one immutable state of the served set.
type snapshot struct {
	kinds   []*Kind
	byGVR   map[schema.GroupVersionResource]*Kind
	custom  map[string][]*Kind // owner → kinds it contributed
	gen     uint64
	changed chan struct{} // closed when the next snapshot replaces this one
}

// New returns a registry allocating from cfg's networks; it fails on a
// network that cannot hold addresses, ports or node ranges.
func New(cfg Config) (*Registry, error) {
	svc, err := cfg.Services.withDefaults()
	if err != nil {
		return nil, err
	}
	cluster, err := cfg.Cluster.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Registry{}
	kinds := append(coreKinds(newServiceAllocator(svc), newPodCIDRAllocator(cluster)), groupKinds(r.Kinds)...)
	kinds = append(kinds, cfg.Extra...)
	r.fixed = kinds[:len(kinds):len(kinds)]
	r.cur.Store(r.build(map[string][]*Kind{}, 1))
	return r, nil
}

// build makes the snapshot of the fixed kinds plus custom, by owner name
// order. A custom kind whose group, version and resource is already served
// is left out: fixed kinds never change, and the first owner keeps a name.
func (r *Registry) build(custom map[string][]*Kind, gen uint64) *snapshot {
	sn := &snapshot{
		byGVR:   make(map[schema.GroupVersionResource]*Kind, len(r.fixed)),
		custom:  custom,
		gen:     gen,
		changed: make(chan struct{}),
	}
	sn.kinds = make([]*Kind, 0, len(r.fixed))
	add := func(k *Kind) {
		gvr := k.GroupVersionResource()
		if _, dup := sn.byGVR[gvr]; dup {
			return
		}
		sn.byGVR[gvr] = k
		sn.kinds = append(sn.kinds, k)
	}
	for _, k := range r.fixed {
		add(k)
	}
	owners := make([]string, 0, len(custom))
	for o := range custom {
		owners = append(owners, o)
	}
	sort.Strings(owners)
	for _, o := range owners {
		for _, k := range custom[o] {
			add(k)
		}
	}
	sn.kinds = sn.kinds[:len(sn.kinds):len(sn.kinds)]
	return sn
}

// SetCustom makes kinds the kinds contributed by owner (a
// CustomResourceDefinition's name), replacing what owner contributed
// before; an empty kinds removes them. Every call that changes the set
// bumps Generation and closes the channel Changed returned before it.
func (r *Registry) SetCustom(owner string, kinds []*Kind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cur.Load()
	if len(kinds) == 0 && old.custom[owner] == nil {
		return
	}
	custom := make(map[string][]*Kind, len(old.custom)+1)
	for o, ks := range old.custom {
		custom[o] = ks
	}
	if len(kinds) == 0 {
		delete(custom, owner)
	} else {
		custom[owner] = append([]*Kind(nil), kinds...)
	}
	r.cur.Store(r.build(custom, old.gen+1))
	close(old.changed)
}

// Kinds returns the current kinds: core/v1 first, then the other built-in
// groups in discovery order, then Config.Extra, then the custom kinds by
// owner. The slice is shared; callers must not modify it. It is cheap:
// callers may read it per request.
func (r *Registry) Kinds() []*Kind { return r.cur.Load().kinds }

// Generation counts changes of the set of kinds; it starts at 1.
func (r *Registry) Generation() uint64 { return r.cur.Load().gen }

// Changed returns a channel closed at the next change of the set of kinds.
func (r *Registry) Changed() <-chan struct{} { return r.cur.Load().changed }

// Lookup returns the kind serving a group, version and resource, or nil.
func (r *Registry) Lookup(gvr schema.GroupVersionResource) *Kind {
	return r.cur.Load().byGVR[gvr]
}

// All returns the kinds of a new registry with the default networks. It
// describes what is served, for code that needs a kind's names, scheme or
// table and not one hub's allocations; storage resolves every kind it is
// handed to its own, so writes always go through the hub's registry.
func All() []*Kind {
	r, err := New(Config{})
	if err != nil {
		panic(err) // the defaults are valid
	}
	return r.fixed
}

// Lookup returns the kind serving gvr among All, or nil.
func Lookup(gvr schema.GroupVersionResource) *Kind {
	for _, k := range All() {
		if k.GroupVersionResource() == gvr {
			return k
		}
	}
	return nil
}
