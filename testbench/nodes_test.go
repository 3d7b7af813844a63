package testbench

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestNodeLostOnSimEdges stops a real sim agent without a word (SIGKILL):
// the hub stops renewing its Lease once its heartbeats are late, and once
// the Lease is older than the grace period (--node-monitor-grace-period,
// 15s here) the node lifecycle controller marks the node Ready=Unknown
// and taints it unreachable; a pod that tolerates that for 5s
// is evicted then and its Deployment replaces it on the other node, while
// a pod with the default disconnect policy (replace=false: it tolerates
// the unreachable taint for ever) stays.
func TestNodeLostOnSimEdges(t *testing.T) {
	t.Parallel() // sim edges on loopback: beside the other sim tests
	const grace = 15 * time.Second
	h := hubtest.Start(t, "--node-monitor-grace-period", grace.String())
	// A grace period shorter than the hub's Lease renewals allow is
	// refused before anything starts.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, h.Bin, "hub", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--node-monitor-grace-period", "5s").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "node monitor grace period 5s is shorter than 15s") {
		t.Errorf("hub with a 5s grace period: %v\n%s", err, out)
	}
	token := joinToken(t, h)
	lost := startSimEdge(t, h, token, "lost-1")
	startSimEdge(t, h, token, "kept-1")
	waitNodesReady(t, h, 2)
	applyYAML(t, h, `apiVersion: apps/v1
kind: Deployment
metadata: {name: quick}
spec:
  replicas: 1
  selector: {matchLabels: {app: quick}}
  template:
    metadata: {labels: {app: quick}}
    spec:
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [lost-1]}]}
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
      containers: [{name: c, image: app}]
---
apiVersion: v1
kind: Pod
metadata: {name: patient}
spec:
  nodeName: lost-1
  containers: [{name: c, image: app}]
`)
	waitUntil(t, "both pods Running on lost-1 (quick by its preferred node affinity)", 60*time.Second, func() bool {
		out, _ := h.Run("get", "pods", "-o", `jsonpath={range .items[*]}{.spec.nodeName}/{.status.phase} {end}`)
		return strings.Count(out, "lost-1/Running") == 2
	})
	quick := strings.TrimSpace(h.MustRun("get", "pods", "-l", "app=quick", "-o", "jsonpath={.items[0].metadata.name}"))

	killed := time.Now()
	if err := lost.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "lost-1 Ready=Unknown with the unreachable taint", 90*time.Second, func() bool {
		out, _ := h.Run("get", "node", "lost-1", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} {.spec.taints[*].key}`)
		return strings.HasPrefix(out, "Unknown ") && strings.Contains(out, "node.kubernetes.io/unreachable")
	})
	marked := time.Since(killed)
	t.Logf("lost-1 marked unreachable %v after its agent died (grace period %v)", marked.Round(time.Second), grace)
	if marked < grace || marked > grace+40*time.Second {
		t.Errorf("lost-1 marked unreachable %v after its agent died; want %v of Lease grace plus at most 25s of missed heartbeats (and the 7s Lease renewal and 5s monitor periods)", marked, grace)
	}
	// The evicted pod stays Terminating while its node cannot confirm the
	// stop (as upstream); its ReplicaSet replaces it at once.
	waitUntil(t, "the pod tolerating 5s evicted and replaced on kept-1", 60*time.Second, func() bool {
		gone, _ := h.Run("get", "pod", quick, "-o", "jsonpath={.metadata.deletionTimestamp}")
		out, _ := h.Run("get", "pods", "-l", "app=quick", "-o", `jsonpath={range .items[*]}{.metadata.name}/{.spec.nodeName}/{.status.phase} {end}`)
		return gone != "" && strings.Contains(out, "/kept-1/Running")
	})
	if out := h.MustRun("get", "pod", "patient", "-o", "jsonpath={.metadata.deletionTimestamp}"); out != "" {
		t.Errorf("the pod with the default disconnect policy is being deleted already (%s)", out)
	}
	if out := h.MustRun("get", "pod", "patient", "-o", `jsonpath={.spec.tolerations[?(@.key=="node.kubernetes.io/unreachable")].operator}/{.spec.tolerations[?(@.key=="node.kubernetes.io/unreachable")].tolerationSeconds}`); out != "Exists/" {
		t.Errorf("patient's unreachable toleration %q, want Exists for ever (the default policy)", out)
	}
}
