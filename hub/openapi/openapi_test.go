package openapi

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	openapiv2 "github.com/google/gnostic-models/openapiv2"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/openapi3"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/registry"
)

func testKinds() []*registry.Kind {
	return []*registry.Kind{
		{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: "pods", Singular: "pod", Namespaced: true, HasStatus: true},
		{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, Resource: "namespaces", Singular: "namespace",
			Verbs: []string{"create", "delete", "get", "list", "patch", "update", "watch"}},
		{GVK: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Resource: "deployments",
			Singular: "deployment", Namespaced: true},
	}
}

func serve(t *testing.T, kinds []*registry.Kind) (*httptest.Server, *discovery.DiscoveryClient) {
	t.Helper()
	h, err := New(kinds, clientgoscheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return srv, dc
}

func TestOpenAPIV3(t *testing.T) {
	_, dc := serve(t, testKinds())
	root := openapi3.NewRoot(dc.OpenAPIV3())
	gvs, err := root.GroupVersions()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(gvs, func(a, b schema.GroupVersion) int { return strings.Compare(a.String(), b.String()) })
	if diff := cmp.Diff([]schema.GroupVersion{{Group: "apps", Version: "v1"}, {Version: "v1"}}, gvs); diff != "" {
		t.Errorf("group versions (-want +got):\n%s", diff)
	}
	spec, err := root.GVSpec(schema.GroupVersion{Version: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	schemas := spec.Components.Schemas
	pod := schemas["io.k8s.api.core.v1.Pod"]
	if pod == nil {
		t.Fatal("no io.k8s.api.core.v1.Pod schema")
	}
	var gvk []map[string]string
	if err := pod.Extensions.GetObject("x-kubernetes-group-version-kind", &gvk); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]map[string]string{{"group": "", "version": "v1", "kind": "Pod"}}, gvk); diff != "" {
		t.Errorf("Pod GVK (-want +got):\n%s", diff)
	}
	containers := schemas["io.k8s.api.core.v1.PodSpec"].Properties["containers"]
	if s, k := containers.Extensions["x-kubernetes-patch-strategy"], containers.Extensions["x-kubernetes-patch-merge-key"]; s != "merge" || k != "name" {
		t.Errorf("containers patch strategy %v key %v, want merge name", s, k)
	}
	for name, want := range map[string]string{
		"io.k8s.apimachinery.pkg.apis.meta.v1.Time": "string",
		"io.k8s.api.core.v1.Container":              "object",
	} {
		if s := schemas[name]; s == nil || !slices.Equal([]string(s.Type), []string{want}) {
			t.Errorf("%s type = %v, want %s", name, s, want)
		}
	}
	if s := schemas["io.k8s.apimachinery.pkg.api.resource.Quantity"]; s == nil || s.Extensions["x-kubernetes-int-or-string"] != true {
		t.Errorf("Quantity = %+v, want int-or-string", s)
	}

	// What kubectl's query-parameter verifier looks for before sending
	// fieldValidation=Strict.
	for _, want := range []string{"Pod", "Namespace"} {
		found := false
		for _, item := range spec.Paths.Paths {
			if item.Patch == nil {
				continue
			}
			var g map[string]string
			if err := item.Patch.Extensions.GetObject("x-kubernetes-group-version-kind", &g); err != nil || g["kind"] != want {
				continue
			}
			for _, p := range item.Patch.Parameters {
				if p.Name == "fieldValidation" {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("no PATCH operation for %s with a fieldValidation parameter", want)
		}
	}

	// kubectl apply computes its patch from these schemas: an added container
	// must merge by name and keep what the server set on the others.
	meta := strategicpatch.PatchMetaFromOpenAPIV3{SchemaList: schemas, Schema: pod}
	original := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x"}]}}`)
	modified := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x"},{"name":"b","image":"y"}]}}`)
	current := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x","imagePullPolicy":"Always"}]}}`)
	patch, err := strategicpatch.CreateThreeWayMergePatch(original, modified, current, meta, false)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := strategicpatch.StrategicMergePatchUsingLookupPatchMeta(current, patch, meta)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Spec struct {
			Containers []map[string]string `json:"containers"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(merged, &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]string{{"name": "a", "image": "x", "imagePullPolicy": "Always"}, {"name": "b", "image": "y"}}
	if diff := cmp.Diff(want, got.Spec.Containers); diff != "" {
		t.Errorf("merged containers (-want +got):\n%s\npatch: %s", diff, patch)
	}

	apps, err := root.GVSpec(schema.GroupVersion{Group: "apps", Version: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if apps.Components.Schemas["io.k8s.api.apps.v1.Deployment"] == nil || apps.Components.Schemas["io.k8s.api.core.v1.Pod"] != nil {
		t.Error("apps/v1 document does not hold exactly what Deployment reaches")
	}
}

func TestOpenAPIV2(t *testing.T) {
	srv, dc := serve(t, testKinds())
	doc, err := dc.OpenAPISchema()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range doc.GetDefinitions().GetAdditionalProperties() {
		names = append(names, p.GetName())
	}
	for _, want := range []string{"io.k8s.api.core.v1.Pod", "io.k8s.api.apps.v1.Deployment", "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"} {
		if !slices.Contains(names, want) {
			t.Errorf("v2 protobuf lacks definition %s", want)
		}
	}

	// JSON by default, and it is the same document.
	resp, err := http.Get(srv.URL + "/openapi/v2")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	fromJSON, err := openapiv2.ParseDocument(body)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(fromJSON, doc) {
		t.Error("v2 JSON and protobuf documents differ")
	}
	if !strings.Contains(string(body), `"x-kubernetes-patch-merge-key":"name"`) {
		t.Error("v2 JSON lacks patch merge keys")
	}
}

func TestRegistryKinds(t *testing.T) {
	kinds := registry.All()
	if len(kinds) == 0 {
		t.Skip("registry has no kinds yet")
	}
	_, dc := serve(t, kinds)
	root := openapi3.NewRoot(dc.OpenAPIV3())
	gvs, err := root.GroupVersions()
	if err != nil {
		t.Fatal(err)
	}
	for _, gv := range gvs {
		if _, err := root.GVSpec(gv); err != nil {
			t.Errorf("GVSpec(%s): %v", gv, err)
		}
	}
	if _, err := dc.OpenAPISchema(); err != nil {
		t.Error(err)
	}
}

// TestEncodings checks that a client accepting gzip gets the stored
// compressed document and one that does not gets the same bytes plain, with
// the same ETag either way.
func TestEncodings(t *testing.T) {
	srv, _ := serve(t, testKinds())
	get := func(acceptEncoding string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/openapi/v2", nil)
		if err != nil {
			t.Fatal(err)
		}
		// Setting Accept-Encoding ourselves keeps the transport from
		// decompressing the body.
		req.Header.Set("Accept-Encoding", acceptEncoding)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("Accept-Encoding %q: status %d", acceptEncoding, resp.StatusCode)
		}
		return resp, b
	}
	plainResp, plain := get("identity")
	if ce := plainResp.Header.Get("Content-Encoding"); ce != "" {
		t.Errorf("plain response has Content-Encoding %q", ce)
	}
	if !json.Valid(plain) {
		t.Fatal("plain /openapi/v2 is not JSON")
	}
	for _, ae := range []string{"gzip", "br, gzip;q=0.5", "deflate , GZIP"} {
		resp, gz := get(ae)
		if ce := resp.Header.Get("Content-Encoding"); ce != "gzip" {
			t.Fatalf("Accept-Encoding %q: Content-Encoding %q, want gzip", ae, ce)
		}
		zr, err := gzip.NewReader(bytes.NewReader(gz))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, plain) {
			t.Errorf("Accept-Encoding %q: inflated body differs from the plain one", ae)
		}
		if resp.Header.Get("ETag") != plainResp.Header.Get("ETag") {
			t.Errorf("Accept-Encoding %q: ETag %s, plain %s", ae, resp.Header.Get("ETag"), plainResp.Header.Get("ETag"))
		}
	}
	if resp, _ := get("gzip;q=0"); resp.Header.Get("Content-Encoding") != "" {
		t.Error("gzip;q=0 got a compressed response")
	}
}
