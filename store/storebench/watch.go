package storebench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tether-edge/tether/internal/benchfmt"
)

// The two-writer watch workload: several servers share one database, as
// several hubs (or several k3s servers on kine) do. Each server writes at a
// fixed rate through its own store instance and runs one watch of every
// pod; every watch must deliver every server's writes, promptly and
// without long silences while writes go on. A quarter of the writes are
// compare-and-put updates of a few keys every server updates, as leader
// election leases are, so the servers' writes also conflict now and then.

// ErrConflict is what a WatchTarget's Update returns when the object's
// revision is not the expected one.
var ErrConflict = errors.New("revision compare failed")

// WatchTarget is one server of a shared store.
type WatchTarget interface {
	// Create stores a new pod and returns its revision.
	Create(ctx context.Context, ns, name string, value []byte) (int64, error)
	// Update replaces a pod if its revision is expected and returns the
	// new revision; ErrConflict otherwise.
	Update(ctx context.Context, ns, name string, value []byte, expected int64) (int64, error)
	// Get returns a pod's current revision.
	Get(ctx context.Context, ns, name string) (int64, error)
	// Watch watches every pod from now on. The channel carries one Change
	// per event and is closed when ctx ends or the watch fails.
	Watch(ctx context.Context) (<-chan Change, error)
}

// Change is one event a watch delivered: the pod's key as namespace/name and
// the revision of the write.
type Change struct {
	Key string
	Rev int64
}

// WatchConfig shapes one server's part of the workload.
type WatchConfig struct {
	// ID names the server; its pods are named after it. Required.
	ID string `json:"id"`
	// Rate is how many writes per second this server makes.
	Rate float64 `json:"rate"`
	// Duration is how long it writes.
	Duration time.Duration `json:"duration"`
}

// sharedNamespace holds the pods every server updates.
const sharedNamespace = "shared"

// sharedKeys is how many shared pods there are; every sharedEvery-th write
// of a server updates one of them.
const (
	sharedKeys  = 4
	sharedEvery = 4
)

func sharedName(i int) string { return fmt.Sprintf("lease-%d", i) }

// PrepareShared creates the pods every server updates. One server calls it
// before any writes.
func PrepareShared(ctx context.Context, t WatchTarget) error {
	for i := range sharedKeys {
		if _, err := t.Create(ctx, sharedNamespace, sharedName(i), Pod(sharedNamespace, sharedName(i), 0)); err != nil {
			return fmt.Errorf("create shared pod %s: %w", sharedName(i), err)
		}
	}
	return nil
}

// Write is one acknowledged write.
type Write struct {
	Key string `json:"key"`
	Rev int64  `json:"rev"`
	// Ack is when the write returned, in Unix nanoseconds.
	Ack int64 `json:"ack"`
}

// Sighting is one event a watch delivered and when, in Unix nanoseconds.
type Sighting struct {
	Key string `json:"key"`
	Rev int64  `json:"rev"`
	At  int64  `json:"at"`
}

// ServerLog is what one server wrote and what its watch saw.
type ServerLog struct {
	ID        string     `json:"id"`
	Writes    []Write    `json:"writes"`
	Conflicts int        `json:"conflicts"`
	Seen      []Sighting `json:"seen"`
	// End is when the server stopped watching, in Unix nanoseconds.
	End int64 `json:"end"`
	// WatchErr is set when the watch ended before the server stopped it.
	WatchErr string `json:"watch_err,omitempty"`
}

// Recorder records the events of one watch with their arrival times.
type Recorder struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	seen  []Sighting
	more  chan struct{} // closed and replaced on every event
	ended bool
}

// StartRecorder starts t's watch and records what it delivers.
func StartRecorder(ctx context.Context, t WatchTarget) (*Recorder, error) {
	ctx, cancel := context.WithCancel(ctx)
	ch, err := t.Watch(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("start watch: %w", err)
	}
	r := &Recorder{cancel: cancel, done: make(chan struct{}), more: make(chan struct{})}
	go func() {
		defer close(r.done)
		for c := range ch {
			at := time.Now().UnixNano()
			r.mu.Lock()
			r.seen = append(r.seen, Sighting{Key: c.Key, Rev: c.Rev, At: at})
			close(r.more)
			r.more = make(chan struct{})
			r.mu.Unlock()
		}
		r.mu.Lock()
		r.ended = true
		close(r.more)
		r.mu.Unlock()
	}()
	return r, nil
}

// Wait waits until the watch delivered n events, ended, or timeout passed.
func (r *Recorder) Wait(n int, timeout time.Duration) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got, ended, more := len(r.seen), r.ended, r.more
		r.mu.Unlock()
		if got >= n || ended {
			return
		}
		select {
		case <-more:
		case <-deadline.C:
			return
		}
	}
}

