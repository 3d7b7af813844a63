package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tether-edge/tether/store"
)

// importChunk is how many objects one import statement writes.
const importChunk = 500

// Import writes objects, keeping their revisions, into the empty store s
// and moves its revision to rev, for moving a cluster's state from another
// backend offline. The history before rev is not carried over: the
// compacted revision becomes rev, so watches from older revisions get
// store.ErrCompacted and clients list again. Import refuses a store that
// holds anything; it must run before any other write.
func (s *Store) Import(ctx context.Context, rev int64, objs []store.Object) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin import: %w", unavailable(err))
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLock); err != nil {
		return fmt.Errorf("take write lock: %w", unavailable(err))
	}
	var cur int64
	var used bool
	if err := tx.QueryRow(ctx, `SELECT rev, EXISTS (SELECT 1 FROM tether_log) FROM tether_counter WHERE id = 1`).Scan(&cur, &used); err != nil {
		return fmt.Errorf("read revision: %w", unavailable(err))
	}
	if cur != 0 || used {
		return fmt.Errorf("import: the database already holds a store at revision %d; import only into an empty one", cur)
	}
	seen := make(map[int64]bool, len(objs))
	for start := 0; start < len(objs); start += importChunk {
		chunk := objs[start:min(start+importChunk, len(objs))]
		rows := make([]logRow, len(chunk))
		for i, o := range chunk {
			if o.Revision <= 0 || o.Revision > rev || seen[o.Revision] {
				return fmt.Errorf("import %v: revision %d is not unique in (0, %d]", o.Key, o.Revision, rev)
			}
			if err := s.checkObject(o); err != nil {
				return fmt.Errorf("import: %w", err)
			}
			seen[o.Revision] = true
			rows[i] = logRow{rev: o.Revision, typ: store.Added, key: o.Key,
				next: &current{value: nonNil(o.Value), labels: o.Labels, fields: o.Fields, rev: o.Revision}}
		}
		if err := tx.SendBatch(ctx, queueRows(&pgx.Batch{}, rows, rev)).Close(); err != nil {
			return fmt.Errorf("import: %w", unavailable(err))
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE tether_counter SET rev = $1, compacted = $1 WHERE id = 1`, rev); err != nil {
		return fmt.Errorf("import: move revision: %w", unavailable(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit import: %w", unavailable(err))
	}
	s.noteRev(rev)
	s.noteCompacted(rev)
	// The imported rows are no events: the feed starts after them.
	s.mu.Lock()
	if s.feedRev < rev {
		s.feedRev = rev
		s.ring.Reset(rev)
	}
	s.mu.Unlock()
	return nil
}
