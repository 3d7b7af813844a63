package testbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestSchedulingOnSimEdges runs the hub's scheduler against real `tether
// edge --runtime sim` agents: pods created with kubectl are placed and run;
// a pod that fits nowhere shows FailedScheduling in `kubectl describe`, and
// is placed as soon as a node that fits it joins.
func TestSchedulingOnSimEdges(t *testing.T) {
	t.Parallel() // sim edges on loopback: beside the other sim tests
	h := hubtest.Start(t)
	token := joinToken(t, h)
	startEdge := func(name, cpu string) { startSimEdge(t, h, token, name, "--sim-cpu", cpu) }
	waitFor := func(what string, timeout time.Duration, ok func() bool) { t.Helper(); waitUntil(t, what, timeout, ok) }
	startEdge("small-1", "1")
	startEdge("small-2", "1")
	waitNodesReady(t, h, 2)

	h.MustRun("create", "deployment", "web", "--image=web", "--replicas=4")
	h.MustRun("set", "resources", "deployment", "web", "--requests=cpu=200m")
	waitFor("4 web pods Running on the two nodes", 60*time.Second, func() bool {
		out, _ := h.Run("get", "pods", "-l", "app=web", "-o", `jsonpath={range .items[*]}{.spec.nodeName}/{.status.phase}{" "}{end}`)
		f := strings.Fields(out)
		if len(f) != 4 {
			return false
		}
		for _, p := range f {
			if !strings.HasPrefix(p, "small-") || !strings.HasSuffix(p, "/Running") {
				return false
			}
		}
		return true
	})
	t.Logf("placement:\n%s", h.MustRun("get", "pods", "-o", "wide"))

	pod := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(pod, []byte(`apiVersion: v1
kind: Pod
metadata: {name: big}
spec:
  containers:
  - name: app
    image: app
    resources: {requests: {cpu: "3"}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustRun("create", "-f", pod)
	want := "0/2 nodes are available: 2 Insufficient cpu."
	waitFor("FailedScheduling in kubectl describe", 30*time.Second, func() bool {
		out, _ := h.Run("describe", "pod", "big")
		return strings.Contains(out, "FailedScheduling") && strings.Contains(out, want)
	})
	if phase := h.MustRun("get", "pod", "big", "-o", "jsonpath={.status.phase}/{.spec.nodeName}"); phase != "Pending/" {
		t.Fatalf("big pod: %q, want Pending and unbound", phase)
	}

	joined := time.Now()
	startEdge("big-1", "8")
	waitFor("big pod placed on big-1 and Running", 60*time.Second, func() bool {
		out, _ := h.Run("get", "pod", "big", "-o", "jsonpath={.spec.nodeName}/{.status.phase}")
		return out == "big-1/Running"
	})
	t.Logf("the pending pod ran %v after the fitting node started", time.Since(joined).Round(time.Millisecond))
	t.Logf("kubectl describe pod big:\n%s", h.MustRun("describe", "pod", "big"))
}

// startSimEdge runs `tether edge --runtime sim` on loopback against h; the
// process stops at the end of the test.
func startSimEdge(t *testing.T, h *hubtest.Hub, token, name string, extra ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"edge", "--hub", "https://" + h.Addr, "--token", token, "--data-dir", filepath.Join(t.TempDir(), name),
		"--name", name, "--runtime", "sim", "--sim-start-delay", "200ms", "--watch-services=false"}, extra...)
	cmd := exec.Command(h.Bin, args...)
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("%s log:\n%s", name, b)
		}
	})
	return cmd
}

// joinToken creates a join token on h.
func joinToken(t *testing.T, h *hubtest.Hub) string {
	t.Helper()
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// waitNodesReady waits until n nodes are Ready.
func waitNodesReady(t *testing.T, h *hubtest.Hub, n int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d Ready nodes", n), 60*time.Second, func() bool {
		out, _ := h.Run("get", "nodes", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}`)
		return strings.Count(out, "True") == n
	})
}

// applyYAML runs kubectl apply with manifests on its standard input.
func applyYAML(t *testing.T, h *hubtest.Hub, yaml string) {
	t.Helper()
	if out, err := h.RunInput(t.Context(), yaml, nil, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// waitUntil polls ok every 250ms until it holds or timeout passes.
func waitUntil(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
