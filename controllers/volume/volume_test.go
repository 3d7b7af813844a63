package volume_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/volume"
	"github.com/tether-edge/tether/hub/hubtest"
)

// TestClaimProtection: a claim carries the pvc-protection finalizer; one
// deleted while a scheduled pod uses it stays until the pod is gone, one no
// pod uses goes at once.
func TestClaimProtection(t *testing.T) {
	kube := startHub(t)
	ctx := context.Background()
	claims := kube.CoreV1().PersistentVolumeClaims("default")
	claim := func(name string) {
		t.Helper()
		_, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: ptr.To("manual"),
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	protected := func(name string) bool {
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		return err == nil && slices.Contains(c.Finalizers, volume.PVCProtectionFinalizer)
	}
	gone := func(name string) bool {
		_, err := claims.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	claim("used")
	claim("unused")
	waitFor(t, "finalizers on both claims", func() bool { return protected("used") && protected("unused") })
	// The claim in use is bound, as it would be.
	if _, err := kube.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "shelf"},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:       "manual",
			ClaimRef:               &corev1.ObjectReference{Namespace: "default", Name: "used"},
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/shelf"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim in use bound", func() bool {
		c, err := claims.Get(ctx, "used", metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound
	})

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "user"},
		Spec: corev1.PodSpec{
			NodeName:   "edge-1", // no agent: the pod stays Pending
			Containers: []corev1.Container{{Name: "app", Image: "app"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "used"}}}},
		},
	}
	if _, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"used", "unused"} {
		if err := claims.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the unused claim deleted", func() bool { return gone("unused") })
	time.Sleep(time.Second)
	c, err := claims.Get(ctx, "used", metav1.GetOptions{})
	if err != nil || c.DeletionTimestamp == nil {
		t.Fatalf("claim in use: %v, %v; want it kept, being deleted", c, err)
	}
	if err := kube.CoreV1().Pods("default").Delete(ctx, "user", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim deleted once its pod is gone", func() bool { return gone("used") })
}

// TestVolumeProtection: a volume carries the pv-protection finalizer; one
// deleted while a claim is bound to it stays until the claim is gone, one
// no claim is bound to goes at once.
func TestVolumeProtection(t *testing.T) {
	kube := startHub(t)
	ctx := context.Background()
	pvs := kube.CoreV1().PersistentVolumes()
	for _, name := range []string{"bound", "free"} {
		if _, err := pvs.Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName:       "shelf-" + name,
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/" + name}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To("shelf-bound"),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	protected := func(name string) bool {
		v, err := pvs.Get(ctx, name, metav1.GetOptions{})
		return err == nil && slices.Contains(v.Finalizers, volume.PVProtectionFinalizer)
	}
	gone := func(name string) bool {
		_, err := pvs.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	waitFor(t, "finalizers on both volumes", func() bool { return protected("bound") && protected("free") })
	waitFor(t, "the claim bound", func() bool {
		v, err := pvs.Get(ctx, "bound", metav1.GetOptions{})
		return err == nil && v.Status.Phase == corev1.VolumeBound
	})
	for _, name := range []string{"bound", "free"} {
		if err := pvs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the free volume deleted", func() bool { return gone("free") })
	time.Sleep(time.Second)
	v, err := pvs.Get(ctx, "bound", metav1.GetOptions{})
	if err != nil || v.DeletionTimestamp == nil {
		t.Fatalf("bound volume: %v, %v; want it kept, being deleted", v, err)
	}
	if c, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{}); err != nil || c.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim of the volume being deleted: %v, %v; want it still Bound", c, err)
	}
	if err := kube.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the volume deleted once its claim is gone", func() bool { return gone("bound") })
}

// startHub starts a hub process with its controllers and returns a client.
func startHub(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h := hubtest.Start(t)
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(rc)
}

// waitFor polls f for up to 20s.
func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
