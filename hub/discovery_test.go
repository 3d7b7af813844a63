package hub_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestDiscoveryStorageVersionHash reads the legacy discovery documents of
// a real hub through kubectl: every resource has upstream's
// storageVersionHash, subresources and reviews have none, and a restart
// keeps them.
func TestDiscoveryStorageVersionHash(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	hashes := func(t *testing.T) map[string]string {
		t.Helper()
		var groups metav1.APIGroupList
		if err := json.Unmarshal([]byte(mustKubectl(t, h, "get", "--raw", "/apis")), &groups); err != nil {
			t.Fatal(err)
		}
		paths := []string{"/api/v1"}
		for _, g := range groups.Groups {
			for _, v := range g.Versions {
				paths = append(paths, "/apis/"+v.GroupVersion)
			}
		}
		out := map[string]string{}
		for _, p := range paths {
			var l metav1.APIResourceList
			if err := json.Unmarshal([]byte(mustKubectl(t, h, "get", "--raw", p)), &l); err != nil {
				t.Fatal(err)
			}
			for _, r := range l.APIResources {
				// Subresources and the create-only reviews, which
				// nothing stores, have none.
				sub := strings.Contains(r.Name, "/") || slices.Equal(r.Verbs, metav1.Verbs{"create"})
				if sub != (r.StorageVersionHash == "") {
					t.Errorf("%s %s: storageVersionHash %q", l.GroupVersion, r.Name, r.StorageVersionHash)
				}
				out[l.GroupVersion+" "+r.Name] = r.StorageVersionHash
			}
		}
		return out
	}
	before := hashes(t)
	for name, want := range map[string]string{
		"v1 pods":                 "xPOwRZ+Yhw8=",
		"v1 configmaps":           "qFsyl6wFWjQ=",
		"events.k8s.io/v1 events": "r2yiGXH7wu8=",
		"apps/v1 deployments":     "8aSe+NMegvE=",
	} {
		if before[name] != want {
			t.Errorf("%s: storageVersionHash %q, want %q", name, before[name], want)
		}
	}

	h.Stop()
	h.Restart()
	after := hashes(t)
	for name, v := range before {
		if after[name] != v {
			t.Errorf("%s: storageVersionHash %q after a restart, %q before", name, after[name], v)
		}
	}
}
