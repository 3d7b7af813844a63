package discovery

import (
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/tether-edge/tether/hub/registry"
)

func testKinds() []*registry.Kind {
	return []*registry.Kind{
		{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: "pods", Singular: "pod",
			Namespaced: true, ShortNames: []string{"po"}, Categories: []string{"all"}, HasStatus: true},
		{GVK: schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, Resource: "namespaces", Singular: "namespace",
			ShortNames: []string{"ns"}, HasStatus: true,
			Verbs: []string{"create", "delete", "get", "list", "patch", "update", "watch"}},
		{GVK: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Resource: "deployments",
			Singular: "deployment", Namespaced: true, ShortNames: []string{"deploy"}, Categories: []string{"all"},
			HasStatus: true, Scale: &registry.ScaleAccess{}},
	}
}

// wantResources is what discovery lists for testKinds. The storage
// version hashes are the ones upstream's kube-apiserver serves.
func wantResources() map[string][]metav1.APIResource {
	all := []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
	gpu := []string{"get", "patch", "update"}
	return map[string][]metav1.APIResource{
		"v1": {
			{Name: "namespaces", SingularName: "namespace", Kind: "Namespace", ShortNames: []string{"ns"},
				Verbs: []string{"create", "delete", "get", "list", "patch", "update", "watch"}, StorageVersionHash: "Q3oi5N2YM8M="},
			{Name: "namespaces/finalize", Kind: "Namespace", Verbs: []string{"update"}},
			{Name: "namespaces/status", Kind: "Namespace", Verbs: gpu},
			{Name: "pods", SingularName: "pod", Namespaced: true, Kind: "Pod", Verbs: all,
				ShortNames: []string{"po"}, Categories: []string{"all"}, StorageVersionHash: "xPOwRZ+Yhw8="},
			{Name: "pods/binding", Namespaced: true, Kind: "Binding", Verbs: []string{"create"}},
			{Name: "pods/exec", Namespaced: true, Kind: "PodExecOptions", Verbs: []string{"create", "get"}},
			{Name: "pods/status", Namespaced: true, Kind: "Pod", Verbs: gpu},
		},
		"apps/v1": {
			{Name: "deployments", SingularName: "deployment", Namespaced: true, Kind: "Deployment", Verbs: all,
				ShortNames: []string{"deploy"}, Categories: []string{"all"}, StorageVersionHash: "8aSe+NMegvE="},
			{Name: "deployments/scale", Namespaced: true, Group: "autoscaling", Version: "v1", Kind: "Scale", Verbs: gpu},
			{Name: "deployments/status", Namespaced: true, Kind: "Deployment", Verbs: gpu},
		},
	}
}

// legacyOnly hides aggregated discovery from the handler.
type legacyOnly struct{ h http.Handler }

func (l legacyOnly) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Header.Set("Accept", "application/json")
	l.h.ServeHTTP(w, r)
}

func TestDiscoveryClient(t *testing.T) {
	h := New(testKinds(), Config{Subresources: []Subresource{
		{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "exec",
			Kind: schema.GroupVersionKind{Version: "v1", Kind: "PodExecOptions"}, Verbs: []string{"create", "get"}},
		{Parent: schema.GroupVersionResource{Version: "v1", Resource: "services"}, Name: "proxy", Verbs: []string{"get"}},
	}})
	for _, tt := range []struct {
		name    string
		handler http.Handler
	}{
		{"aggregated", h},
		{"legacy", legacyOnly{h}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			defer srv.Close()
			dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			groups, lists, err := dc.ServerGroupsAndResources()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, g := range groups {
				names = append(names, g.Name+"="+g.PreferredVersion.GroupVersion)
			}
			if diff := cmp.Diff([]string{"=v1", "apps=apps/v1"}, names); diff != "" {
				t.Errorf("groups (-want +got):\n%s", diff)
			}
			got := map[string][]metav1.APIResource{}
			for _, l := range lists {
				rs := l.APIResources
				for i := range rs {
					// Aggregated discovery fills in what legacy leaves empty.
					if tt.name == "aggregated" {
						gv, _ := schema.ParseGroupVersion(l.GroupVersion)
						if rs[i].Group == gv.Group && rs[i].Version == gv.Version {
							rs[i].Group, rs[i].Version = "", ""
						}
						if len(rs[i].Name) > len(rs[i].SingularName) && containsSlash(rs[i].Name) {
							rs[i].SingularName = ""
						}
					}
				}
				sort.Slice(rs, func(i, j int) bool { return rs[i].Name < rs[j].Name })
				got[l.GroupVersion] = rs
			}
			want := wantResources()
			if tt.name == "aggregated" {
				// The aggregated documents have no storageVersionHash.
				for _, rs := range want {
					for i := range rs {
						rs[i].StorageVersionHash = ""
					}
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}

			mapper := restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(memCache{dc}), dc, nil)
			for short, want := range map[string]schema.GroupVersionResource{
				"deploy": {Group: "apps", Version: "v1", Resource: "deployments"},
				"po":     {Version: "v1", Resource: "pods"},
				"ns":     {Version: "v1", Resource: "namespaces"},
			} {
				gvr, err := mapper.ResourceFor(schema.GroupVersionResource{Resource: short})
				if err != nil {
					t.Errorf("ResourceFor(%s): %v", short, err)
					continue
				}
				if gvr != want {
					t.Errorf("ResourceFor(%s) = %v, want %v", short, gvr, want)
				}
			}
		})
	}
}

