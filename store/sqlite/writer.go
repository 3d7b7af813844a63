package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

type opKind int

const (
	opCreate opKind = iota
	opUpdate
	opDelete
	opCompact
)

type op struct {
	kind     opKind
	obj      store.Object
	expected int64
	compact  int64 // opCompact: the compacted revision to set
	chunkTo  int64 // opCompact: delete rows in (expected, chunkTo]
	res      chan opResult
}

type opResult struct {
	rev int64
	obj store.Object
	err error
}

// pending is one change a batch will apply to memory after it commits.
type pending struct {
	op   *op
	key  store.Key
	next *state // nil for deletions
	prev *state
	ev   *store.Event
	res  opResult
}

type writer struct {
	s                          *Store
	insLog, upObj, delObj, put *sql.Stmt

	walPath      string
	nextRestart  time.Time     // after a busy restart, do not retry before
	restartDelay time.Duration // doubles while restarts keep finding readers
}

// walCheckpointBytes bounds the write-ahead log. The background checkpoint
// (see Store.checkpointLoop) copies pages into the database file but cannot
// reset the log while commits keep coming, so under sustained writes the log
// would grow without end. Past this size the writer, between batches,
// checkpoints the rest itself and restarts the log from its beginning; the
// journal size limit cuts the file back to this size, so that the file only
// outgrows it again once the restarted log does.
const walCheckpointBytes = 8 << 20

// restartBusyTimeout is how long a restart waits for readers of older
// snapshots (a watch replaying the change log to a slow consumer may hold one
// for long) before it gives up and retries after a delay that starts at
// minRestartDelay and doubles up to maxRestartDelay; writes wait meanwhile,
// so it is short.
const (
	restartBusyTimeout = 20 * time.Millisecond
	minRestartDelay    = 250 * time.Millisecond
	maxRestartDelay    = 4 * time.Second
)

func newWriter(s *Store) (*writer, error) {
	w := &writer{s: s, walPath: s.cfg.Path + "-wal"}
	var err error
	prep := func(q string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = s.db.Prepare(q)
		return st
	}
	w.insLog = prep(`INSERT INTO log(rev, type, resource, namespace, name, value, labels, fields, prev_rev) VALUES (?,?,?,?,?,?,?,?,?)`)
	w.upObj = prep(`INSERT INTO objects(resource, namespace, name, rev) VALUES (?,?,?,?)
		ON CONFLICT(resource, namespace, name) DO UPDATE SET rev = excluded.rev`)
	w.delObj = prep(`DELETE FROM objects WHERE resource = ? AND namespace = ? AND name = ?`)
	w.put = prep(`UPDATE meta SET v = ? WHERE k = ?`)
	if err != nil {
		return nil, fmt.Errorf("prepare statements: %w", err)
	}
	return w, nil
}

func (s *Store) submit(ctx context.Context, o *op) (opResult, error) {
	o.res = make(chan opResult, 1)
	// sendMu orders sends before Close: once Close holds it, nothing more
	// enters the queue, so the writer's final drain answers every op.
	s.sendMu.RLock()
	if s.sendClosed {
		s.sendMu.RUnlock()
		return opResult{}, store.ErrClosed
	}
	select {
	case s.ops <- o:
		s.sendMu.RUnlock()
	case <-ctx.Done():
		s.sendMu.RUnlock()
		return opResult{}, fmt.Errorf("queue write: %w", ctx.Err())
	}
	// Once queued, the write happens; wait for it even if ctx ends so the
	// caller never mistakes a committed write for a failed one.
	r := <-o.res
	return r, r.err
}

func (s *Store) checkObject(obj store.Object) error {
	if obj.Resource == "" || obj.Name == "" {
		return fmt.Errorf("write %v: resource and name are required", obj.Key)
	}
	if len(obj.Value) > s.cfg.MaxValueSize {
		return fmt.Errorf("write %v: %d bytes: %w", obj.Key, len(obj.Value), store.ErrTooLarge)
	}
	return nil
}

// Create stores a new object.
func (s *Store) Create(ctx context.Context, obj store.Object) (int64, error) {
	if err := s.checkObject(obj); err != nil {
		return 0, err
	}
	r, err := s.submit(ctx, &op{kind: opCreate, obj: cloneObject(obj)})
	return r.rev, err
}

// Update replaces an existing object.
func (s *Store) Update(ctx context.Context, obj store.Object, expected int64) (int64, error) {
	if err := s.checkObject(obj); err != nil {
		return 0, err
	}
	r, err := s.submit(ctx, &op{kind: opUpdate, obj: cloneObject(obj), expected: expected})
	return r.rev, err
}

// Delete removes an object and returns its last state.
func (s *Store) Delete(ctx context.Context, key store.Key, expected int64) (store.Object, error) {
	r, err := s.submit(ctx, &op{kind: opDelete, obj: store.Object{Key: key}, expected: expected})
	return r.obj, err
}

