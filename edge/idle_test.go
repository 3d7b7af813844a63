package edge_test

import (
	"flag"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/internal/benchfmt"
)

var (
	idleWindow = flag.Duration("edge.idle-window", 30*time.Second, "how long TestIdleUplink measures")
	idleSettle = flag.Duration("edge.idle-settle", 20*time.Second, "how long TestIdleUplink waits before measuring")
)

// TestIdleUplink measures what an idle agent sends once settled: the
// tunnel's heartbeats, plus one node status report per StatusInterval
// (5 min), whose cost is measured on a second agent that reports every 10s.
// The whole must stay at or below 0.1 kbit/s. The hub stores none of the
// second agent's reports: they move nothing but heartbeats.
func TestIdleUplink(t *testing.T) {
	e := startHub(t)
	idle := startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "idle",
		NodeIP: netip.MustParseAddr("192.0.2.20"), StatusCheckInterval: 10 * time.Second})
	chatty := startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "chatty",
		NodeIP: netip.MustParseAddr("192.0.2.21"), StatusInterval: 10 * time.Second, StatusCheckInterval: time.Second})
	<-idle.Registered()
	<-chatty.Registered()
	waitNodeReady(t, e, "idle")
	waitNodeReady(t, e, "chatty")
	// Registration, and a burst the tunnel sends in the first seconds of
	// a connection, are not idle traffic: measured apart.
	r0 := idle.Stats()
	time.Sleep(*idleSettle)

	// A loaded machine only adds bytes (retransmissions when a packet's
	// acknowledgement came late), never removes them: when a window is
	// over the budget, up to two more are measured and the least counts.
	total := 0.0
	for round := range 3 {
		i0, c0 := idle.Stats(), chatty.Stats()
		n0 := getNode(t, e, "chatty")
		time.Sleep(*idleWindow)
		i1, c1 := idle.Stats(), chatty.Stats()
		n1 := getNode(t, e, "chatty")
		// The hub holds reports that only move heartbeats in memory:
		// the Node is not written, yet reads show the heartbeats.
		if n1.ResourceVersion != n0.ResourceVersion {
			t.Errorf("the chatty node's reports at rest were stored: resourceVersion %s → %s", n0.ResourceVersion, n1.ResourceVersion)
		}
		if b0, b1 := readyHeartbeat(n0), readyHeartbeat(n1); !b1.After(b0) {
			t.Errorf("GET shows the chatty node's Ready heartbeat at %v after %v of reports, before at %v", b1, *idleWindow, b0)
		}

		secs := idleWindow.Seconds()
		idleRate := float64(i1.TunnelBytesSent-i0.TunnelBytesSent) * 8 / secs
		reports := c1.NodeStatusWrites - c0.NodeStatusWrites
		if reports == 0 {
			t.Fatalf("the chatty agent wrote no status in %v", *idleWindow)
		}
		extra := float64(c1.TunnelBytesSent-c0.TunnelBytesSent) - float64(i1.TunnelBytesSent-i0.TunnelBytesSent)
		perReport := max(extra/float64(reports), 0)
		total = idleRate + perReport*8/300
		t.Logf("idle agent: %.1f bit/s of heartbeats and keepalives; a node status report costs %.0f B on the uplink; "+
			"with one report per 5 min: %.1f bit/s (budget 100)", idleRate, perReport, total)
		if round == 0 {
			t.Logf("after registration, %v of settling sent %d B (the tunnel's start-up burst)", *idleSettle, i0.TunnelBytesSent-r0.TunnelBytesSent)
		}
		if i1.Lists+i1.Gets+i1.Watches != i0.Lists+i0.Gets+i0.Watches {
			t.Errorf("idle agent made read requests: %+v → %+v", i0, i1)
		}
		if total <= 100 {
			break
		}
	}
	benchfmt.Report(t, benchfmt.Figure{Name: "edge_idle_uplink", Value: total, Unit: "bit/s", Target: "<=100",
		Extra: []string{"status_every_s=300", fmt.Sprintf("window_s=%.0f", idleWindow.Seconds())}})
	if total > 100 {
		t.Errorf("idle uplink %.1f bit/s exceeds 100 bit/s", total)
	}
}

func getNode(t *testing.T, e *env, name string) *corev1.Node {
	t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func readyHeartbeat(n *corev1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}
