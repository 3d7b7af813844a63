package edge

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// statusPatches counts the pod status patches a fake clientset took.
func statusPatches(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func runningStatus(pod *corev1.Pod, ready bool) corev1.PodStatus {
	return computePodStatus(podStatusInput{
		pod: pod, now: t0,
		rt: &PodStatus{UID: pod.UID, SandboxReady: true, Containers: []ContainerStatus{
			{Name: "app", State: ContainerRunning, Ready: ready, StartedAt: t0},
		}},
	})
}

// TestStatusManagerBatchesStart checks that a pod starting within the
// batching window costs one status write, and that statuses past Pending
// are written at once.
func TestStatusManagerBatchesStart(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	m := newStatusManager(client.CoreV1().Pods, &metrics{})
	ctx := context.Background()

	creating := computePodStatus(podStatusInput{pod: pod, now: t0, rt: &PodStatus{UID: pod.UID, SandboxReady: true}})
	if creating.Phase != corev1.PodPending {
		t.Fatalf("phase %s, want Pending", creating.Phase)
	}
	if err := m.set(ctx, pod, creating, false); err != nil {
		t.Fatal(err)
	}
	if n := statusPatches(client); n != 0 {
		t.Fatalf("%d writes of a Pending status inside the window, want 0", n)
	}
	if got := m.base(pod); got.Phase != corev1.PodPending {
		t.Fatalf("base is %q, want the held-back Pending status", got.Phase)
	}
	running := runningStatus(pod, true)
	if err := m.set(ctx, pod, running, false); err != nil {
		t.Fatal(err)
	}
	if n := statusPatches(client); n != 1 {
		t.Fatalf("%d writes after Running, want 1", n)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || len(got.Status.ContainerStatuses) != 1 || !got.Status.ContainerStatuses[0].Ready {
		t.Fatalf("hub status %+v, want Running and ready", got.Status)
	}
	// The held-back status must not land after the newer one.
	time.Sleep(m.window + 200*time.Millisecond)
	if n := statusPatches(client); n != 1 {
		t.Fatalf("%d writes after the window, want still 1", n)
	}
	// A readiness change is written at once.
	if err := m.set(ctx, got, runningStatus(got, false), false); err != nil {
		t.Fatal(err)
	}
	if n := statusPatches(client); n != 2 {
		t.Fatalf("%d writes after readiness change, want 2", n)
	}
}

// TestStatusManagerFlushesPending checks that a pod staying Pending has its
// status written once the window passes.
func TestStatusManagerFlushesPending(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	m := newStatusManager(client.CoreV1().Pods, &metrics{})
	m.window = 50 * time.Millisecond
	creating := computePodStatus(podStatusInput{pod: pod, now: t0, rt: &PodStatus{UID: pod.UID, SandboxReady: true}})
	if err := m.set(context.Background(), pod, creating, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for statusPatches(client) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Pending status was never written")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, _ := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if got.Status.Phase != corev1.PodPending || got.Status.StartTime == nil {
		t.Fatalf("hub status %+v, want the Pending status", got.Status)
	}
	m.mu.Lock()
	left := len(m.pending)
	m.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d statuses still held back after the write", left)
	}
}

func TestNoopPatch(t *testing.T) {
	for patch, want := range map[string]bool{
		`{}`: true, `{"status":{}}`: true, `{"status":{"conditions":{}}}`: true,
		`{"status":{"phase":"Running"}}`: false, `{"status":[]}`: false,
	} {
		if got := noopPatch([]byte(patch)); got != want {
			t.Errorf("noopPatch(%s) = %v, want %v", patch, got, want)
		}
	}
}
