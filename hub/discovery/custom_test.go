package discovery

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apidiscovery "k8s.io/apiserver/pkg/endpoints/discovery"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/tether-edge/tether/hub/registry"
)

// customKinds is what a CustomResourceDefinition of widgets.example.com
// with three served versions (v1 stored) contributes, and one of a
// second group.
func customKinds() (widgets, others []*registry.Kind) {
	newU := func() runtime.Object { return &unstructured.Unstructured{} }
	stored := schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}
	for _, v := range []string{"v1beta1", "v2alpha1", "v1"} {
		widgets = append(widgets, &registry.Kind{
			GVK: schema.GroupVersionKind{Group: "example.com", Version: v, Kind: "Widget"}, Resource: "widgets",
			Singular: "widget", Namespaced: true, ShortNames: []string{"wd"}, Categories: []string{"all"},
			HasStatus: true, Scale: &registry.ScaleAccess{}, New: newU, StoredAs: stored,
		})
	}
	others = []*registry.Kind{{GVK: schema.GroupVersionKind{Group: "aaa.example.org", Version: "v1", Kind: "Thing"},
		Resource: "things", Singular: "thing", New: newU}}
	return widgets, others
}

// get returns the body and ETag of path as accept asks.
func get(t *testing.T, srv *httptest.Server, path, accept string) ([]byte, string, int) {
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

// TestCustomResources shows discovery following the registry: custom
// groups appear after the built-in ones, with their versions by priority,
// names, subresources and storage version hash, in the legacy and the
// aggregated documents, with new ETags; and leave with their last kind.
func TestCustomResources(t *testing.T) {
	reg, err := registry.New(registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(nil, Config{Registry: reg}))
	defer srv.Close()
	accepts := []string{"", ContentTypeV2, ContentTypeV2Beta1}
	before := map[string]string{}
	for _, a := range accepts {
		_, before[a], _ = get(t, srv, "/apis", a)
	}

	widgets, others := customKinds()
	reg.SetCustom("widgets.example.com", widgets)
	reg.SetCustom("things.aaa.example.org", others)
	for _, a := range accepts {
		if _, etag, _ := get(t, srv, "/apis", a); etag == before[a] {
			t.Errorf("Accept %q: ETag %s unchanged by new groups", a, etag)
		}
	}

	// Legacy: custom groups last, by name; versions by priority.
	body, _, _ := get(t, srv, "/apis", "")
	var groups metav1.APIGroupList
	if err := json.Unmarshal(body, &groups); err != nil {
		t.Fatal(err)
	}
	n := len(groups.Groups)
	if n < 3 || groups.Groups[n-2].Name != "aaa.example.org" || groups.Groups[n-1].Name != "example.com" {
		t.Fatalf("groups end with %v", groups.Groups[max(0, n-3):])
	}
	if !slices.ContainsFunc(groups.Groups[:n-2], func(g metav1.APIGroup) bool { return g.Name == "authorization.k8s.io" }) {
		t.Errorf("the review kinds' groups are not among the built-in ones: %v", groups.Groups)
	}
	want := metav1.APIGroup{Name: "example.com", Versions: []metav1.GroupVersionForDiscovery{
		{GroupVersion: "example.com/v1", Version: "v1"}, {GroupVersion: "example.com/v1beta1", Version: "v1beta1"},
		{GroupVersion: "example.com/v2alpha1", Version: "v2alpha1"}},
		PreferredVersion: metav1.GroupVersionForDiscovery{GroupVersion: "example.com/v1", Version: "v1"}}
	if diff := cmp.Diff(want, groups.Groups[n-1]); diff != "" {
		t.Errorf("example.com group (-want +got):\n%s", diff)
	}
	body, _, code := get(t, srv, "/apis/example.com/v1beta1", "")
	var rl metav1.APIResourceList
	if err := json.Unmarshal(body, &rl); err != nil || code != 200 {
		t.Fatalf("resource list: %d %s", code, body)
	}
	gpu := []string{"get", "patch", "update"}
	wantRes := []metav1.APIResource{
		{Name: "widgets", SingularName: "widget", Namespaced: true, Kind: "Widget", Verbs: DefaultVerbs,
			ShortNames: []string{"wd"}, Categories: []string{"all"},
			StorageVersionHash: apidiscovery.StorageVersionHash("example.com", "v1", "Widget")},
		{Name: "widgets/scale", Namespaced: true, Group: "autoscaling", Version: "v1", Kind: "Scale", Verbs: gpu},
		{Name: "widgets/status", Namespaced: true, Kind: "Widget", Verbs: gpu},
	}
	if diff := cmp.Diff(wantRes, rl.APIResources); diff != "" {
		t.Errorf("example.com/v1beta1 resources (-want +got):\n%s", diff)
	}

	// Aggregated: the same, in both versions of the format.
	for _, a := range accepts[1:] {
		body, _, _ := get(t, srv, "/apis", a)
		var agg apidiscoveryv2.APIGroupDiscoveryList // v2beta1 has the same shape
		if err := json.Unmarshal(body, &agg); err != nil {
			t.Fatal(err)
		}
		last := agg.Items[len(agg.Items)-1]
		var versions []string
		for _, v := range last.Versions {
			versions = append(versions, v.Version)
		}
		if last.Name != "example.com" || !slices.Equal(versions, []string{"v1", "v1beta1", "v2alpha1"}) {
			t.Fatalf("%s: last group %s %v", a, last.Name, versions)
		}
		r := last.Versions[0].Resources[0]
		if r.Resource != "widgets" || r.SingularResource != "widget" || !slices.Equal(r.ShortNames, []string{"wd"}) ||
			len(r.Subresources) != 2 || r.Subresources[0].Subresource != "scale" || r.Subresources[1].Subresource != "status" {
			t.Errorf("%s: widgets %+v", a, r)
		}
	}

	// client-go maps the short name to the resource.
	dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(memCache{dc}), dc, nil)
	if gvr, err := mapper.ResourceFor(schema.GroupVersionResource{Resource: "wd"}); err != nil || gvr != (schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}) {
		t.Errorf("wd maps to %v, %v", gvr, err)
	}

	// Removing a group's last kind removes the group.
	reg.SetCustom("widgets.example.com", nil)
	if _, _, code := get(t, srv, "/apis/example.com", ""); code != http.StatusNotFound {
		t.Errorf("/apis/example.com after removal: %d", code)
	}
	if _, _, code := get(t, srv, "/apis/example.com/v1", ""); code != http.StatusNotFound {
		t.Errorf("/apis/example.com/v1 after removal: %d", code)
	}
	reg.SetCustom("things.aaa.example.org", nil)
	for _, a := range accepts {
		if _, etag, _ := get(t, srv, "/apis", a); etag != before[a] {
			t.Errorf("Accept %q: ETag %s after removal, want %s as before", a, etag, before[a])
		}
	}
}

// BenchmarkRebuild measures the first aggregated /apis request after a
// change of the registry: what a client waits for to see a new custom
// resource.
func BenchmarkRebuild(b *testing.B) {
	reg, err := registry.New(registry.Config{})
	if err != nil {
		b.Fatal(err)
	}
	h := New(nil, Config{Registry: reg})
	widgets, _ := customKinds()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			reg.SetCustom("widgets.example.com", widgets)
		} else {
			reg.SetCustom("widgets.example.com", nil)
		}
		req := httptest.NewRequest("GET", "/apis", nil)
		req.Header.Set("Accept", ContentTypeV2)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
}
