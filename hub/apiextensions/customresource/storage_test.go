package customresource

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// storageFixture is hub/storage over SQLite following a registry that
// serves the test CRD's kinds, as the hub runs them.
func storageFixture(t *testing.T) (*storage.Storage, map[string]*registry.Kind) {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	reg, err := registry.New(registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := storage.New(storage.Config{Store: st, Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		FutureWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("new storage: %v", err)
	}
	if err := s.Bootstrap(context.Background(), storage.BootstrapConfig{AdvertiseAddress: "192.0.2.10", Port: 6443}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	crd := loadCRD(t)
	kinds, err := Kinds(crd)
	if err != nil {
		t.Fatal(err)
	}
	reg.SetCustom(crd.Name, kinds)
	out := map[string]*registry.Kind{}
	for _, v := range []string{"v1", "v1beta1"} {
		k := reg.Lookup(schema.GroupVersionResource{Group: "example.tether.dev", Version: v, Resource: "widgets"})
		if k == nil {
			t.Fatalf("widgets %s not served", v)
		}
		out[v] = k
	}
	return s, out
}

// asU returns a check of a storage call's result: it fails the test on
// an error and returns the object as unstructured.
func asU(t *testing.T) func(runtime.Object, error) *unstructured.Unstructured {
	return func(obj runtime.Object, err error) *unstructured.Unstructured {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			t.Fatalf("got %T, want unstructured", obj)
		}
		return u
	}
}

func nestedOf(u *unstructured.Unstructured, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(u.Object, path...)
	return v
}

// TestThroughStorage writes and reads custom objects through hub/storage
// over SQLite: create with pruning and defaults, refusals with
// kube-apiserver's messages that store nothing, spec and status updates
// with generation, /scale, server-side apply merging by list-map keys,
// defaults on read, reads through the other version, and field
// selectors.
func TestThroughStorage(t *testing.T) {
	s, ks := storageFixture(t)
	v1, beta := ks["v1"], ks["v1beta1"]
	ctx := context.Background()

	// Create: the API server prunes the body, storage defaults, drops
	// status and validates.
	in := obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, colour: red, ports: [{name: http, port: 80}]}
status: {phase: Ready}
`)
	if pruned := v1.Prune(in); !reflect.DeepEqual(pruned, []string{"spec.colour"}) {
		t.Errorf("pruned %v", pruned)
	}
	w := asU(t)(s.Create(ctx, v1, "default", in, storage.Options{FieldManager: "kubectl"}))
	if w.GetGeneration() != 1 || nestedOf(w, "spec", "replicas") != int64(1) || nestedOf(w, "spec", "mode") != "Fast" ||
		nestedOf(w, "spec", "ports") == nil || w.Object["status"] != nil {
		t.Errorf("created %v", w.Object)
	}
	if p, _, _ := unstructured.NestedSlice(w.Object, "spec", "ports"); len(p) != 1 || p[0].(map[string]any)["protocol"] != "TCP" {
		t.Errorf("ports not defaulted: %v", p)
	}

	// Refusals: 422 with kube-apiserver's message, nothing stored.
	for _, tc := range []struct{ name, spec, msg string }{
		{"schema", `{image: nginx, replicas: 12}`,
			`Widget.example.tether.dev "bad" is invalid: spec.replicas: Invalid value: 12: spec.replicas in body should be less than or equal to 10`},
		{"rule", `{image: nginx, replicas: 2, minReplicas: 3}`,
			`Widget.example.tether.dev "bad" is invalid: spec: Invalid value: minReplicas must not exceed replicas`},
		{"enum", `{image: nginx, mode: Medium}`,
			`Widget.example.tether.dev "bad" is invalid: [spec.mode: Unsupported value: "Medium": supported values: "Fast", "Slow", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]`},
	} {
		bad := obj(t, "{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: bad, namespace: default}, spec: "+tc.spec+"}")
		_, err := s.Create(ctx, v1, "default", bad, storage.Options{FieldManager: "kubectl"})
		if !apierrors.IsInvalid(err) || err.Error() != tc.msg {
			t.Errorf("%s: got %v\nwant %s", tc.name, err, tc.msg)
		}
		if se, ok := err.(apierrors.APIStatus); ok && (se.Status().Details == nil || se.Status().Details.Kind != "Widget" || len(se.Status().Details.Causes) == 0) {
			t.Errorf("%s: status details %+v", tc.name, se.Status().Details)
		}
	}
	if _, err := s.Get(ctx, v1, "default", "bad"); !apierrors.IsNotFound(err) {
		t.Errorf("a refused create stored something: %v", err)
	}

	// A spec change bumps generation; the transition rule holds image.
	w.Object["spec"].(map[string]any)["replicas"] = int64(4)
	w = asU(t)(s.Update(ctx, v1, "default", "w", w, storage.Options{FieldManager: "kubectl"}))
	if w.GetGeneration() != 2 {
		t.Errorf("generation after a spec change: %d", w.GetGeneration())
	}
	img := w.DeepCopy()
	img.Object["spec"].(map[string]any)["image"] = "redis"
	_, err := s.Update(ctx, v1, "default", "w", img, storage.Options{FieldManager: "kubectl"})
	if want := `Widget.example.tether.dev "w" is invalid: spec.image: Invalid value: "redis": image is immutable`; err == nil || err.Error() != want {
		t.Errorf("image change: got %v, want %s", err, want)
	}

	// /status writes status alone and keeps generation; its schema is
	// checked.
	st := w.DeepCopy()
	st.Object["status"] = map[string]any{"replicas": int64(4), "selector": "app=w", "phase": "Ready"}
	st.Object["spec"].(map[string]any)["replicas"] = int64(9)
	w = asU(t)(s.Update(ctx, v1, "default", "w", st, storage.Options{FieldManager: "controller", Subresource: "status"}))
	if w.GetGeneration() != 2 || nestedOf(w, "spec", "replicas") != int64(4) || nestedOf(w, "status", "phase") != "Ready" {
		t.Errorf("after a status write: %v", w.Object)
	}
	badStatus := w.DeepCopy()
	badStatus.Object["status"] = map[string]any{"replicas": int64(-1)}
	_, err = s.Update(ctx, v1, "default", "w", badStatus, storage.Options{FieldManager: "controller", Subresource: "status"})
	if want := `Widget.example.tether.dev "w" is invalid: .status.replicas: Invalid value: -1: should be a non-negative integer`; err == nil || err.Error() != want {
		t.Errorf("bad status: got %v, want %s", err, want)
	}

	// /scale, as the API server writes it.
	w = asU(t)(s.GuaranteedUpdate(ctx, v1, "default", "w", storage.Options{FieldManager: "kubectl-scale"},
		func(cur runtime.Object) (runtime.Object, error) {
			v1.Scale.Set(cur, 6)
			return cur, nil
		}))
	if spec, status, sel := v1.Scale.Get(w); spec != 6 || status != 4 || sel != "app=w" || w.GetGeneration() != 3 {
		t.Errorf("scale: %d %d %q, generation %d", spec, status, sel, w.GetGeneration())
	}

	// Server-side apply merges the ports list by name.
	apply := func(manager, y string) *unstructured.Unstructured {
		t.Helper()
		obj, _, err := s.Apply(ctx, v1, "default", "w", []byte(y), storage.Options{FieldManager: manager})
		return asU(t)(obj, err)
	}
	apply("web", `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: w, namespace: default}, spec: {image: nginx, ports: [{name: https, port: 443}]}}`)
	w = apply("metrics", `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: w, namespace: default}, spec: {ports: [{name: metrics, port: 9090}]}}`)
	var names []string
	p, _, _ := unstructured.NestedSlice(w.Object, "spec", "ports")
	for _, e := range p {
		names = append(names, e.(map[string]any)["name"].(string))
	}
	if !reflect.DeepEqual(names, []string{"http", "https", "metrics"}) {
		t.Errorf("ports after two applies: %v", names)
	}

	// Created through v1beta1 (which has no spec.mode), the object is
	// stored without it and reads back through v1 defaulted.
	b := asU(t)(s.Create(ctx, beta, "default", obj(t, `
