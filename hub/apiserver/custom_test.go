package apiserver

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// widgetGVR is the custom resource the tests of this file register.
var widgetGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// widgetKinds builds by hand what a CustomResourceDefinition would
// contribute: widgets.example.com/v1 (namespaced, with status and scale,
// a size column, spec.size selectable, its schema declaring
// spec.size, spec.replicas and status.replicas) and a deprecated
// gadgets.example.com/v1beta1.
func widgetKinds() []*registry.Kind {
	declared := map[string]map[string]bool{"spec": {"size": true, "replicas": true}, "status": {"replicas": true}}
	prune := func(obj runtime.Object) []string {
		u := obj.(*unstructured.Unstructured)
		var out []string
		for k, v := range u.Object {
			switch k {
			case "apiVersion", "kind", "metadata":
				continue
			}
			fields, ok := declared[k]
			m, isMap := v.(map[string]any)
			if !ok || !isMap {
				out = append(out, k)
				delete(u.Object, k)
				continue
			}
			for f := range m {
				if !fields[f] {
					out = append(out, k+"."+f)
					delete(m, f)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	newWidget := func(gvk schema.GroupVersionKind) func() runtime.Object {
		return func() runtime.Object {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			return u
		}
	}
	gvk := widgetGVR.GroupVersion().WithKind("Widget")
	noStrategic := []types.PatchType{types.JSONPatchType, types.MergePatchType, types.ApplyYAMLPatchType}
	widget := &registry.Kind{
		GVK: gvk, Resource: "widgets", Singular: "widget", Namespaced: true,
		ShortNames: []string{"wd"}, Categories: []string{"all"},
		HasStatus: true, HasSpec: true,
		New:           newWidget(gvk),
		TypeConverter: managedfields.NewDeducedTypeConverter(),
		PatchTypes:    noStrategic,
		NoProtobuf:    true,
		Prune:         prune,
		Scale: &registry.ScaleAccess{
			Get: func(obj runtime.Object) (int32, int32, string) {
				u := obj.(*unstructured.Unstructured)
				spec, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
				status, _, _ := unstructured.NestedInt64(u.Object, "status", "replicas")
				return int32(spec), int32(status), ""
			},
			Set: func(obj runtime.Object, n int32) {
				_ = unstructured.SetNestedField(obj.(*unstructured.Unstructured).Object, int64(n), "spec", "replicas")
			},
		},
		Columns: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string", Format: "name"},
			{Name: "Size", Type: "integer"},
		},
		Cells: func(obj runtime.Object, _ time.Time) []any {
			u := obj.(*unstructured.Unstructured)
			size, _, _ := unstructured.NestedInt64(u.Object, "spec", "size")
			return []any{u.GetName(), size}
		},
		Fields: func(obj runtime.Object) fields.Set {
			size, _, _ := unstructured.NestedFieldNoCopy(obj.(*unstructured.Unstructured).Object, "spec", "size")
			s, _ := json.Marshal(size)
			return fields.Set{"spec.size": string(s)}
		},
		FieldLabels: []string{"spec.size"},
	}
	ggvk := schema.GroupVersionKind{Group: "example.com", Version: "v1beta1", Kind: "Gadget"}
	gadget := &registry.Kind{
		GVK: ggvk, Resource: "gadgets", Singular: "gadget", Namespaced: true,
		New: newWidget(ggvk), TypeConverter: managedfields.NewDeducedTypeConverter(),
		PatchTypes: noStrategic, NoProtobuf: true, Deprecated: true,
	}
	return []*registry.Kind{widget, gadget}
}

// customHub serves the API for a registry, over a real storage on a real
// SQLite file.
type customHub struct {
	reg *registry.Registry
	srv *httptest.Server
	dyn *dynamic.DynamicClient
}

func newCustomHub(t *testing.T) *customHub {
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
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stg, err := storage.New(storage.Config{Store: st, Registry: reg, Logger: quiet})
	if err != nil {
		t.Fatalf("new storage: %v", err)
	}
	if err := stg.Bootstrap(context.Background(), storage.BootstrapConfig{AdvertiseAddress: "192.0.2.10"}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	s, err := New(Config{Storage: stg, Registry: reg, Authenticator: tokenAuth{}, Logger: quiet,
		Version: version.Info{Major: "1", Minor: "37", GitVersion: "v1.37.2"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	dyn, err := dynamic.NewForConfig(&rest.Config{Host: srv.URL, BearerToken: "good"})
	if err != nil {
		t.Fatal(err)
	}
	return &customHub{reg: reg, srv: srv, dyn: dyn}
}

// do sends a request and returns the response with its body read.
func (h *customHub) do(t *testing.T, method, path, contentType, accept, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer good")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// statusOf decodes a Status body.
func statusOf(t *testing.T, body string) metav1.Status {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("decode status %q: %v", body, err)
	}
	return st
}

func widget(name string, size int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"size": size, "replicas": int64(1)},
	}}
}

const widgetsPath = "/apis/example.com/v1/namespaces/default/widgets"

// TestCustomResourceServed shows a custom kind served the moment the
// registry has it, with the whole machinery of built-in kinds (list,
// field selectors, tables, watch, status, scale, deletecollection), and
// gone the moment it leaves.
func TestCustomResourceServed(t *testing.T) {
	h := newCustomHub(t)
	ctx := context.Background()
	if resp, _ := h.do(t, "GET", widgetsPath, "", "", ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("before registration: %d, want 404", resp.StatusCode)
	}
	h.reg.SetCustom("widgets.example.com", widgetKinds())
	widgets := h.dyn.Resource(widgetGVR).Namespace("default")

	w, err := widgets.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	created, err := widgets.Create(ctx, widget("a", 3), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if created.GetUID() == "" || created.GetGeneration() != 1 {
		t.Errorf("created: uid %q generation %d", created.GetUID(), created.GetGeneration())
	}
	select {
	case ev := <-w.ResultChan():
		if u, ok := ev.Object.(*unstructured.Unstructured); !ok || u.GetName() != "a" || ev.Type != "ADDED" {
			t.Errorf("watch event %s %T", ev.Type, ev.Object)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event")
	}
	if _, err := widgets.Create(ctx, widget("b", 5), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create b: %v", err)
	}
	list, err := widgets.List(ctx, metav1.ListOptions{FieldSelector: "spec.size=5"})
	if err != nil || len(list.Items) != 1 || list.Items[0].GetName() != "b" {
		t.Fatalf("field-selected list: %v %v", err, list)
	}

	// The server-side table has the kind's columns.
	resp, body := h.do(t, "GET", widgetsPath, "", "application/json;as=Table;v=v1;g=meta.k8s.io", "")
	var tbl metav1.Table
	if err := json.Unmarshal([]byte(body), &tbl); err != nil || resp.StatusCode != 200 {
		t.Fatalf("table: %d %s", resp.StatusCode, body)
	}
	if len(tbl.ColumnDefinitions) != 2 || tbl.ColumnDefinitions[1].Name != "Size" || len(tbl.Rows) != 2 ||
		tbl.Rows[1].Cells[0] != "b" || tbl.Rows[1].Cells[1] != float64(5) {
		t.Errorf("table: %s", body)
	}
	// Metadata only, as protobuf too.
	resp, body = h.do(t, "GET", widgetsPath+"/a", "", "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io", "")
	if resp.StatusCode != 200 || !strings.Contains(body, `"kind":"PartialObjectMetadata"`) || !strings.Contains(body, `"name":"a"`) {
		t.Errorf("partial metadata: %d %s", resp.StatusCode, body)
	}
	resp, _ = h.do(t, "GET", widgetsPath+"/a", "", "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;v=v1;g=meta.k8s.io", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != mediaProtobuf {
		t.Errorf("partial metadata as protobuf: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	// Status and spec are written apart; generation follows spec.
	st := created.DeepCopy()
	_ = unstructured.SetNestedField(st.Object, int64(2), "status", "replicas")
	_ = unstructured.SetNestedField(st.Object, int64(9), "spec", "size")
	st, err = widgets.UpdateStatus(ctx, st, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	if size, _, _ := unstructured.NestedInt64(st.Object, "spec", "size"); size != 3 || st.GetGeneration() != 1 {
		t.Errorf("status write changed spec: size %d generation %d", size, st.GetGeneration())
	}
	// Scale reads and writes spec.replicas.
	resp, body = h.do(t, "GET", widgetsPath+"/a/scale", "", "", "")
	if resp.StatusCode != 200 || !strings.Contains(body, `"kind":"Scale"`) || !strings.Contains(body, `"replicas":1`) {
		t.Fatalf("get scale: %d %s", resp.StatusCode, body)
	}
	resp, body = h.do(t, "PATCH", widgetsPath+"/a/scale", string(types.MergePatchType), "", `{"spec":{"replicas":4}}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"replicas":4`) {
		t.Fatalf("patch scale: %d %s", resp.StatusCode, body)
	}
	got, err := widgets.Get(ctx, "a", metav1.GetOptions{})
	if n, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas"); err != nil || n != 4 || got.GetGeneration() != 2 {
		t.Errorf("after scale: %v replicas %d generation %d", err, n, got.GetGeneration())
	}
	if resp, _ := h.do(t, "PATCH", widgetsPath+"/a/scale", string(types.StrategicMergePatchType), "", `{"spec":{"replicas":4}}`); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("strategic merge patch of scale: %d, want 415", resp.StatusCode)
	}

	if err := widgets.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatalf("deletecollection: %v", err)
	}
	if list, err := widgets.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("after deletecollection: %v %v", err, list)
	}

	// Built-in kinds are untouched by the custom ones.
	if resp, _ := h.do(t, "GET", "/api/v1/namespaces/default/configmaps", "", "application/vnd.kubernetes.protobuf", ""); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != mediaProtobuf {
		t.Errorf("configmaps as protobuf: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	// When the kind leaves, its watches end and it is no longer served.
	w2, err := widgets.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w2.Stop()
	h.reg.SetCustom("widgets.example.com", nil)
	if _, err := widgets.List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("list after removal: %v, want NotFound", err)
	}
	timeout := time.After(5 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-w2.ResultChan():
		case <-timeout:
			t.Fatal("the watch of a removed kind did not end")
		}
	}
}

// TestCustomResourceFieldValidation shows Kind.Prune under each
// fieldValidation directive, for bodies and for patches, with upstream's
// messages.
func TestCustomResourceFieldValidation(t *testing.T) {
	h := newCustomHub(t)
	h.reg.SetCustom("widgets.example.com", widgetKinds())
	body := `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"%s"},"spec":{"size":1,"foo":"x"},"bar":1}`
	mk := func(name string) string { return strings.Replace(body, "%s", name, 1) }

	resp, out := h.do(t, "POST", widgetsPath+"?fieldValidation=Strict", "application/json", "", mk("strict"))
	want := `Widget in version "v1" cannot be handled as a Widget: strict decoding error: unknown field "bar", unknown field "spec.foo"`
	if st := statusOf(t, out); resp.StatusCode != 400 || st.Message != want || st.Reason != metav1.StatusReasonBadRequest {
		t.Errorf("strict create: %d %q, want 400 %q", resp.StatusCode, st.Message, want)
	}
	if resp, _ := h.do(t, "GET", widgetsPath+"/strict", "", "", ""); resp.StatusCode != 404 {
		t.Errorf("refused widget stored: %d", resp.StatusCode)
	}

	resp, out = h.do(t, "POST", widgetsPath, "application/json", "", mk("warn"))
	if resp.StatusCode != 201 || strings.Contains(out, "foo") || strings.Contains(out, "bar") {
		t.Errorf("create (Warn by default): %d %s", resp.StatusCode, out)
	}
	wantWarn := []string{`299 - "unknown field \"bar\""`, `299 - "unknown field \"spec.foo\""`}
	if got := resp.Header.Values("Warning"); !slices.Equal(got, wantWarn) {
		t.Errorf("warnings %q, want %q", got, wantWarn)
	}

	resp, out = h.do(t, "POST", widgetsPath+"?fieldValidation=Ignore", "application/json", "", mk("ignore"))
	if resp.StatusCode != 201 || strings.Contains(out, "foo") || len(resp.Header.Values("Warning")) != 0 {
		t.Errorf("ignore create: %d %s %q", resp.StatusCode, out, resp.Header.Values("Warning"))
	}

	// YAML bodies decode alike.
	yamlBody := "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: yaml\nspec:\n  size: 2\n  foo: x\n"
	resp, out = h.do(t, "POST", widgetsPath+"?fieldValidation=Strict", "application/yaml", "", yamlBody)
	if st := statusOf(t, out); resp.StatusCode != 400 || !strings.HasSuffix(st.Message, `strict decoding error: unknown field "spec.foo"`) {
		t.Errorf("strict YAML create: %d %s", resp.StatusCode, out)
	}
	resp, out = h.do(t, "PUT", widgetsPath+"/warn", "application/yaml", "", strings.Replace(yamlBody, "yaml", "warn", 1))
	if resp.StatusCode != 200 || strings.Contains(out, "foo") || !strings.Contains(out, `"size":2`) {
		t.Errorf("YAML update: %d %s", resp.StatusCode, out)
	}

	// A patch's result is pruned the same way.
	resp, out = h.do(t, "PATCH", widgetsPath+"/warn?fieldValidation=Strict", string(types.MergePatchType), "", `{"spec":{"foo":"y"}}`)
	if st := statusOf(t, out); resp.StatusCode != 400 || st.Message != `strict decoding error: unknown field "spec.foo"` {
		t.Errorf("strict patch: %d %q", resp.StatusCode, st.Message)
	}
	resp, out = h.do(t, "PATCH", widgetsPath+"/warn", string(types.JSONPatchType), "", `[{"op":"add","path":"/spec/foo","value":"y"},{"op":"replace","path":"/spec/size","value":7}]`)
	if resp.StatusCode != 200 || strings.Contains(out, "foo") || !strings.Contains(out, `"size":7`) ||
		!slices.Equal(resp.Header.Values("Warning"), []string{`299 - "unknown field \"spec.foo\""`}) {
		t.Errorf("warn patch: %d %s %q", resp.StatusCode, out, resp.Header.Values("Warning"))
	}
	resp, _ = h.do(t, "PATCH", widgetsPath+"/warn?fieldValidation=Ignore", string(types.MergePatchType), "", `{"spec":{"foo":"y"}}`)
	if resp.StatusCode != 200 || len(resp.Header.Values("Warning")) != 0 {
		t.Errorf("ignore patch: %d %q", resp.StatusCode, resp.Header.Values("Warning"))
	}
}

// TestCustomResourceRequests shows what custom kinds refuse as upstream
// does: bodies of another kind or version, strategic merge patches,
// protobuf, and the Warning of a deprecated version.
func TestCustomResourceRequests(t *testing.T) {
	h := newCustomHub(t)
	h.reg.SetCustom("widgets.example.com", widgetKinds())
	if _, err := h.dyn.Resource(widgetGVR).Namespace("default").Create(context.Background(), widget("a", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	resp, out := h.do(t, "POST", widgetsPath, "application/json", "", `{"apiVersion":"example.com/v1","kind":"Gizmo","metadata":{"name":"g"}}`)
	if st := statusOf(t, out); resp.StatusCode != 422 || st.Message != `Widget.example.com "g" is invalid: kind: Invalid value: "Gizmo": must be Widget` {
		t.Errorf("other kind: %d %q", resp.StatusCode, st.Message)
	}
	resp, out = h.do(t, "POST", widgetsPath, "application/json", "", `{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"g"}}`)
	if st := statusOf(t, out); resp.StatusCode != 400 || st.Message != "the API version in the data (example.com/v2) does not match the expected API version (example.com/v1)" {
		t.Errorf("other version: %d %q", resp.StatusCode, st.Message)
	}

	resp, out = h.do(t, "PATCH", widgetsPath+"/a", string(types.StrategicMergePatchType), "", `{"spec":{"size":2}}`)
	want := "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
	if st := statusOf(t, out); resp.StatusCode != 415 || st.Message != want || st.Reason != metav1.StatusReasonUnsupportedMediaType {
		t.Errorf("strategic merge patch: %d %q", resp.StatusCode, st.Message)
	}
	resp, out = h.do(t, "PATCH", widgetsPath+"/a/status", string(types.StrategicMergePatchType), "", `{"status":{"replicas":2}}`)
	if resp.StatusCode != 415 {
		t.Errorf("strategic merge patch of status: %d %s", resp.StatusCode, out)
	}

	// Protobuf is not a custom resource's: an Accept of protobuf only is
	// 406, a mixed one gets JSON, and a protobuf body does not decode
	// into one (400, upstream's decoding error).
	resp, out = h.do(t, "GET", widgetsPath+"/a", "", mediaProtobuf, "")
	if st := statusOf(t, out); resp.StatusCode != 406 || st.Message != "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf" {
		t.Errorf("protobuf get: %d %q", resp.StatusCode, st.Message)
	}
	if resp, _ := h.do(t, "GET", widgetsPath, "", mediaProtobuf+";as=Table;v=v1;g=meta.k8s.io", ""); resp.StatusCode != 406 {
		t.Errorf("protobuf table: %d, want 406", resp.StatusCode)
	}
	resp, _ = h.do(t, "GET", widgetsPath+"/a", "", mediaProtobuf+", application/json", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != mediaJSON {
		t.Errorf("mixed accept: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, _ = h.do(t, "GET", widgetsPath+"?watch=1&timeoutSeconds=1", "", mediaProtobuf, "")
	if resp.StatusCode != 406 {
		t.Errorf("protobuf watch: %d, want 406", resp.StatusCode)
	}
	unk := &runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "example.com/v1", Kind: "Widget"}, Raw: []byte{0x0a, 0x00}}
	pb, err := unk.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	resp, out = h.do(t, "POST", widgetsPath, mediaProtobuf, "", "k8s\x00"+string(pb))
	if st := statusOf(t, out); resp.StatusCode != 400 || st.Message != `Widget in version "v1" cannot be handled as a Widget: object *unstructured.Unstructured does not implement the protobuf marshalling interface and cannot be encoded to a protobuf message` {
		t.Errorf("protobuf body: %d %q", resp.StatusCode, st.Message)
	}

	// Every request to a deprecated version carries upstream's warning.
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/apis/example.com/v1beta1/namespaces/default/gadgets", ""},
		{"POST", "/apis/example.com/v1beta1/namespaces/default/gadgets", `{"apiVersion":"example.com/v1beta1","kind":"Gadget","metadata":{"name":"g"}}`},
		{"GET", "/apis/example.com/v1beta1/namespaces/default/gadgets/missing", ""},
	} {
		resp, out := h.do(t, r.method, r.path, "application/json", "", r.body)
		if got := resp.Header.Values("Warning"); !slices.Equal(got, []string{`299 - "example.com/v1beta1 Gadget is deprecated"`}) {
			t.Errorf("%s %s: %d %s: warnings %q", r.method, r.path, resp.StatusCode, out, got)
		}
	}
	if got := resp.Header.Values("Warning"); len(got) != 0 {
		t.Errorf("warnings on a served version: %q", got)
	}
}
