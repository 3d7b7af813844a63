package postgres

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/selection"

	"github.com/tether-edge/tether/store"
)

type watcher struct {
	s    *Store
	opts store.WatchOptions
	out  chan store.Event
	// index is the field an equality term of the watch's field selector
	// requires, and value its value: the watch is routed only the events
	// whose object has (or had) that value. Empty: every event of the
	// resource is queued and filtered by the watch.
	index, value string

	// replay (from, to] from the change log before the queue, if to > from.
	replayFrom, replayTo int64
	// after: events at or below it are not queued (the feed may not have
	// reached the revision the watch starts from).
	after int64

	mu     sync.Mutex
	queue  []*store.Event
	signal chan struct{}

	// ctx is the context given to Watch; the goroutine that feeds out
	// starts with the first call of Events (see store.Batcher).
	ctx     context.Context
	started sync.Once
	stopCtx func() bool // under mu

	endOnce sync.Once
	ended   chan struct{}
	err     error
}

func (w *watcher) Events() <-chan store.Event {
	w.started.Do(func() {
		w.out = make(chan store.Event, 64)
		go w.run(w.ctx)
	})
	return w.out
}

// Batches implements store.Batcher: a watch with no change log to replay
// can be consumed through Next.
func (w *watcher) Batches() bool { return w.replayTo <= w.replayFrom }

// Ready implements store.Batcher.
func (w *watcher) Ready() <-chan struct{} { return w.signal }

// Next implements store.Batcher: the queued events, filtered, and copied
// unless the watch is read-only.
func (w *watcher) Next() ([]store.Event, bool) {
	select {
	case <-w.ended:
		return nil, true
	default:
	}
	w.mu.Lock()
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	evs := make([]store.Event, 0, len(q))
	for _, ev := range q {
		if e, ok := w.filter(*ev, w.opts.ReadOnly); ok {
			evs = append(evs, e)
		}
	}
	return evs, false
}

func (w *watcher) Err() error {
	<-w.ended
	return w.err
}

func (w *watcher) Stop() {
	w.s.mu.Lock()
	w.s.removeWatcherLocked(w)
	w.s.mu.Unlock()
	w.end(nil)
}

// watchIndex returns the field and value of the first equality term of a
// field selector, if any. A thousand agents each watching the pods bound to
// their node would otherwise wake a thousand goroutines per pod change.
func watchIndex(opts store.WatchOptions) (field, value string) {
	if opts.Resource == "" || opts.Field == nil {
		return "", ""
	}
	for _, r := range opts.Field.Requirements() {
		if r.Operator == selection.Equals || r.Operator == selection.DoubleEquals {
			return r.Field, r.Value
		}
	}
	return "", ""
}

// watchRoutes holds the watchers of one resource that have an index.
type watchRoutes map[string]map[string]map[*watcher]struct{} // field → value → watchers

func (s *Store) addWatcherLocked(w *watcher) {
	s.watchers[w] = struct{}{}
	if w.index == "" {
		s.unindexed[w] = struct{}{}
		return
	}
	r := s.routes[w.opts.Resource]
	if r == nil {
		r = watchRoutes{}
		s.routes[w.opts.Resource] = r
	}
	byValue := r[w.index]
	if byValue == nil {
		byValue = map[string]map[*watcher]struct{}{}
		r[w.index] = byValue
	}
	set := byValue[w.value]
	if set == nil {
		set = map[*watcher]struct{}{}
		byValue[w.value] = set
	}
	set[w] = struct{}{}
}

func (s *Store) removeWatcherLocked(w *watcher) {
	if _, ok := s.watchers[w]; !ok {
		return
	}
	delete(s.watchers, w)
	if w.index == "" {
		delete(s.unindexed, w)
		return
	}
	r := s.routes[w.opts.Resource]
	set := r[w.index][w.value]
	delete(set, w)
	if len(set) == 0 {
		delete(r[w.index], w.value)
		if len(r[w.index]) == 0 {
			delete(r, w.index)
			if len(r) == 0 {
				delete(s.routes, w.opts.Resource)
			}
		}
	}
}

func (w *watcher) end(err error) {
	w.endOnce.Do(func() {
		w.err = err
		close(w.ended)
		w.mu.Lock()
		stop := w.stopCtx
		w.mu.Unlock()
		if stop != nil {
			stop()
		}
		// A consumer of Next learns of the end from Ready.
		select {
		case w.signal <- struct{}{}:
		default:
		}
	})
}

func (w *watcher) wants(ev *store.Event) bool {
	k := ev.Object.Key
	return (w.opts.Resource == "" || w.opts.Resource == k.Resource) &&
		(w.opts.Namespace == "" || w.opts.Namespace == k.Namespace)
}

// push queues one event; called with the store lock held. It reports false
// when the watcher overflowed and must be dropped.
func (w *watcher) push(ev *store.Event) bool {
	if ev.Object.Revision <= w.after || !w.wants(ev) {
		return true
	}
	w.mu.Lock()
	if len(w.queue) >= w.s.cfg.WatchQueue {
		w.queue = nil
		w.mu.Unlock()
		w.end(store.ErrWatchOverflow)
		return false
	}
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
	return true
}

