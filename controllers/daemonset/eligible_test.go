package daemonset

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestShouldRun(t *testing.T) {
	node := func(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	taint := func(key string, e corev1.TaintEffect) corev1.Taint {
		return corev1.Taint{Key: key, Value: "v", Effect: e}
	}
	ds := func(mod func(*corev1.PodSpec)) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{}
		if mod != nil {
			mod(&d.Spec.Template.Spec)
		}
		return d
	}
	tests := []struct {
		name      string
		ds        *appsv1.DaemonSet
		node      *corev1.Node
		run, keep bool
	}{
		{"plain", ds(nil), node(nil), true, true},
		{"nodeSelector matches", ds(func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"disk": "ssd"} }), node(map[string]string{"disk": "ssd"}), true, true},
		{"nodeSelector misses", ds(func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"disk": "ssd"} }), node(nil), false, false},
		{"affinity misses", ds(func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
		}), node(map[string]string{"zone": "b"}), false, false},
		{"affinity by name", ds(func(s *corev1.PodSpec) { s.Affinity = pinAffinity(nil, "n1") }), node(nil), true, true},
		{"untolerated NoSchedule: keep running", ds(nil), node(nil, taint("dedicated", corev1.TaintEffectNoSchedule)), false, true},
		{"untolerated NoExecute: evict", ds(nil), node(nil, taint("dedicated", corev1.TaintEffectNoExecute)), false, false},
		{"PreferNoSchedule ignored", ds(nil), node(nil, taint("x", corev1.TaintEffectPreferNoSchedule)), true, true},
		{"tolerated", ds(func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "v", Effect: corev1.TaintEffectNoSchedule}}
		}), node(nil, taint("dedicated", corev1.TaintEffectNoSchedule)), true, true},
		{"not-ready tolerated by default", ds(nil), node(nil, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}), true, true},
		{"unreachable tolerated by default", ds(nil), node(nil, corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}), true, true},
		{"unschedulable tolerated by default", ds(nil), node(nil, corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}), true, true},
		{"disk pressure tolerated by default", ds(nil), node(nil, corev1.Taint{Key: corev1.TaintNodeDiskPressure, Effect: corev1.TaintEffectNoSchedule}), true, true},
		{"network unavailable: not tolerated", ds(nil), node(nil, corev1.Taint{Key: corev1.TaintNodeNetworkUnavailable, Effect: corev1.TaintEffectNoSchedule}), false, true},
		{"network unavailable: hostNetwork tolerates", ds(func(s *corev1.PodSpec) { s.HostNetwork = true }),
			node(nil, corev1.Taint{Key: corev1.TaintNodeNetworkUnavailable, Effect: corev1.TaintEffectNoSchedule}), true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run, keep := ShouldRun(tc.ds, tc.node)
			if run != tc.run || keep != tc.keep {
				t.Errorf("ShouldRun = %v, %v; want %v, %v", run, keep, tc.run, tc.keep)
			}
		})
	}
}

func TestBudgets(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	abs := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	tests := []struct {
		surge, unavail       *intstr.IntOrString
		desired              int
		wantSurge, wantUnavl int
	}{
		{nil, nil, 10, 0, 1},
		{nil, pct("10%"), 3, 0, 1}, // rounds up
		{nil, pct("25%"), 10, 0, 3},
		{pct("20%"), abs(0), 10, 2, 0},
		{abs(0), abs(0), 5, 0, 1},
	}
	for _, tc := range tests {
		ds := &appsv1.DaemonSet{Spec: appsv1.DaemonSetSpec{UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
			RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxSurge: tc.surge, MaxUnavailable: tc.unavail}}}}
		s, u := Budgets(ds, tc.desired)
		if s != tc.wantSurge || u != tc.wantUnavl {
			t.Errorf("Budgets(%v, %v, %d) = %d, %d; want %d, %d", tc.surge, tc.unavail, tc.desired, s, u, tc.wantSurge, tc.wantUnavl)
		}
	}
}
