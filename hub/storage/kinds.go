package storage

import (
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
)

// The kinds a Storage serves are either fixed (Config.Kinds) or follow the
// hub's registry, whose custom kinds (the versions of
// CustomResourceDefinitions) come and go while the hub runs. Every lookup
// goes through a kindView, an immutable index of one generation of the
// registry, rebuilt when the registry's generation moves on; requests
// resolve the kind they are handed against it, and watches of a kind that
// leaves it end.

// kindView indexes the kinds served at one registry generation.
type kindView struct {
	gen   uint64
	byGVK map[schema.GroupVersionKind]*registry.Kind
	byRes map[string]*registry.Kind // qualified resource → kind stored there
}

// buildView indexes kinds, leaving out (and reporting) those that cannot
// be served: a kind the scheme does not know and that has no New, a view
// of a kind not served or without conversions.
func buildView(sch *runtime.Scheme, kinds []*registry.Kind, gen uint64) (*kindView, []error) {
	v := &kindView{
		gen:   gen,
		byGVK: make(map[schema.GroupVersionKind]*registry.Kind, len(kinds)),
		byRes: make(map[string]*registry.Kind, len(kinds)),
	}
	var problems []error
	for _, k := range kinds {
		if k.New == nil && !sch.Recognizes(k.GVK) {
			problems = append(problems, fmt.Errorf("kind %s is not in the scheme", k.GVK))
			continue
		}
		if _, dup := v.byGVK[k.GVK]; !dup {
			v.byGVK[k.GVK] = k
		}
	}
	for _, k := range kinds {
		if v.byGVK[k.GVK] != k {
			continue
		}
		switch {
		case k.StoredAs.Empty():
			v.byRes[k.QualifiedResource()] = k
		case v.byGVK[k.StoredAs] == nil:
			problems = append(problems, fmt.Errorf("kind %s is stored as %s, which is not served", k.GVK, k.StoredAs))
			delete(v.byGVK, k.GVK)
		case k.ToStorage == nil || k.FromStorage == nil:
			problems = append(problems, fmt.Errorf("kind %s is stored as %s without conversions", k.GVK, k.StoredAs))
			delete(v.byGVK, k.GVK)
		}
	}
	return v, problems
}

// view returns the kinds served now. With a registry, a view older than
// the registry's generation is rebuilt first; that costs one atomic load
// and a comparison per call otherwise.
func (s *Storage) view() *kindView {
	v := s.kv.Load()
	if s.reg == nil {
		return v
	}
	gen := s.reg.Generation()
	if gen == v.gen {
		return v
	}
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if v = s.kv.Load(); v.gen == gen {
		return v
	}
	// The kinds read now are at least as new as gen; a newer set is
	// indexed again at the next call.
	v, problems := buildView(s.scheme, s.reg.Kinds(), gen)
	for _, err := range problems {
		s.log.Warn("kind not served", "err", err)
	}
	s.kv.Store(v)
	s.forgetKinds(v)
	s.rdefaults.forget(v)
	return v
}

// forgetKinds drops the field managers of kinds v no longer serves (a
// custom kind replaced or removed).
func (s *Storage) forgetKinds(v *kindView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.fms {
		if v.byGVK[key.gvk] != key.kind {
			delete(s.fms, key)
		}
	}
}

// kindServed reports whether k, or a kind replacing it, is served now,
// and returns the kind to use from now on.
func (s *Storage) kindServed(k *registry.Kind) (*registry.Kind, bool) {
	o := s.view().byGVK[k.GVK]
	return o, o != nil
}

// isUnstructured reports whether obj is a custom resource's object.
func isUnstructured(obj runtime.Object) (*unstructured.Unstructured, bool) {
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// contentChanged reports whether two unstructured objects differ outside
// metadata, and outside status when the kind has a status subresource:
// the generation rule of custom resources.
func contentChanged(k *registry.Kind, obj, old *unstructured.Unstructured) bool {
	strip := func(u *unstructured.Unstructured) map[string]any {
		m := make(map[string]any, len(u.Object))
		for key, v := range u.Object {
			if key == "metadata" || (k.HasStatus && key == "status") {
				continue
			}
			m[key] = v
		}
		return m
	}
	return !apiequality.Semantic.DeepEqual(strip(obj), strip(old))
}

// customConvertor converts custom resources between the versions of their
// definition, which (conversion strategy None) differ only in apiVersion;
// typed objects go to the scheme. With readOnly, converting an object to
// the version it has returns the object itself, as inPlaceConvertor does
// for typed objects: for field managers that only read what they convert
// (those recording Update entries); apply builds its result from what it
// converts and gets copies.
type customConvertor struct {
	inPlaceConvertor
	readOnly bool
}

// ConvertToVersion implements runtime.ObjectConvertor.
func (c customConvertor) ConvertToVersion(in runtime.Object, target runtime.GroupVersioner) (runtime.Object, error) {
	u, ok := isUnstructured(in)
	if !ok {
		return c.inPlaceConvertor.ConvertToVersion(in, target)
	}
	gvk := u.GroupVersionKind()
	t, ok := target.KindForGroupVersionKinds([]schema.GroupVersionKind{gvk})
	if !ok {
		return nil, fmt.Errorf("convert %s: no version of it is wanted", gvk)
	}
	if c.readOnly && t == gvk {
		return u, nil
	}
	out := u.DeepCopy()
	out.SetGroupVersionKind(t)
	return out, nil
}

// Convert implements runtime.ObjectConvertor.
func (c customConvertor) Convert(in, out, context any) error {
	u, ok := in.(*unstructured.Unstructured)
	o, ok2 := out.(*unstructured.Unstructured)
	if !ok || !ok2 {
		return c.inPlaceConvertor.Convert(in, out, context)
	}
	u.DeepCopyInto(o)
	return nil
}

// ConvertFieldLabel implements runtime.ObjectConvertor.
func (c customConvertor) ConvertFieldLabel(gvk schema.GroupVersionKind, label, value string) (string, string, error) {
	return label, value, nil
}

// unstructuredCreater makes empty custom resources for the field managers.
type unstructuredCreater struct{}

// New implements runtime.ObjectCreater.
func (unstructuredCreater) New(kind schema.GroupVersionKind) (runtime.Object, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kind)
	return u, nil
}

// noDefaults is the defaulter of custom resources' field managers:
// defaults are set by the kind's Default before the field manager runs.
type noDefaults struct{}

// Default implements runtime.ObjectDefaulter.
func (noDefaults) Default(runtime.Object) {}
