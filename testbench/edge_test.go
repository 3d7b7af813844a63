package testbench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// labHub is a tether hub running in a lab's hub namespace, with the pinned
// kubectl pointed at it.
type labHub struct {
	t       *testing.T
	l       *Lab
	tether  string
	kubectl string
	data    string
	api     string
	proc    *Process
}

func startLabHub(t *testing.T, l *Lab, extra ...string) *labHub {
	t.Helper()
	tether, kubectl := buildTools(t)
	h := &labHub{t: t, l: l, tether: tether, kubectl: kubectl, data: t.TempDir(), api: l.Hub().Addr + ":6443"}
	args := append([]string{tether, "hub", "--data-dir", h.data, "--listen", h.api}, extra...)
	p, err := l.Start("hub", "tether-hub", args...)
	if err != nil {
		t.Fatal(err)
	}
	h.proc = p
	t.Cleanup(func() { _ = p.Stop(15 * time.Second) })
	h.waitServing()
	return h
}

func (h *labHub) waitServing() {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := h.run("get", "--raw", "/readyz"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("hub not ready within 60s; log in %s", h.proc.LogPath())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (h *labHub) kubeconfig() string { return filepath.Join(h.data, "admin.kubeconfig") }

// run runs kubectl as the admin from the hub's namespace.
func (h *labHub) run(args ...string) (string, error) {
	return h.runAs(h.kubeconfig(), args...)
}

func (h *labHub) runAs(kubeconfig string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := append([]string{h.kubectl, "--kubeconfig", kubeconfig, "--request-timeout", "30s"}, args...)
	out, err := h.l.Exec(ctx, "hub", full...)
	return string(out), err
}

func (h *labHub) mustRun(args ...string) string {
	h.t.Helper()
	out, err := h.run(args...)
	if err != nil {
		h.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// token creates a join token with `tether token create`.
func (h *labHub) token(ttl time.Duration) string {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := h.l.Exec(ctx, "hub", h.tether, "token", "create", "--data-dir", h.data, "--ttl", ttl.String())
	if err != nil {
		h.t.Fatalf("tether token create: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// metric returns the sum of a counter's series whose labels contain every
// fragment in match.
func (h *labHub) metric(name string, match ...string) float64 {
	h.t.Helper()
	out := h.mustRun("get", "--raw", "/metrics")
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		if rest != "" && rest[0] != '{' && rest[0] != ' ' {
			continue
		}
		ok := true
		for _, m := range match {
			if !strings.Contains(rest, m) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// startEdge runs `tether edge` with the sim runtime on a lab node.
func (h *labHub) startEdge(node, zone, token string, extra ...string) *Process {
	h.t.Helper()
	host := h.l.Host(node)
	args := append([]string{h.tether, "edge", "--hub", "https://" + h.api, "--token", token,
		"--data-dir", filepath.Join(host.DataDir, "edge"), "--name", node, "--runtime", "sim", "--zone", zone}, extra...)
	p, err := h.l.Start(node, "edge-"+node, args...)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	return p
}

// joinFails runs `tether edge` with token and expects it to give up with a
// message containing want.
func (h *labHub) joinFails(node, token, want string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := filepath.Join(h.l.Host(node).DataDir, "refused")
	out, err := h.l.Exec(ctx, node, h.tether, "edge", "--hub", "https://"+h.api, "--token", token,
		"--data-dir", dir, "--name", node, "--runtime", "sim")
	if err == nil {
		h.t.Fatalf("tether edge with a bad token succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), want) {
		h.t.Fatalf("tether edge with a bad token: want a message with %q, got:\n%s", want, out)
	}
	_ = os.RemoveAll(dir)
}

// waitReady waits until every node is Ready.
func (h *labHub) waitReady(timeout time.Duration, nodes ...string) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, _ := h.run("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		ready := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			if n, s, ok := strings.Cut(line, "="); ok && s == "True" {
				ready[n] = true
			}
		}
		all := true
		for _, n := range nodes {
			all = all && ready[n]
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("nodes %v not all Ready within %v:\n%s", nodes, timeout, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nodeKubeconfig writes a kubeconfig that uses a joined node's own
// credentials from its data dir.
func (h *labHub) nodeKubeconfig(node string) string {
	h.t.Helper()
	dir := filepath.Join(h.l.Host(node).DataDir, "edge")
	cert, key := filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")
	for _, f := range []string{cert, key} {
		if _, err := os.Stat(f); err != nil {
			h.t.Fatalf("node %s has no credentials at %s: %v", node, f, err)
		}
	}
	ca := filepath.Join(h.data, "pki", "ca.crt")
	path := filepath.Join(h.t.TempDir(), node+".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: hub
  cluster: {server: "https://%s", certificate-authority: %q}
users:
- name: node
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: node
  context: {cluster: hub, user: node}
current-context: node
`, h.api, ca, cert, key)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		h.t.Fatal(err)
	}
	return path
}

// TestEdgesJoinThroughNAT: nodes in two NAT'd sites join with a token and
// become Ready; bad tokens and a wrong CA pin are refused; the hub reaches a
// node only through its tunnel; a node's credentials are confined to what
// its own pods need; a restarted agent uses its certificate, not the token.
func TestEdgesJoinThroughNAT(t *testing.T) {
	requireRoot(t)
	l := newLab(t, Spec{Sites: []SiteSpec{
		{Name: "shop", Nodes: 2, Link: LinkParams{Rate: 4_000_000, Delay: Duration(15 * time.Millisecond)}},
		{Name: "factory", Nodes: 1, Link: LinkParams{Rate: 2_000_000, Delay: Duration(40 * time.Millisecond)}},
	}})
	h := startLabHub(t, l)

	good := h.token(time.Hour)
	id := strings.SplitN(strings.TrimPrefix(good, "tether:"), ".", 2)[0]
	h.joinFails("shop-n1", strings.Replace(good, id+".", "zzzzzz.", 1), "unknown")
	expired := h.token(time.Second)
	time.Sleep(1500 * time.Millisecond)
	h.joinFails("shop-n1", expired, "expired")
	pin := good[strings.LastIndex(good, "sha256:"):]
	h.joinFails("shop-n1", strings.Replace(good, pin, "sha256:"+strings.Repeat("0", 64), 1), "pin")

	edges := map[string]*Process{}
	for _, n := range []struct{ node, zone string }{{"shop-n1", "shop"}, {"shop-n2", "shop"}, {"factory-n1", "factory"}} {
		edges[n.node] = h.startEdge(n.node, n.zone, good)
	}
	h.waitReady(90*time.Second, "shop-n1", "shop-n2", "factory-n1")
	t.Logf("kubectl get nodes -o wide:\n%s", h.mustRun("get", "nodes", "-o", "wide", "-L", "topology.kubernetes.io/zone"))
	if z := h.mustRun("get", "node", "factory-n1", "-o", `jsonpath={.metadata.labels.topology\.kubernetes\.io/zone}`); z != "factory" {
		t.Errorf("factory-n1 zone label %q", z)
	}

	// The Lease is kept fresh from the tunnel's heartbeats.
	for i := 0; i < 3; i++ {
		rt := h.mustRun("get", "lease", "-n", "kube-node-lease", "shop-n1", "-o", "jsonpath={.spec.renewTime}")
		when, err := time.Parse("2006-01-02T15:04:05.000000Z07:00", rt)
		if err != nil {
			t.Fatalf("lease renewTime %q: %v", rt, err)
		}
		if age := time.Since(when); age > 10*time.Second {
			t.Errorf("lease of shop-n1 renewed %v ago, want at most 10s", age)
		}
		time.Sleep(4 * time.Second)
	}

	// The hub reaches a NAT'd node through its tunnel, and only so.
	out := h.mustRun("get", "--raw", "/api/v1/nodes/factory-n1/proxy/healthz")
	if strings.TrimSpace(out) != "ok" {
		t.Errorf("node proxy healthz: %q", out)
	}
	err := l.InHost("hub", func() error {
		c, err := net.DialTimeout("tcp", l.Host("factory-n1").Addr+":10250", 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Error("the hub reached factory-n1 directly; it should only reach it through the tunnel")
	}

	// Node credentials: own pods' secret yes, another node's no; another
	// node's status no.
	for _, n := range []string{"shop-n1", "factory-n1"} {
		h.mustRun("create", "secret", "generic", "s-"+n, "--from-literal=k=v")
		pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p-%s"},"spec":{"nodeName":%q,
			"containers":[{"name":"c","image":"sim","env":[{"name":"K","valueFrom":{"secretKeyRef":{"name":"s-%s","key":"k"}}}]}]}}`, n, n, n)
		f := filepath.Join(t.TempDir(), "pod.json")
		if err := os.WriteFile(f, []byte(pod), 0o644); err != nil {
			t.Fatal(err)
		}
		h.mustRun("create", "-f", f)
	}
	asShop := h.nodeKubeconfig("shop-n1")
	if out, err := h.runAs(asShop, "get", "secret", "s-shop-n1", "-o", "name"); err != nil {
		t.Errorf("shop-n1 reading its own pod's secret: %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"get", "secret", "s-factory-n1"},
		{"get", "pod", "p-factory-n1"},
		{"patch", "node", "factory-n1", "--subresource", "status", "--type", "merge", "-p", `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Hijacked"}]}}`},
		{"label", "node", "factory-n1", "evil=yes"},
		{"get", "secrets", "-A"},
		{"create", "namespace", "evil"},
	} {
		out, err := h.runAs(asShop, args...)
		if err == nil || !strings.Contains(out, "Forbidden") && !strings.Contains(out, "forbidden") {
			t.Errorf("shop-n1: kubectl %s: want 403, got err=%v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// Pods bound to nodes run on them (sim runtime) and report status.
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := h.run("get", "pod", "p-factory-n1", "-o", "jsonpath={.status.phase} {.status.podIP}")
		if strings.HasPrefix(out, "Running 10.42.") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod on factory-n1 not Running with a pod IP within 60s: %q", out)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// A restarted agent keeps its identity: the token is gone by then.
	h.mustRun("delete", "secret", "-n", "kube-system", "bootstrap-token-"+id)
	if err := edges["shop-n2"].Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	h.waitReady(60*time.Second, "shop-n2")
	if out := h.mustRun("get", "--raw", "/api/v1/nodes/shop-n2/proxy/healthz"); strings.TrimSpace(out) != "ok" {
		t.Errorf("healthz of restarted shop-n2: %q", out)
	}
}

// runPod creates a sim pod bound to node and waits until it runs.
func (h *labHub) runPod(name, node string, timeout time.Duration) {
	h.t.Helper()
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"nodeName":%q,"containers":[{"name":"c","image":"sim"}]}}`, name, node)
	f := filepath.Join(h.t.TempDir(), name+".json")
	if err := os.WriteFile(f, []byte(pod), 0o644); err != nil {
		h.t.Fatal(err)
	}
	h.mustRun("create", "-f", f)
	deadline := time.Now().Add(timeout)
	for {
		out, _ := h.run("get", "pod", name, "-o", "jsonpath={.status.phase}")
		if out == "Running" {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("pod %s on %s not Running within %v (phase %q)", name, node, timeout, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestEdgeResumesWatchesAfterPartition cuts a site off for 2.5 times the
// tunnel's idle timeout, so that both ends drop the connection: when the
// link heals, the agent reconnects and resumes its watches from the last
// resourceVersion it saw. The hub's request counters show no new LIST.
// The hub runs with a 10 s idle timeout (the default is 45 s) so that the
// cut need not last minutes.
func TestEdgeResumesWatchesAfterPartition(t *testing.T) {
	requireRoot(t)
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1, Link: LinkParams{Rate: 2_000_000, Delay: Duration(25 * time.Millisecond)}}}})
	const idle = 10 * time.Second
	h := startLabHub(t, l, "--tunnel-idle-timeout", idle.String())
	h.startEdge("shop-n1", "shop", h.token(time.Hour))
	h.waitReady(90*time.Second, "shop-n1")
	h.runPod("before", "shop-n1", 60*time.Second)

	lists := h.metric("apiserver_request_total", `verb="list"`)
	before := h.mustRun("get", "--raw", "/metrics")
	handshakes := h.metric("tether_tunnel_handshakes_total")
	if err := l.Partition("shop", Both); err != nil {
		t.Fatal(err)
	}
	time.Sleep(idle * 5 / 2)
	if err := l.Heal("shop"); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	// The agent's backoff grew during the partition; it comes back within
	// its cap.
	h.runPod("after", "shop-n1", 120*time.Second)
	t.Logf("a pod created after healing ran %v after the heal", time.Since(healed).Round(time.Millisecond))
	if got := h.metric("tether_tunnel_handshakes_total"); got <= handshakes {
		t.Errorf("no new tunnel handshake after the partition (%v before, %v after)", handshakes, got)
	}
	if got := h.metric("apiserver_request_total", `verb="list"`); got != lists {
		t.Errorf("the agent listed again after the partition: LIST requests %v before, %v after; now:\n%s", lists, got, listLines(before))
		t.Logf("after:\n%s", listLines(h.mustRun("get", "--raw", "/metrics")))
	}
}

// listLines returns the LIST request counters of a /metrics text.
func listLines(metrics string) string {
	var b strings.Builder
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "apiserver_request_total") && strings.Contains(line, `verb="list"`) {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// TestTunnelSurvivesNATRebinding moves a site's NAT mapping twice while
// `kubectl logs` streams megabytes from a node through the tunnel: the
// transfer completes intact and the tunnel never reconnects, because QUIC
// follows the new address instead of breaking its streams.
func TestTunnelSurvivesNATRebinding(t *testing.T) {
	requireRoot(t)
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1, Link: LinkParams{Rate: 20_000_000, Delay: Duration(20 * time.Millisecond)}}}})
	h := startLabHub(t, l)
	h.startEdge("shop-n1", "shop", h.token(time.Hour))
	h.waitReady(90*time.Second, "shop-n1")

	// A finished container's log is a pure function of its run, so every
	// read returns the same bytes: about 1.2 MB here.
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"chatty","annotations":{
		"sim.tether.dev/log-interval":"500us","sim.tether.dev/crash-after":"15s","sim.tether.dev/exit-code":"0"}},
		"spec":{"nodeName":"shop-n1","restartPolicy":"Never","containers":[{"name":"c","image":"sim"}]}}`
	f := filepath.Join(t.TempDir(), "chatty.json")
	if err := os.WriteFile(f, []byte(pod), 0o644); err != nil {
		t.Fatal(err)
	}
	h.mustRun("create", "-f", f)
	deadline := time.Now().Add(90 * time.Second)
	for h.mustRun("get", "pod", "chatty", "-o", "jsonpath={.status.phase}") != "Succeeded" {
		if time.Now().After(deadline) {
			t.Fatal("chatty did not succeed within 90s")
		}
		time.Sleep(time.Second)
	}
	want := h.mustRun("logs", "chatty")
	if len(want) < 1<<20 {
		t.Fatalf("reference log is only %d bytes", len(want))
	}

	// At 1 Mbit/s the transfer takes about 10 s.
	if err := l.Shape("shop", LinkParams{Rate: 1_000_000, Delay: Duration(20 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	handshakes := h.metric("tether_tunnel_handshakes_total")
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, err := h.run("logs", "chatty")
		done <- result{out, err}
	}()
	for _, at := range []time.Duration{2500 * time.Millisecond, 5500 * time.Millisecond} {
		time.Sleep(time.Until(start.Add(at)))
		if err := l.Rebind(context.Background(), "shop"); err != nil {
			t.Fatal(err)
		}
	}
	res := <-done
	took := time.Since(start)
	if res.err != nil {
		t.Fatalf("kubectl logs across NAT rebinding: %v", res.err)
	}
	if took < 6*time.Second {
		t.Errorf("the transfer took only %v: both rebinds should have happened during it", took)
	}
	if res.out != want {
		t.Fatalf("log through the rebound tunnel differs: %d bytes, want %d", len(res.out), len(want))
	}
	if got := h.metric("tether_tunnel_handshakes_total"); got != handshakes {
		t.Errorf("the tunnel reconnected during NAT rebinding (%v handshakes before, %v after); it should migrate", handshakes, got)
	}
	t.Logf("%d bytes through the tunnel in %v with two NAT rebinds", len(res.out), took.Round(time.Millisecond))
}
