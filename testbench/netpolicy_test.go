package testbench

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// npObjects are the NetworkPolicy lab's pods: a web server, two clients in
// its namespace (friend and stranger) and one in a namespace labelled
// team=b (outsider).
const npObjects = `apiVersion: v1
kind: Namespace
metadata: {name: np-b, labels: {team: b}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: web
    image: %[1]s
    ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: friend, labels: {role: friend}}
spec: {containers: [{name: c, image: %[2]s}]}
---
apiVersion: v1
kind: Pod
metadata: {name: stranger, labels: {role: stranger}}
spec: {containers: [{name: c, image: %[2]s}]}
---
apiVersion: v1
kind: Pod
metadata: {name: outsider, namespace: np-b}
spec: {containers: [{name: c, image: %[2]s}]}
`

// npLab is a containerd node with NetworkPolicy enforcement and its pods.
type npLab struct {
	n    *ctrNode
	h    *labHub
	pods map[string]*corev1.Pod // by name, over both namespaces
	web  string                 // web's IP:8080
	seq  atomic.Int64
}

// TestContainerdNetworkPolicy runs real pods on a containerd node with
// the eBPF dataplane and checks NetworkPolicy with real connections: a
// deny-all ingress policy blocks everyone; allows by pod label and by
// namespace label let exactly the selected clients through; an ipBlock
// with an except; both ends must allow (a client's egress policy blocks
// what the server's ingress allows); egress deny-all blocks DNS until an
// egress rule allows port 53. Then the node is cut off from the hub: the
// policies keep being enforced, also after an agent restart while cut
// off, and a policy added at the hub meanwhile applies at reconnection.
// Connections are opened with ctr inside the pods' containers, so the
// checks need no hub.
func TestContainerdNetworkPolicy(t *testing.T) {
	requireContainerdNode(t)
	cgroup := containersCgroup(t)
	pins := fmt.Sprintf("/sys/fs/bpf/tether-netpol-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pins) })
	l, h, archive := upCtrLab(t, t.TempDir(), 1024, SiteSpec{Name: "shop", Nodes: 1})
	n := startCtrNode(t, l, h, "shop-n1", "shop", []string{archive},
		"--dataplane", "ebpf", "--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--uplinks", "none",
		"--dns-addr", labDNSAddr, "--dns-upstream", l.Hub().Addr+":53")
	h.waitReady(90*time.Second, "shop-n1")
	h.applyManifest(t, fmt.Sprintf(npObjects, images.Echo, images.Sleeper))
	lab := &npLab{n: n, h: h}
	eventually(t, 90*time.Second, "web, friend, stranger and outsider Running", func() (bool, string) {
		out, err := h.run("get", "pods", "-A", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		var list corev1.PodList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return false, err.Error()
		}
		lab.pods = map[string]*corev1.Pod{}
		var states []string
		for i := range list.Items {
			p := &list.Items[i]
			lab.pods[p.Name] = p
			n.track(p)
			states = append(states, p.Name+"="+string(p.Status.Phase))
		}
		for _, name := range []string{"web", "friend", "stranger", "outsider"} {
			if p := lab.pods[name]; p == nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return false, strings.Join(states, " ")
			}
		}
		return true, ""
	})
	lab.web = lab.pods["web"].Status.PodIP + ":8080"
	strangerIP := lab.pods["stranger"].Status.PodIP

	t.Run("no policy", func(t *testing.T) {
		lab.expect(t, map[string]bool{"friend": true, "stranger": true, "outsider": true})
	})
	t.Run("deny-all ingress", func(t *testing.T) {
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-deny}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
`)
		lab.expect(t, map[string]bool{"friend": false, "stranger": false, "outsider": false})
	})
	t.Run("allow by pod label", func(t *testing.T) {
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-friend}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: friend}}}]
    ports: [{port: http}]
`)
		lab.expect(t, map[string]bool{"friend": true, "stranger": false, "outsider": false})
	})
	t.Run("allow by namespace label", func(t *testing.T) {
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-team-b}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}}]
`)
		lab.expect(t, map[string]bool{"friend": true, "stranger": false, "outsider": true})
	})
	t.Run("ipBlock except", func(t *testing.T) {
		h.must(t, "delete", "networkpolicy", "web-friend", "web-team-b")
		h.applyManifest(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-block}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: 0.0.0.0/0, except: [%s/32]}}]
`, strangerIP))
		lab.expect(t, map[string]bool{"friend": true, "stranger": false, "outsider": true})
	})
	t.Run("both ends must allow", func(t *testing.T) {
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: friend-dns-only}
spec:
  podSelector: {matchLabels: {role: friend}}
  policyTypes: [Egress]
  egress:
  - ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
`)
		lab.expect(t, map[string]bool{"friend": false, "outsider": true})
		h.must(t, "delete", "networkpolicy", "friend-dns-only")
		lab.expect(t, map[string]bool{"friend": true})
	})
	t.Run("egress deny-all blocks DNS until allowed", func(t *testing.T) {
		const name = "kubernetes.default.svc.cluster.local"
		lab.expectLookup(t, "stranger", name, true)
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: stranger-egress}
spec:
  podSelector: {matchLabels: {role: stranger}}
  policyTypes: [Egress]
`)
		lab.expectLookup(t, "stranger", name, false)
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: stranger-dns}
spec:
  podSelector: {matchLabels: {role: stranger}}
  egress:
  - ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
