package disruption

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestCompute(t *testing.T) {
	i := intstr.FromInt32
	s := intstr.FromString
	tests := []struct {
		name                       string
		spec                       policyv1.PodDisruptionBudgetSpec
		healthy, matched, expected int32
		want                       Counts
	}{
		{"minAvailable int", policyv1.PodDisruptionBudgetSpec{MinAvailable: new(i(2))}, 3, 3, 0, Counts{3, 2, 3, 1}},
		{"minAvailable int not met", policyv1.PodDisruptionBudgetSpec{MinAvailable: new(i(2))}, 1, 3, 0, Counts{3, 2, 1, 0}},
		{"minAvailable percent rounds up", policyv1.PodDisruptionBudgetSpec{MinAvailable: new(s("50%"))}, 5, 5, 5, Counts{5, 3, 5, 2}},
		{"maxUnavailable int", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(i(1))}, 3, 3, 3, Counts{3, 2, 3, 1}},
		{"maxUnavailable percent rounds up", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(s("30%"))}, 10, 10, 10, Counts{10, 7, 10, 3}},
		{"maxUnavailable with a missing pod", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(i(1))}, 2, 2, 3, Counts{3, 2, 2, 0}},
		{"maxUnavailable over scale", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(i(5))}, 3, 3, 3, Counts{3, 0, 3, 3}},
		{"no pods expected", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(i(1))}, 0, 0, 0, Counts{0, 0, 0, 0}},
		{"minAvailable 0 with no pods", policyv1.PodDisruptionBudgetSpec{MinAvailable: new(i(0))}, 0, 0, 0, Counts{0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Compute(tt.spec, tt.healthy, tt.matched, tt.expected); got != tt.want {
				t.Errorf("Compute = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestCanEvict(t *testing.T) {
	ready := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	unready := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	done := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	pdb := func(allowed, cur, desired int32, policy *policyv1.UnhealthyPodEvictionPolicyType) *policyv1.PodDisruptionBudget {
		return &policyv1.PodDisruptionBudget{
			Spec:   policyv1.PodDisruptionBudgetSpec{UnhealthyPodEvictionPolicy: policy},
			Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, CurrentHealthy: cur, DesiredHealthy: desired},
		}
	}
	always := new(policyv1.AlwaysAllow)
	tests := []struct {
		name string
		pdb  *policyv1.PodDisruptionBudget
		pod  *corev1.Pod
		want Verdict
	}{
		{"healthy pod, budget allows", pdb(1, 3, 2, nil), ready, Verdict{Allowed: true, Consume: true}},
		{"healthy pod, budget exhausted", pdb(0, 2, 2, nil), ready, Verdict{Reason: "Cannot evict pod as it would violate the pod's disruption budget."}},
		{"unhealthy pod, budget met", pdb(0, 2, 2, nil), unready, Verdict{Allowed: true}},
		{"unhealthy pod, budget not met", pdb(0, 1, 2, nil), unready, Verdict{Reason: "Cannot evict pod as it would violate the pod's disruption budget."}},
		{"unhealthy pod, AlwaysAllow", pdb(0, 1, 2, always), unready, Verdict{Allowed: true}},
		{"ended pod", pdb(0, 0, 2, nil), done, Verdict{Allowed: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CanEvict(tt.pdb, tt.pod); got != tt.want {
				t.Errorf("CanEvict = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestKeptDisruptions(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	deleting := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b", DeletionTimestamp: &metav1.Time{Time: now}}}
	pods := []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, deleting, {ObjectMeta: metav1.ObjectMeta{Name: "c"}}}
	in := map[string]metav1.Time{
		"a":    metav1.NewTime(now.Add(-time.Minute)),     // kept
		"b":    metav1.NewTime(now.Add(-time.Minute)),     // being deleted: dropped
		"c":    metav1.NewTime(now.Add(-3 * time.Minute)), // expired: dropped
		"gone": metav1.NewTime(now),                       // no such pod: dropped
	}
	out, next := keptDisruptions(in, pods, now)
	if _, ok := out["a"]; len(out) != 1 || !ok {
		t.Errorf("kept %v", out)
	}
	if !next.Equal(now.Add(time.Minute)) {
		t.Errorf("next check %v", next)
	}
}
