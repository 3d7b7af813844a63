package memtrim

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

const (
	// settlePoll is how often allocation is sampled while waiting for the
	// process to settle after start-up.
	settlePoll = 200 * time.Millisecond
	// settleAlloc is the allocation per poll below which the process
	// counts as quiet; an idle hub or agent allocates a few kilobytes per
	// second.
	settleAlloc = 256 << 10
	// settleQuietPolls is how many quiet polls in a row mean settled.
	settleQuietPolls = 3
	// settleMax bounds the wait on a process that never quiets down (a
	// fleet reconnecting to the hub at once); the release then happens
	// anyway.
	settleMax = 30 * time.Second

	// burstPoll is how often allocation is sampled between bursts. One
	// wake-up a second costs nothing measurable.
	burstPoll = time.Second
	// burstAlloc is the allocation since the last release that makes a
	// burst: far more than an idle process allocates between two
	// releases, about what an agent allocates to start a few pods.
	burstAlloc = 16 << 20
	// burstQuiet is how long allocation must stay below the settling
	// rate (settleAlloc per settlePoll) after a burst before the release.
	burstQuiet = 5 * time.Second
	// burstMinInterval spaces releases: however bursty the process, a
	// release (two collections and a pass over the executable's
	// mappings, a few milliseconds) runs at most this often.
	burstMinInterval = 30 * time.Second

	// growthSettle is how long after a release the process's resident
	// size is watched to learn what its periodic work keeps resident (a
	// node status every 10 s, a forced garbage collection every 2
	// minutes): the largest size seen in that window is the baseline.
	growthSettle = 150 * time.Second
	// growthRSS is how far above the baseline the resident size of a
	// quiet process may grow before it releases again: work with a
	// longer period (an agent's five-minute node report, bookmark flush
	// and image check) touches pages that a release hands back, while it
	// allocates far less than a burst.
	growthRSS = 2 << 20
	// growthPolls is how many polls pass between two reads of the
	// resident size while quiet.
	growthPolls = 5
)

// Config says when a Trimmer releases memory. The zero value releases once,
// after start-up.
type Config struct {
	// Logger receives a debug line per release. Nil: slog.Default().
	Logger *slog.Logger
	// Ready, when set, holds the first release back until it is closed:
	// the process's start-up is done (the hub serves, the agent's node is
	// registered). The release then waits for the process to settle.
	Ready <-chan struct{}
	// ReadyTimeout bounds the wait for Ready: a node that starts while its
	// hub is out of reach has its pods running from the local state and
	// releases anyway. 0: no bound.
	ReadyTimeout time.Duration
	// AfterBursts releases again each time the process has gone quiet
	// after a burst of work (an agent starting or stopping many pods),
	// at most once per 30 seconds, and each time a quiet process has
	// grown 2 MiB resident beyond what it kept in the minutes after the
	// last release (work with a long period). These releases page the executable
	// out too (PageOut, not Unmap): the code the next burst runs again
	// costs a read of each page from the disk, while pages left in the
	// page cache would come back sixteen at a time (see Unmap) and leave
	// the process larger than before the release within seconds.
	AfterBursts bool
}

// Trimmer releases memory as its Config says. Build it with New, run it
// with Run.
type Trimmer struct {
	cfg Config
	log *slog.Logger
	// The constants of the same names; tests shorten them.
	burstPoll, burstQuiet, burstMinInterval, growthSettle time.Duration
	burstAlloc, growthRSS                                 uint64
	// rss reads the resident size; 0 where it cannot be read.
	rss func() uint64
	// released, when set (by tests), is called after each release.
	released func(after string, r Result)
	// base is what the process had allocated at the last release.
	base uint64
}

// New returns a Trimmer; nothing happens until Run.
func New(cfg Config) *Trimmer {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Trimmer{cfg: cfg, log: log, burstPoll: burstPoll, burstQuiet: burstQuiet,
		burstMinInterval: burstMinInterval, burstAlloc: burstAlloc,
		growthSettle: growthSettle, growthRSS: growthRSS, rss: residentSize}
}

// Run releases memory once start-up is done and, with AfterBursts, after
// every burst, until ctx ends.
func (t *Trimmer) Run(ctx context.Context) {
	if t.cfg.Ready != nil {
		var timeout <-chan time.Time
		if t.cfg.ReadyTimeout > 0 {
			tm := time.NewTimer(t.cfg.ReadyTimeout)
			defer tm.Stop()
			timeout = tm.C
		}
		select {
		case <-ctx.Done():
			return
		case <-t.cfg.Ready:
		case <-timeout:
		}
	}
	waitSettled(ctx)
	if ctx.Err() != nil {
		return
	}
	t.release("start-up", PageOut)
	if !t.cfg.AfterBursts {
		return
	}
	t.afterBursts(ctx)
}

