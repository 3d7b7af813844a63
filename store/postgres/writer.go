package postgres

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

type opKind int

const (
	opCreate opKind = iota
	opUpdate
	opDelete
)

type op struct {
	kind     opKind
	obj      store.Object
	expected int64
	res      chan opResult
}

type opResult struct {
	rev int64
	obj store.Object
	err error
}

// current is one key's state as the database holds it.
type current struct {
	value          []byte
	labels, fields map[string]string
	rev            int64
}

func (c *current) object(k store.Key) store.Object {
	return store.Object{Key: k, Value: c.value, Labels: c.labels, Fields: c.fields, Revision: c.rev}
}

// logRow is one change-log row a batch writes.
type logRow struct {
	rev     int64
	typ     store.EventType
	key     store.Key
	next    *current // nil for deletions
	prevRev int64
}

type writer struct {
	s *Store
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
	// Once queued, the write is attempted; wait for it even if ctx ends so
	// the caller never mistakes a committed write for a failed one.
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

// run drains the queue into one transaction per batch until Close.
func (w *writer) run() {
	s := w.s
	defer close(s.done)
	batch := make([]*op, 0, s.cfg.MaxBatch)
	for {
		batch = batch[:0]
		select {
		case o := <-s.ops:
			batch = append(batch, o)
		case <-s.quit:
			for {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
					if len(batch) == s.cfg.MaxBatch {
						w.commit(batch)
						batch = batch[:0]
					}
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				w.commit(batch)
			}
			return
		}
	fill:
		for len(batch) < s.cfg.MaxBatch {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		w.commit(batch)
	}
}

func sameMap(a, b map[string]string) bool {
	return len(a) == len(b) && maps.Equal(a, b)
}

func verb(k opKind) string {
	switch k {
	case opCreate:
		return "create"
	case opUpdate:
		return "update"
	}
	return "delete"
}

// commit runs one batch in one transaction and answers its operations.
func (w *writer) commit(batch []*op) {
	s := w.s
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WriteTimeout)
	defer cancel()
	results := make([]opResult, len(batch))
	last, err := w.apply(ctx, batch, results)
	if err != nil {
		err = unavailable(err)
		s.log.Error("commit batch", "ops", len(batch), "err", err)
		for i := range batch {
			batch[i].res <- opResult{err: fmt.Errorf("%s %v: %w", verb(batch[i].kind), batch[i].obj.Key, err)}
		}
		return
	}
	if last > 0 {
		s.noteRev(last)
		s.poke()
	}
	for i := range batch {
		batch[i].res <- results[i]
	}
}

// apply checks the batch against the current state under the write lock,
// writes it and commits; it returns the newest revision written (zero if
// none) and fills in each operation's result.
func (w *writer) apply(ctx context.Context, batch []*op, results []opResult) (int64, error) {
	s := w.s
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	// A connection left inside the transaction by a failure is closed
	// rather than reused, which rolls the transaction back.
	defer conn.Release()
	// One round trip: begin, take the lock (see the package
	// documentation: it orders revisions by commit), then read the counter
	// and the batch's keys. Each statement after the lock takes a snapshot
	// of its own, so they see every commit that came before the lock.
	keys := batchKeys(batch)
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	b.Queue(`SELECT pg_advisory_xact_lock($1)`, writeLock)
	b.Queue(`SELECT rev FROM tether_counter WHERE id = 1`)
	b.Queue(currentQuery, keys.res, keys.nss, keys.names)
	br := conn.SendBatch(ctx, b)
	var rev int64
	if _, err := br.Exec(); err != nil {
		br.Close()
		return 0, fmt.Errorf("begin: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return 0, fmt.Errorf("take write lock: %w", err)
	}
	if err := br.QueryRow().Scan(&rev); err != nil {
		br.Close()
		return 0, fmt.Errorf("read revision: %w", err)
	}
	cur, err := scanCurrent(br, len(batch))
	if err != nil {
		br.Close()
		return 0, err
	}
	if err := br.Close(); err != nil {
		return 0, fmt.Errorf("read current state: %w", err)
	}
	var rows []logRow
	for i, o := range batch {
		k := o.obj.Key
		c := cur[k]
		switch o.kind {
		case opCreate:
			if c != nil {
				results[i].err = fmt.Errorf("create %v: %w", k, store.ErrExists)
				continue
			}
		case opUpdate, opDelete:
			if c == nil {
				results[i].err = fmt.Errorf("%s %v: %w", verb(o.kind), k, store.ErrNotFound)
				continue
			}
			if o.expected != 0 && o.expected != c.rev {
				results[i].err = fmt.Errorf("%s %v at revision %d, current %d: %w", verb(o.kind), k, o.expected, c.rev, store.ErrConflict)
				continue
			}
			if o.kind == opUpdate && bytes.Equal(c.value, o.obj.Value) && sameMap(c.labels, o.obj.Labels) && sameMap(c.fields, o.obj.Fields) {
				results[i].rev = c.rev
				continue
			}
		}
		rev++
		row := logRow{rev: rev, key: k}
		if c != nil {
			row.prevRev = c.rev
		}
		if o.kind == opDelete {
			row.typ = store.Deleted
			dead := c.object(k)
			dead.Revision = rev
			results[i].obj = cloneObject(dead)
			cur[k] = nil
		} else {
			row.typ = store.Added
			if c != nil {
				row.typ = store.Modified
			}
			row.next = &current{value: nonNil(o.obj.Value), labels: o.obj.Labels, fields: o.obj.Fields, rev: rev}
			cur[k] = row.next
		}
		results[i].rev = rev
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		if _, err := conn.Exec(ctx, `COMMIT`); err != nil {
			return 0, fmt.Errorf("end transaction: %w", err)
		}
		return 0, nil
	}
	// The second and last round trip: the rows, the counter, the
	// notification and the commit.
	b = queueRows(&pgx.Batch{}, rows, rev)
	b.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("write %d changes and commit: %w", len(rows), err)
	}
	return rev, nil
}

type keyArrays struct{ res, nss, names []string }

// batchKeys returns the distinct keys of a batch as arrays for unnest.
func batchKeys(batch []*op) keyArrays {
	seen := make(map[store.Key]bool, len(batch))
	var k keyArrays
	for _, o := range batch {
		if seen[o.obj.Key] {
			continue
		}
		seen[o.obj.Key] = true
		k.res, k.nss, k.names = append(k.res, o.obj.Resource), append(k.nss, o.obj.Namespace), append(k.names, o.obj.Name)
	}
	return k
}

// currentQuery reads the current state of the keys given as three arrays.
const currentQuery = `SELECT o.resource, o.namespace, o.name, o.rev, l.value, l.labels, l.fields
	FROM unnest($1::text[], $2::text[], $3::text[]) AS k(resource, namespace, name)
	JOIN tether_objects o ON o.resource = k.resource AND o.namespace = k.namespace AND o.name = k.name
	JOIN tether_log l ON l.rev = o.rev`

// scanCurrent reads currentQuery's result; keys it lacks do not exist.
func scanCurrent(br pgx.BatchResults, n int) (map[store.Key]*current, error) {
	cur := make(map[store.Key]*current, n)
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read current state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k store.Key
		var c current
		var lb, fb []byte
		if err := rows.Scan(&k.Resource, &k.Namespace, &k.Name, &c.rev, &c.value, &lb, &fb); err != nil {
			return nil, fmt.Errorf("read current state: %w", err)
		}
		c.value = nonNil(c.value)
		if c.labels, err = rowcodec.DecodeMap(lb); err != nil {
			return nil, fmt.Errorf("read labels of %v: %w", k, err)
		}
		if c.fields, err = rowcodec.DecodeMap(fb); err != nil {
			return nil, fmt.Errorf("read fields of %v: %w", k, err)
		}
		cur[k] = &c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read current state: %w", err)
	}
	return cur, nil
}

