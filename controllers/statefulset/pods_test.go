package statefulset

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestIdentity(t *testing.T) {
	set := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "u"},
		Spec: appsv1.StatefulSetSpec{ServiceName: "nginx",
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "nginx"}},
				Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "www"}, {Name: "cfg"}}}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "www"}}}}}
	p := newPod(set, &set.Spec.Template, "web-abc", 2)
	if p.Name != "web-2" || p.Spec.Hostname != "web-2" || p.Spec.Subdomain != "nginx" ||
		p.Labels[PodNameLabel] != "web-2" || p.Labels[PodIndexLabel] != "2" || p.Labels[appsv1.ControllerRevisionHashLabelKey] != "web-abc" {
		t.Errorf("pod identity: %+v %+v", p.ObjectMeta, p.Spec)
	}
	if len(p.Spec.Volumes) != 2 || p.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != "www-web-2" {
		t.Errorf("volumes %+v", p.Spec.Volumes)
	}
	if !identityMatches(set, p, 2) || ordinalOf(set, p) != 2 {
		t.Error("a new pod does not match its own identity")
	}
	for name, want := range map[string]int{"web-0": 0, "web-10": 10, "webx-1": -1, "web-": -1, "web-a": -1, "web-web-3": -1} {
		if got := ordinalOf(set, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}); got != want {
			t.Errorf("ordinalOf(%s) = %d, want %d", name, got, want)
		}
	}
}

func TestClaimOwners(t *testing.T) {
	set := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: "set"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-3", UID: "pod"}}
	del, keep := appsv1.DeletePersistentVolumeClaimRetentionPolicyType, appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	tests := []struct {
		whenDeleted, whenScaled appsv1.PersistentVolumeClaimRetentionPolicyType
		condemned               bool
		want                    []string
	}{
		{keep, keep, true, nil},
		{del, keep, false, []string{"set"}},
		{keep, del, false, nil},
		{keep, del, true, []string{"pod"}},
		{del, del, true, []string{"set", "pod"}},
	}
	for _, tc := range tests {
		set.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{WhenDeleted: tc.whenDeleted, WhenScaled: tc.whenScaled}
		refs := claimOwners(set, pod, tc.condemned)
		var got []string
		for _, r := range refs {
			got = append(got, string(r.UID))
		}
		if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
			t.Errorf("%s/%s condemned=%v: owners %v, want %v", tc.whenDeleted, tc.whenScaled, tc.condemned, got, tc.want)
		}
	}
}
