package openapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	openapiv2 "github.com/google/gnostic-models/openapiv2"
	"google.golang.org/protobuf/proto"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdbuilder "k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/tether-edge/tether/hub/discovery"
	"github.com/tether-edge/tether/hub/registry"
)

// widgetCRD is a small CustomResourceDefinition of example.com/v1
// widgets, its schema declaring spec.size and spec.replicas.
func widgetCRD() *apiextensionsv1.CustomResourceDefinition {
	integer := func(desc string) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "integer", Description: desc}
	}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", Description: "Widget is a test widget.",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Description: "What the widget should be.", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"size": integer("Size of the widget in centimetres."), "replicas": integer("How many widgets."),
						}},
					}}}}},
		},
	}
}

// customKinds returns widgets, described by documents apiextensions'
// builder makes from widgetCRD as upstream does, and gadgets, whose small
// hand-made documents have a schema and no paths.
func customKinds() []*registry.Kind {
	crd := widgetCRD()
	newU := func() runtime.Object { return &unstructured.Unstructured{} }
	widgets := &registry.Kind{
		GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, Resource: "widgets",
		Singular: "widget", Namespaced: true, New: newU,
		OpenAPIV3: func() (*spec3.OpenAPI, error) { return crdbuilder.BuildOpenAPIV3(crd, "v1", crdbuilder.Options{}) },
		OpenAPIV2: func() (*spec.Swagger, error) {
			return crdbuilder.BuildOpenAPIV2(crd, "v1", crdbuilder.Options{V2: true, StripValueValidation: true, StripNullable: true})
		},
	}
	// The gadgets' documents have the path kubectl explain looks the
	// kind up by, without the fieldValidation parameter: kubectl then
	// validates gadgets itself, against the schema.
	gadgetDoc := func(v3 bool) []byte {
		ref, defs := "#/definitions/com.example.v1.Gadget", "definitions"
		resp := `{"200":{"description":"OK","schema":{"$ref":"` + ref + `"}}}`
		if v3 {
			ref, defs = "#/components/schemas/com.example.v1.Gadget", "components"
			resp = `{"200":{"description":"OK","content":{"application/json":{"schema":{"$ref":"` + ref + `"}}}}}`
		}
		gvk := `"x-kubernetes-group-version-kind":{"group":"example.com","version":"v1","kind":"Gadget"}`
		op := `{"operationId":"op",` + gvk + `,"responses":` + resp + `}`
		schema := `{"com.example.v1.Gadget":{"type":"object","description":"Gadget is a small thing.",` +
			`"properties":{"apiVersion":{"type":"string"},"kind":{"type":"string"},"metadata":{"type":"object"},` +
			`"color":{"type":"string","description":"Color of the gadget."}},` +
			`"x-kubernetes-group-version-kind":[{"group":"example.com","version":"v1","kind":"Gadget"}]}}`
		if v3 {
			schema = `{"schemas":` + schema + `}`
		}
		head := `"swagger":"2.0","info":{"title":"gadgets","version":"v1"}`
		if v3 {
			head = `"openapi":"3.0.0","info":{"title":"gadgets","version":"v1"}`
		}
		return []byte(`{` + head + `,"paths":{"/apis/example.com/v1/namespaces/{namespace}/gadgets/{name}":{"get":` + op + `,"patch":` + op + `}},"` + defs + `":` + schema + `}`)
	}
	gadgets := &registry.Kind{
		GVK: schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gadget"}, Resource: "gadgets",
		Singular: "gadget", Namespaced: true, New: newU,
		OpenAPIV3: func() (*spec3.OpenAPI, error) {
			d := &spec3.OpenAPI{}
			return d, json.Unmarshal(gadgetDoc(true), d)
		},
		OpenAPIV2: func() (*spec.Swagger, error) {
			d := &spec.Swagger{}
			return d, json.Unmarshal(gadgetDoc(false), d)
		},
	}
	return []*registry.Kind{widgets, gadgets}
}

// fetch returns the body and ETag of path.
func fetch(t *testing.T, srv *httptest.Server, path, accept string) ([]byte, string, int) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b, resp.Header.Get("ETag"), resp.StatusCode
}

