package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-edge/tether/store"
)

// compactChunk is how many revisions one compaction transaction covers, so
// that writers wait for the lock only briefly.
const compactChunk = 1000

// Compact removes change-log entries up to rev, in chunks, and moves the
// compacted revision there. Background compaction does the same on its own
// schedule; rev above the current revision is an error. Rows that are still
// current, or that a retained row needs as its previous state, stay.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	cur := s.Revision()
	if rev > cur {
		return fmt.Errorf("compact to %d, current %d: %w", rev, cur, store.ErrFutureRevision)
	}
	if rev <= 0 {
		return nil
	}
	var from int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(min(rev), 1) - 1 FROM tether_log`).Scan(&from); err != nil {
		return fmt.Errorf("find oldest log entry: %w", unavailable(err))
	}
	// The first chunk already moves the compacted revision to rev, so that
	// every chunk may delete a row whose successor is at or below rev.
	for first := true; first || from < rev; first = false {
		to := min(from+compactChunk, rev)
		if err := s.compactChunk(ctx, from, to, rev); err != nil {
			return err
		}
		from = to
	}
	s.noteCompacted(rev)
	return nil
}

// compactChunk deletes log rows in (from, to] that are neither current nor
// the previous state of a row above compacted, and raises the compacted
// revision, in one transaction under the write lock.
func (s *Store) compactChunk(ctx context.Context, from, to, compacted int64) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin compaction: %w", unavailable(err))
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLock); err != nil {
		return fmt.Errorf("take write lock: %w", unavailable(err))
	}
	if _, err := tx.Exec(ctx, `UPDATE tether_counter SET compacted = greatest(compacted, $1) WHERE id = 1`, compacted); err != nil {
		return fmt.Errorf("move compacted revision: %w", unavailable(err))
	}
	if to > from {
		_, err = tx.Exec(ctx, `DELETE FROM tether_log l WHERE l.rev > $1 AND l.rev <= $2
			AND NOT EXISTS (SELECT 1 FROM tether_objects o WHERE o.rev = l.rev)
			AND NOT EXISTS (SELECT 1 FROM tether_log n WHERE n.prev_rev = l.rev AND n.prev_rev > 0 AND n.rev > $3)`, from, to, compacted)
		if err != nil {
			return fmt.Errorf("compact log: %w", unavailable(err))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit compaction: %w", unavailable(err))
	}
	return nil
}

// compactLoop applies the retention bounds every CompactInterval.
func (s *Store) compactLoop() {
	t := time.NewTicker(s.cfg.CompactInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.compactOnce()
	}
}

func (s *Store) compactOnce() {
	now := time.Now()
	rev, compacted := s.Revision(), s.CompactedRevision()
	s.checkpoints = append(s.checkpoints, checkpoint{at: now, rev: rev})
	target := rev - s.cfg.Retain
	cut := 0
	for i, c := range s.checkpoints {
		if now.Sub(c.at) >= s.cfg.RetainFor {
			target = max(target, c.rev)
			cut = i
		}
	}
	s.checkpoints = s.checkpoints[cut:]
	if target <= compacted {
		return
	}
	if err := s.Compact(s.ctx, target); err != nil && s.ctx.Err() == nil {
		s.log.Error("compact change log", "revision", target, "err", err)
	}
}
