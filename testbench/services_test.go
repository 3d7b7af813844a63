package testbench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestEndpointSlicesOnSimEdges runs the EndpointSlice and Endpoints
// controllers against pods that real `tether edge --runtime sim` agents
// run: the slices name each pod's node, zone and readiness; when a pod's
// readiness changes on its node (its container crashes and comes back), the
// slice follows within a second of the status the agent reported; 250 pods
// behind one Service land in slices of at most 100 each.
func TestEndpointSlicesOnSimEdges(t *testing.T) {
	t.Parallel() // sim edges on loopback: beside the other sim tests
	h := hubtest.Start(t)
	token := joinToken(t, h)
	startSimEdge(t, h, token, "shop-1", "--zone", "shop", "--sim-pods", "300", "--sim-backoff-base", "2s")
	startSimEdge(t, h, token, "yard-1", "--zone", "yard", "--sim-pods", "300", "--sim-backoff-base", "2s")
	waitNodesReady(t, h, 2)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Pod readiness and endpoint readiness, as the watches saw them.
	type change struct {
		pod   string
		ready bool
		at    time.Time
	}
	var mu sync.Mutex
	var podChanges, epChanges []change
	podReady := map[string]bool{}
	epReady := map[string]bool{}
	pw, err := client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: "app=flaky"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range pw.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.DeletionTimestamp != nil {
				continue
			}
			r := false
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady {
					r = c.Status == corev1.ConditionTrue
				}
			}
			mu.Lock()
			if old, seen := podReady[p.Name]; !seen || old != r {
				podReady[p.Name] = r
				podChanges = append(podChanges, change{p.Name, r, time.Now()})
			}
			mu.Unlock()
		}
	}()
	sw, err := client.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=flaky"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range sw.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			mu.Lock()
			for _, e := range s.Endpoints {
				if e.TargetRef == nil {
					continue
				}
				r := e.Conditions.Ready != nil && *e.Conditions.Ready
				if old, seen := epReady[e.TargetRef.Name]; !seen || old != r {
					epReady[e.TargetRef.Name] = r
					epChanges = append(epChanges, change{e.TargetRef.Name, r, time.Now()})
				}
			}
			mu.Unlock()
		}
	}()

	// Pods whose container crashes 3s after each start: ready, then not,
	// then ready again at once or after the back-off.
	applyYAML(t, h, `apiVersion: apps/v1
kind: Deployment
metadata: {name: flaky}
spec:
  replicas: 3
  selector: {matchLabels: {app: flaky}}
  template:
    metadata:
      labels: {app: flaky}
      annotations: {sim.tether.dev/crash-after: 3s}
    spec:
      containers:
      - {name: web, image: web, ports: [{name: http, containerPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: flaky}
spec:
  selector: {app: flaky}
  ports: [{name: web, port: 80, targetPort: http}]
`)
	// The first restart comes at once, the second after the 2s back-off:
	// not ready (starting), ready, not ready for a moment, ready, not
	// ready for 2s, ready.
	waitUntil(t, "six readiness states of every pod", 90*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := map[string]int{}
		for _, c := range podChanges {
			n[c.pod]++
		}
		return len(n) == 3 && !slices.ContainsFunc(slices.Collect(maps.Values(n)), func(k int) bool { return k < 6 })
	})
	time.Sleep(2 * time.Second) // the slices' last changes
	mu.Lock()
	var delays []time.Duration
	// A pod's changes count from the first time a slice listed it: its
	// first readiness may come before the Service's slices exist.
	listed := map[string]time.Time{}
	for _, ec := range epChanges {
		if _, ok := listed[ec.pod]; !ok {
			listed[ec.pod] = ec.at
		}
	}
	// A state the pod left again sooner than the slices are given to
	// follow may never show in them (the first restart comes at once,
	// and a controller that reads the pod after it sees it ready again,
	// as upstream's would): such a state and the change back from it are
	// not counted.
	back := map[string]bool{} // the pod's next change undoes a short state
	for i, pc := range podChanges {
		if back[pc.pod] {
			back[pc.pod] = false
			continue
		}
		if first, ok := listed[pc.pod]; !ok || pc.at.Before(first) {
			continue
		}
		if j := slices.IndexFunc(podChanges[i+1:], func(next change) bool { return next.pod == pc.pod }); j >= 0 {
			if lasted := podChanges[i+1+j].at.Sub(pc.at); lasted < time.Second {
				t.Logf("pod %s was ready=%v for %v only; not counted", pc.pod, pc.ready, lasted.Round(time.Millisecond))
				back[pc.pod] = true
				continue
			}
		}
		// The first endpoint change of that pod to that readiness after
		// the pod's own.
		k := slices.IndexFunc(epChanges, func(ec change) bool {
			return ec.pod == pc.pod && ec.ready == pc.ready && !ec.at.Before(pc.at.Add(-50*time.Millisecond))
		})
		if k < 0 {
			t.Errorf("pod %s became ready=%v at %s; no endpoint followed", pc.pod, pc.ready, pc.at.Format("15:04:05.000"))
			continue
		}
		delays = append(delays, max(epChanges[k].at.Sub(pc.at), 0))
	}
	mu.Unlock()
	slices.Sort(delays)
	if len(delays) == 0 {
		t.Error("no readiness change lasted long enough to be followed")
	} else {
		t.Logf("endpoint readiness after pod readiness: %d changes, median %v, max %v",
			len(delays), delays[len(delays)/2].Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond))
		if worst := delays[len(delays)-1]; worst > time.Second {
			t.Errorf("an EndpointSlice followed a readiness change after %v, want ≤ 1s", worst)
		}
	}

	// What one endpoint says.
	slicesOf := func(svc string) []discoveryv1.EndpointSlice {
		l, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	for _, s := range slicesOf("flaky") {
		if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
			t.Errorf("slice %s managed-by %q", s.Name, s.Labels[discoveryv1.LabelManagedBy])
		}
		if len(s.Ports) != 1 || s.Ports[0].Port == nil || *s.Ports[0].Port != 8080 || s.Ports[0].Name == nil || *s.Ports[0].Name != "web" {
			t.Errorf("slice %s ports %+v, want web → 8080 (the named container port)", s.Name, s.Ports)
		}
		for _, e := range s.Endpoints {
			node := ""
			if e.NodeName != nil {
				node = *e.NodeName
			}
			zone := ""
			if e.Zone != nil {
				zone = *e.Zone
			}
			if (node != "shop-1" || zone != "shop") && (node != "yard-1" || zone != "yard") {
				t.Errorf("endpoint %v: node %q zone %q", e.Addresses, node, zone)
			}
			if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || !strings.HasPrefix(e.TargetRef.Name, "flaky-") {
				t.Errorf("endpoint %v: targetRef %+v", e.Addresses, e.TargetRef)
			}
		}
	}
	if out := h.MustRun("get", "endpoints", "flaky", "-o", "jsonpath={.subsets[*].ports[0].port}"); !strings.Contains(out, "8080") {
		t.Errorf("legacy Endpoints of flaky: ports %q", out)
	}

	// 250 pods behind one Service.
	h.MustRun("create", "deployment", "many", "--image=web", "--replicas=250", "--port=8080")
	h.MustRun("expose", "deployment", "many", "--port=80", "--target-port=8080")
	last := ""
	defer func() {
		if t.Failed() {
			t.Logf("slices of many, last seen: %s", last)
			t.Logf("pods of many:\n%s", h.MustRun("get", "pods", "-l", "app=many", "--no-headers", "-o", "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,READY:.status.conditions[?(@.type=='Ready')].status"))
		}
	}()
	waitUntil(t, "250 endpoints in slices of at most 100", 3*time.Minute, func() bool {
		ss := slicesOf("many")
		total := 0
		var desc []string
		for _, s := range ss {
			if len(s.Endpoints) > 100 {
				t.Fatalf("slice %s has %d endpoints", s.Name, len(s.Endpoints))
			}
			ready := 0
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
			total += ready
			desc = append(desc, fmt.Sprintf("%s: %d endpoints, %d ready", s.Name, len(s.Endpoints), ready))
		}
		last = strings.Join(desc, "; ")
		// Slices are packed as full as the order of the changes allows but
		// never rebalanced afterwards, as upstream's controller does: a
		// ramp-up that arrives in uneven batches may leave more than three.
		return total == 250
	})
	var sizes []string
	for _, s := range slicesOf("many") {
		sizes = append(sizes, fmt.Sprint(len(s.Endpoints)))
	}
	t.Logf("250 ready pods on two sim nodes: slices of %s endpoints", strings.Join(sizes, ", "))
}
