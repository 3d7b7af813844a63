package registry

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
