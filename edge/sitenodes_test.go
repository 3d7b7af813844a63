package edge

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSiteNodeChanged: a site peer's Node is written to the local state
// when what the site reads from it changes, not when its conditions move.
func TestSiteNodeChanged(t *testing.T) {
	base := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "5",
				Labels:      map[string]string{LabelZone: "shop"},
				Annotations: map[string]string{AnnotationGossipPort: "7946"}},
			Status: corev1.NodeStatus{
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.Node)
		want   bool
	}{
		{"resourceVersion only", func(n *corev1.Node) { n.ResourceVersion = "6" }, false},
		{"Ready turned Unknown", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }, false},
		{"tainted", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}} }, false},
		{"zone", func(n *corev1.Node) { n.Labels[LabelZone] = "depot" }, true},
		{"gossip port", func(n *corev1.Node) { n.Annotations[AnnotationGossipPort] = "7947" }, true},
		{"address", func(n *corev1.Node) { n.Status.Addresses[0].Address = "10.0.0.2" }, true},
	} {
		cur := base()
		tc.change(cur)
		if got := siteNodeChanged(base(), cur); got != tc.want {
			t.Errorf("%s: changed = %v, want %v", tc.name, got, tc.want)
		}
	}
}
