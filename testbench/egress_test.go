package testbench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// natEgress: a pod's connection to a host beyond the site (a server in the
// hub's namespace, past the site's NAT router) leaves its node with the
// node's address, given by the eBPF dataplane: the router's conntrack
// shows the node as the source, the server answers, the agent's metrics
// count it, and the node's
// network namespace holds no iptables or nftables rule of tether or its
// CNI configuration.
func natEgress(t *testing.T, l *Lab, h *labHub, n *ctrNode) {
	var ln net.Listener
	if err := l.InHost("hub", func() error {
		var err error
		ln, err = net.Listen("tcp4", "10.213.0.1:5080")
		return err
	}); err != nil {
		t.Fatalf("listen in the hub's namespace: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "from %s", r.RemoteAddr)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	out := h.must(t, "exec", "conf", "--", "/testapp", "get", "http://10.213.0.1:5080/")
	if !strings.HasPrefix(out, "from ") {
		t.Fatalf("the pod's request beyond the site: %q", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := l.Host(n.name).Addr
	ct, err := l.Exec(ctx, n.zone+"-router", "conntrack", "-L", "-p", "tcp", "--dport", "5080")
	if err != nil {
		t.Fatalf("conntrack on the router: %v\n%s", err, ct)
	}
	if !strings.Contains(string(ct), "src="+node+" dst=10.213.0.1 ") {
		t.Errorf("the router saw the pod's connection come from another address than the node's (%s):\n%s", node, ct)
	}

	metrics := h.must(t, "get", "--raw", "/api/v1/nodes/"+n.name+"/proxy/metrics")
	if m := regexp.MustCompile(`(?m)^tether_edge_dataplane_masqueraded_total (\d+)$`).FindStringSubmatch(metrics); m == nil || m[1] == "0" {
		t.Errorf("the agent's metrics count no masqueraded connection: %q", m)
	}
	noNodeRules(t, l, n)
}

// noNodeRules checks that the node's network namespace holds no iptables
// or nftables rule of tether or its CNI configuration (nftables tables of
// the lab itself aside).
func noNodeRules(t *testing.T, l *Lab, n *ctrNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if rules, err := l.Exec(ctx, n.name, "nft", "list", "ruleset"); err != nil {
		t.Errorf("nft list ruleset on %s: %v\n%s", n.name, err, rules)
	} else {
		for _, line := range strings.Split(string(rules), "\n") {
			if strings.HasPrefix(line, "table ") && !strings.Contains(line, " tether_lab") {
				t.Errorf("nftables on %s has a table that is not the lab's: %q\n%s", n.name, line, rules)
			}
		}
	}
	// CI installs iptables (the dataplane's benchmarks compare with
	// it), so the CNI bridge could have used it.
	saved, err := l.Exec(ctx, n.name, "iptables-save")
	if err != nil {
		t.Fatalf("iptables-save on %s: %v\n%s", n.name, err, saved)
	}
	for _, line := range strings.Split(string(saved), "\n") {
		if strings.HasPrefix(line, "-A ") {
			t.Errorf("iptables on %s has a rule: %q", n.name, line)
		}
	}
}

// natHostPortPod publishes the echo server's port on the node.
const natHostPortPod = `
apiVersion: v1
kind: Pod
metadata: {name: hostport}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: %s
    imagePullPolicy: Never
    ports: [{containerPort: 8080, hostPort: 18080}]
`

// natHostPort: a pod's hostPort answers on the node's address, served by
// the eBPF dataplane rather than the CNI portmap plugin: from the site's
// router (beyond the node's uplink) the pod sees the router's address,
// from another pod that pod's address; the node's network namespace holds
// no iptables or nftables rule for it, and the port closes with the pod.
func natHostPort(t *testing.T, l *Lab, h *labHub, n *ctrNode) {
	h.applyManifest(t, fmt.Sprintf(natHostPortPod, images.Echo))
	eventually(t, 60*time.Second, "pod hostport Running", func() (bool, string) {
		p, err := h.pod("hostport")
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
	node := l.Host(n.name).Addr
	router := node[:strings.LastIndex(node, ".")] + ".1" // the site LAN's gateway
	url := "http://" + node + ":18080/remote"
	fromRouter := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return dialInHost(l, n.zone+"-router", network, addr)
		}}}
	get := func() (string, error) {
		resp, err := fromRouter.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b)), err
	}
	// The pod's readiness says nothing of its server: retry briefly.
	var got string
	eventually(t, 20*time.Second, "the host port answering the router", func() (bool, string) {
		var err error
		got, err = get()
		return err == nil, fmt.Sprint(got, err)
	})
	if !strings.HasPrefix(got, router+":") {
		t.Errorf("over the uplink the pod saw the client %s, want the router %s (no SNAT)", got, router)
	}
	conf, err := h.pod("conf")
	if err != nil {
		t.Fatal(err)
	}
	out := strings.TrimSpace(h.must(t, "exec", "conf", "--", "/testapp", "get", url))
	if !strings.HasPrefix(out, conf.Status.PodIP+":") {
		t.Errorf("from pod conf (%s) the host port's pod saw the client %s", conf.Status.PodIP, out)
	}
	noNodeRules(t, l, n)

	h.must(t, "delete", "pod", "hostport", "--wait")
	if got, err := get(); err == nil {
		t.Errorf("the host port still answers after its pod was deleted: %s", got)
	}
}
