package kit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// syncs records the keys a queue syncs, and what the sync of each
// returns next.
type syncs struct {
	mu     sync.Mutex
	got    []string
	result func(n int) error // by the number of syncs so far
	seen   chan struct{}
}

func (s *syncs) sync(_ context.Context, key string) error {
	s.mu.Lock()
	s.got = append(s.got, key)
	n := len(s.got)
	s.mu.Unlock()
	s.seen <- struct{}{}
	return s.result(n)
}

func runQueue(t *testing.T, q *Queue, s *syncs) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		q.Run(ctx, 2, slog.New(slog.NewTextHandler(io.Discard, nil)), s.sync)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func wait(t *testing.T, s *syncs, within time.Duration) {
	t.Helper()
	select {
	case <-s.seen:
	case <-time.After(within):
		t.Fatalf("no sync within %v", within)
	}
}

func quiet(t *testing.T, s *syncs, d time.Duration) {
	t.Helper()
	select {
	case <-s.seen:
		t.Fatalf("synced again within %v", d)
	case <-time.After(d):
	}
}

// TestQueueRequeueAfter: a sync returning RequeueAfter is synced again
// after that delay, on the queue's clock, and its back-off is reset.
func TestQueueRequeueAfter(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	q := NewQueue("test", WithClock(clk), WithBackoff(time.Millisecond, time.Second))
	s := &syncs{seen: make(chan struct{}, 10), result: func(n int) error {
		if n == 1 {
			return RequeueAfter(time.Hour)
		}
		return nil
	}}
	q.AddRateLimited("k") // one failure's worth of back-off
	runQueue(t, q, s)
	wait(t, s, 5*time.Second)
	quiet(t, s, 50*time.Millisecond) // the test clock has not moved
	if n := q.q.NumRequeues("k"); n != 0 {
		t.Errorf("back-off of %d failures after RequeueAfter, want 0", n)
	}
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(time.Hour)
	wait(t, s, 5*time.Second)
}

// TestQueueBackoffInRealTime: a failed sync is retried after its back-off,
// in real time even when the queue's delays run on a test clock.
func TestQueueBackoffInRealTime(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	q := NewQueue("test", WithClock(clk), WithBackoff(20*time.Millisecond, time.Second))
	s := &syncs{seen: make(chan struct{}, 10), result: func(n int) error {
		if n < 3 {
			return errors.New("boom")
		}
		return nil
	}}
	// The clock starts before the first sync can: taken after the
	// workers run, it missed the time since the first sync on a busy
	// machine and read less than the back-offs.
	start := time.Now()
	q.Add("k")
	runQueue(t, q, s)
	for range 3 {
		wait(t, s, 5*time.Second)
	}
	// Back-offs of 20ms then 40ms.
	if d := time.Since(start); d < 60*time.Millisecond {
		t.Errorf("three syncs in %v, want the back-off of 60ms between them", d)
	}
	quiet(t, s, 100*time.Millisecond)
	if n := q.q.NumRequeues("k"); n != 0 {
		t.Errorf("back-off of %d failures after success, want 0", n)
	}
}

func TestRequeueAfterZero(t *testing.T) {
	if err := RequeueAfter(0); err != nil {
		t.Errorf("RequeueAfter(0) = %v, want nil", err)
	}
}
