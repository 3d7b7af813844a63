package testbench

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestDrainHonoursDisruptionBudget drains a sim edge with kubectl while a
// PodDisruptionBudget asks for 3 of 4 replicas: the drain evicts through
// pods/eviction, waits whenever the budget allows no disruption, and ends
// with every pod on the other node and never fewer than 3 ready.
func TestDrainHonoursDisruptionBudget(t *testing.T) {
	t.Parallel() // sim edges on loopback: beside the other sim tests
	h := hubtest.Start(t)
	token := joinToken(t, h)
	startSimEdge(t, h, token, "node-a")
	startSimEdge(t, h, token, "node-b")
	waitNodesReady(t, h, 2)
	h.MustRun("create", "deployment", "web", "--image=web", "--replicas=4")
	h.MustRun("rollout", "status", "deployment/web", "--timeout=60s")
	h.MustRun("create", "pdb", "web", "--selector=app=web", "--min-available=3")
	waitUntil(t, "the budget allows one disruption", 30*time.Second, func() bool {
		out, _ := h.Run("get", "pdb", "web", "-o", "jsonpath={.status.disruptionsAllowed}")
		return out == "1"
	})

	// Watch readiness while the drain runs.
	var minReady atomic.Int64
	minReady.Store(4)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for ctx.Err() == nil {
			out, err := h.Run("get", "deployment", "web", "-o", "jsonpath={.status.readyReplicas}")
			if err == nil && out != "" {
				var n int64
				for _, c := range out {
					n = n*10 + int64(c-'0')
				}
				if n < minReady.Load() {
					minReady.Store(n)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	out, err := h.Run("drain", "node-a", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
	stop()
	if err != nil {
		t.Fatalf("kubectl drain: %v\n%s", err, out)
	}
	t.Logf("kubectl drain:\n%s", out)
	if !strings.Contains(out, "evicted") {
		t.Errorf("drain did not evict through the eviction API:\n%s", out)
	}
	placed := h.MustRun("get", "pods", "-l", "app=web", "-o", `jsonpath={range .items[*]}{.spec.nodeName} {end}`)
	if strings.Contains(placed, "node-a") || strings.Count(placed, "node-b") != 4 {
		t.Errorf("after the drain the pods are on %q, want all 4 on node-b", placed)
	}
	if m := minReady.Load(); m < 3 {
		t.Errorf("ready replicas fell to %d during the drain; the budget asks for 3", m)
	}
	if s := h.MustRun("get", "node", "node-a", "-o", "jsonpath={.spec.unschedulable}"); s != "true" {
		t.Errorf("drained node is not cordoned: %q", s)
	}
}
