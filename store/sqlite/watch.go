package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
	"github.com/tether-edge/tether/store/internal/watchq"
)

// watcher is a watch of the store; watchq.Watcher does the watching, and
// the store supplies the replay of its change log.
type watcher struct {
	*watchq.Watcher
	s *Store
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
	w := &watcher{s: s}
	w.Watcher = watchq.New(ctx, opts, watchq.Config{
		Queue:  s.cfg.WatchQueue,
		Replay: w.replay,
		Remove: w.remove,
	})
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
	w.Fill(s.ring, s.rev)
	s.watchers.Add(w)
	s.mu.Unlock()
	w.Begin()
	return w, nil
}

// replay delivers (from, to] from the change log in one read transaction,
// so compaction cannot remove rows underneath it; see watchq.Config.
func (w *watcher) replay(ctx context.Context, from, to int64, send func(store.Event) bool) error {
	tx, err := w.s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("begin replay: %w", err)
	}
	defer tx.Rollback()
	var compacted int64
	if err := tx.QueryRow(`SELECT v FROM meta WHERE k = 'compacted'`).Scan(&compacted); err != nil {
		return fmt.Errorf("read compacted revision: %w", err)
	}
	if from < compacted {
		return fmt.Errorf("replay from revision %d, compacted %d: %w", from, compacted, store.ErrCompacted)
	}
	q := `SELECT l.rev, l.type, l.resource, l.namespace, l.name, l.value, l.labels, l.fields,
			p.rev, p.value, p.labels, p.fields
		FROM log l LEFT JOIN log p ON p.rev = l.prev_rev AND l.prev_rev > 0
		WHERE l.rev > ? AND l.rev <= ?`
	args := []any{from, to}
	opts := w.Options()
	if opts.Resource != "" {
		q += ` AND l.resource = ?`
		args = append(args, opts.Resource)
	}
	if opts.Namespace != "" {
		q += ` AND l.namespace = ?`
		args = append(args, opts.Namespace)
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
			if o.Labels, err = rowcodec.DecodeMap(plb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			if o.Fields, err = rowcodec.DecodeMap(pfb); err != nil {
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
			if ev.Object.Labels, err = rowcodec.DecodeMap(lb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			if ev.Object.Fields, err = rowcodec.DecodeMap(fb); err != nil {
				return fmt.Errorf("read change log at %d: %w", rev, err)
			}
			if ev.Type == store.Modified {
				ev.Prev = pobj
			}
		}
		if !send(ev) {
			return nil
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read change log: %w", err)
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
