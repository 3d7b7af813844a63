package hub_test

import (
	"context"
	"crypto/tls"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/tunnel"
)

// TestNodeLeaseFromHeartbeats: a node's tunnel heartbeats renew its Lease
// in the hub's memory. GET, LIST and `kubectl get lease -w` see renewTime
// move, the store is written once for the session (the hub's metrics
// tell), a client's write is kept, and a restart keeps the Lease.
func TestNodeLeaseFromHeartbeats(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	admin := clientFor(t, h)
	ctx := t.Context()
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	id := joinNode(t, h, "n1")
	pair, err := tls.X509KeyPair(id.cert, id.key)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tunnel.NewClient(tunnel.ClientConfig{
		Addr:              h.Addr,
		TLS:               &tls.Config{ServerName: "127.0.0.1", RootCAs: id.roots(t), Certificates: []tls.Certificate{pair}},
		Hello:             func() tunnel.Hello { return tunnel.Hello{Node: "n1"} },
		HeartbeatInterval: time.Second,
		BackoffBase:       100 * time.Millisecond,
		BackoffCap:        time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	tctx, stopTunnel := context.WithCancel(ctx)
	defer stopTunnel()
	go func() { _ = tc.Run(tctx) }()

	leases := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	var first *coordinationv1.Lease
	waitFor(t, "the node's Lease", func() bool {
		first, err = leases.Get(ctx, "n1", metav1.GetOptions{})
		return err == nil
	})

	// kubectl watches while the hub renews the Lease twice (every 7s).
	wctx, cancel := context.WithTimeout(ctx, 17*time.Second)
	defer cancel()
	out, _ := h.RunInput(wctx, "", nil, "get", "lease", "-n", corev1.NamespaceNodeLease, "n1", "-w", "--output-watch-events",
		"-o", `jsonpath={.type} {.object.metadata.resourceVersion} {.object.spec.renewTime}{"\n"}`)
	line := regexp.MustCompile(`(?m)^(ADDED|MODIFIED) (\d+) (\S+)$`)
	events := line.FindAllStringSubmatch(out, -1)
	modified := 0
	for i, ev := range events {
		if i > 0 && (len(ev[2]) < len(events[i-1][2]) || len(ev[2]) == len(events[i-1][2]) && ev[2] < events[i-1][2]) {
			t.Errorf("resourceVersion went down: %s after %s", ev[2], events[i-1][2])
		}
		if ev[1] == "MODIFIED" && i > 0 && ev[3] > events[i-1][3] {
			modified++
		}
	}
	if modified < 2 {
		t.Errorf("kubectl get lease -w saw %d renewals in 17s, want 2:\n%s", modified, out)
	}

	got, err := leases.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Errorf("GET: renewTime %v, first %v", got.Spec.RenewTime, first.Spec.RenewTime)
	}
	list, err := leases.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 || !list.Items[0].Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Errorf("LIST: %+v %v", list, err)
	}
	metrics, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := string(metrics)
	if !strings.Contains(m, "\ntether_node_lease_renewals_total{kept=\"store\"} 1\n") ||
		regexp.MustCompile(`\ntether_node_lease_renewals_total\{kept="memory"\} [01]\n`).MatchString(m) {
		t.Errorf("want one stored renewal and the others in memory:\n%s", grepLines(m, "tether_node_lease"))
	}

	// A client's write is kept.
	mustKubectl(t, h, "label", "lease", "-n", corev1.NamespaceNodeLease, "n1", "checked=yes")
	if got, err := leases.Get(ctx, "n1", metav1.GetOptions{}); err != nil || got.Labels["checked"] != "yes" {
		t.Errorf("after kubectl label: %+v %v", got, err)
	}

	// A restart keeps the Lease, and renewals go on.
	h.Restart()
	admin = clientFor(t, h)
	got, err = admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *got.Spec.HolderIdentity != "n1" || *got.Spec.LeaseDurationSeconds != 40 || got.Labels["checked"] != "yes" || len(got.OwnerReferences) != 1 {
		t.Errorf("Lease after a restart: %+v", got)
	}
}
