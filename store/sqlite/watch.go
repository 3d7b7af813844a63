package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"sync"

	"github.com/tether-edge/tether/store"
)

type watcher struct {
	s    *Store
	opts store.WatchOptions
	out  chan store.Event

	// replay (from, to] from the change log before the queue, if to > from.
	replayFrom, replayTo int64

	mu     sync.Mutex
	queue  []*store.Event
	signal chan struct{}

	endOnce sync.Once
	ended   chan struct{}
	err     error
}

func (w *watcher) Events() <-chan store.Event { return w.out }

func (w *watcher) Err() error {
	<-w.ended
	return w.err
}

func (w *watcher) Stop() {
	w.s.mu.Lock()
	delete(w.s.watchers, w)
	w.s.mu.Unlock()
	w.end(nil)
}

func (w *watcher) end(err error) {
	w.endOnce.Do(func() {
		w.err = err
		close(w.ended)
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
	if !w.wants(ev) {
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
	s.ring = append(s.ring, ev)
	if len(s.ring) >= 2*s.cfg.WatchCache {
		drop := len(s.ring) - s.cfg.WatchCache
		s.ringBase = s.ring[drop-1].Object.Revision
		s.ring = append(s.ring[:0:0], s.ring[drop:]...)
	}
	for w := range s.watchers {
		if !w.push(ev) {
			delete(s.watchers, w)
		}
	}
}

// Watch starts a watch; see store.WatchOptions.
func (s *Store) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher, error) {
	w := &watcher{
		s:      s,
		opts:   opts,
		out:    make(chan store.Event, 64),
		signal: make(chan struct{}, 1),
		ended:  make(chan struct{}),
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, store.ErrClosed
	case opts.Revision < s.compacted:
		c := s.compacted
		s.mu.Unlock()
		return nil, fmt.Errorf("watch from revision %d, compacted %d: %w", opts.Revision, c, store.ErrCompacted)
	case opts.Revision > s.rev:
		r := s.rev
		s.mu.Unlock()
		return nil, fmt.Errorf("watch from revision %d, current %d: %w", opts.Revision, r, store.ErrFutureRevision)
	}
	if opts.Revision >= s.ringBase {
		i := sort.Search(len(s.ring), func(i int) bool { return s.ring[i].Object.Revision > opts.Revision })
		for _, ev := range s.ring[i:] {
			if w.wants(ev) {
				w.queue = append(w.queue, ev)
			}
		}
	} else {
		w.replayFrom, w.replayTo = opts.Revision, s.rev
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	go w.run(ctx)
	return w, nil
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.out)
	defer func() {
		w.s.mu.Lock()
		delete(w.s.watchers, w)
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
			if !w.send(ctx, *ev) {
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

// send filters and delivers one event; false when the watch ended.
func (w *watcher) send(ctx context.Context, ev store.Event) bool {
	ev, ok := store.FilterEvent(w.opts.Label, w.opts.Field, ev)
	if !ok {
		return true
	}
	ev.Object = cloneObject(ev.Object)
	if ev.Prev != nil {
		p := cloneObject(*ev.Prev)
		ev.Prev = &p
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

// replay delivers (replayFrom, replayTo] from the change log in one read
// transaction, so compaction cannot remove rows underneath it.
func (w *watcher) replay(ctx context.Context) error {
	tx, err := w.s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("begin replay: %w", err)
	}
	defer tx.Rollback()
	var compacted int64
	if err := tx.QueryRow(`SELECT v FROM meta WHERE k = 'compacted'`).Scan(&compacted); err != nil {
		return fmt.Errorf("read compacted revision: %w", err)
	}
	if w.replayFrom < compacted {
		return fmt.Errorf("replay from revision %d, compacted %d: %w", w.replayFrom, compacted, store.ErrCompacted)
	}
	q := `SELECT l.rev, l.type, l.resource, l.namespace, l.name, l.value, l.labels, l.fields,
			p.rev, p.value, p.labels, p.fields
		FROM log l LEFT JOIN log p ON p.rev = l.prev_rev AND l.prev_rev > 0
		WHERE l.rev > ? AND l.rev <= ?`
	args := []any{w.replayFrom, w.replayTo}
	if w.opts.Resource != "" {
		q += ` AND l.resource = ?`
		args = append(args, w.opts.Resource)
	}
	if w.opts.Namespace != "" {
		q += ` AND l.namespace = ?`
		args = append(args, w.opts.Namespace)
	}
	q += ` ORDER BY l.rev`
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("query change log: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			rev, typ       int64
			k              store.Key
			val, lb, fb    []byte
			prev           sql.NullInt64
			pval, plb, pfb []byte
		)
		if err := rows.Scan(&rev, &typ, &k.Resource, &k.Namespace, &k.Name, &val, &lb, &fb, &prev, &pval, &plb, &pfb); err != nil {
			return fmt.Errorf("read change log: %w", err)
		}
		ev := store.Event{Type: store.EventType(typ)}
		var pobj *store.Object
		if prev.Valid {
			o := store.Object{Key: k, Value: nonNil(pval), Revision: prev.Int64}
			if o.Labels, err = decodeMap(plb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			if o.Fields, err = decodeMap(pfb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			pobj = &o
		}
		if ev.Type == store.Deleted {
			if pobj == nil {
				return fmt.Errorf("read change log at %d: deletion without previous state", rev)
			}
			ev.Object = *pobj
			ev.Object.Revision = rev
			ev.Prev = pobj
		} else {
			ev.Object = store.Object{Key: k, Value: nonNil(val), Revision: rev}
			if ev.Object.Labels, err = decodeMap(lb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			if ev.Object.Fields, err = decodeMap(fb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			if ev.Type == store.Modified {
				ev.Prev = pobj
			}
		}
		if !w.send(ctx, ev) {
			return w.errOr(nil)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read change log: %w", err)
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

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
