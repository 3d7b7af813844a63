package hub_test

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
)

var crdBenchFull = flag.Bool("crdbench.full", false, "TestCRDDiscoveryLatency with 20 definitions (default 5)")

// TestCRDDiscoveryLatency measures how long a new CustomResourceDefinition
// takes to become usable by a client that finds resources through
// discovery, as Helm does between installing a chart's CRDs and its
// templates: from the create request until a RESTMapper, reset after every
// miss, maps the new kind and a list of it succeeds. It reports the p99
// over the definitions (the largest, with so few).
func TestCRDDiscoveryLatency(t *testing.T) {
	n := 5
	if *crdBenchFull {
		n = 20
	}
	h := hubtest.Start(t, apiOnly...)
	dc := dynamicFor(t, h)
	ctx := t.Context()
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cached := memory.NewMemCacheClient(disc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)

	var took []time.Duration
	for i := range n {
		group := fmt.Sprintf("bench%d.example.com", i)
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1",
			"kind":       "CustomResourceDefinition",
			"metadata":   map[string]any{"name": "things." + group},
			"spec": map[string]any{
				"group": group, "scope": "Namespaced",
				"names": map[string]any{"plural": "things", "singular": "thing", "kind": "Thing"},
				"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
					"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
			},
		}}
		gk := schema.GroupKind{Group: group, Kind: "Thing"}
		start := time.Now()
		if _, err := dc.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := mapper.RESTMapping(gk, "v1")
			if err == nil {
				if _, err = dc.Resource(m.Resource).Namespace("default").List(ctx, metav1.ListOptions{}); err == nil {
					break
				}
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("%s not usable after 30s: %v", gk, err)
			}
			mapper.Reset()
			time.Sleep(10 * time.Millisecond)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	p99 := took[(len(took)*99+99)/100-1]
	t.Logf("CRD create → usable through discovery, %d definitions: p50 %v, p99 %v", n, took[len(took)/2], p99)
	benchfmt.Report(t, benchfmt.Figure{Name: "crd_discovery_refresh_p99", Value: p99.Seconds(), Unit: "s", Target: "<=1",
		Mode: benchfmt.Mode(*crdBenchFull), Extra: []string{fmt.Sprintf("crds=%d", n)}})
	if p99 > time.Second {
		t.Errorf("p99 %v, want <= 1s", p99)
	}
}