apiVersion: example.tether.dev/v1beta1
kind: Widget
metadata: {name: old, namespace: default}
spec: {image: busybox}
`), storage.Options{FieldManager: "kubectl"}))
	if b.GetAPIVersion() != "example.tether.dev/v1beta1" || nestedOf(b, "spec", "mode") != nil || nestedOf(b, "spec", "replicas") != int64(1) {
		t.Errorf("created through v1beta1: %v", b.Object)
	}
	got := asU(t)(s.Get(ctx, v1, "default", "old"))
	if got.GetAPIVersion() != "example.tether.dev/v1" || nestedOf(got, "spec", "mode") != "Fast" || nestedOf(got, "spec", "minReplicas") != int64(0) {
		t.Errorf("read through v1: %v", got.Object)
	}

	// Field selectors from selectableFields.
	slow := w.DeepCopy()
	slow.SetName("slow")
	slow.SetResourceVersion("")
	slow.SetUID("")
	slow.SetManagedFields(nil)
	slow.Object["spec"].(map[string]any)["mode"] = "Slow"
	asU(t)(s.Create(ctx, v1, "default", slow, storage.Options{FieldManager: "kubectl"}))
	lst, err := s.List(ctx, v1, "default", storage.ListOptions{Field: fields.OneTermEqualSelector("spec.mode", "Slow")})
	if err != nil {
		t.Fatal(err)
	}
	if items := lst.(*unstructured.UnstructuredList).Items; len(items) != 1 || items[0].GetName() != "slow" {
		t.Errorf("spec.mode=Slow selected %d items", len(items))
	}
	if _, err := s.List(ctx, v1, "default", storage.ListOptions{Field: fields.OneTermEqualSelector("spec.image", "nginx")}); err == nil {
		t.Errorf("a field that is not selectable was accepted")
	}
}
