package memtrim

import (
	"context"
	"runtime"
	"sync/atomic"
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

func TestTrimmerReleasesAfterGrowth(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := New(Config{AfterBursts: true})
	tr.burstPoll, tr.burstQuiet, tr.burstMinInterval = 50*time.Millisecond, 150*time.Millisecond, 300*time.Millisecond
	tr.burstAlloc, tr.growthSettle, tr.growthRSS = 1<<40, time.Second, 2<<20
	var rss atomic.Uint64
	rss.Store(10 << 20)
	tr.rss = func() uint64 { return rss.Load() }
	releases := make(chan string, 10)
	tr.released = func(after string, _ Result) { releases <- after }
	go tr.Run(ctx)
	if after := <-releases; after != "start-up" {
		t.Fatalf("first release after %q, want start-up", after)
	}

	// What the process keeps resident in the minutes after a release is
	// its baseline, however far above the size right after the release.
	rss.Store(14 << 20)
	expectNoRelease(t, releases, 2*time.Second)
	// Growth within the margin: nothing.
	rss.Store(15 << 20)
	expectNoRelease(t, releases, time.Second)
	// Beyond it, once quiet: a release, and a new baseline after it.
	rss.Store(17 << 20)
	select {
	case after := <-releases:
		if after != "growth" {
			t.Fatalf("release after %q, want growth", after)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no release after the resident size grew")
	}
	expectNoRelease(t, releases, 2*time.Second)
	rss.Store(20 << 20)
	select {
	case after := <-releases:
		if after != "growth" {
			t.Fatalf("release after %q, want growth", after)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no release after the resident size grew again")
	}
}

func TestResidentSize(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/statm")
	}
	before := residentSize()
	if before == 0 {
		t.Fatal("no resident size")
	}
	sink = make([]byte, 32<<20)
	for i := 0; i < len(sink); i += 4096 {
		sink[i] = 1
	}
	after := residentSize()
	sink = nil
	if after < before+30<<20 {
		t.Fatalf("resident size %d after touching 32 MiB, %d before", after, before)
	}
}

func expectNoRelease(t *testing.T, releases <-chan string, d time.Duration) {
	t.Helper()
	select {
	case after := <-releases:
		t.Fatalf("released after %s", after)
	case <-time.After(d):
	}
}
