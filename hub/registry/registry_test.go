package registry

import (
	"context"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Two registries, as two hubs in one process have, share no allocation:
// an address one of them gave out is free in the other.
func TestRegistriesShareNothing(t *testing.T) {
	gvr := corev1.SchemeGroupVersion.WithResource("services")
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admit := func(r *Registry, name string) error {
		s := newService(name, "")
		s.Spec.ClusterIP = "10.0.0.10"
		return r.Lookup(gvr).Admit(ctx, nil, s, nil)
	}
	if err := admit(a, "dns"); err != nil {
		t.Fatalf("first hub: %v", err)
	}
	if err := admit(a, "other"); !apierrors.IsInvalid(err) {
		t.Fatalf("first hub, the same address again: err = %v, want Invalid", err)
	}
	if err := admit(b, "dns"); err != nil {
		t.Fatalf("second hub: %v", err)
	}
	if _, err := New(Config{Services: ServiceNetwork{NodePortFirst: 5, NodePortLast: 1}}); err == nil {
		t.Error("New accepted an inverted node port range")
	}
	if _, err := New(Config{Cluster: ClusterNetwork{NodeMaskSize: 8}}); err == nil {
		t.Error("New accepted node ranges larger than the cluster network")
	}
}

// Custom kinds come and go with their owner; built-in and extra kinds never
// change, and a custom kind cannot take a name already served.
func TestSetCustom(t *testing.T) {
	extra := &Kind{GVK: schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}, Resource: "customresourcedefinitions"}
	r, err := New(Config{Extra: []*Kind{extra}})
	if err != nil {
		t.Fatal(err)
	}
	base := len(r.Kinds())
	if r.Kinds()[base-1] != extra || r.Lookup(extra.GroupVersionResource()) != extra {
		t.Fatal("the extra kind is not served last")
	}
	if g := r.Generation(); g != 1 {
		t.Fatalf("Generation() = %d, want 1", g)
	}
	widget := func(v string) *Kind {
		return &Kind{GVK: schema.GroupVersionKind{Group: "example.com", Version: v, Kind: "Widget"}, Resource: "widgets"}
	}
	changed := r.Changed()
	v1, v2 := widget("v1"), widget("v2")
	r.SetCustom("widgets.example.com", []*Kind{v1, v2})
	select {
	case <-changed:
	default:
		t.Fatal("Changed() was not closed by SetCustom")
	}
	if g := r.Generation(); g != 2 {
		t.Fatalf("Generation() = %d, want 2", g)
	}
	if len(r.Kinds()) != base+2 || r.Lookup(v2.GroupVersionResource()) != v2 {
		t.Fatalf("custom kinds not served: %d kinds", len(r.Kinds()))
	}
	// A custom kind may not replace a built-in one.
	pods := r.Lookup(corev1.SchemeGroupVersion.WithResource("pods"))
	r.SetCustom("evil", []*Kind{{GVK: corev1.SchemeGroupVersion.WithKind("Pod"), Resource: "pods"}})
	if r.Lookup(corev1.SchemeGroupVersion.WithResource("pods")) != pods || len(r.Kinds()) != base+2 {
		t.Fatal("a custom kind replaced a built-in one")
	}
	r.SetCustom("evil", nil)
	// Replacing an owner's kinds drops what it served before.
	r.SetCustom("widgets.example.com", []*Kind{v2})
	if r.Lookup(v1.GroupVersionResource()) != nil || r.Lookup(v2.GroupVersionResource()) != v2 {
		t.Fatal("replacing an owner's kinds kept the old ones")
	}
	g := r.Generation()
	r.SetCustom("nobody", nil)
	if r.Generation() != g {
		t.Fatal("removing nothing changed the generation")
	}
	r.SetCustom("widgets.example.com", nil)
	if len(r.Kinds()) != base || r.Lookup(v2.GroupVersionResource()) != nil {
		t.Fatal("removal left custom kinds")
	}
}

// Readers see a consistent set while kinds change concurrently (run with
// -race).
func TestSetCustomConcurrent(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	k := &Kind{GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, Resource: "widgets"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ks := r.Kinds()
				for _, x := range ks {
					_ = x.Resource
				}
				_ = r.Lookup(k.GroupVersionResource())
				select {
				case <-r.Changed():
				case <-stop:
					return
				}
			}
		}()
	}
	for i := 0; i < 1000; i++ {
		if i%2 == 0 {
			r.SetCustom("widgets.example.com", []*Kind{k})
		} else {
			r.SetCustom("widgets.example.com", nil)
		}
	}
	close(stop)
	wg.Wait()
	if g := r.Generation(); g != 1001 {
		t.Fatalf("Generation() = %d, want 1001", g)
	}
}

// The built-in kinds serve distinct resources (Lookup is a map).
func TestBuiltinKindsDistinct(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kinds()) != len(All()) {
		t.Fatalf("registry serves %d kinds, All has %d: a duplicate resource", len(r.Kinds()), len(All()))
	}
}