// Stop ends the watch and fills in log's sightings and end time.
func (r *Recorder) Stop(log *ServerLog) {
	r.mu.Lock()
	ended := r.ended
	r.mu.Unlock()
	log.End = time.Now().UnixNano()
	r.cancel()
	<-r.done
	if ended {
		log.WatchErr = "the watch ended while writes were being delivered"
	}
	r.mu.Lock()
	log.Seen = slices.Clone(r.seen)
	r.mu.Unlock()
}

// WriteAt waits until start, then writes through t at cfg.Rate for
// cfg.Duration, one write at a time: creates of new pods alternating with an
// update of the pod last created, and every fourth write a compare-and-put
// update of a shared pod at the revision just read. A write that falls
// behind its slot is made at once. It returns the log of the writes; a
// conflict on a shared pod is counted, not retried.
func WriteAt(ctx context.Context, t WatchTarget, cfg WatchConfig, start time.Time) (ServerLog, error) {
	log := ServerLog{ID: cfg.ID}
	if cfg.Rate <= 0 || cfg.Duration <= 0 || cfg.ID == "" {
		return log, fmt.Errorf("write: bad config %+v", cfg)
	}
	n := int(cfg.Rate * cfg.Duration.Seconds())
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	ns := "writer-" + cfg.ID
	var (
		lastName string
		lastRev  int64
		created  int
	)
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-ctx.Done():
				return log, ctx.Err()
			case <-time.After(d):
			}
		}
		var (
			key string
			rev int64
			err error
		)
		switch {
		case i%sharedEvery == sharedEvery-1:
			name := sharedName(i / sharedEvery % sharedKeys)
			key = sharedNamespace + "/" + name
			var cur int64
			if cur, err = t.Get(ctx, sharedNamespace, name); err != nil {
				return log, fmt.Errorf("get shared pod %s: %w", name, err)
			}
			rev, err = t.Update(ctx, sharedNamespace, name, Pod(sharedNamespace, name, i+1), cur)
			if errors.Is(err, ErrConflict) {
				log.Conflicts++
				continue
			}
		case lastName == "":
			lastName = podName(created)
			created++
			key = ns + "/" + lastName
			rev, err = t.Create(ctx, ns, lastName, Pod(ns, lastName, 0))
			lastRev = rev
		default:
			key = ns + "/" + lastName
			rev, err = t.Update(ctx, ns, lastName, Pod(ns, lastName, 1), lastRev)
			lastName = ""
		}
		if err != nil {
			return log, fmt.Errorf("write %s: %w", key, err)
		}
		log.Writes = append(log.Writes, Write{Key: key, Rev: rev, Ack: time.Now().UnixNano()})
	}
	return log, nil
}

// WatchResult sums up one run of the workload on one kind of store.
type WatchResult struct {
	Name    string `json:"name"`
	Servers int    `json:"servers"`
	// Rate is the combined write rate asked for, per second.
	Rate float64 `json:"rate"`
	// Achieved is the combined rate of acknowledged writes.
	Achieved  float64 `json:"achieved"`
	Written   int     `json:"written"`
	Conflicts int     `json:"conflicts"`
	// Delivered is, per watch, how many of the writes it delivered.
	Delivered []int `json:"delivered"`
	// MaxDelayMs and P99DelayMs are over every write and every watch: the
	// time from a write's acknowledgement to its event's arrival, 0 when
	// the event came first. A write never delivered counts until the
	// watch stopped.
	MaxDelayMs float64 `json:"max_delay_ms"`
	P99DelayMs float64 `json:"p99_delay_ms"`
	// LongestSilenceMs is the longest time any watch delivered nothing
	// while an acknowledged write was waiting for it.
	LongestSilenceMs float64 `json:"longest_silence_ms"`
	// Stalls counts silences longer than StallAfter, over all watches.
	Stalls int `json:"stalls"`
	// WatchErrs holds watches that ended early.
	WatchErrs []string `json:"watch_errs,omitempty"`
}

// StallAfter is the silence that counts as a stall.
const StallAfter = time.Second

// Missing returns how many writes the worst watch did not deliver.
func (r WatchResult) Missing() int {
	miss := 0
	for _, d := range r.Delivered {
		miss = max(miss, r.Written-d)
	}
	return miss
}

