package storage

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/tether-edge/tether/hub/registry"
)

// Field managers record who owns which field of an object (managedFields)
// on every write, and merge server-side apply patches by that ownership.

// fmKey names one cached field manager.
type fmKey struct {
	gvk schema.GroupVersionKind
	// kind is the kind the field manager was built for: a custom kind
	// replaced by another of the same GVK (a changed schema) gets its own.
	kind *registry.Kind
	sub  string
	// update marks the field managers that only record Update entries
	// (see updateConverter); apply uses the others.
	update bool
}

// fieldManager returns the cached field manager of a kind and subresource,
// for recording Update entries (update) or for server-side apply.
func (s *Storage) fieldManager(k *registry.Kind, sub string, update bool) (*managedfields.FieldManager, error) {
	if sub == "finalize" {
		sub = ""
	}
	key := fmKey{k.GVK, k, sub, update}
	s.mu.Lock()
	defer s.mu.Unlock()
	if fm := s.fms[key]; fm != nil {
		return fm, nil
	}
	var reset map[fieldpath.APIVersion]fieldpath.Filter
	if f := resetFilter(k, sub); f != nil {
		reset = map[fieldpath.APIVersion]fieldpath.Filter{fieldpath.APIVersion(k.GVK.GroupVersion().String()): f}
	}
	tc := s.typeConverter(k)
	if update {
		tc = s.updateConverter(k)
	}
	var fm *managedfields.FieldManager
	var err error
	if k.New != nil {
		// Custom resources: unstructured objects, converted between
		// versions by apiVersion, defaulted before the manager runs,
		// unknown fields pruned before it too.
		fm, err = managedfields.NewDefaultCRDFieldManager(tc, customConvertor{inPlaceConvertor{s.scheme}, update}, noDefaults{}, unstructuredCreater{},
			k.GVK, k.GVK.GroupVersion(), sub, reset)
	} else {
		fm, err = managedfields.NewDefaultFieldManager(tc, inPlaceConvertor{s.scheme}, s.scheme, s.scheme,
			k.GVK, k.GVK.GroupVersion(), sub, reset)
	}
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("build field manager for %s: %w", k.GVK, err))
	}
	s.fms[key] = fm
	return fm, nil
}

// inPlaceConvertor is the scheme, except that converting a typed object to
// the version it already has returns the object itself where the scheme
// returns a deep copy. The field managers convert the live and the new
// object of every write only to read them (or convert objects they have
// just built), so the two copies per write bought nothing.
type inPlaceConvertor struct{ *runtime.Scheme }

// ConvertToVersion implements runtime.ObjectConvertor.
func (c inPlaceConvertor) ConvertToVersion(in runtime.Object, target runtime.GroupVersioner) (runtime.Object, error) {
	if _, ok := in.(runtime.Unstructured); !ok {
		gvk := in.GetObjectKind().GroupVersionKind()
		if t, ok := target.KindForGroupVersionKinds([]schema.GroupVersionKind{gvk}); ok && t == gvk && !gvk.Empty() {
			if kinds, _, err := c.ObjectKinds(in); err == nil {
				for _, k := range kinds {
					if k == gvk {
						return in, nil
					}
				}
			}
		}
	}
	return c.Scheme.ConvertToVersion(in, target)
}

// recordUpdate records an Update entry for the manager in obj's
// managedFields. live is only read.
func (s *Storage) recordUpdate(k *registry.Kind, sub string, live, obj runtime.Object, manager string) (runtime.Object, error) {
	if manager == "" {
		if m, err := meta.Accessor(obj); err == nil && len(m.GetManagedFields()) == 0 && live != nil {
			if lm, err := meta.Accessor(live); err == nil {
				m.SetManagedFields(lm.GetManagedFields())
			}
		}
		return obj, nil
	}
	withType(k, obj)
	withType(k, live)
	if _, ok := isUnstructured(obj); ok {
		// The shortcuts below walk Go structs; custom resources go to
		// the field manager whole.
		fm, err := s.fieldManager(k, sub, true)
		if err != nil {
			return nil, err
		}
		return fm.UpdateNoErrors(live, obj, manager), nil
	}
	m, merr := meta.Accessor(live)
	common := merr == nil && sameVersion(k, m)
	if common {
		if entries, ok := s.updateEntries(k, sub, live, obj, manager); ok {
			nm, _ := meta.Accessor(obj)
			nm.SetManagedFields(entries)
			return obj, nil
		}
	}
	fm, err := s.fieldManager(k, sub, true)
	if err != nil {
		return nil, err
	}
	if common && m.GetUID() != "" {
		// An update of a stored object: compare only what differs.
		if plive, pobj, ok := pruneEqual(live, obj, false); ok {
			out := fm.UpdateNoErrors(plive, pobj, manager)
			om, err1 := meta.Accessor(out)
			nm, err2 := meta.Accessor(obj)
			if err1 == nil && err2 == nil {
				nm.SetManagedFields(om.GetManagedFields())
				return obj, nil
			}
		}
	}
	return fm.UpdateNoErrors(live, obj, manager), nil
}

// sameVersion reports whether every managedFields entry of m is of k's
// version: comparisons in other versions convert whole objects, which
// pruneEqual is not made for.
func sameVersion(k *registry.Kind, m metav1.Object) bool {
	gv := k.GVK.GroupVersion().String()
	for _, e := range m.GetManagedFields() {
		if e.APIVersion != gv {
			return false
		}
	}
	return true
}