func containsSlash(s string) bool {
	for _, c := range s {
		if c == '/' {
			return true
		}
	}
	return false
}

// memCache adapts a discovery client to the cached interface the deferred
// mapper wants, without caching.
type memCache struct{ discovery.DiscoveryInterface }

func (memCache) Fresh() bool { return true }
func (memCache) Invalidate() {}

func TestNegotiationAndPaths(t *testing.T) {
	h := New(testKinds(), Config{})
	tests := []struct {
		path, accept, wantType string
		wantCode               int
	}{
		{"/api", "", "application/json", 200},
		{"/api", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json", ContentTypeV2, 200},
		{"/apis", "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json", ContentTypeV2Beta1, 200},
		{"/apis", "application/json;q=1,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0.5", "application/json", 200},
		{"/apis", "application/vnd.kubernetes.protobuf", "application/json", 200},
		{"/apis/apps", "", "application/json", 200},
		{"/apis/apps/v1", "", "application/json", 200},
		{"/apis/batch", "", "application/json", 404},
		{"/apis/apps/v2", "", "application/json", 404},
		{"/api/v2", "", "application/json", 404},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", tt.path, nil)
		r.Header.Set("Accept", tt.accept)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tt.wantCode || w.Header().Get("Content-Type") != tt.wantType {
			t.Errorf("GET %s Accept %q = %d %q, want %d %q", tt.path, tt.accept, w.Code, w.Header().Get("Content-Type"), tt.wantCode, tt.wantType)
		}
		if w.Code != 200 {
			continue
		}
		r.Header.Set("If-None-Match", w.Header().Get("ETag"))
		w2 := httptest.NewRecorder()
		h.ServeHTTP(w2, r)
		if w2.Code != http.StatusNotModified {
			t.Errorf("GET %s with matching ETag = %d, want 304", tt.path, w2.Code)
		}
	}
}

func TestRegistryKinds(t *testing.T) {
	kinds := registry.All()
	if len(kinds) == 0 {
		t.Skip("registry has no kinds yet")
	}
	srv := httptest.NewServer(New(kinds, Config{}))
	defer srv.Close()
	dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range lists {
		for _, r := range l.APIResources {
			if !containsSlash(r.Name) {
				n++
			}
		}
	}
	if n != len(kinds) {
		t.Errorf("discovery lists %d resources, registry has %d kinds", n, len(kinds))
	}
}

func TestStorageVersionHashes(t *testing.T) {
	serve := func() map[string]metav1.APIResource {
		srv := httptest.NewServer(legacyOnly{New(registry.All(), Config{})})
		defer srv.Close()
		dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		_, lists, err := dc.ServerGroupsAndResources()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]metav1.APIResource{}
		for _, l := range lists {
			for _, r := range l.APIResources {
				out[l.GroupVersion+" "+r.Name] = r
			}
		}
		return out
	}
	first := serve()
	for name, r := range first {
		switch sub := containsSlash(r.Name); {
		case sub && r.StorageVersionHash != "":
			t.Errorf("%s: subresource with storageVersionHash %q", name, r.StorageVersionHash)
		case !sub && r.StorageVersionHash == "":
			t.Errorf("%s: no storageVersionHash", name)
		}
	}
	// Values kube-apiserver serves; events.k8s.io Events are stored as
	// core Events and share their hash.
	for name, want := range map[string]string{
		"v1 pods":                   "xPOwRZ+Yhw8=",
		"v1 configmaps":             "qFsyl6wFWjQ=",
		"v1 namespaces":             "Q3oi5N2YM8M=",
		"v1 events":                 "r2yiGXH7wu8=",
		"events.k8s.io/v1 events":   "r2yiGXH7wu8=",
		"apps/v1 deployments":       "8aSe+NMegvE=",
		"apps/v1 deployments/scale": "",
	} {
		if got := first[name].StorageVersionHash; got != want {
			t.Errorf("%s: storageVersionHash %q, want %q", name, got, want)
		}
	}
	if diff := cmp.Diff(first, serve()); diff != "" {
		t.Errorf("a second handler lists other resources (-first +second):\n%s", diff)
	}
}