// afterBursts releases once the process allocated burstAlloc since the
// last release and then stayed quiet for burstQuiet, or once it stayed
// quiet that long with a resident size growthRSS above its baseline; at
// most once per burstMinInterval.
func (t *Trimmer) afterBursts(ctx context.Context) {
	// Quiet is the same allocation rate as when settling.
	quietAlloc := uint64(settleAlloc) * uint64(t.burstPoll) / uint64(settlePoll)
	tick := time.NewTicker(t.burstPoll)
	defer tick.Stop()
	last, lastAt := t.base, time.Now()
	var (
		quietSince time.Time
		baseline   uint64 // largest resident size in growthSettle after the last release
		polls      int
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := allocated()
		if now-last >= quietAlloc {
			quietSince = time.Time{}
		} else if quietSince.IsZero() {
			quietSince = time.Now()
		}
		last = now
		if quietSince.IsZero() || time.Since(quietSince) < t.burstQuiet || time.Since(lastAt) < t.burstMinInterval {
			continue
		}
		after := ""
		if now-t.base >= t.burstAlloc {
			after = "burst"
		} else if polls++; polls >= growthPolls || time.Since(lastAt) < t.growthSettle {
			polls = 0
			rss := t.rss()
			switch {
			case time.Since(lastAt) < t.growthSettle:
				baseline = max(baseline, rss)
			case baseline > 0 && rss > baseline+t.growthRSS:
				after = "growth"
			}
		}
		if after == "" {
			continue
		}
		t.release(after, PageOut)
		last, lastAt, baseline, polls = t.base, time.Now(), 0, 0
	}
}

func (t *Trimmer) release(after string, exe Executable) {
	since := allocated() - t.base
	r, err := Release(exe)
	t.base = allocated()
	m := readMemory()
	t.log.Debug("released memory", "after", after, "allocatedSince", since, "heapReleased", r.HeapReleased,
		"executableAdvised", r.ExecutableAdvised, "librariesAdvised", r.LibrariesAdvised, "err", err, "took", r.Took,
		"heapObjects", m.heapObjects, "heapUnused", m.heapUnused, "stacks", m.stacks, "runtime", m.runtime)
	if t.released != nil {
		t.released(after, r)
	}
}

// Executable says what a release does with the resident pages of the
// executable.
type Executable int

const (
	// PageOut has the kernel reclaim them (MADV_PAGEOUT, Linux 5.4 and
	// later): they leave the process and, unless another process maps
	// them, the page cache too; a page needed again is read from the
	// disk, alone (read-ahead is off), so that only what the process
	// uses comes back. For what only start-up ran.
	PageOut Executable = iota
	// Unmap only unmaps them (MADV_DONTNEED): they stay in the page
	// cache, clean, among the first pages the kernel reclaims when
	// memory is short, and a page needed again faults back without
	// reading the disk, but with the neighbours the page cache holds
	// (fault-around maps up to 64 KiB around the faulting page): a
	// process that runs code scattered over the executable soon has
	// more of it resident than before. For tests and measurements.
	Unmap
)

// Result tells what a release did.
type Result struct {
	// HeapReleased is how much more of the heap the kernel has back.
	HeapReleased int64
	// ExecutableAdvised is the size of the executable's mappings the
	// kernel was advised about (see releaseExecutable); 0 where the
	// kernel has no MADV_PAGEOUT.
	ExecutableAdvised int64
	// LibrariesAdvised is the size of the shared libraries' read-only
	// mappings that were unmapped.
	LibrariesAdvised int64
	Took             time.Duration
}

// Release collects garbage twice (the second empties what sync.Pools kept
// from the first), returns the free heap to the kernel and releases the
// resident pages of the executable's read-only mappings as exe says, and
// those of the shared libraries'.
func Release(exe Executable) (Result, error) {
	start := time.Now()
	before := heapReleased()
	runtime.GC()
	debug.FreeOSMemory()
	r := Result{HeapReleased: int64(heapReleased()) - int64(before)}
	var err error
	r.ExecutableAdvised, r.LibrariesAdvised, err = releaseExecutable(exe)
	r.Took = time.Since(start)
	return r, err
}

// waitSettled returns once the process allocated less than settleAlloc in
// each of settleQuietPolls consecutive polls, after settleMax, or when ctx
// ends.
func waitSettled(ctx context.Context) {
	deadline := time.NewTimer(settleMax)
	defer deadline.Stop()
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	last, quiet := allocated(), 0
	for quiet < settleQuietPolls {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
		now := allocated()
		if now-last < settleAlloc {
			quiet++
		} else {
			quiet = 0
		}
		last = now
	}
}

// allocated is the heap the process allocated since it started.
func allocated() uint64 { return readUint64("/gc/heap/allocs:bytes") }

// heapReleased is the memory of the heap the kernel has back.
func heapReleased() uint64 { return readUint64("/memory/classes/heap/released:bytes") }

// memory is what the Go runtime holds, from runtime/metrics: the heap's
// objects and the free space of its spans in use, goroutine stacks, and
// the runtime's own structures (metadata, profiling, OS thread stacks).
type memory struct {
	heapObjects, heapUnused, stacks, runtime uint64
}

func readMemory() memory {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/stacks:bytes"},
		{Name: "/memory/classes/metadata/mcache/inuse:bytes"},
		{Name: "/memory/classes/metadata/mspan/inuse:bytes"},
		{Name: "/memory/classes/metadata/other:bytes"},
		{Name: "/memory/classes/os-stacks:bytes"},
		{Name: "/memory/classes/other:bytes"},
		{Name: "/memory/classes/profiling/buckets:bytes"},
	}
	metrics.Read(s)
	v := make([]uint64, len(s))
	for i := range s {
		if s[i].Value.Kind() == metrics.KindUint64 {
			v[i] = s[i].Value.Uint64()
		}
	}
	return memory{heapObjects: v[0], heapUnused: v[1], stacks: v[2], runtime: v[3] + v[4] + v[5] + v[6] + v[7] + v[8]}
}

func readUint64(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
