package memtrim

import (
	"context"
	"testing"
	"time"
)

// sink keeps allocations from being optimised away.
var sink []byte

func TestTrimmerWaitsForReadyThenReleasesAfterBursts(t *testing.T) {
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := New(Config{Ready: ready, AfterBursts: true})
	tr.burstPoll, tr.burstQuiet, tr.burstMinInterval, tr.burstAlloc = 100*time.Millisecond, 300*time.Millisecond, time.Second, 8<<20
	type release struct {
		after string
		at    time.Time
	}
	releases := make(chan release, 10)
	tr.released = func(after string, _ Result) { releases <- release{after, time.Now()} }
	go tr.Run(ctx)

	select {
	case r := <-releases:
		t.Fatalf("released (after %s) before start-up was done", r.after)
	case <-time.After(time.Second):
	}
	close(ready)
	var first release
	select {
	case first = <-releases:
	case <-time.After(settleMax + 5*time.Second):
		t.Fatal("no release after start-up")
	}
	if first.after != "start-up" {
		t.Fatalf("first release after %q, want start-up", first.after)
	}

	// Quiet: nothing more.
	select {
	case r := <-releases:
		t.Fatalf("released after %s with no burst", r.after)
	case <-time.After(2 * time.Second):
	}

	// A burst, then quiet: one release, no earlier than the minimum
	// interval after the first.
	for range 64 {
		sink = make([]byte, 256<<10)
	}
	sink = nil
	select {
	case r := <-releases:
		if r.after != "burst" {
			t.Fatalf("release after %q, want burst", r.after)
		}
		if r.at.Sub(first.at) < tr.burstMinInterval {
			t.Fatalf("released %v after the previous release, want at least %v", r.at.Sub(first.at), tr.burstMinInterval)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no release after a burst")
	}
	select {
	case r := <-releases:
		t.Fatalf("released again after %s with no new burst", r.after)
	case <-time.After(2 * time.Second):
	}
}

func TestTrimmerReadyTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := New(Config{Ready: make(chan struct{}), ReadyTimeout: 500 * time.Millisecond})
	done := make(chan string, 1)
	tr.released = func(after string, _ Result) { done <- after }
	start := time.Now()
	go tr.Run(ctx)
	select {
	case <-done:
		if time.Since(start) < 500*time.Millisecond {
			t.Fatalf("released after %v, before the ready timeout", time.Since(start))
		}
	case <-time.After(settleMax + 5*time.Second):
		t.Fatal("no release after the ready timeout")
	}
}
