package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/sqlite"
)

const widgetOwner = "widgets.example.com"

// customFixture is a storage following a registry, as the hub runs it.
func customFixture(t testing.TB) (*Storage, *registry.Registry, *sqlite.Store) {
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
	s, err := New(Config{Store: st, Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		BookmarkInterval: 100 * time.Millisecond, FutureWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("new storage: %v", err)
	}
	if err := s.Bootstrap(context.Background(), BootstrapConfig{AdvertiseAddress: "192.0.2.10", Port: 6443}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	return s, reg, st
}

func widgetGVK(v string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: "example.com", Version: v, Kind: "Widget"}
}

// widgetKinds builds, by hand, the kinds a CustomResourceDefinition of
// Widgets would give: v1 stored, v2 a view of it (conversion None), a
// status subresource, spec.color defaulted on read to color.
func widgetKinds(color string) []*registry.Kind {
	tc := managedfields.NewDeducedTypeConverter()
	convert := func(to schema.GroupVersionKind) func(runtime.Object) (runtime.Object, error) {
		return func(obj runtime.Object) (runtime.Object, error) {
			obj.GetObjectKind().SetGroupVersionKind(to)
			return obj, nil
		}
	}
	defaultOnRead := func(obj runtime.Object) {
		u := obj.(*unstructured.Unstructured)
		if _, found, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "color"); !found {
			_ = unstructured.SetNestedField(u.Object, color, "spec", "color")
		}
	}
	mk := func(v string) *registry.Kind {
		return &registry.Kind{
			GVK: widgetGVK(v), Resource: "widgets", Singular: "widget", Namespaced: true, HasStatus: true,
			New:           func() runtime.Object { return &unstructured.Unstructured{} },
			TypeConverter: tc, DefaultOnRead: defaultOnRead, NoProtobuf: true,
			PatchTypes: []types.PatchType{types.JSONPatchType, types.MergePatchType, types.ApplyPatchType},
		}
	}
	v1, v2 := mk("v1"), mk("v2")
	v2.StoredAs, v2.ToStorage, v2.FromStorage = v1.GVK, convert(v1.GVK), convert(v2.GVK)
	return []*registry.Kind{v1, v2}
}

func widgetKind(t testing.TB, reg *registry.Registry, v string) *registry.Kind {
	t.Helper()
	k := reg.Lookup(widgetGVK(v).GroupVersion().WithResource("widgets"))
	if k == nil {
		t.Fatalf("widgets %s not served", v)
	}
	return k
}

func widget(v, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(widgetGVK(v))
	u.SetName(name)
	return u
}

func asU(t testing.TB, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		t.Fatalf("got %T, want *unstructured.Unstructured", obj)
	}
	return u
}

func nested(u *unstructured.Unstructured, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(u.Object, path...)
	return v
}

// patchWith returns a tryUpdate applying a JSON merge patch or a JSON
// patch, as the API server's PATCH does.
func patchWith(t testing.TB, pt types.PatchType, patch string) func(runtime.Object) (runtime.Object, error) {
	return func(cur runtime.Object) (runtime.Object, error) {
		orig, err := json.Marshal(cur)
		if err != nil {
			return nil, err
		}
		var out []byte
		switch pt {
		case types.MergePatchType:
			out, err = jsonpatch.MergePatch(orig, []byte(patch))
		case types.JSONPatchType:
			var p jsonpatch.Patch
			if p, err = jsonpatch.DecodePatch([]byte(patch)); err == nil {
				out, err = p.Apply(orig)
			}
		}
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(out); err != nil {
			return nil, err
		}
		u.SetResourceVersion("")
		return u, nil
	}
}

