package edge_test

import (
	"context"
	"net/netip"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// TestUnknownWhileConnectedReportsAgain: when a connected node's Ready
// condition turns Unknown (the node lifecycle controller's write after a
// late heartbeat, here an admin's), the hub holding its tunnel tells the
// agent, which writes its status again at once instead of at its next
// periodic report, five minutes later.
func TestUnknownWhileConnectedReportsAgain(t *testing.T) {
	e := startHub(t)
	a := startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "n1",
		NodeIP: netip.MustParseAddr("192.0.2.31")})
	<-a.Registered()
	waitNodeReady(t, e, "n1")
	ctx := context.Background()
	nodes := e.client.CoreV1().Nodes()

	// The agent writes nothing by itself while nothing changes.
	time.Sleep(2 * time.Second)
	writes := a.Stats().NodeStatusWrites

	n, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionUnknown
			n.Status.Conditions[i].Reason = "NodeStatusUnknown"
			n.Status.Conditions[i].Message = "Kubelet stopped posting node status."
		}
	}
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	marked := time.Now()
	eventually(t, 3*time.Second, "n1 Ready again", func() (bool, string) {
		n, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return nodeReady(n), n.Status.String()
	})
	t.Logf("n1 read Ready again %v after it was marked Unknown", time.Since(marked).Round(time.Millisecond))
	if got := a.Stats().NodeStatusWrites - writes; got != 1 {
		t.Errorf("the agent wrote its status %d times, want 1", got)
	}
	m, err := e.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^tether_node_status_nudges_total\{result="sent"\} 1$`).Match(m) {
		t.Errorf("hub metrics: want one nudge sent:\n%s", regexp.MustCompile(`(?m)^tether_node_status_nudges.*$`).FindAll(m, -1))
	}
}
