package edge_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/join"
)

// These tests run a real hub process and agents in this process, over the
// real tunnel on loopback.

type env struct {
	hub    *hubtest.Hub
	url    string
	token  string
	client kubernetes.Interface
}

func startHub(t *testing.T) *env {
	t.Helper()
	return startHubArgs(t)
}

// startHubArgs starts a hub with extra flags.
func startHubArgs(t *testing.T, args ...string) *env {
	t.Helper()
	h := hubtest.Start(t, args...)
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v\n%s", err, h.Logs())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return &env{hub: h, url: "https://" + h.Addr, token: strings.TrimSpace(string(out)), client: kubernetes.NewForConfigOrDie(cfg)}
}

type runningAgent struct {
	*edge.Agent
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned, with err
	err    error
}

func (r *runningAgent) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			t.Fatalf("agent: %v", r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop within 15s")
	}
}

func startAgent(t *testing.T, cfg edge.Config) *runningAgent {
	t.Helper()
	if cfg.Runtime == nil {
		cfg.Runtime = sim.New(sim.Config{StartDelay: 100 * time.Millisecond, BackoffBase: 500 * time.Millisecond, LogInterval: 100 * time.Millisecond})
	}
	if cfg.StatusCheckInterval == 0 {
		cfg.StatusCheckInterval = time.Second
	}
	cfg.TunnelBackoffCap = 2 * time.Second
	a, err := edge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = a.Run(ctx); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(15 * time.Second):
		}
	})
	return r
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := f()
		if ok {
			return
		}
		last = state
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v; last state: %s", what, timeout, last)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitNodeReady(t *testing.T, e *env, name string) *corev1.Node {
	t.Helper()
	var node *corev1.Node
	eventually(t, 60*time.Second, "node "+name+" Ready", func() (bool, string) {
		n, err := e.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		node = n
		return nodeReady(n), n.Status.String()
	})
	return node
}

func newPod(name, node string, ann map[string]string, policy corev1.RestartPolicy) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: ann},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: policy,
			Containers:    []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
		},
	}
}

func waitPod(t *testing.T, e *env, name, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, 30*time.Second, "pod "+name+" "+what, func() (bool, string) {
		p, err := e.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return ok(p), p.Status.String()
	})
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func TestAgentEndToEnd(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	dir := t.TempDir()
	cfg := edge.Config{
		HubURL: e.url, Token: e.token, DataDir: dir, NodeName: "edge-1", Zone: "site-a",
		NodeIP: netip.MustParseAddr("192.0.2.10"), Labels: map[string]string{"example.com/shop": "12"},
	}
	a := startAgent(t, cfg)

	node := waitNodeReady(t, e, "edge-1")
	if node.Labels[edge.LabelZone] != "site-a" || node.Labels[edge.LabelHostname] != "edge-1" || node.Labels["example.com/shop"] != "12" {
		t.Errorf("node labels %v", node.Labels)
	}
	if node.Status.NodeInfo.ContainerRuntimeVersion != "sim://0.1.0" || node.Status.NodeInfo.KubeletVersion == "" {
		t.Errorf("node info %+v", node.Status.NodeInfo)
	}
	if node.Spec.PodCIDR == "" {
		t.Fatalf("the hub assigned no pod CIDR to the node")
	}
	cidr := netip.MustParsePrefix(node.Spec.PodCIDR)
	if fi, err := os.Stat(filepath.Join(dir, "node.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node key: %v, mode %v", err, fi.Mode())
	}

	// A pod bound to the node runs, with an address from its range.
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("web", "edge-1", nil, corev1.RestartPolicyAlways), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := waitPod(t, e, "web", "Running and Ready", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && podReady(p) })
	if ip := netip.MustParseAddr(web.Status.PodIP); !cidr.Contains(ip) {
		t.Errorf("pod IP %s outside the node's range %s", ip, cidr)
	}
	if web.Status.HostIP != "192.0.2.10" || web.Status.StartTime == nil || len(web.Status.ContainerStatuses) != 1 ||
		!strings.HasPrefix(web.Status.ContainerStatuses[0].ContainerID, "sim://") {
		t.Errorf("pod status %s", web.Status.String())
	}

	// Crash loops and completions are reported.
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("crash", "edge-1", map[string]string{sim.CrashAfter: "200ms"}, corev1.RestartPolicyAlways), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("job", "edge-1", map[string]string{sim.ExitCode: "0"}, corev1.RestartPolicyNever), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "crash", "in CrashLoopBackOff", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CrashLoopBackOff" && cs[0].RestartCount >= 1
	})
	waitPod(t, e, "job", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })

	// Logs and the node proxy go through the hub and the tunnel.
	logs, err := e.client.CoreV1().Pods("default").GetLogs("web", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "sim: container app started") {
		t.Errorf("pods/log through the hub: %v %q", err, logs)
	}
	health, err := e.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/edge-1/proxy/healthz").DoRaw(ctx)
	if err != nil || string(health) != "ok" {
		t.Errorf("node proxy /healthz: %v %q", err, health)
	}

	// Graceful deletion: the agent stops the pod and finalises it.
	grace := int64(30)
	if err := e.client.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "pod web deleted", func() (bool, string) {
		_, err := e.client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errString(err)
	})

	// A restart uses the saved certificate: no token needed.
	a.stop(t)
	cfg.Token = ""
	a = startAgent(t, cfg)
	<-a.Registered()
	waitNodeReady(t, e, "edge-1")
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("web2", "edge-1", nil, corev1.RestartPolicyAlways), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "web2", "Running after the agent restarted", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	// The finished job stays finished across the restart.
	if p, err := e.client.CoreV1().Pods("default").Get(ctx, "job", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("job after restart: %v %v", err, p.Status.Phase)
	}
}