// queueRows queues statements that append the log rows, point the objects
// at their newest rows, move the counter to rev and notify listeners.
func queueRows(b *pgx.Batch, rows []logRow, rev int64) *pgx.Batch {
	n := len(rows)
	var (
		revs, prevs       = make([]int64, n), make([]int64, n)
		types             = make([]int16, n)
		res, nss, names   = make([]string, n), make([]string, n), make([]string, n)
		vals, lbls, flds  = make([][]byte, n), make([][]byte, n), make([][]byte, n)
		final             = map[store.Key]*logRow{}
		upR, upN, upM     []string
		upRev             []int64
		delR, delN, delNm []string
	)
	for i := range rows {
		r := &rows[i]
		revs[i], prevs[i], types[i] = r.rev, r.prevRev, int16(r.typ)
		res[i], nss[i], names[i] = r.key.Resource, r.key.Namespace, r.key.Name
		if r.next != nil {
			vals[i], lbls[i], flds[i] = r.next.value, rowcodec.EncodeMap(r.next.labels), rowcodec.EncodeMap(r.next.fields)
		}
		final[r.key] = r
	}
	// One row per key: a batch may write a key more than once.
	for k, r := range final {
		if r.next == nil {
			delR, delN, delNm = append(delR, k.Resource), append(delN, k.Namespace), append(delNm, k.Name)
			continue
		}
		upR, upN, upM, upRev = append(upR, k.Resource), append(upN, k.Namespace), append(upM, k.Name), append(upRev, r.rev)
	}
	b.Queue(`INSERT INTO tether_log (rev, type, resource, namespace, name, value, labels, fields, prev_rev)
		SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[], $8::bytea[], $9::bigint[])`,
		revs, types, res, nss, names, vals, lbls, flds, prevs)
	if len(delR) > 0 {
		b.Queue(`DELETE FROM tether_objects o USING unnest($1::text[], $2::text[], $3::text[]) AS k(resource, namespace, name)
			WHERE o.resource = k.resource AND o.namespace = k.namespace AND o.name = k.name`, delR, delN, delNm)
	}
	if len(upR) > 0 {
		b.Queue(`INSERT INTO tether_objects (resource, namespace, name, rev)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
			ON CONFLICT (resource, namespace, name) DO UPDATE SET rev = excluded.rev`, upR, upN, upM, upRev)
	}
	b.Queue(`UPDATE tether_counter SET rev = $1 WHERE id = 1`, rev)
	b.Queue(`SELECT pg_notify($1, $2)`, notifyChannel, strconv.FormatInt(rev, 10))
	return b
}
