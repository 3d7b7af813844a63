package storage

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"

	"github.com/tether-edge/tether/hub/registry"
)

// benchPayload is the data of one object in the custom-vs-ConfigMap
// benchmarks: the same fields in a ConfigMap's data and a custom
// resource's spec.
func benchPayload(i int) map[string]string {
	d := map[string]string{}
	for j := range 8 {
		d[fmt.Sprintf("key%d", j)] = fmt.Sprintf("value-%d-%d-abcdefghijklmnop", i, j)
	}
	return d
}

// BenchmarkCustomVsConfigMap creates objects and lists them, as custom
// resources (unstructured, a deduced type converter, a default on read
// that finds its field set, as defaults set on write make it) and as
// ConfigMaps of the same data, in one store.
func BenchmarkCustomVsConfigMap(b *testing.B) {
	s, reg, _ := customFixture(b)
	ctx := context.Background()
	gk := &registry.Kind{GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gadget"}, Resource: "gadgets",
		Namespaced: true, HasStatus: true, New: func() runtime.Object { return &unstructured.Unstructured{} },
		TypeConverter: managedfields.NewDeducedTypeConverter(),
		DefaultOnRead: func(obj runtime.Object) {
			u := obj.(*unstructured.Unstructured)
			if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "key0"); !found {
				_ = unstructured.SetNestedField(u.Object, "default", "spec", "key0")
			}
		}}
	reg.SetCustom("gadgets.example.com", []*registry.Kind{gk})
	cms := kind(b, "", "v1", "configmaps")
	newCustom := func(i int) runtime.Object {
		spec := map[string]any{}
		for k, v := range benchPayload(i) {
			spec[k] = v
		}
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetGroupVersionKind(gk.GVK)
		u.SetName(fmt.Sprintf("obj-%d", i))
		u.SetLabels(map[string]string{"app": "bench"})
		return u
	}
	newCM := func(i int) runtime.Object {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("obj-%d", i), Labels: map[string]string{"app": "bench"}},
			Data: benchPayload(i)}
	}
	const n = 2000
	for i := range n {
		if _, err := s.Create(ctx, gk, "default", newCustom(i), Options{FieldManager: "bench"}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Create(ctx, cms, "default", newCM(i), Options{FieldManager: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		k    *registry.Kind
	}{{"custom", gk}, {"configmap", cms}} {
		b.Run("listjson/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				l, ok, err := s.ListJSON(ctx, c.k, "default", ListOptions{})
				if err != nil || !ok {
					b.Fatal(ok, err)
				}
				_ = l.Bytes()
			}
		})
	}
	for _, c := range []struct {
		name string
		k    *registry.Kind
		mk   func(int) runtime.Object
	}{{"custom", gk, newCustom}, {"configmap", cms, newCM}} {
		seq := 1_000_000 // b.Run calls the function again with a larger b.N
		b.Run("create/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				seq++
				if _, err := s.Create(ctx, c.k, "default", c.mk(seq), Options{FieldManager: "bench"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