// Custom resources get the whole object machinery: create, get and list
// through either version, PUT, merge and JSON patches, server-side apply,
// the status split, generation, and defaults applied on every read but
// never stored.
func TestCustomResourceObjects(t *testing.T) {
	s, reg, st := customFixture(t)
	ctx := context.Background()
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	v1, v2 := widgetKind(t, reg, "v1"), widgetKind(t, reg, "v2")

	in := widget("v1", "a", map[string]any{"size": int64(1)})
	in.Object["status"] = map[string]any{"ready": true}
	out, err := s.Create(ctx, v1, "default", in, Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	u := asU(t, out)
	if u.GetGeneration() != 1 || u.GetUID() == "" || u.GetResourceVersion() == "" {
		t.Errorf("created: generation %d, uid %q, rv %q", u.GetGeneration(), u.GetUID(), u.GetResourceVersion())
	}
	if _, has := u.Object["status"]; has {
		t.Errorf("create kept status: %v", u.Object["status"])
	}
	if nested(u, "spec", "color") != "blue" {
		t.Errorf("created object not defaulted on read: %v", u.Object["spec"])
	}
	if mf := u.GetManagedFields(); len(mf) != 1 || mf[0].Manager != "test" || mf[0].APIVersion != "example.com/v1" {
		t.Errorf("managedFields = %+v", mf)
	}
	raw, err := st.Get(ctx, store.Key{Resource: "widgets.example.com", Namespace: "default", Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw.Value), "color") || !strings.Contains(string(raw.Value), `"apiVersion":"example.com/v1"`) {
		t.Errorf("stored value %s: want v1 without the read default", raw.Value)
	}

	// Both versions read the one object; v2 sees its own apiVersion.
	got, err := s.Get(ctx, v2, "default", "a")
	if err != nil {
		t.Fatalf("get v2: %v", err)
	}
	if g := asU(t, got); g.GetAPIVersion() != "example.com/v2" || nested(g, "spec", "color") != "blue" || nested(g, "spec", "size") != int64(1) {
		t.Errorf("get v2 = %v", g.Object)
	}
	if _, err := s.Create(ctx, v2, "default", widget("v2", "b", map[string]any{"color": "green"}), Options{FieldManager: "test"}); err != nil {
		t.Fatalf("create v2: %v", err)
	}
	lst, err := s.List(ctx, v1, "default", ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	ul, ok := lst.(*unstructured.UnstructuredList)
	if !ok || ul.GetAPIVersion() != "example.com/v1" || ul.GetKind() != "WidgetList" || len(ul.Items) != 2 {
		t.Fatalf("list = %T %#v", lst, lst)
	}
	colors := map[string]any{}
	for _, it := range ul.Items {
		if it.GetAPIVersion() != "example.com/v1" || it.GetKind() != "Widget" {
			t.Errorf("list item %s has type %s %s", it.GetName(), it.GetAPIVersion(), it.GetKind())
		}
		colors[it.GetName()] = nested(&it, "spec", "color")
	}
	if colors["a"] != "blue" || colors["b"] != "green" {
		t.Errorf("listed colors = %v", colors)
	}
	// The JSON list has the read defaults too, decoding only what it must:
	// "a" is stored without the default, "b" with its own color.
	for range 2 {
		if body := customListJSON(t, s, v1, "default", ListOptions{}); !strings.Contains(body, `"color":"blue"`) {
			t.Errorf("JSON list without the read default: %s", body)
		}
	}
	s.rdefaults.mu.RLock()
	noted := len(s.rdefaults.m)
	s.rdefaults.mu.RUnlock()
	if noted == 0 {
		t.Error("no object is known to read as stored")
	}

	// PUT: a metadata-only change keeps generation, a spec change bumps
	// it, and status in the body of a main write is ignored.
	cur := asU(t, got).DeepCopy()
	cur.SetLabels(map[string]string{"x": "y"})
	cur.Object["status"] = map[string]any{"ready": true}
	out, err = s.Update(ctx, v2, "default", "a", cur, Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("update labels: %v", err)
	}
	if u := asU(t, out); u.GetGeneration() != 1 || u.GetLabels()["x"] != "y" || u.Object["status"] != nil {
		t.Errorf("after a label update: generation %d, labels %v, status %v", u.GetGeneration(), u.GetLabels(), u.Object["status"])
	}
	out, err = s.GuaranteedUpdate(ctx, v1, "default", "a", Options{FieldManager: "merge"}, patchWith(t, types.MergePatchType, `{"spec":{"size":2}}`))
	if err != nil {
		t.Fatalf("merge patch: %v", err)
	}
	if u := asU(t, out); u.GetGeneration() != 2 || nested(u, "spec", "size") != int64(2) {
		t.Errorf("after a merge patch: generation %d, spec %v", u.GetGeneration(), u.Object["spec"])
	}
	out, err = s.GuaranteedUpdate(ctx, v2, "default", "a", Options{FieldManager: "jsonp"}, patchWith(t, types.JSONPatchType, `[{"op":"replace","path":"/spec/size","value":3}]`))
	if err != nil {
		t.Fatalf("json patch: %v", err)
	}
	if u := asU(t, out); u.GetGeneration() != 3 || nested(u, "spec", "size") != int64(3) || u.GetAPIVersion() != "example.com/v2" {
		t.Errorf("after a JSON patch: generation %d, %v", u.GetGeneration(), u.Object)
	}

	// /status: only status changes, generation stays.
	cur = asU(t, out).DeepCopy()
	cur.Object["status"] = map[string]any{"ready": true}
	_ = unstructured.SetNestedField(cur.Object, int64(99), "spec", "size")
	cur.SetLabels(map[string]string{"x": "changed"})
	out, err = s.Update(ctx, v2, "default", "a", cur, Options{FieldManager: "ctrl", Subresource: "status"})
	if err != nil {
		t.Fatalf("status update: %v", err)
	}
	u = asU(t, out)
	if u.GetGeneration() != 3 || nested(u, "status", "ready") != true || nested(u, "spec", "size") != int64(3) || u.GetLabels()["x"] != "y" {
		t.Errorf("after a status update: generation %d, %v", u.GetGeneration(), u.Object)
	}
	found := false
	for _, e := range u.GetManagedFields() {
		if e.Manager == "ctrl" && e.Subresource == "status" && strings.Contains(e.FieldsV1.GetRawString(), "f:ready") {
			found = true
		}
	}
	if !found {
		t.Errorf("no status entry for ctrl: %+v", u.GetManagedFields())
	}
	// A main write keeps the stored status.
	cur = u.DeepCopy()
	delete(cur.Object, "status")
	_ = unstructured.SetNestedField(cur.Object, int64(4), "spec", "size")
	out, err = s.Update(ctx, v2, "default", "a", cur, Options{FieldManager: "test"})
	if err != nil {
		t.Fatalf("update spec: %v", err)
	}
	if u := asU(t, out); nested(u, "status", "ready") != true || u.GetGeneration() != 4 {
		t.Errorf("a main write changed status or missed generation: %v", u.Object)
	}

	// Server-side apply: create, take ownership, conflict, force.
	applyA := `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"c"},"spec":{"size":5}}`
	out, created, err := s.Apply(ctx, v1, "default", "c", []byte(applyA), Options{FieldManager: "a"})
	if err != nil || !created {
		t.Fatalf("apply create: created %v, %v", created, err)
	}
	if u := asU(t, out); nested(u, "spec", "size") != int64(5) || u.GetGeneration() != 1 || nested(u, "spec", "color") != "blue" {
		t.Errorf("applied: %v", u.Object)
	}
	applyB := `{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"c"},"spec":{"size":6}}`
	_, _, err = s.Apply(ctx, v2, "default", "c", []byte(applyB), Options{FieldManager: "b"})
	wantReason(t, err, metav1.StatusReasonConflict)
	out, _, err = s.Apply(ctx, v2, "default", "c", []byte(applyB), Options{FieldManager: "b", Force: true})
	if err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	u = asU(t, out)
	if nested(u, "spec", "size") != int64(6) || u.GetGeneration() != 2 {
		t.Errorf("forced apply: %v", u.Object)
	}
	owners := map[string]string{}
	for _, e := range u.GetManagedFields() {
		owners[e.Manager] = e.APIVersion
	}
	if owners["b"] != "example.com/v2" {
		t.Errorf("managedFields after a forced apply: %+v", u.GetManagedFields())
	}
	// Applying the same again changes nothing.
	again, _, err := s.Apply(ctx, v2, "default", "c", []byte(applyB), Options{FieldManager: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if asU(t, again).GetResourceVersion() != u.GetResourceVersion() {
		t.Errorf("a repeated apply wrote: rv %s → %s", u.GetResourceVersion(), asU(t, again).GetResourceVersion())
	}

	// Server-side apply of status: status alone changes.
	applyStatus := `{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"c"},"spec":{"size":7},"status":{"phase":"Ready"}}`
	out, _, err = s.Apply(ctx, v2, "default", "c", []byte(applyStatus), Options{FieldManager: "ctrl", Subresource: "status"})
	if err != nil {
		t.Fatalf("apply status: %v", err)
	}
	if u := asU(t, out); nested(u, "status", "phase") != "Ready" || nested(u, "spec", "size") != int64(6) || u.GetGeneration() != 2 {
		t.Errorf("after applying status: %v", u.Object)
	}

	// A changed definition (another default) applies at once to reads
	// of what is stored without the field. (Updates store what they
	// read, defaults included, as upstream.)
	if _, err := s.Create(ctx, v1, "default", widget("v1", "e", map[string]any{}), Options{}); err != nil {
		t.Fatal(err)
	}
	reg.SetCustom(widgetOwner, widgetKinds("red"))
	got, err = s.Get(ctx, v1, "default", "e")
	if err != nil {
		t.Fatal(err)
	}
	if c := nested(asU(t, got), "spec", "color"); c != "red" {
		t.Errorf("after the definition changed, color = %v, want red", c)
	}
	// Deleting works; the kind removed, its resources are not found.
	if _, deleted, err := s.Delete(ctx, v1, "default", "b", nil, false); err != nil || !deleted {
		t.Fatalf("delete: deleted %v, %v", deleted, err)
	}
	dl, err := s.DeleteCollection(ctx, v2, "default", ListOptions{}, nil, false)
	if err != nil {
		t.Fatalf("delete collection: %v", err)
	}
	if n := len(dl.(*unstructured.UnstructuredList).Items); n != 3 {
		t.Errorf("delete collection deleted %d objects, want 3", n)
	}
	if l, err := s.List(ctx, v1, "", ListOptions{}); err != nil || len(l.(*unstructured.UnstructuredList).Items) != 0 {
		t.Errorf("after delete collection: %v, %v", l, err)
	}
	reg.SetCustom(widgetOwner, nil)
	_, err = s.Get(ctx, v1, "default", "a")
	wantReason(t, err, metav1.StatusReasonNotFound)
	_, err = s.Create(ctx, v1, "default", widget("v1", "d", nil), Options{})
	wantReason(t, err, metav1.StatusReasonNotFound)
}

// Watches see custom resources defaulted on read, in the version they
// watch, and end when the kind leaves the registry.
func TestCustomResourceWatch(t *testing.T) {
	s, reg, _ := customFixture(t)
	ctx := context.Background()
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	v1, v2 := widgetKind(t, reg, "v1"), widgetKind(t, reg, "v2")
	if _, err := s.Create(ctx, v1, "default", widget("v1", "a", map[string]any{"size": int64(1)}), Options{}); err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, v2, "default", WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	bw, err := s.Watch(ctx, v1, "", WatchOptions{ResourceVersion: "1", AllowBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bw.Stop()
	check := func(ev watch.Event, typ watch.EventType, size int64) {
		t.Helper()
		if ev.Type != typ {
			t.Fatalf("event %s, want %s", ev.Type, typ)
		}
		u := asU(t, ev.Object)
		if u.GetAPIVersion() != "example.com/v2" || nested(u, "spec", "color") != "blue" || nested(u, "spec", "size") != size {
			t.Errorf("%s event object: %v", typ, u.Object)
		}
	}
	check(next(t, w), watch.Added, 1)
	if _, err := s.GuaranteedUpdate(ctx, v1, "default", "a", Options{}, patchWith(t, types.MergePatchType, `{"spec":{"size":2}}`)); err != nil {
		t.Fatal(err)
	}
	check(next(t, w), watch.Modified, 2)
	// Replacing the definition keeps the watch.
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	if _, err := s.GuaranteedUpdate(ctx, v1, "default", "a", Options{}, patchWith(t, types.MergePatchType, `{"spec":{"size":3}}`)); err != nil {
		t.Fatal(err)
	}
	check(next(t, w), watch.Modified, 3)
	if ev := nextNonBookmark(t, bw); ev.Type != watch.Added {
		t.Fatalf("bookmark watch: %s", ev.Type)
	}
	if ev := next(t, bw); ev.Type != watch.Bookmark && ev.Type != watch.Modified {
		t.Fatalf("bookmark watch: %s", ev.Type)
	}
	reg.SetCustom(widgetOwner, nil)
	for _, wi := range []watch.Interface{w, bw} {
		deadline := time.After(5 * time.Second)
	drain:
		for {
			select {
			case ev, ok := <-wi.ResultChan():
				if !ok {
					break drain
				}
				if ev.Type == watch.Error {
					t.Errorf("watch ended with an error event: %v", ev.Object)
				}
			case <-deadline:
				t.Fatal("the watch of a removed kind did not end")
			}
		}
	}
	_, err = s.Watch(ctx, v2, "default", WatchOptions{})
	wantReason(t, err, metav1.StatusReasonNotFound)
}

// Requests of custom and built-in kinds run while the registry changes
// (run with -race).
func TestCustomResourceConcurrentRegistry(t *testing.T) {
	s, reg, _ := customFixture(t)
	ctx := context.Background()
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	v1 := widgetKind(t, reg, "v1")
	gadget := &registry.Kind{GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gadget"}, Resource: "gadgets",
		Namespaced: true, New: func() runtime.Object { return &unstructured.Unstructured{} }}
	w, err := s.Watch(ctx, v1, "default", WatchOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for range w.ResultChan() {
		}
	}()
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() {
		defer churn.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			reg.SetCustom(widgetOwner, widgetKinds("blue"))
			if i%2 == 0 {
				reg.SetCustom("gadgets.example.com", []*registry.Kind{gadget})
			} else {
				reg.SetCustom("gadgets.example.com", nil)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				name := "w" + string(rune('a'+g)) + string(rune('a'+i))
				if _, err := s.Create(ctx, v1, "default", widget("v1", name, map[string]any{"size": int64(i)}), Options{FieldManager: "m"}); err != nil {
					errs <- err
					return
				}
				if _, err := s.GuaranteedUpdate(ctx, v1, "default", name, Options{FieldManager: "m"}, patchWith(t, types.MergePatchType, `{"spec":{"size":100}}`)); err != nil {
					errs <- err
					return
				}
				if _, err := s.List(ctx, v1, "default", ListOptions{}); err != nil {
					errs <- err
					return
				}
				if _, err := s.Get(ctx, kind(t, "", "v1", "namespaces"), "", "default"); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(stop)
	churn.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A custom resource's JSON list is the stored values with their
// resourceVersion inserted, byte for byte what encoding the list List
// returns gives; an object stored in another version makes it step aside.
func TestCustomResourceListJSON(t *testing.T) {
	s, reg, _ := customFixture(t)
	ctx := context.Background()
	gadget := func(v string, stored string) *registry.Kind {
		k := &registry.Kind{GVK: schema.GroupVersionKind{Group: "example.com", Version: v, Kind: "Gadget"}, Resource: "gadgets",
			Namespaced: true, HasStatus: true, New: func() runtime.Object { return &unstructured.Unstructured{} },
			TypeConverter: managedfields.NewDeducedTypeConverter()}
		if stored != v {
			k.StoredAs = schema.GroupVersionKind{Group: "example.com", Version: stored, Kind: "Gadget"}
			to := func(gvk schema.GroupVersionKind) func(runtime.Object) (runtime.Object, error) {
				return func(obj runtime.Object) (runtime.Object, error) {
					obj.GetObjectKind().SetGroupVersionKind(gvk)
					return obj, nil
				}
			}
			k.ToStorage, k.FromStorage = to(k.StoredAs), to(k.GVK)
		}
		return k
	}
	reg.SetCustom("gadgets.example.com", []*registry.Kind{gadget("v1", "v1"), gadget("v2", "v1")})
	v1 := reg.Lookup(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gadgets"})
	objs := []map[string]any{
		{"spec": map[string]any{"a": int64(1), "b": 1.5, "s": "<&> é", "l": []any{"x", map[string]any{"y": true}}}},
		{"data": "before metadata", "spec": map[string]any{}},
		{"zzz": nil},
	}
	for i, o := range objs {
		u := &unstructured.Unstructured{Object: o}
		u.SetGroupVersionKind(v1.GVK)
		u.SetName("g" + string(rune('a'+i)))
		u.SetLabels(map[string]string{"i": string(rune('a' + i))})
		u.SetAnnotations(map[string]string{"note": "x"})
		u.SetFinalizers([]string{"example.com/keep"})
		if _, err := s.Create(ctx, v1, "default", u, Options{FieldManager: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	customListJSON(t, s, v1, "default", ListOptions{})
	if _, ok, err := s.ListProtobuf(ctx, v1, "default", ListOptions{}); ok || err != nil {
		t.Errorf("custom resources as protobuf: ok %v, %v; want not answered", ok, err)
	}
	first, err := s.List(ctx, v1, "default", ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	customListJSON(t, s, v1, "default", ListOptions{Limit: 1})
	customListJSON(t, s, v1, "default", ListOptions{Limit: 1, Continue: first.(*unstructured.UnstructuredList).GetContinue()})
	customListJSON(t, s, v1, "default", ListOptions{Label: labels.SelectorFromSet(labels.Set{"i": "z"})})

	// The definition now stores v2: objects stored as v1 need converting.
	reg.SetCustom("gadgets.example.com", []*registry.Kind{gadget("v1", "v2"), gadget("v2", "v2")})
	v2 := reg.Lookup(schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "gadgets"})
	customListJSON(t, s, v2, "default", ListOptions{})
	lst, err := s.List(ctx, v2, "default", ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range lst.(*unstructured.UnstructuredList).Items {
		if it.GetAPIVersion() != "example.com/v2" {
			t.Errorf("item %s listed as %s", it.GetName(), it.GetAPIVersion())
		}
	}
}

// A custom resource with a finalizer waits for it on delete, and goes
// once it is removed.
func TestCustomResourceFinalizers(t *testing.T) {
	s, reg, _ := customFixture(t)
	ctx := context.Background()
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	v1 := widgetKind(t, reg, "v1")
	u := widget("v1", "f", map[string]any{"size": int64(1)})
	u.SetFinalizers([]string{"example.com/hold"})
	if _, err := s.Create(ctx, v1, "default", u, Options{}); err != nil {
		t.Fatal(err)
	}
	out, deleted, err := s.Delete(ctx, v1, "default", "f", nil, false)
	if err != nil || deleted {
		t.Fatalf("delete: deleted %v, %v", deleted, err)
	}
	if asU(t, out).GetDeletionTimestamp() == nil {
		t.Fatal("no deletionTimestamp")
	}
	if _, err := s.GuaranteedUpdate(ctx, v1, "default", "f", Options{}, patchWith(t, types.MergePatchType, `{"metadata":{"finalizers":null}}`)); err != nil {
		t.Fatalf("remove finalizer: %v", err)
	}
	_, err = s.Get(ctx, v1, "default", "f")
	wantReason(t, err, metav1.StatusReasonNotFound)
}

// customListJSON checks that ListJSON answers and gives what encoding
// List's list gives, and returns the body.
func customListJSON(t *testing.T, s *Storage, k *registry.Kind, ns string, opts ListOptions) string {
	t.Helper()
	ctx := context.Background()
	want, err := s.List(ctx, k, ns, opts)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.ListJSON(ctx, k, ns, opts)
	if err != nil || !ok {
		t.Fatalf("ListJSON: ok %v, %v", ok, err)
	}
	var wb bytes.Buffer
	if err := json.NewEncoder(&wb).Encode(want); err != nil {
		t.Fatal(err)
	}
	gb := got.Bytes()
	if !bytes.Equal(gb, wb.Bytes()) || got.Len() != wb.Len() {
		t.Errorf("ListJSON differs from List (Len %d, %d bytes)\n got: %s\nwant: %s", got.Len(), wb.Len(), gb, wb.Bytes())
	}
	return string(gb)
}