func (w *writer) run() {
	s := w.s
	defer close(s.done)
	tick := time.NewTicker(s.cfg.CompactInterval)
	defer tick.Stop()
	compacting := false
	var compactDone chan struct{}
	batch := make([]*op, 0, s.cfg.MaxBatch)
	for {
		batch = batch[:0]
		select {
		case o := <-s.ops:
			batch = append(batch, o)
		case <-tick.C:
			if !compacting {
				compacting = true
				compactDone = make(chan struct{})
				go func(done chan struct{}) {
					s.compact()
					close(done)
				}(compactDone)
			}
			continue
		case <-compactDone:
			compacting = false
			compactDone = nil
			continue
		case <-s.quit:
			// Flush whatever is queued, then stop.
			for {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
					if len(batch) < s.cfg.MaxBatch {
						continue
					}
					w.commit(batch)
					batch = batch[:0]
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				w.commit(batch)
			}
			if compactDone != nil {
				<-compactDone
			}
			return
		}
		var wait <-chan time.Time
		if s.cfg.BatchWait > 0 {
			wait = time.After(s.cfg.BatchWait)
		}
	fill:
		for len(batch) < s.cfg.MaxBatch {
			if wait == nil {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
				default:
					break fill
				}
				continue
			}
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			case <-wait:
				break fill
			}
		}
		w.commit(batch)
		w.boundWAL()
	}
}

// boundWAL restarts the write-ahead log once it exceeds walCheckpointBytes.
// Only the writer goroutine commits, so no write can slip in between the
// checkpoint and the next batch, which begins the log again at its start.
func (w *writer) boundWAL() {
	fi, err := os.Stat(w.walPath)
	if err != nil || fi.Size() <= walCheckpointBytes {
		return
	}
	s := w.s
	now := time.Now()
	if now.Before(w.nextRestart) {
		return
	}
	ctx := context.Background()
	c, err := s.db.Conn(ctx)
	if err != nil {
		s.log.Warn("restart write-ahead log", "err", err)
		return
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", restartBusyTimeout.Milliseconds())); err != nil {
		s.log.Warn("restart write-ahead log", "err", err)
		return
	}
	var busy, frames, copied int64
	s.ckptMu.Lock()
	err = c.QueryRowContext(ctx, `PRAGMA wal_checkpoint(RESTART)`).Scan(&busy, &frames, &copied)
	s.ckptMu.Unlock()
	if _, err2 := c.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", busyTimeout.Milliseconds())); err2 != nil {
		s.log.Warn("restore busy timeout", "err", err2)
	}
	if err == nil && busy == 0 {
		w.restartDelay = 0
		return
	}
	if err != nil {
		s.log.Warn("restart write-ahead log", "err", err)
	}
	// A reader still uses an older snapshot; the log grows meanwhile.
	w.restartDelay = min(max(2*w.restartDelay, minRestartDelay), maxRestartDelay)
	w.nextRestart = now.Add(w.restartDelay)
}

func sameMap(a, b map[string]string) bool {
	return len(a) == len(b) && maps.Equal(a, b)
}

