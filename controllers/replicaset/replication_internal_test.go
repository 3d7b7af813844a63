package replicaset

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestReplicationControllerView checks that a ReplicationController
// survives the trip through its ReplicaSet view, and that the view carries
// what the sync reads.
func TestReplicationControllerView(t *testing.T) {
	rc := &corev1.ReplicationController{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "u1", ResourceVersion: "7", Generation: 3,
			Labels: map[string]string{"app": "web"}},
		Spec: corev1.ReplicationControllerSpec{
			Replicas: ptr.To[int32](4), MinReadySeconds: 5, Selector: map[string]string{"app": "web"},
			Template: &corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", "tier": "fe"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}},
			},
		},
		Status: corev1.ReplicationControllerStatus{
			Replicas: 4, FullyLabeledReplicas: 3, ReadyReplicas: 2, AvailableReplicas: 1, ObservedGeneration: 2,
			Conditions: []corev1.ReplicationControllerCondition{{Type: corev1.ReplicationControllerReplicaFailure,
				Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: "quota"}},
		},
	}
	rs := rcToReplicaSet(rc)
	if rs.Kind != "ReplicationController" || rs.APIVersion != "v1" {
		t.Errorf("view type %+v, want the ReplicationController's for events", rs.TypeMeta)
	}
	if rs.Spec.Selector.MatchLabels["app"] != "web" || len(rs.Spec.Selector.MatchExpressions) != 0 ||
		*rs.Spec.Replicas != 4 || rs.Spec.MinReadySeconds != 5 || rs.Spec.Template.Labels["tier"] != "fe" {
		t.Errorf("view spec %+v", rs.Spec)
	}
	if rs.Status.Conditions[0].Type != "ReplicaFailure" || rs.Status.FullyLabeledReplicas != 3 {
		t.Errorf("view status %+v", rs.Status)
	}
	if back := replicaSetToRC(rs); !apiequality.Semantic.DeepEqual(back, rc) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, rc)
	}
}