// publishLocked records a committed event and fans it out; s.mu is held.
func (s *Store) publishLocked(ev *store.Event) {
	s.ring.Add(ev)
	for w := range s.unindexed {
		if !w.push(ev) {
			s.removeWatcherLocked(w)
		}
	}
	for field, byValue := range s.routes[ev.Object.Key.Resource] {
		v := ev.Object.Fields[field]
		for w := range byValue[v] {
			if !w.push(ev) {
				s.removeWatcherLocked(w)
			}
		}
		// An object that leaves a watch's selection is still its event.
		if ev.Prev != nil {
			if pv := ev.Prev.Fields[field]; pv != v {
				for w := range byValue[pv] {
					if !w.push(ev) {
						s.removeWatcherLocked(w)
					}
				}
			}
		}
	}
}

// Watch starts a watch; see store.WatchOptions.
func (s *Store) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher, error) {
	w := &watcher{
		s:      s,
		opts:   opts,
		after:  opts.Revision,
		ctx:    ctx,
		signal: make(chan struct{}, 1),
		ended:  make(chan struct{}),
	}
	s.mu.Lock()
	switch {
	case s.closed.Load():
		s.mu.Unlock()
		return nil, store.ErrClosed
	case opts.Revision < s.compacted.Load():
		c := s.compacted.Load()
		s.mu.Unlock()
		return nil, fmt.Errorf("watch from revision %d, compacted %d: %w", opts.Revision, c, store.ErrCompacted)
	case opts.Revision > s.rev.Load():
		r := s.rev.Load()
		s.mu.Unlock()
		return nil, fmt.Errorf("watch from revision %d, current %d: %w", opts.Revision, r, store.ErrFutureRevision)
	}
	if recent, ok := s.ring.Since(opts.Revision); ok {
		for _, ev := range recent {
			if w.wants(ev) {
				w.queue = append(w.queue, ev)
			}
		}
	} else {
		w.replayFrom, w.replayTo = opts.Revision, s.feedRev
	}
	w.index, w.value = watchIndex(opts)
	s.addWatcherLocked(w)
	s.mu.Unlock()
	// The events from the ring are pending for a consumer of Next.
	w.signal <- struct{}{}
	// The watch ends with ctx whichever way it is consumed; a watch
	// consumed through Next has no goroutine of its own to notice.
	stop := context.AfterFunc(ctx, w.Stop)
	w.mu.Lock()
	w.stopCtx = stop
	w.mu.Unlock()
	select {
	case <-w.ended:
		// Ended before the registration was recorded.
		stop()
	default:
	}
	return w, nil
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.out)
	defer func() {
		w.s.mu.Lock()
		w.s.removeWatcherLocked(w)
		w.s.mu.Unlock()
	}()
	if w.replayTo > w.replayFrom {
		if err := w.replay(ctx); err != nil {
			if ctx.Err() != nil {
				err = nil
			}
			w.end(err)
			return
		}
	}
	for {
		w.mu.Lock()
		q := w.queue
		w.queue = nil
		w.mu.Unlock()
		for _, ev := range q {
			if !w.send(ctx, *ev, w.opts.ReadOnly) {
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-w.signal:
		case <-w.ended:
			return
		case <-ctx.Done():
			w.end(nil)
			return
		}
	}
}

// send filters and delivers one event; false when the watch ended. An
// event that shares the store's state is copied unless shared says the
// consumer may have it as it is: it was read for this watch alone, or the
// watch is read-only.
func (w *watcher) send(ctx context.Context, ev store.Event, shared bool) bool {
	ev, ok := w.filter(ev, shared)
	if !ok {
		return true
	}
	select {
	case <-w.ended:
		return false
	default:
	}
	select {
	case w.out <- ev:
		return true
	case <-w.ended:
		return false
	case <-ctx.Done():
		w.end(nil)
		return false
	}
}

// filter applies the watch's selectors to one event, and copies what it
// delivers out of the store's state unless shared says the consumer may
// have it as it is.
func (w *watcher) filter(ev store.Event, shared bool) (store.Event, bool) {
	ev, ok := store.FilterEvent(w.opts.Label, w.opts.Field, ev)
	if !ok {
		return ev, false
	}
	if !shared {
		ev.Object = cloneObject(ev.Object)
		if ev.Prev != nil {
			p := cloneObject(*ev.Prev)
			ev.Prev = &p
		}
	}
	return ev, true
}

// replayChunk is how many revisions a replay reads per snapshot.
const replayChunk = 1000

// replay delivers (replayFrom, replayTo] from the change log, a chunk of
// revisions per snapshot, holding no connection while it sends: a slow
// consumer must not keep a connection of the pool. Each chunk starts at or
// above the compacted revision of its snapshot, and compaction never
// removes a row above it, nor the previous state of one.
func (w *watcher) replay(ctx context.Context) error {
	for pos := w.replayFrom; pos < w.replayTo; {
		to := min(pos+replayChunk, w.replayTo)
		var evs []store.Event
		var head, compacted int64
		err := w.s.readLog(ctx, pos, to, w.opts.Resource, w.opts.Namespace, &head, &compacted, func(ev store.Event) error {
			evs = append(evs, ev)
			return nil
		})
		if err != nil {
			return err
		}
		if pos < compacted {
			return fmt.Errorf("replay from revision %d, compacted %d: %w", pos, compacted, store.ErrCompacted)
		}
		for _, ev := range evs {
			if !w.send(ctx, ev, true) {
				return w.errOr(nil)
			}
		}
		pos = to
	}
	return nil
}

func (w *watcher) errOr(def error) error {
	select {
	case <-w.ended:
		return w.err
	default:
		return def
	}
}
