package deployment

import (
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestFenceposts(t *testing.T) {
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	abs := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	tests := []struct {
		surge, unavail *intstr.IntOrString
		desired        int32
		wantS, wantU   int32
	}{
		{nil, nil, 3, 1, 0}, // 25% of 3: surge rounds up, unavailable down
		{nil, nil, 4, 1, 1},
		{nil, nil, 10, 3, 2},            // 2.5 → 3 and 2
		{pct("0%"), pct("0%"), 5, 0, 1}, // both zero: one may be unavailable
		{abs(3), abs(2), 10, 3, 2},
		{pct("50%"), pct("50%"), 5, 3, 2},
		{abs(0), pct("100%"), 3, 0, 3},
	}
	for _, tc := range tests {
		s, u := Fenceposts(tc.surge, tc.unavail, tc.desired)
		if s != tc.wantS || u != tc.wantU {
			t.Errorf("Fenceposts(%v, %v, %d) = %d, %d; want %d, %d", tc.surge, tc.unavail, tc.desired, s, u, tc.wantS, tc.wantU)
		}
	}
	d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2),
		Strategy: appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: abs(5)}}}}
	if got := MaxUnavailable(d); got != 2 {
		t.Errorf("MaxUnavailable above replicas: %d, want 2", got)
	}
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	if MaxSurge(d) != 0 || MaxUnavailable(d) != 0 {
		t.Errorf("Recreate has surge %d unavailable %d, want 0 0", MaxSurge(d), MaxUnavailable(d))
	}
}

func rs(name string, size, maxReplicas int32, age time.Duration) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age)),
			Annotations: map[string]string{MaxReplicasAnnotation: itoa(maxReplicas)}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(size)},
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

func TestProportionalSizes(t *testing.T) {
	abs := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	dep := func(replicas int32) *appsv1.Deployment {
		return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas),
			Strategy: appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: abs(3), MaxUnavailable: abs(2)}}}}
	}
	tests := []struct {
		name     string
		replicas int32
		rss      []*appsv1.ReplicaSet
		want     map[string]int32
		op       string
	}{
		// The documented example: 10 → 15 with 8 old and 5 new.
		{"doc example", 15, []*appsv1.ReplicaSet{rs("old", 8, 13, time.Hour), rs("new", 5, 13, 0)}, map[string]int32{"old": 11, "new": 7}, "up"},
		{"scale down", 5, []*appsv1.ReplicaSet{rs("old", 8, 13, time.Hour), rs("new", 5, 13, 0)}, map[string]int32{"old": 5, "new": 3}, "down"},
		{"to zero", 0, []*appsv1.ReplicaSet{rs("old", 8, 13, time.Hour), rs("new", 5, 13, 0)}, map[string]int32{"old": 0, "new": 0}, "down"},
		{"no change", 10, []*appsv1.ReplicaSet{rs("old", 8, 13, time.Hour), rs("new", 5, 13, 0)}, map[string]int32{"old": 8, "new": 5}, ""},
		// Equal sizes: leftovers go to the newer when growing.
		{"tie up", 12, []*appsv1.ReplicaSet{rs("old", 4, 8, time.Hour), rs("new", 4, 8, 0)}, map[string]int32{"old": 7, "new": 8}, "up"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, op := ProportionalSizes(dep(tc.replicas), tc.rss)
			if op != tc.op {
				t.Errorf("op %q, want %q", op, tc.op)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("sizes %v, want %v", got, tc.want)
					break
				}
			}
		})
	}
}

func TestNewRSReplicas(t *testing.T) {
	abs := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](10),
		Strategy: appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: abs(3), MaxUnavailable: abs(2)}}}}
	old, cur := rs("old", 10, 13, time.Hour), rs("new", 0, 13, 0)
	if got := newRSReplicas(d, []*appsv1.ReplicaSet{old, cur}, cur); got != 3 {
		t.Errorf("first step: new size %d, want 3 (surge)", got)
	}
	old.Spec.Replicas = ptr.To[int32](8)
	cur.Spec.Replicas = ptr.To[int32](3)
	if got := newRSReplicas(d, []*appsv1.ReplicaSet{old, cur}, cur); got != 5 {
		t.Errorf("after old shrank to 8: new size %d, want 5", got)
	}
	cur.Status.AvailableReplicas = 0
	if got := scaleDownBudget(d, []*appsv1.ReplicaSet{old, rs("new", 5, 13, 0)}, rs("new", 5, 13, 0)); got != 0 {
		t.Errorf("budget with 5 unavailable new pods: %d, want 0", got)
	}
}

func TestRevisionAnnotations(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		"kubernetes.io/change-cause": "v2", RevisionAnnotation: "9", lastAppliedAnnotation: "{}",
	}}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3)}}
	r := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{RevisionAnnotation: "2"}}}
	// Rolling back to a ReplicaSet of revision 2 when 3 is the newest.
	if !setNewRSAnnotations(d, r, 4, true) {
		t.Fatal("no change reported")
	}
	want := map[string]string{RevisionAnnotation: "4", RevisionHistoryAnnotation: "2", "kubernetes.io/change-cause": "v2"}
	for k, v := range want {
		if r.Annotations[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, r.Annotations[k], v, r.Annotations)
		}
	}
	if _, ok := r.Annotations[lastAppliedAnnotation]; ok {
		t.Error("last-applied-configuration copied to the replicaset")
	}
	setNewRSAnnotations(d, r, 6, true)
	if r.Annotations[RevisionHistoryAnnotation] != "2,4" {
		t.Errorf("history %q, want 2,4", r.Annotations[RevisionHistoryAnnotation])
	}
	// A new ReplicaSet gets the replica annotations.
	n := &appsv1.ReplicaSet{}
	setNewRSAnnotations(d, n, 1, false)
	if n.Annotations[DesiredReplicasAnnotation] != "3" || n.Annotations[MaxReplicasAnnotation] != "4" {
		t.Errorf("new replicaset annotations %v", n.Annotations)
	}
}

func TestFindNewRSIgnoresHash(t *testing.T) {
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i:1"}}}}
	d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: tmpl}}
	withHash := tmpl.DeepCopy()
	withHash.Labels = labelsWith(withHash.Labels, appsv1.DefaultDeploymentUniqueLabelKey, "abc")
	other := tmpl.DeepCopy()
	other.Spec.Containers[0].Image = "i:2"
	a := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: appsv1.ReplicaSetSpec{Template: *other}}
	b := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: appsv1.ReplicaSetSpec{Template: *withHash}}
	if got := findNewRS(d, []*appsv1.ReplicaSet{a, b}); got != b {
		t.Errorf("found %v, want b", got)
	}
}
