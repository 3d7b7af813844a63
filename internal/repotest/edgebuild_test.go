package repotest

import (
	"slices"
	"strings"
	"testing"
)

// hubOnly are the packages the edge-only build of cmd/tether (-tags edge,
// scripts/build.sh's tether-edge) must not link: the hub's API server,
// store, scheduler and controllers.
var hubOnly = []string{"hub/...", "store/...", "scheduler/...", "controllers/..."}

// typedClients are the parts of client-go the edge-only build must not
// link either: the typed clientset, its scheme of every API group and the
// apply configurations of every kind, which made up a quarter of the
// binary. The agent speaks to the hub through edge/kube.
var typedClients = []string{"k8s.io/client-go/kubernetes/...", "k8s.io/client-go/applyconfigurations/...", "k8s.io/client-go/gentype"}

// TestEdgeBuildLinksNoHub checks that `go list -deps -tags edge
// ./cmd/tether` names no hub, store, scheduler or controllers package and
// none of client-go's typed clients, and that the full build links both
// (so that the check means something).
func TestEdgeBuildLinksNoHub(t *testing.T) {
	edge := listDeps(t, "edge", "cmd/tether")
	if edge["edge"] == nil || edge["edge/containerd"] == nil || edge["dataplane"] == nil {
		t.Fatalf("the edge build does not link the agent: %v", mapKeys(edge))
	}
	var bad []string
	for path := range edge {
		if matches(path, hubOnly) || matches(path, typedClients) {
			bad = append(bad, path+" (through "+strings.Join(chainTo(edge, "cmd/tether", []string{path}, false), " → ")+")")
		}
	}
	slices.Sort(bad)
	if len(bad) > 0 {
		t.Errorf("the edge build (-tags edge) links hub-side packages or typed clients:\n\t%s", strings.Join(bad, "\n\t"))
	}
	full := listDeps(t, "", "cmd/tether")
	for _, want := range []string{"hub", "store/sqlite", "scheduler", "controllers", "k8s.io/client-go/kubernetes"} {
		if full[want] == nil {
			t.Errorf("the full build does not link %s", want)
		}
	}
}

func mapKeys(m map[string]*pkgInfo) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
