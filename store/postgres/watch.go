package postgres

import (
	"context"
	"fmt"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/watchq"
)

// watcher is a watch of the store; watchq.Watcher does the watching, and
// the store supplies the replay of its change log.
type watcher struct {
	*watchq.Watcher
	s *Store
	// after: events at or below it are not queued (the feed may not have
	// reached the revision the watch starts from).
	after int64
}

// Push queues one event above after; see watchq.Watcher.Push.
func (w *watcher) Push(ev *store.Event) bool {
	if ev.Object.Revision <= w.after {
		return true
	}
	return w.Watcher.Push(ev)
}

// remove takes w out of the store's watchers.
func (w *watcher) remove() {
	w.s.mu.Lock()
	w.s.watchers.Remove(w)
	w.s.mu.Unlock()
}

// publishLocked records a committed event and fans it out; s.mu is held.
func (s *Store) publishLocked(ev *store.Event) {
	s.ring.Add(ev)
	s.watchers.Publish(ev)
}

// Watch starts a watch; see store.WatchOptions.
func (s *Store) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher, error) {
	w := &watcher{s: s, after: opts.Revision}
	w.Watcher = watchq.New(ctx, opts, watchq.Config{
		Queue:  s.cfg.WatchQueue,
		Replay: w.replay,
		Remove: w.remove,
	})
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
	w.Fill(s.ring, s.feedRev)
	s.watchers.Add(w)
	s.mu.Unlock()
	w.Begin()
	return w, nil
}

// replayChunk is how many revisions a replay reads per snapshot.
const replayChunk = 1000

// replay delivers (from, to] from the change log, a chunk of revisions per
// snapshot, holding no connection while it sends: a slow consumer must not
// keep a connection of the pool. Each chunk starts at or above the
// compacted revision of its snapshot, and compaction never removes a row
// above it, nor the previous state of one. See watchq.Config.
func (w *watcher) replay(ctx context.Context, from, to int64, send func(store.Event) bool) error {
	opts := w.Options()
	for pos := from; pos < to; {
		end := min(pos+replayChunk, to)
		var evs []store.Event
		var head, compacted int64
		err := w.s.readLog(ctx, pos, end, opts.Resource, opts.Namespace, &head, &compacted, func(ev store.Event) error {
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
			if !send(ev) {
				return nil
			}
		}
		pos = end
	}
	return nil
}
