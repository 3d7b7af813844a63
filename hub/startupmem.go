package hub

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Start-up of the hub (package initialization of every linked library,
// scheme registration, OpenAPI generation, the first LIST and WATCH of the
// in-process controllers and scheduler) touches far more memory than the hub
// needs once it idles: code and read-only data of the executable that runs
// once, and heap garbage the collector frees but the runtime keeps mapped
// for reuse. Once the hub has settled, releaseStartupMemory hands both back
// to the kernel, once. Pages needed again later fault back in, code from the
// page cache or the executable, heap as it is allocated.

const (
	// settlePoll is how often allocation is sampled while waiting for the
	// hub to settle.
	settlePoll = 200 * time.Millisecond
	// settleAlloc is the allocation per poll below which the hub counts as
	// quiet; the idle hub allocates a few kilobytes per second.
	settleAlloc = 256 << 10
	// settleQuietPolls is how many quiet polls in a row mean settled.
	settleQuietPolls = 3
	// settleMax bounds the wait on a hub that never quiets down (a fleet
	// reconnecting at once); the release then happens anyway.
	settleMax = 30 * time.Second
)

// releaseStartupMemory waits until the hub has settled after start-up, then
// collects garbage, returns the free heap to the operating system and pages
// out the executable's read-only mappings (see pageOutExecutable).
func releaseStartupMemory(ctx context.Context, log *slog.Logger) {
	waitSettled(ctx)
	if ctx.Err() != nil {
		return
	}
	start := time.Now()
	debug.FreeOSMemory()
	paged, err := pageOutExecutable()
	log.Debug("released start-up memory", "executablePagedOut", paged, "err", err, "took", time.Since(start))
}

// waitSettled returns once the process allocated less than settleAlloc in
// each of settleQuietPolls consecutive polls, after settleMax, or when ctx
// ends.
func waitSettled(ctx context.Context) {
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	read := func() uint64 {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return sample[0].Value.Uint64()
	}
	deadline := time.NewTimer(settleMax)
	defer deadline.Stop()
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	last, quiet := read(), 0
	for quiet < settleQuietPolls {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
		now := read()
		if now-last < settleAlloc {
			quiet++
		} else {
			quiet = 0
		}
		last = now
	}
}