// v3Index returns the index's group-versions and their URLs.
func v3Index(t *testing.T, srv *httptest.Server) (map[string]string, string) {
	t.Helper()
	body, etag, _ := fetch(t, srv, "/openapi/v3", "")
	var idx struct {
		Paths map[string]struct {
			URL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(body, &idx); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range idx.Paths {
		out[k] = v.URL
	}
	return out, etag
}

// TestCustomResourceDocuments shows the documents following the
// registry: a custom kind's OpenAPI v3 and v2 documents are merged in
// when it comes, under new hashes and ETags, and go when it leaves.
func TestCustomResourceDocuments(t *testing.T) {
	reg, err := registry.New(registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandler(Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	index, indexTag := v3Index(t, srv)
	if _, ok := index["apis/example.com/v1"]; ok {
		t.Fatal("example.com/v1 served before it is registered")
	}
	if _, ok := index["apis/apps/v1"]; !ok {
		t.Error("the index lacks apps/v1")
	}
	_, v2Tag, _ := fetch(t, srv, "/openapi/v2", "")

	reg.SetCustom("widgets.example.com", customKinds())
	index, tag := v3Index(t, srv)
	url, ok := index["apis/example.com/v1"]
	if !ok || tag == indexTag {
		t.Fatalf("index after registration: %v (ETag %s, before %s)", index, tag, indexTag)
	}
	body, etag, code := fetch(t, srv, url, "")
	if code != 200 || !strings.HasSuffix(url, "?hash="+strings.Trim(etag, `"`)) {
		t.Fatalf("GET %s: %d, ETag %s", url, code, etag)
	}
	var v3 struct {
		Paths      map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(body, &v3); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"com.example.v1.Widget", "com.example.v1.WidgetList", "com.example.v1.Gadget", "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"} {
		if _, ok := v3.Components.Schemas[name]; !ok {
			t.Errorf("v3 document lacks schema %s", name)
		}
	}
	if _, ok := v3.Paths["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]; !ok {
		t.Errorf("v3 document lacks the widget path; has %d paths", len(v3.Paths))
	}
	// Built-in group-versions keep their documents.
	if index["api/v1"] == "" || index["api/v1"] != mustIndex(t, h)["api/v1"] {
		t.Errorf("api/v1 URL changed")
	}

	body, etag, _ = fetch(t, srv, "/openapi/v2", "")
	if etag == v2Tag {
		t.Error("v2 ETag unchanged by a new kind")
	}
	var v2 struct {
		Paths       map[string]json.RawMessage `json:"paths"`
		Definitions map[string]json.RawMessage `json:"definitions"`
	}
	if err := json.Unmarshal(body, &v2); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"com.example.v1.Widget", "com.example.v1.Gadget", "io.k8s.api.core.v1.Pod"} {
		if _, ok := v2.Definitions[name]; !ok {
			t.Errorf("v2 document lacks definition %s", name)
		}
	}
	if _, ok := v2.Paths["/apis/example.com/v1/namespaces/{namespace}/widgets"]; !ok {
		t.Error("v2 document lacks the widgets path")
	}
	pb, _, code := fetch(t, srv, "/openapi/v2", acceptProtobufV2)
	var gd openapiv2.Document
	if err := proto.Unmarshal(pb, &gd); err != nil || code != 200 {
		t.Fatalf("v2 protobuf: %d %v", code, err)
	}

	reg.SetCustom("widgets.example.com", nil)
	if _, _, code := fetch(t, srv, url, ""); code != http.StatusNotFound {
		t.Errorf("GET %s after removal: %d", url, code)
	}
	if _, tag := v3Index(t, srv); tag != indexTag {
		t.Errorf("index ETag %s after removal, want %s", tag, indexTag)
	}
	if _, etag, _ := fetch(t, srv, "/openapi/v2", ""); etag != v2Tag {
		t.Errorf("v2 ETag %s after removal, want %s", etag, v2Tag)
	}
}

// mustIndex returns the built-in documents' index URLs.
func mustIndex(t *testing.T, h *Handler) map[string]string {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	idx, _ := v3Index(t, srv)
	return idx
}

// TestKubectlCustomResource runs a real kubectl against discovery and
// OpenAPI following a registry: explain of custom resources, and
// kubectl's validation of them, server-side where the document says the
// server validates (widgets) and client-side where it does not (gadgets).
func TestKubectlCustomResource(t *testing.T) {
	kubectl := os.Getenv("TETHER_KUBECTL")
	if kubectl == "" {
		var err error
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Skip("no kubectl: set TETHER_KUBECTL (scripts/test.sh builds the pinned one into bin/) or put one on PATH")
		}
	}
	reg, err := registry.New(registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	oa, err := NewHandler(Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	reg.SetCustom("widgets.example.com", customKinds())
	mux := http.NewServeMux()
	mux.Handle("/openapi/", oa)
	disc := discovery.New(nil, discovery.Config{Registry: reg})
	for _, p := range []string{"/api", "/api/", "/apis", "/apis/"} {
		mux.Handle(p, disc)
	}
	queries := make(chan string, 1)
	mux.HandleFunc("POST /apis/example.com/v1/namespaces/{ns}/{resource}", func(w http.ResponseWriter, r *http.Request) {
		select {
		case queries <- r.URL.RawQuery:
		default:
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		cmd := exec.Command(kubectl, append([]string{"--server=" + srv.URL, "--cache-dir=" + filepath.Join(dir, "cache")}, args...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "none"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("explain", "widgets.spec")
	for _, want := range []string{"GROUP:      example.com", "KIND:       Widget", "What the widget should be.", "size\t<integer>", "Size of the widget in centimetres."} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("kubectl explain widgets.spec lacks %q (%v):\n%s", want, err, out)
		}
	}
	out, err = run("explain", "gadgets.color")
	if err != nil || !strings.Contains(out, "Color of the gadget.") {
		t.Errorf("kubectl explain gadgets.color (%v):\n%s", err, out)
	}

	manifest := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	out, err = run("create", "-n", "default", "-f", manifest("w.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 1\n"))
	if err != nil {
		t.Fatalf("kubectl create widget: %v\n%s", err, out)
	}
	if query := <-queries; !strings.Contains(query, "fieldValidation=Strict") {
		t.Errorf("kubectl create widget sent query %q, want fieldValidation=Strict", query)
	}
	out, err = run("create", "-n", "default", "-f", manifest("g.yaml", "apiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: g\ncolour: red\n"))
	if err == nil || !strings.Contains(out, `unknown field "colour"`) {
		t.Errorf("kubectl create of a gadget with an unknown field: %v\n%s", err, out)
	}
	out, err = run("create", "-n", "default", "-f", manifest("g2.yaml", "apiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: g\ncolor: red\n"))
	if err != nil {
		t.Errorf("kubectl create of a valid gadget: %v\n%s", err, out)
	}
}

// BenchmarkRebuild measures the first /openapi/v3 index and group-version
// requests after a change of the registry.
func BenchmarkRebuild(b *testing.B) {
	reg, err := registry.New(registry.Config{})
	if err != nil {
		b.Fatal(err)
	}
	h, err := NewHandler(Config{Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		reg.SetCustom("widgets.example.com", customKinds())
		for _, p := range []string{"/openapi/v3", "/openapi/v3/apis/example.com/v1"} {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", p, nil))
		}
	}
}