// Analyze matches every server's writes with every server's watch.
func Analyze(name string, rate float64, logs []ServerLog) WatchResult {
	res := WatchResult{Name: name, Servers: len(logs), Rate: rate}
	type wkey struct {
		key string
		rev int64
	}
	ack := map[wkey]int64{}
	var first, last int64
	for _, l := range logs {
		res.Conflicts += l.Conflicts
		for _, w := range l.Writes {
			ack[wkey{w.Key, w.Rev}] = w.Ack
			if first == 0 || w.Ack < first {
				first = w.Ack
			}
			last = max(last, w.Ack)
		}
		if l.WatchErr != "" {
			res.WatchErrs = append(res.WatchErrs, l.ID+": "+l.WatchErr)
		}
	}
	res.Written = len(ack)
	if last > first {
		res.Achieved = float64(res.Written-1) / (float64(last-first) / 1e9)
	}
	var delays []int64
	for _, l := range logs {
		seen := map[wkey]int64{}
		for _, s := range l.Seen {
			k := wkey{s.Key, s.Rev}
			if _, ok := ack[k]; ok {
				if _, dup := seen[k]; !dup {
					seen[k] = s.At
				}
			}
		}
		res.Delivered = append(res.Delivered, len(seen))
		// Sweep the acknowledgements and deliveries in time order.
		type point struct {
			at      int64
			deliver bool
		}
		var pts []point
		for k, a := range ack {
			at, ok := seen[k]
			if !ok {
				delays = append(delays, max(0, l.End-a))
				pts = append(pts, point{a, false})
				continue
			}
			delays = append(delays, max(0, at-a))
			pts = append(pts, point{min(a, at), false}, point{at, true})
		}
		slices.SortFunc(pts, func(a, b point) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			// At the same instant, acknowledgements come first.
			return cmp.Compare(boolInt(a.deliver), boolInt(b.deliver))
		})
		pending, since := 0, int64(0)
		silence := func(t int64) {
			d := time.Duration(t - since)
			res.LongestSilenceMs = max(res.LongestSilenceMs, ms(d))
			if d > StallAfter {
				res.Stalls++
			}
		}
		for _, p := range pts {
			if !p.deliver {
				pending++
				if pending == 1 {
					since = p.at
				}
				continue
			}
			silence(p.at)
			pending--
			since = p.at
		}
		if pending > 0 {
			silence(l.End)
		}
	}
	slices.Sort(delays)
	if len(delays) > 0 {
		res.MaxDelayMs = ms(time.Duration(delays[len(delays)-1]))
		ds := make([]time.Duration, len(delays))
		for i, d := range delays {
			ds[i] = time.Duration(d)
		}
		res.P99DelayMs = ms(percentile(ds, 0.99))
	}
	return res
}

// String formats the result as one line.
func (r WatchResult) String() string {
	s := fmt.Sprintf("%s, %d servers at %.0f writes/s (achieved %.0f): %d written, %d conflicts, delivered %v, "+
		"max delay %.1f ms, p99 delay %.1f ms, longest silence %.1f ms, %d stalls",
		r.Name, r.Servers, r.Rate, r.Achieved, r.Written, r.Conflicts, r.Delivered,
		r.MaxDelayMs, r.P99DelayMs, r.LongestSilenceMs, r.Stalls)
	for _, e := range r.WatchErrs {
		s += "; " + e
	}
	return s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// WatchFigures returns the two-writer watch comparison of tether and a peer
// at one combined rate as benchmark figures: the longest delay from a
// write's acknowledgement to its delivery, the writes the worst watch
// missed and the stalls, each with the target tether must meet (no
// delivery later than StallAfter, nothing missed, no stall).
func WatchFigures(tether, peer WatchResult, mode string) []benchfmt.Figure {
	extra := []string{fmt.Sprintf("servers=%d", tether.Servers), fmt.Sprintf("rate=%.0f/s", tether.Rate),
		fmt.Sprintf("written=%d", tether.Written), fmt.Sprintf("peer_written=%d", peer.Written)}
	add := func(name string, v, pv float64, unit, target string) benchfmt.Figure {
		return benchfmt.Figure{Name: fmt.Sprintf("store_pg_two_writer_watch_%s_%.0fwps", name, tether.Rate),
			Value: v, Unit: unit, Target: target, Peer: peer.Name, PeerValue: pv, Mode: mode, Extra: extra}
	}
	return []benchfmt.Figure{
		add("max_delay", tether.MaxDelayMs, peer.MaxDelayMs, "ms", fmt.Sprintf("<=%d", StallAfter.Milliseconds())),
		add("missing", float64(tether.Missing()), float64(peer.Missing()), "events", "<=0"),
		add("stalls", float64(tether.Stalls), float64(peer.Stalls), "stalls", "<=0"),
	}
}
