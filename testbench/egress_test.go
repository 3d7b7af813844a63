package testbench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
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
