package replicaset

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

var now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

type podOpt func(*corev1.Pod)

func pod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func on(node string) podOpt           { return func(p *corev1.Pod) { p.Spec.NodeName = node } }
func phase(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }
func created(ago time.Duration) podOpt {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(now.Add(-ago)) }
}
func cost(v string) podOpt {
	return func(p *corev1.Pod) { p.Annotations = map[string]string{DeletionCostAnnotation: v} }
}
func restarts(n int32) podOpt {
	return func(p *corev1.Pod) { p.Status.ContainerStatuses = []corev1.ContainerStatus{{RestartCount: n}} }
}
func readyFor(ago time.Duration) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(-ago))}}
	}
}

func names(pods []*corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

// TestPodsToDelete checks each rule of the scale-down order on its own,
// the pod that should go first listed second so order matters.
func TestPodsToDelete(t *testing.T) {
	tests := []struct {
		name      string
		keep, del *corev1.Pod
		related   []*corev1.Pod
	}{
		{"unassigned first", pod("a", readyFor(time.Hour)), pod("b", on(""), phase(corev1.PodPending)), nil},
		{"pending before running", pod("a", readyFor(time.Hour)), pod("b", phase(corev1.PodPending)), nil},
		{"unknown before running", pod("a"), pod("b", phase(corev1.PodUnknown)), nil},
		{"pending before unknown", pod("a", phase(corev1.PodUnknown)), pod("b", phase(corev1.PodPending)), nil},
		{"not ready before ready", pod("a", readyFor(time.Hour)), pod("b"), nil},
		{"lower deletion cost first", pod("a", readyFor(time.Hour), cost("10")), pod("b", readyFor(time.Hour), cost("-5")), nil},
		{"more co-located pods first", pod("a", on("n1"), readyFor(time.Hour)), pod("b", on("n2"), readyFor(time.Hour)),
			[]*corev1.Pod{pod("x", on("n2")), pod("y", on("n2")), pod("a", on("n1")), pod("b", on("n2"))}},
		{"more recently ready first", pod("a", readyFor(4*time.Hour)), pod("b", readyFor(time.Minute)), nil},
		{"more restarts first", pod("a", restarts(1)), pod("b", restarts(7)), nil},
		{"newer first", pod("a", created(10*time.Hour)), pod("b", created(time.Minute)), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			related := tc.related
			if related == nil {
				related = []*corev1.Pod{tc.keep, tc.del}
			}
			got := PodsToDelete([]*corev1.Pod{tc.keep, tc.del}, related, 1, now)
			if len(got) != 1 || got[0].Name != tc.del.Name {
				t.Errorf("deleted %v, want [%s]", names(got), tc.del.Name)
			}
		})
	}
}

// TestPodsToDeleteOrder checks a mixed set against the full order.
func TestPodsToDeleteOrder(t *testing.T) {
	pods := []*corev1.Pod{
		pod("ready-old", readyFor(8*time.Hour), created(9*time.Hour)),
		pod("running-unready", created(time.Hour)),
		pod("unscheduled", on(""), phase(corev1.PodPending)),
		pod("ready-new", readyFor(time.Minute), created(2*time.Minute)),
		pod("pending", phase(corev1.PodPending)),
	}
	got := names(PodsToDelete(pods, pods, 4, now))
	want := []string{"unscheduled", "pending", "running-unready", "ready-new"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestSlowStart(t *testing.T) {
	var calls atomic.Int32
	done, err := SlowStart(10, 1, func() error { calls.Add(1); return nil })
	if done != 10 || err != nil || calls.Load() != 10 {
		t.Errorf("all succeed: done %d err %v calls %d", done, err, calls.Load())
	}
	// Failing from the start costs one call, then the batches stop.
	calls.Store(0)
	done, err = SlowStart(500, 1, func() error { calls.Add(1); return errors.New("quota") })
	if done != 0 || err == nil || calls.Load() != 1 {
		t.Errorf("all fail: done %d err %v calls %d, want 0, error, 1", done, err, calls.Load())
	}
	// Batches are 1, 2, 4, 8: the fourth call fails, batch 3 (size 4)
	// runs fully, then it stops after 7 calls.
	calls.Store(0)
	done, _ = SlowStart(100, 1, func() error {
		if calls.Add(1) == 4 {
			return errors.New("once")
		}
		return nil
	})
	if calls.Load() != 7 || done != 6 {
		t.Errorf("one failure: %d calls, %d done; want 7 and 6", calls.Load(), done)
	}
}

// TestBatchCarryOver checks that a scale-up spanning several syncs goes on
// at full batch size only after a clean sync that hit the burst cap, and
// not for long.
func TestBatchCarryOver(t *testing.T) {
	now := time.Unix(1000, 0)
	c := &Controller{burst: 500, now: func() time.Time { return now }, batches: map[string]carriedBatch{}}
	if b := c.firstBatch("ns/a"); b != 1 {
		t.Fatalf("first batch %d, want 1", b)
	}
	c.noteBatch("ns/a", 500, true)
	if b := c.firstBatch("ns/a"); b != 500 {
		t.Fatalf("after a full clean sync: %d, want 500", b)
	}
	c.noteBatch("ns/a", 500, false)
	if b := c.firstBatch("ns/a"); b != 1 {
		t.Fatalf("after a failure: %d, want 1", b)
	}
	c.noteBatch("ns/a", 500, true)
	c.noteBatch("ns/a", 20, true) // the scale-up is done
	if b := c.firstBatch("ns/a"); b != 1 {
		t.Fatalf("after the last sync of a scale-up: %d, want 1", b)
	}
	c.noteBatch("ns/a", 500, true)
	now = now.Add(2 * batchCarryOver)
	if b := c.firstBatch("ns/a"); b != 1 {
		t.Fatalf("long after: %d, want 1", b)
	}
}

func TestStatusCountsHeldBack(t *testing.T) {
	now := time.Unix(1000, 0)
	c := &Controller{statusWritten: map[string]time.Time{}}
	rs := &appsv1.ReplicaSet{Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](10)}}
	rs.Generation, rs.Status.ObservedGeneration = 1, 1
	counts := func(n int32) appsv1.ReplicaSetStatus {
		return appsv1.ReplicaSetStatus{Replicas: 10, FullyLabeledReplicas: 10, ReadyReplicas: n, AvailableReplicas: n, ObservedGeneration: 1}
	}
	if d := c.statusDue("ns/a", rs, counts(1), now); d != 0 {
		t.Fatalf("first status held back %v", d)
	}
	rs.Status = counts(1)
	if d := c.statusDue("ns/a", rs, counts(4), now.Add(300*time.Millisecond)); d != 700*time.Millisecond {
		t.Fatalf("counts within the interval: held back %v, want 700ms", d)
	}
	if d := c.statusDue("ns/a", rs, counts(10), now.Add(400*time.Millisecond)); d != 0 {
		t.Fatalf("settled status held back %v", d)
	}
	rs.Status = counts(10)
	newGen := counts(4)
	newGen.ObservedGeneration = 2
	if d := c.statusDue("ns/a", rs, newGen, now.Add(500*time.Millisecond)); d != 0 {
		t.Fatalf("status of a new generation held back %v", d)
	}
	if d := c.statusDue("ns/b", rs, counts(3), now.Add(500*time.Millisecond)); d != 0 {
		t.Fatalf("another ReplicaSet's status held back %v", d)
	}
}
