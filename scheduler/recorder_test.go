package scheduler

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestRecorderBoundsEventWrites: a burst of events is written at the
// upstream scheduler's event rate (burst 100, then 50 a second) and what
// does not fit the queue of 1,000 is dropped, so a burst of bindings does
// not become as many event writes.
func TestRecorderBoundsEventWrites(t *testing.T) {
	cs := fake.NewClientset()
	var creates atomic.Int64
	cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		creates.Add(1)
		return true, nil, nil
	})
	r := newRecorder(cs, "default-scheduler", "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const burst = 3000
	for i := range burst {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprint("p", i), UID: types.UID(fmt.Sprint(i))}}
		r.event(pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned")
	}
	if got := r.dropped.Load(); got != burst-eventQueue {
		t.Errorf("dropped %d events of %d, want %d", got, burst, burst-eventQueue)
	}
	start := time.Now()
	go r.run(ctx)
	time.Sleep(time.Second)
	n := creates.Load()
	elapsed := time.Since(start).Seconds()
	if max := eventBurst + eventQPS*elapsed + 4; float64(n) > max {
		t.Errorf("%d events written in %.2fs, want at most %.0f", n, elapsed, max)
	}
	if n < eventBurst {
		t.Errorf("%d events written in %.2fs, want the burst of %d at once", n, elapsed, eventBurst)
	}
}

// TestRecorderForgetsDeletedPods: the repeat counts kept per pod go with
// the pod.
func TestRecorderForgetsDeletedPods(t *testing.T) {
	cs := fake.NewClientset()
	r := newRecorder(cs, "default-scheduler", "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1"}}
	ctx := context.Background()
	r.write(ctx, pendingEvent{pod: pod, typ: corev1.EventTypeWarning, reason: "FailedScheduling", message: "m", at: time.Now()})
	r.write(ctx, pendingEvent{pod: pod, typ: corev1.EventTypeNormal, reason: "Preempted", message: "m", at: time.Now()})
	if len(r.last) != 2 {
		t.Fatalf("remembered %d events, want 2", len(r.last))
	}
	r.forget(pod.UID)
	if len(r.last) != 0 {
		t.Errorf("remembered %d events after the pod was deleted, want 0", len(r.last))
	}
}
