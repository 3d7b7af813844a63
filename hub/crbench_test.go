package hub_test

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
)

var crBenchFull = flag.Bool("crbench.full", false, "run the custom resource benchmark at full size (10,000 objects of each kind) and check its targets")

// recordCRD is the custom resource of the benchmark: a namespaced kind
// whose spec.data holds string values, as a ConfigMap's data does.
const recordCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: records.bench.tether.dev
spec:
  group: bench.tether.dev
  scope: Namespaced
  names: {kind: Record, listKind: RecordList, plural: records, singular: record}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              data:
                type: object
                additionalProperties: {type: string}
`

// TestCustomResourceBenchmark measures custom objects against ConfigMaps
// of the same size in one hub and run, both through client-go's dynamic
// client over HTTPS: creates per second with 16 clients, in alternating
// rounds, the hub process's CPU time per create of each kind, and the p99
// of LISTs of every object of the kind, alternating too. Short by default
// (1,000 objects of each kind); with -crbench.full, 10,000 of each and the
// targets checked: within 1.3× of ConfigMaps.
func TestCustomResourceBenchmark(t *testing.T) {
	n, lists := 1000, 10
	if *crBenchFull {
		n, lists = 10000, 30
	}
	const (
		clients = 16
		rounds  = 4
	)
	h := hubtest.Start(t, apiOnly...)
	mustKubectlIn(t, h, recordCRD, "apply", "-f", "-")
	mustKubectl(t, h, "wait", "--for=condition=Established", "--timeout=30s", "crd/records.bench.tether.dev")
	mustKubectl(t, h, "create", "namespace", "bench")
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Timeout = time.Minute
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	records := dyn.Resource(schema.GroupVersionResource{Group: "bench.tether.dev", Version: "v1", Resource: "records"}).Namespace("bench")
	configMaps := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("bench")

	// Four values of 64 bytes each, in spec.data of a Record and in data
	// of a ConfigMap.
	data := map[string]any{}
	for i := range 4 {
		data[fmt.Sprintf("key%d", i)] = strings.Repeat(string(rune('a'+i)), 64)
	}
	record := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "bench.tether.dev/v1", "kind": "Record",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"data": data},
		}}
	}
	configMap := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name},
			"data":     data,
		}}
	}
	ctx := t.Context()
	var seq atomic.Int64
	hubCPU := func() time.Duration {
		d, err := h.CPU()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// A round's cost is its wall time and the CPU time the hub process
	// spent in it; the second does not depend on what else runs on the
	// machine.
	type cost struct{ took, cpu time.Duration }
	round := func(sum *cost, c dynamic.ResourceInterface, obj func(string) *unstructured.Unstructured, count int) {
		start, cpu0 := time.Now(), hubCPU()
		parallel(t, clients, count, func(int) error {
			_, err := c.Create(ctx, obj(fmt.Sprintf("obj-%d", seq.Add(1))), metav1.CreateOptions{})
			return err
		})
		sum.took += time.Since(start)
		sum.cpu += hubCPU() - cpu0
	}
	var cr, cm cost
	per := n / rounds
	for r := range rounds {
		// Which kind goes first alternates, so neither always meets the
		// other's leftovers (WAL checkpoints, say).
		if r%2 == 0 {
			round(&cr, records, record, per)
			round(&cm, configMaps, configMap, per)
		} else {
			round(&cm, configMaps, configMap, per)
			round(&cr, records, record, per)
		}
	}
	crRate, cmRate := float64(per*rounds)/cr.took.Seconds(), float64(per*rounds)/cm.took.Seconds()
	// CPU milliseconds per 1,000 creates.
	perK := func(d time.Duration) float64 { return float64(d) / 1e6 * 1000 / float64(per*rounds) }
	crCPU, cmCPU := perK(cr.cpu), perK(cm.cpu)
	t.Logf("creates/s: custom objects %.0f, configmaps %.0f; hub CPU ms per 1,000 creates: custom objects %.0f, configmaps %.0f (load %s)",
		crRate, cmRate, crCPU, cmCPU, loadavg())

	list := func(c dynamic.ResourceInterface) time.Duration {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		start := time.Now()
		l, err := c.List(ctx, metav1.ListOptions{})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != per*rounds {
			t.Fatalf("list: %d items, want %d", len(l.Items), per*rounds)
		}
		return took
	}
	list(records) // warm up
	list(configMaps)
	var crLists, cmLists []time.Duration
	for range lists {
		crLists = append(crLists, list(records))
		cmLists = append(cmLists, list(configMaps))
	}
	crP99, cmP99 := pct(crLists, 0.99), pct(cmLists, 0.99)
	t.Logf("list of %d: custom objects p50 %v p99 %v, configmaps p50 %v p99 %v", per*rounds,
		pct(crLists, 0.5), crP99, pct(cmLists, 0.5), cmP99)

	mode, msf := benchfmt.Mode(*crBenchFull), func(d time.Duration) float64 { return float64(d) / 1e6 }
	size := fmt.Sprintf("objects=%d", per*rounds)
	creates := benchfmt.Figure{Name: "crd_creates", Value: crRate, Unit: "creates/s", Target: "ratio>=0.77",
		Peer: "configmaps", PeerValue: cmRate, Mode: mode, Extra: []string{size}}
	listFig := benchfmt.Figure{Name: "crd_list_p99", Value: msf(crP99), Unit: "ms", Target: "ratio<=1.3",
		Peer: "configmaps", PeerValue: msf(cmP99), Mode: mode, Extra: []string{size}}
	cpu := benchfmt.Figure{Name: "crd_create_cpu", Value: crCPU, Unit: "cpu-ms/1k-creates", Target: "ratio<=1.3",
		Peer: "configmaps", PeerValue: cmCPU, Mode: mode, Extra: []string{size}}
	benchfmt.Report(t, creates)
	benchfmt.Report(t, listFig)
	benchfmt.Report(t, cpu)
	if *crBenchFull {
		for _, f := range []benchfmt.Figure{creates, listFig, cpu} {
			if f.Met() == "no" {
				r, _ := f.Ratio()
				t.Errorf("%s: %.3f× configmaps, target %s", f.Name, r, f.Target)
			}
		}
	}
}
