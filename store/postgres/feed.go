package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

// feedChunk is how many log rows the feed reads per query.
const feedChunk = 1000

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// feedPosition returns the newest revision the feed published.
func (s *Store) feedPosition() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.feedRev
}

// poke wakes the feed.
func (s *Store) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sleep waits for d or the end of the store; false when the store ends.
func (s *Store) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// listen holds a connection that LISTENs for commits and wakes the feed for
// each; it reconnects with backoff when the connection breaks and wakes the
// feed once more after each reconnect, for what it missed meanwhile.
func (s *Store) listen() {
	backoff := minBackoff
	for s.ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(s.ctx, s.connCfg.Copy())
		if err == nil {
			_, err = conn.Exec(s.ctx, "LISTEN "+notifyChannel)
		}
		if err == nil {
			backoff = minBackoff
			s.poke()
			for {
				var n *pgconn.Notification
				if n, err = conn.WaitForNotification(s.ctx); err != nil {
					break
				}
				// This server's own commits woke the feed already.
				if rev, perr := strconv.ParseInt(n.Payload, 10, 64); perr == nil && rev <= s.feedPosition() {
					continue
				}
				s.poke()
			}
		}
		if conn != nil {
			conn.Close(context.Background())
		}
		if s.ctx.Err() != nil {
			return
		}
		s.log.Warn("listen for changes", "err", unavailable(err), "retry", backoff)
		if !s.sleep(backoff) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// feed reads the change log above the newest revision it published whenever
// woken, and fans the events out to the watchers. A failed read is retried
// with backoff until the database answers again.
func (s *Store) feed() {
	backoff := minBackoff
	var retry <-chan time.Time
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-retry:
		}
		retry = nil
		if err := s.catchUp(); err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.log.Warn("read change log", "err", err, "retry", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
	}
}

// catchUp publishes every committed revision above the feed's position.
func (s *Store) catchUp() error {
	for {
		s.mu.Lock()
		from := s.feedRev
		s.mu.Unlock()
		evs, to, head, compacted, err := s.readChunk(from)
		if err != nil {
			return err
		}
		s.noteRev(head)
		s.noteCompacted(compacted)
		// Revisions have no gaps (see the package documentation): what is
		// missing was compacted while this server was not reading, and its
		// watchers cannot be told what happened.
		lost := func(upTo int64) {
			err := fmt.Errorf("change feed found revisions %d to %d compacted (to %d) before it read them: %w", s.feedRev+1, upTo, compacted, store.ErrCompacted)
			s.resetLocked(err, upTo)
		}
		s.mu.Lock()
		for _, ev := range evs {
			r := ev.Object.Revision
			if r != s.feedRev+1 {
				lost(r - 1)
			}
			s.publishLocked(ev)
			s.feedRev = r
		}
		if s.feedRev < to {
			lost(to)
			s.feedRev = to
		}
		done := s.feedRev >= head
		s.mu.Unlock()
		if done {
			return nil
		}
	}
}

// resetLocked ends with err every watch that needed a lost revision (the
// revisions up to base that the feed did not read) and restarts the recent
// events above base; s.mu is held. A watch that starts at base or above
// (one opened while the feed lagged behind the revision it asked for)
// needs none of them and goes on.
func (s *Store) resetLocked(err error, base int64) {
	s.log.Error("change feed lost events", "err", err)
	for w := range s.watchers.All() {
		if w.after >= base {
			continue
		}
		w.End(err)
		s.watchers.Remove(w)
	}
	s.ring.Reset(base)
}

// readChunk reads the log rows in (from, from+feedChunk] with the newest
// and the compacted revision, in one snapshot and one round trip.
func (s *Store) readChunk(from int64) (evs []*store.Event, to, head, compacted int64, err error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.WriteTimeout)
	defer cancel()
	err = s.readLog(ctx, from, from+feedChunk, "", "", &head, &compacted, func(ev store.Event) error {
		evs = append(evs, &ev)
		return nil
	})
	if err != nil {
		return nil, 0, 0, 0, err
	}
	return evs, max(from, min(head, from+feedChunk)), head, compacted, nil
}

// readLog calls fn with the events of the log in (from, to], limited to one
// resource and namespace if given, and sets head and compacted to the newest
// and the compacted revision, all from one snapshot read in one round trip.
// The snapshot is taken by its first query, so every log row it shows is at
// or below the head it shows.
func (s *Store) readLog(ctx context.Context, from, to int64, resource, namespace string, head, compacted *int64, fn func(store.Event) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect to read the change log: %w", unavailable(err))
	}
	defer conn.Release()
	q, args := logQuery(from, to, resource, namespace)
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`)
	b.Queue(`SELECT rev, compacted FROM tether_counter WHERE id = 1`)
	b.Queue(q, args...)
	b.Queue(`COMMIT`)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin reading the change log: %w", unavailable(err))
	}
	if err := br.QueryRow().Scan(head, compacted); err != nil {
		return fmt.Errorf("read revision: %w", unavailable(err))
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("query change log: %w", unavailable(err))
	}
	if err := scanEvents(rows, fn); err != nil {
		return err
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("end reading the change log: %w", unavailable(err))
	}
	return nil
}

// logQuery selects the events of the log in (from, to], oldest first,
// limited to one resource and namespace if given, with each row's previous
// state.
func logQuery(from, to int64, resource, namespace string) (string, []any) {
	q := `SELECT l.rev, l.type, l.resource, l.namespace, l.name, l.value, l.labels, l.fields,
			p.rev, p.value, p.labels, p.fields
		FROM tether_log l LEFT JOIN tether_log p ON p.rev = l.prev_rev AND l.prev_rev > 0
		WHERE l.rev > $1 AND l.rev <= $2`
	args := []any{from, to}
	if resource != "" {
		args = append(args, resource)
		q += fmt.Sprintf(" AND l.resource = $%d", len(args))
	}
	if namespace != "" {
		args = append(args, namespace)
		q += fmt.Sprintf(" AND l.namespace = $%d", len(args))
	}
	return q + ` ORDER BY l.rev`, args
}

// scanEvents turns logQuery's rows into events and calls fn with each.
func scanEvents(rows pgx.Rows, fn func(store.Event) error) error {
	defer rows.Close()
	var err error
	for rows.Next() {
		var (
			rev            int64
			typ            int16
			k              store.Key
			val, lb, fb    []byte
			prev           *int64
			pval, plb, pfb []byte
		)
		if err := rows.Scan(&rev, &typ, &k.Resource, &k.Namespace, &k.Name, &val, &lb, &fb, &prev, &pval, &plb, &pfb); err != nil {
			return fmt.Errorf("read change log: %w", unavailable(err))
		}
		ev := store.Event{Type: store.EventType(typ)}
		var pobj *store.Object
		if prev != nil {
			o := store.Object{Key: k, Value: nonNil(pval), Revision: *prev}
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
		if err := fn(ev); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read change log: %w", unavailable(err))
	}
	return nil
}