`)
		lab.expectLookup(t, "stranger", name, true)
		h.must(t, "delete", "networkpolicy", "stranger-egress", "stranger-dns")
	})
	t.Run("offline and restarted", func(t *testing.T) {
		// In force: web-deny and web-block (everyone but stranger).
		ctx := t.Context()
		if err := l.CutNodeUplink(ctx, "shop-n1"); err != nil {
			t.Fatal(err)
		}
		restored := false
		defer func() {
			if !restored {
				l.RestoreNodeUplink(ctx, "shop-n1")
			}
		}()
		lab.expect(t, map[string]bool{"friend": true, "stranger": false, "outsider": true})
		n.restartAgent(t)
		time.Sleep(3 * time.Second) // the restarted agent compiled its local state
		lab.expect(t, map[string]bool{"friend": true, "stranger": false, "outsider": true})
		// Added at the hub while the node cannot hear of it.
		h.applyManifest(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-stranger}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: stranger}}}]
`)
		lab.expect(t, map[string]bool{"stranger": false})
		if err := l.RestoreNodeUplink(ctx, "shop-n1"); err != nil {
			t.Fatal(err)
		}
		restored = true
		// The agent failed its dials while cut off, so its next one waits
		// a full-jitter draw under the tunnel's 60 s backoff cap.
		start := time.Now()
		eventually(t, 90*time.Second, "shop-n1 connected to the hub", func() (bool, string) {
			out, err := h.run("get", "--raw", "/api/v1/nodes/shop-n1/proxy/healthz")
			return err == nil, out
		})
		t.Logf("shop-n1 reconnected %v after its uplink was restored", time.Since(start).Round(time.Second))
		lab.expect(t, map[string]bool{"friend": true, "stranger": true, "outsider": true})
	})
	t.Run("drops in the agent's metrics", func(t *testing.T) {
		m := h.must(t, "get", "--raw", "/api/v1/nodes/shop-n1/proxy/metrics")
		if !strings.Contains(m, `tether_edge_netpol_drops_total{direction="ingress",pod="default/web"}`) {
			t.Errorf("no drop counter for default/web ingress in:\n%s", m)
		}
	})
}

// reach tells whether pod opens a TCP connection to addr, from inside the
// pod's container (ctr, which needs no hub).
func (lab *npLab) reach(pod, addr string) (bool, string) {
	p := lab.pods[pod]
	cs, err := lab.n.containers()
	if err != nil {
		return false, err.Error()
	}
	name := p.Spec.Containers[0].Name
	c, _, ok := latestInstance(cs, p.UID, name)
	if !ok {
		return false, "no container of " + pod
	}
	out, err := lab.n.exec("ctr", "--address", lab.n.sock, "-n", "tether", "tasks", "exec",
		"--exec-id", fmt.Sprintf("np-%d", lab.seq.Add(1)), c.ID, "/testapp", "dial", addr, "1500ms")
	return err == nil && strings.Contains(out, "connected"), out
}

// expect waits until each client reaches web as wanted, and checks that it
// stays so.
func (lab *npLab) expect(t *testing.T, want map[string]bool) {
	t.Helper()
	for pod, ok := range want {
		eventually(t, 30*time.Second, fmt.Sprintf("%s reaches web: %v", pod, ok), func() (bool, string) {
			got, out := lab.reach(pod, lab.web)
			return got == ok, out
		})
	}
	for pod, ok := range want {
		if got, out := lab.reach(pod, lab.web); got != ok {
			t.Errorf("%s reaches web: %v, want %v (%s)", pod, got, ok, out)
		}
	}
}

// expectLookup waits until pod's DNS lookup of name succeeds or fails as
// wanted.
func (lab *npLab) expectLookup(t *testing.T, pod, name string, ok bool) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%s resolves %s: %v", pod, name, ok), func() (bool, string) {
		p := lab.pods[pod]
		cs, err := lab.n.containers()
		if err != nil {
			return false, err.Error()
		}
		c, _, found := latestInstance(cs, p.UID, p.Spec.Containers[0].Name)
		if !found {
			return false, "no container"
		}
		out, err := lab.n.exec("ctr", "--address", lab.n.sock, "-n", "tether", "tasks", "exec",
			"--exec-id", fmt.Sprintf("np-%d", lab.seq.Add(1)), c.ID, "/testapp", "lookup", name, "1500ms")
		return (err == nil) == ok, out
	})
}
