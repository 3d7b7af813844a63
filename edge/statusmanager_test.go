package edge

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// waitPatches waits up to 5s for the fake clientset to have taken n
// status patches, and returns how many it took.
func waitPatches(t *testing.T, c *fake.Clientset, n int) int {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); statusPatches(c) < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // for a write too many to show
	return statusPatches(c)
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
	m := newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &metrics{})
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
	if n := waitPatches(t, client, 1); n != 1 {
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
	if n := waitPatches(t, client, 2); n != 2 {
		t.Fatalf("%d writes after readiness change, want 2", n)
	}
}

// TestStatusManagerFlushesPending checks that a pod staying Pending has its
// status written once the window passes.
func TestStatusManagerFlushesPending(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	m := newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &metrics{})
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

// TestStatusManagerDoesNotWaitForTheHub: with a hub that does not answer
// (a link that died before the tunnel noticed), setting a status returns
// at once; the newest status is written once the hub answers, and the
// statuses set meanwhile are not written one by one.
func TestStatusManagerDoesNotWaitForTheHub(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	release := make(chan struct{})
	var hung atomic.Int32
	client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if hung.Add(1) == 1 {
			<-release // the first write hangs until the hub answers
		}
		return false, nil, nil
	})
	m := newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &metrics{})
	ctx := context.Background()
	set := make(chan error, 1)
	go func() {
		for i := range 5 {
			st := runningStatus(pod, i%2 == 0)
			st.ContainerStatuses[0].RestartCount = int32(i)
			if err := m.set(ctx, pod, st, false); err != nil {
				set <- err
				return
			}
		}
		set <- nil
	}()
	select {
	case err := <-set:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		close(release)
		t.Fatal("setting 5 statuses waited for the hub, which does not answer")
	}
	if base := m.base(pod); base.ContainerStatuses[0].RestartCount != 4 {
		t.Fatalf("base has restart count %d, want the newest status's 4", base.ContainerStatuses[0].RestartCount)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if len(got.Status.ContainerStatuses) == 1 && got.Status.ContainerStatuses[0].RestartCount == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the newest status never reached the hub: %+v", got.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := statusPatches(client); n > 2 {
		t.Errorf("%d status writes, want the hung one and the newest", n)
	}
}

// TestStatusManagerRetriesWhenAskedAgain: a status whose writes failed
// waits out a back-off, but is tried again at once when its pod's worker
// sets it again (as it does when the tunnel comes back).
func TestStatusManagerRetriesWhenAskedAgain(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	var down atomic.Bool
	down.Store(true)
	client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("hub unreachable")
		}
		return false, nil, nil
	})
	m := newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &metrics{})
	ctx := context.Background()
	st := runningStatus(pod, true)
	if err := m.set(ctx, pod, st, false); err != nil {
		t.Fatal(err)
	}
	// Two failed writes: the next try is 2s away.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.mu.Lock()
		backoff := m.pending[pod.UID].backoff
		m.mu.Unlock()
		if backoff >= 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("back-off %v after 5s of failed writes", backoff)
		}
	}
	down.Store(false)
	asked := time.Now()
	if err := m.set(ctx, pod, st, false); err != nil {
		t.Fatal(err)
	}
	for {
		got, _ := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if got.Status.Phase == corev1.PodRunning {
			break
		}
		if time.Since(asked) > time.Second {
			t.Fatalf("the status was not written within 1s of being set again")
		}
		time.Sleep(5 * time.Millisecond)
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

// TestStatusManagerLeavesOthersConditions checks that a status built from
// an older copy of the pod does not delete a condition someone else set
// since (the node lifecycle's Lost mark).
func TestStatusManagerLeavesOthersConditions(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	m := newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &metrics{})
	ctx := context.Background()
	if err := m.set(ctx, pod, runningStatus(pod, true), false); err != nil {
		t.Fatal(err)
	}
	waitPatches(t, client, 1)
	hubPod, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const lost corev1.PodConditionType = "tether.io/Lost"
	hubPod.Status.Conditions = append(hubPod.Status.Conditions, corev1.PodCondition{Type: lost, Status: corev1.ConditionTrue})
	if hubPod, err = client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, hubPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	hubPod.ResourceVersion = "100" // newer than what the agent wrote
	// The pod's worker computed its status from its older copy.
	if err := m.set(ctx, hubPod, runningStatus(pod, false), false); err != nil {
		t.Fatal(err)
	}
	if n := waitPatches(t, client, 2); n != 2 {
		t.Fatalf("%d status writes, want 2", n)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found, ready := false, true
	for _, c := range got.Status.Conditions {
		switch c.Type {
		case lost:
			found = c.Status == corev1.ConditionTrue
		case corev1.PodReady:
			ready = c.Status == corev1.ConditionTrue
		}
	}
	if !found || ready {
		t.Fatalf("hub's conditions after the agent's write: %+v; want Lost kept and Ready false", got.Status.Conditions)
	}
}