func errString(err error) string {
	if err == nil {
		return "exists"
	}
	return err.Error()
}

func TestAgentJoinRefusals(t *testing.T) {
	e := startHub(t)
	tok, err := join.ParseToken(e.token)
	if err != nil {
		t.Fatal(err)
	}
	run := func(token string) error {
		a, err := edge.New(edge.Config{HubURL: e.url, Token: token, DataDir: t.TempDir(), NodeName: "refused", Runtime: sim.New(sim.Config{})})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return a.Run(ctx)
	}
	wrongPin := tok
	wrongPin.CAHash = "sha256:" + strings.Repeat("0", 64)
	if err := run(wrongPin.String()); err == nil || !strings.Contains(err.Error(), "does not match the pin") {
		t.Errorf("wrong CA pin: %v", err)
	}
	unknown := tok
	unknown.Secret = strings.Repeat("x", 16)
	if err := run(unknown.String()); err == nil || !strings.Contains(err.Error(), "refused the join token") {
		t.Errorf("unknown token: %v", err)
	}
	if err := run(""); err == nil || !strings.Contains(err.Error(), "join token is needed") {
		t.Errorf("no token: %v", err)
	}
}

func TestAgentResumesWatchesAfterHubRestart(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	a := startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-r",
		NodeIP: netip.MustParseAddr("192.0.2.11")})
	waitNodeReady(t, e, "edge-r")
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("before", "edge-r", nil, corev1.RestartPolicyAlways), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "before", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	before := a.Stats()

	e.hub.Stop()
	eventually(t, 20*time.Second, "agent notices the hub is gone", func() (bool, string) { return !a.Stats().Connected, "connected" })
	e.hub.Restart()
	eventually(t, 30*time.Second, "agent reconnects", func() (bool, string) { return a.Stats().Connected, "disconnected" })

	if _, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("after", "edge-r", nil, corev1.RestartPolicyAlways), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "after", "Running after the hub restarted", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	after := a.Stats()
	if after.Lists != before.Lists {
		t.Errorf("the agent re-listed after the hub restarted: %d LISTs before, %d after (watches %d → %d)", before.Lists, after.Lists, before.Watches, after.Watches)
	}
	t.Logf("before: %+v", before)
	t.Logf("after:  %+v", after)
}

// TestAgentReportsReadyAfterReconnect: while the hub did not hear a node
// its lifecycle controller set the node's conditions to Unknown; the
// agent, which never reads them back, writes its whole status again once
// its tunnel is back, so the node is Ready again at its next status check
// rather than at the next periodic report minutes later.
func TestAgentReportsReadyAfterReconnect(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	a := startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-u",
		NodeIP: netip.MustParseAddr("192.0.2.12"), StatusCheckInterval: time.Second})
	waitNodeReady(t, e, "edge-u")

	// What the lifecycle controller writes when the Lease goes stale.
	n, err := e.client.CoreV1().Nodes().Get(ctx, "edge-u", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		n.Status.Conditions[i].Status = corev1.ConditionUnknown
		n.Status.Conditions[i].Reason = "NodeStatusUnknown"
		n.Status.Conditions[i].Message = "Kubelet stopped posting node status."
	}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.hub.Stop()
	eventually(t, 20*time.Second, "agent notices the hub is gone", func() (bool, string) { return !a.Stats().Connected, "connected" })
	e.hub.Restart()
	eventually(t, 30*time.Second, "agent reconnects", func() (bool, string) { return a.Stats().Connected, "disconnected" })
	back := time.Now()
	eventually(t, 10*time.Second, "node Ready=True again after the reconnect", func() (bool, string) {
		n, err := e.client.CoreV1().Nodes().Get(ctx, "edge-u", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, string(c.Status) + " " + c.Reason
			}
		}
		return false, "no Ready condition"
	})
	t.Logf("Ready again %v after the tunnel came back", time.Since(back).Round(time.Millisecond))
}
