package edge_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// TestClaimsWaitAndRunOffline: a pod whose claim is not bound waits in
// ContainerCreating with a FailedMount event and starts once the claim is
// bound; its claim and volume are kept in the local state, so that it runs
// again after a reboot with the hub down.
func TestClaimsWaitAndRunOffline(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	rt := newSourcedSim()
	cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-v", NodeIP: netip.MustParseAddr("192.0.2.40"), Runtime: rt}
	a := startAgent(t, cfg)
	waitNodeReady(t, e, "edge-v")

	if _, err := e.client.CoreV1().PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "books"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr("manual"),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := newPod("reader", "edge-v", nil, corev1.RestartPolicyAlways)
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "books"}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	p, err := e.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "reader", "waiting in ContainerCreating", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return p.Status.Phase == corev1.PodPending && len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ContainerCreating"
	})
	eventually(t, 30*time.Second, "a FailedMount event", func() (bool, string) {
		evs, err := e.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=reader"})
		if err != nil {
			return false, err.Error()
		}
		var got []string
		for _, ev := range evs.Items {
			if ev.Reason == "FailedMount" && ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "PVC is not bound") &&
				strings.Contains(ev.Message, "unmounted volumes=[data]") && ev.Source.Component == "kubelet" {
				return true, ""
			}
			got = append(got, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Sprint(got)
	})
	if !rt.gone(p.UID) {
		t.Fatal("the runtime got a pod whose claim is not bound")
	}

	// The volume arrives; the binder binds the claim; the pod starts.
	if _, err := e.client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "shelf"},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:       "manual",
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/shelf"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "claim bound", func() (bool, string) {
		c, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "books", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Phase == corev1.ClaimBound, fmt.Sprint(c.Status, c.Spec.VolumeName, c.Finalizers)
	})
	waitPod(t, e, "reader", "Running once its claim is bound", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && podReady(p)
	})
	rt.mu.Lock()
	src := rt.src
	rt.mu.Unlock()
	if pv, err := src.PersistentVolume("shelf"); err != nil || pv.Spec.HostPath.Path != "/srv/shelf" {
		t.Fatalf("the volume reaches the runtime's sources: %v %v", pv, err)
	}

	// A reboot with the hub down: claim and volume come from the local
	// state.
	a.stop(t)
	e.hub.Stop()
	rt = newSourcedSim()
	cfg.Runtime, cfg.Token = rt, ""
	a = startAgent(t, cfg)
	eventually(t, 10*time.Second, "the pod runs again from the local state", func() (bool, string) { return rt.running(p.UID) })
	rt.mu.Lock()
	src = rt.src
	rt.mu.Unlock()
	if c, err := src.PersistentVolumeClaim("default", "books"); err != nil || c.Spec.VolumeName != "shelf" {
		t.Errorf("claim from the local state: %v %v", c, err)
	}
	e.hub.Restart()
	eventually(t, 30*time.Second, "agent reconnects", func() (bool, string) {
		s := a.Stats()
		return s.Connected && s.Registered, fmt.Sprintf("%+v", s)
	})
	waitPod(t, e, "reader", "Running after the hub came back", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && podReady(p)
	})
}
