package storage

import (
	"fmt"
	"reflect"
	"strings"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
)

// The split between an object's main resource and its status: a main
// write keeps the stored status, a /status write keeps everything else,
// and generation follows the changes of the main resource.

func setOrDelete(dst map[string]any, key string, src map[string]any) {
	if v, ok := src[key]; ok {
		dst[key] = v
	} else {
		delete(dst, key)
	}
}

// copyTop returns an object with the top-level fields of obj that keep
// selects (by JSON name) and the other top-level fields of cur. Typed
// objects are combined field by field from a deep copy of cur; others
// through their unstructured form, which edit changes.
func (s *Storage) copyTop(k *registry.Kind, obj, cur runtime.Object, keep func(key string) bool, edit func(dst, src map[string]any)) (runtime.Object, error) {
	if out, ok := copyTopTyped(obj, cur, keep); ok {
		return withType(k, out), nil
	}
	if u, ok := isUnstructured(obj); ok {
		if c, ok := isUnstructured(cur); ok {
			edit(u.Object, c.DeepCopy().Object)
			return withType(k, u), nil
		}
	}
	dst, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("convert %s: %w", k.GVK.Kind, err))
	}
	src, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cur)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("convert %s: %w", k.GVK.Kind, err))
	}
	edit(dst, src)
	out, err := s.newObjectOf(k)
	if err != nil {
		return nil, err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(dst, out); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("convert %s: %w", k.GVK.Kind, err))
	}
	return withType(k, out), nil
}

// copyTopTyped is copyTop for two typed objects of one struct type. The
// fields taken from cur are deep copies: the result is changed by
// defaulting and admission, cur must stay as stored.
func copyTopTyped(obj, cur runtime.Object, keep func(key string) bool) (runtime.Object, bool) {
	a, b := reflect.ValueOf(obj), reflect.ValueOf(cur)
	if a.Type() != b.Type() || a.Kind() != reflect.Pointer || a.IsNil() || b.IsNil() || a.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	t := a.Elem().Type()
	names := make([]string, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || (name == "" && !f.Anonymous) || name == "-" {
			return nil, false
		}
		names[i] = name
	}
	out := cur.DeepCopyObject()
	ov := reflect.ValueOf(out)
	if ov.Type() != a.Type() {
		return nil, false
	}
	for i, name := range names {
		if keep(name) {
			ov.Elem().Field(i).Set(a.Elem().Field(i))
		}
	}
	return out, true
}

// hasGeneration reports whether the kind's objects carry
// metadata.generation: kinds with a spec, and every custom resource.
func hasGeneration(k *registry.Kind) bool {
	return k.HasSpec || k.New != nil
}

// keepStatusOnly turns obj, a /status write of a custom resource, into
// cur with obj's status and managedFields.
func keepStatusOnly(obj *unstructured.Unstructured, cur runtime.Object) {
	c, ok := isUnstructured(cur)
	if !ok {
		return
	}
	status, has := obj.Object["status"]
	mf := obj.GetManagedFields()
	c.DeepCopyInto(obj)
	if has {
		obj.Object["status"] = status
	} else {
		delete(obj.Object, "status")
	}
	obj.SetManagedFields(mf)
}

// specChanged compares the "spec" fields of two typed objects; for
// custom resources, everything but metadata and (with a status
// subresource) status, as upstream.
func specChanged(k *registry.Kind, obj, old runtime.Object) bool {
	if u, ok := isUnstructured(obj); ok {
		if o, ok := isUnstructured(old); ok {
			return contentChanged(k, u, o)
		}
	}
	a := reflect.ValueOf(obj).Elem().FieldByName("Spec")
	b := reflect.ValueOf(old).Elem().FieldByName("Spec")
	if !a.IsValid() || !b.IsValid() {
		return false
	}
	return !apiequality.Semantic.DeepEqual(a.Interface(), b.Interface())
}