// commit applies one batch in one transaction, then publishes it.
func (w *writer) commit(batch []*op) {
	s := w.s
	s.mu.RLock()
	rev := s.rev
	s.mu.RUnlock()
	overlay := map[store.Key]*state{}
	lookup := func(k store.Key) *state {
		if st, ok := overlay[k]; ok {
			return st
		}
		s.mu.RLock()
		st := s.getLocked(k)
		s.mu.RUnlock()
		return st
	}
	work := make([]pending, 0, len(batch))
	var compactTo int64
	for _, o := range batch {
		k := o.obj.Key
		cur := lookup(k)
		p := pending{op: o, key: k, prev: cur}
		switch o.kind {
		case opCompact:
			compactTo = max(compactTo, o.compact)
			work = append(work, p)
			continue
		case opCreate:
			if cur != nil {
				p.res.err = fmt.Errorf("create %v: %w", k, store.ErrExists)
				work = append(work, p)
				continue
			}
		case opUpdate, opDelete:
			if cur == nil {
				p.res.err = fmt.Errorf("%s %v: %w", verb(o.kind), k, store.ErrNotFound)
				work = append(work, p)
				continue
			}
			if o.expected != 0 && o.expected != cur.rev {
				p.res.err = fmt.Errorf("%s %v at revision %d, current %d: %w", verb(o.kind), k, o.expected, cur.rev, store.ErrConflict)
				work = append(work, p)
				continue
			}
			if o.kind == opUpdate && bytes.Equal(cur.value, o.obj.Value) && sameMap(cur.labels, o.obj.Labels) && sameMap(cur.fields, o.obj.Fields) {
				p.res.rev = cur.rev
				work = append(work, p)
				continue
			}
		}
		rev++
		var ev store.Event
		if o.kind == opDelete {
			p.next = nil
			dead := viewOf(k, cur)
			dead.Revision = rev
			prev := viewOf(k, cur)
			ev = store.Event{Type: store.Deleted, Object: dead, Prev: &prev}
			p.res.obj = cloneObject(dead)
		} else {
			p.next = &state{value: o.obj.Value, labels: o.obj.Labels, fields: o.obj.Fields, rev: rev}
			if p.next.value == nil {
				p.next.value = []byte{}
			}
			ev = store.Event{Type: store.Added, Object: viewOf(k, p.next)}
			if cur != nil {
				prev := viewOf(k, cur)
				ev.Type = store.Modified
				ev.Prev = &prev
			}
		}
		p.res.rev = rev
		p.ev = &ev
		overlay[k] = p.next
		work = append(work, p)
	}
	err := w.write(work, rev, compactTo)
	if err != nil {
		s.log.Error("commit batch", "ops", len(batch), "err", err)
		for i := range work {
			if work[i].res.err == nil {
				work[i].op.res <- opResult{err: fmt.Errorf("commit batch: %w", err)}
			}
		}
		for i := range work {
			if work[i].res.err != nil {
				work[i].op.res <- work[i].res
			}
		}
		return
	}
	s.mu.Lock()
	for i := range work {
		p := &work[i]
		if p.ev == nil {
			continue
		}
		if p.next == nil {
			s.removeLocked(p.key)
		} else {
			s.putLocked(p.key, p.next)
		}
		s.publishLocked(p.ev)
	}
	s.rev = rev
	if compactTo > s.compacted {
		s.compacted = compactTo
	}
	s.mu.Unlock()
	for i := range work {
		work[i].op.res <- work[i].res
	}
}

func verb(k opKind) string {
	switch k {
	case opCreate:
		return "create"
	case opUpdate:
		return "update"
	case opDelete:
		return "delete"
	}
	return "compact"
}

func (w *writer) write(work []pending, rev, compactTo int64) (err error) {
	s := w.s
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	insLog, upObj, delObj := tx.Stmt(w.insLog), tx.Stmt(w.upObj), tx.Stmt(w.delObj)
	wrote := false
	for i := range work {
		p := &work[i]
		if p.op.kind == opCompact {
			if err := w.compactChunk(tx, p.op.expected, p.op.chunkTo, p.op.compact); err != nil {
				return err
			}
			continue
		}
		if p.ev == nil {
			continue
		}
		wrote = true
		k := p.key
		var prevRev int64
		if p.prev != nil {
			prevRev = p.prev.rev
		}
		if p.next == nil {
			if _, err := insLog.Exec(p.res.rev, int(store.Deleted), k.Resource, k.Namespace, k.Name, nil, nil, nil, prevRev); err != nil {
				return fmt.Errorf("log delete of %v: %w", k, err)
			}
			if _, err := delObj.Exec(k.Resource, k.Namespace, k.Name); err != nil {
				return fmt.Errorf("delete %v: %w", k, err)
			}
			continue
		}
		if _, err := insLog.Exec(p.res.rev, int(p.ev.Type), k.Resource, k.Namespace, k.Name, p.next.value, rowcodec.EncodeMap(p.next.labels), rowcodec.EncodeMap(p.next.fields), prevRev); err != nil {
			return fmt.Errorf("log write of %v: %w", k, err)
		}
		if _, err := upObj.Exec(k.Resource, k.Namespace, k.Name, p.res.rev); err != nil {
			return fmt.Errorf("write %v: %w", k, err)
		}
	}
	put := tx.Stmt(w.put)
	if wrote {
		if _, err := put.Exec(rev, "rev"); err != nil {
			return fmt.Errorf("persist revision: %w", err)
		}
	}
	if compactTo > 0 {
		if _, err := tx.Exec(`UPDATE meta SET v = max(v, ?) WHERE k = 'compacted'`, compactTo); err != nil {
			return fmt.Errorf("persist compacted revision: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// compactChunk deletes log rows in (from, to] that are neither current nor
// the previous state of a row above compacted, the compacted revision the
// same batch sets: only rows above it can still be replayed.
func (w *writer) compactChunk(tx *sql.Tx, from, to, compacted int64) error {
	_, err := tx.Exec(`DELETE FROM log WHERE rev > ?1 AND rev <= ?2
		AND NOT EXISTS (SELECT 1 FROM objects o WHERE o.rev = log.rev)
		AND NOT EXISTS (SELECT 1 FROM log n WHERE n.prev_rev = log.rev AND n.rev > ?3)`, from, to, compacted)
	if err != nil {
		return fmt.Errorf("compact log: %w", err)
	}
	return nil
}

const compactChunk = 1000
