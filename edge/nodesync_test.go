package edge_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// TestNodeRewritesStatusMarkedUnknown checks that an agent without a site
// writes its status again soon after the hub marked its node Unknown while
// it was connected, rather than when its status is next due (minutes
// later): it follows its own Node, as the kubelet does.
func TestNodeRewritesStatusMarkedUnknown(t *testing.T) {
	e := startHub(t)
	startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-unk",
		StatusInterval: time.Hour, StatusCheckInterval: 500 * time.Millisecond})
	waitNodeReady(t, e, "edge-unk")
	nodes := e.client.CoreV1().Nodes()
	for round := range 2 {
		// What the hub's node lifecycle writes for a node it stopped hearing.
		n, err := nodes.Get(context.Background(), "edge-unk", metav1.GetOptions{})
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
		if _, err := nodes.UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		marked := time.Now()
		eventually(t, 10*time.Second, "edge-unk Ready again", func() (bool, string) {
			n, err := nodes.Get(context.Background(), "edge-unk", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return nodeReady(n), n.Status.String()
		})
		t.Logf("round %d: Ready again %v after the hub marked it Unknown", round, time.Since(marked).Round(time.Millisecond))
	}
}
