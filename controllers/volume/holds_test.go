package volume

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestHolds covers when a claim keeps a deleted volume, including the
// moment between a binding's two writes: the volume reads Bound and the
// claim does not name it yet.
func TestHolds(t *testing.T) {
	vol := func(uid types.UID, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv"},
			Spec:       corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{Namespace: "default", Name: "data", UID: uid}},
			Status:     corev1.PersistentVolumeStatus{Phase: phase},
		}
	}
	claim := func(uid types.UID, volumeName string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data", UID: uid},
			Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: volumeName},
		}
	}
	for _, c := range []struct {
		name string
		v    *corev1.PersistentVolume
		p    *corev1.PersistentVolumeClaim
		want bool
	}{
		{"bound both ways", vol("u1", corev1.VolumeBound), claim("u1", "pv"), true},
		{"volume Bound, claim not written yet", vol("u1", corev1.VolumeBound), claim("u1", ""), true},
		{"claim names the volume before its phase", vol("u1", corev1.VolumeAvailable), claim("u1", "pv"), true},
		{"reserved for a claim that names it", vol("", corev1.VolumeAvailable), claim("u1", "pv"), true},
		{"reserved, the claim not bound", vol("", corev1.VolumeAvailable), claim("u1", ""), false},
		{"a claim of the same name, another UID", vol("u1", corev1.VolumeBound), claim("u2", "pv"), false},
		{"released", vol("u1", corev1.VolumeReleased), claim("u1", ""), false},
	} {
		if got := holds(c.v, c.p); got != c.want {
			t.Errorf("%s: holds = %v, want %v", c.name, got, c.want)
		}
	}
	if holds(&corev1.PersistentVolume{}, claim("u1", "pv")) {
		t.Error("a volume without a claimRef is held")
	}
}
