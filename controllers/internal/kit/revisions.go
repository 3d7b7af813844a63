package kit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
)

// RevisionName names a ControllerRevision of parent with hash, keeping the
// name within the 253 characters of a DNS subdomain.
func RevisionName(parent, hash string) string {
	if len(parent) > 223 {
		parent = parent[:223]
	}
	return parent + "-" + hash
}

// NewRevision builds (without creating) a ControllerRevision of owner at
// the given revision number holding data (a strategic merge patch that
// restores the template), labelled with the template labels and
// controller-revision-hash, and named by the hash of its data.
func NewRevision(owner metav1.Object, gvk schema.GroupVersionKind, templateLabels map[string]string, data []byte, revision int64, collisionCount *int32) *appsv1.ControllerRevision {
	cr := &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       owner.GetNamespace(),
			Labels:          maps.Clone(templateLabels),
			OwnerReferences: []metav1.OwnerReference{ControllerRef(owner, gvk)},
		},
		Data:     runtime.RawExtension{Raw: data},
		Revision: revision,
	}
	if cr.Labels == nil {
		cr.Labels = map[string]string{}
	}
	hash := RevisionHash(cr, collisionCount)
	cr.Name = RevisionName(owner.GetName(), hash)
	cr.Labels[appsv1.ControllerRevisionHashLabelKey] = hash
	return cr
}

// SortRevisions orders revisions by revision number, then creation time,
// then name: oldest first.
func SortRevisions(revs []*appsv1.ControllerRevision) {
	slices.SortStableFunc(revs, func(a, b *appsv1.ControllerRevision) int {
		if a.Revision != b.Revision {
			return cmpInt(a.Revision, b.Revision)
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			if a.CreationTimestamp.Before(&b.CreationTimestamp) {
				return -1
			}
			return 1
		}
		return cmpString(a.Name, b.Name)
	})
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// NextRevisionNumber returns one more than the highest revision of revs
// (sorted oldest first), or 1.
func NextRevisionNumber(revs []*appsv1.ControllerRevision) int64 {
	if len(revs) == 0 {
		return 1
	}
	return revs[len(revs)-1].Revision + 1
}

// EqualRevisions reports whether two revisions hold the same data,
// compared as JSON values so that a store re-encoding the bytes does not
// make equal revisions differ.
func EqualRevisions(a, b *appsv1.ControllerRevision) bool {
	if a == nil || b == nil {
		return a == b
	}
	if bytes.Equal(a.Data.Raw, b.Data.Raw) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a.Data.Raw, &va) != nil || json.Unmarshal(b.Data.Raw, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// FindEqualRevisions returns the revisions of revs holding the same data
// as needle.
func FindEqualRevisions(revs []*appsv1.ControllerRevision, needle *appsv1.ControllerRevision) []*appsv1.ControllerRevision {
	var out []*appsv1.ControllerRevision
	for _, r := range revs {
		if EqualRevisions(r, needle) {
			out = append(out, r)
		}
	}
	return out
}

// CreateRevision creates rev. When a revision of the same name exists with
// different data (a hash collision), it bumps *collisionCount, renames rev
// and tries again; when one exists with the same data and owner, it returns
// that one. The caller persists *collisionCount in its status.
func CreateRevision(ctx context.Context, client kubernetes.Interface, owner metav1.Object, rev *appsv1.ControllerRevision, collisionCount *int32) (*appsv1.ControllerRevision, error) {
	api := client.AppsV1().ControllerRevisions(rev.Namespace)
	for range 100 {
		cr := rev.DeepCopy()
		hash := RevisionHash(cr, collisionCount)
		cr.Name = RevisionName(owner.GetName(), hash)
		cr.Labels[appsv1.ControllerRevisionHashLabelKey] = hash
		created, err := api.Create(ctx, cr, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create controller revision: %w", err)
		}
		existing, gerr := api.Get(ctx, cr.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("read existing controller revision: %w", gerr)
		}
		if metav1.IsControlledBy(existing, owner) && EqualRevisions(existing, cr) {
			return existing, nil
		}
		*collisionCount++
	}
	return nil, fmt.Errorf("create controller revision for %s: too many hash collisions", owner.GetName())
}

// TemplatePatch is the data of a StatefulSet or DaemonSet revision: a
// strategic merge patch that replaces spec.template with t. kubectl
// rollout undo applies it to the owner as is, and rollout history shows
// the template in it.
func TemplatePatch(t *corev1.PodTemplateSpec) ([]byte, error) {
	raw, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("encode pod template: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode pod template: %w", err)
	}
	m["$patch"] = "replace"
	return json.Marshal(map[string]any{"spec": map[string]any{"template": m}})
}

// TemplateFromRevision returns the pod template a revision made by
// TemplatePatch restores.
func TemplateFromRevision(cr *appsv1.ControllerRevision) (*corev1.PodTemplateSpec, error) {
	var patch struct {
		Spec struct {
			Template map[string]any `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(cr.Data.Raw, &patch); err != nil {
		return nil, fmt.Errorf("decode revision %s: %w", cr.Name, err)
	}
	delete(patch.Spec.Template, "$patch")
	raw, err := json.Marshal(patch.Spec.Template)
	if err != nil {
		return nil, fmt.Errorf("decode revision %s: %w", cr.Name, err)
	}
	t := &corev1.PodTemplateSpec{}
	if err := json.Unmarshal(raw, t); err != nil {
		return nil, fmt.Errorf("decode revision %s template: %w", cr.Name, err)
	}
	return t, nil
}
