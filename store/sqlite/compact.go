package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-edge/tether/store"
)

// Compact removes change-log entries up to rev now, in chunks, and moves the
// compacted revision there. Background compaction does the same on its own
// schedule; rev above the current revision is an error.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	s.mu.RLock()
	cur, compacted := s.rev, s.compacted
	s.mu.RUnlock()
	if rev > cur {
		return fmt.Errorf("compact to %d, current %d: %w", rev, cur, store.ErrFutureRevision)
	}
	if rev <= compacted && rev <= 0 {
		return nil
	}
	// Start at the oldest row: rows kept earlier as current or previous
	// state may be free now.
	var from int64
	if err := s.rdb.QueryRowContext(ctx, `SELECT coalesce(min(rev), 1) - 1 FROM log`).Scan(&from); err != nil {
		return fmt.Errorf("find oldest log entry: %w", err)
	}
	if rev > compacted && from >= rev {
		_, err := s.submit(ctx, &op{kind: opCompact, compact: rev, expected: rev, chunkTo: rev})
		return err
	}
	// The first chunk already moves the compacted revision to rev, so that
	// every chunk may delete a row whose successor is at or below rev:
	// nothing replays from there any more. Bounding the kept previous
	// states by the chunk's end instead would keep, forever, every row
	// whose successor came more than a chunk later.
	for from < rev {
		to := min(from+compactChunk, rev)
		if _, err := s.submit(ctx, &op{kind: opCompact, compact: rev, expected: from, chunkTo: to}); err != nil {
			return fmt.Errorf("compact to %d: %w", to, err)
		}
		from = to
	}
	return nil
}

// compact applies the retention bounds; run by the writer's ticker.
func (s *Store) compact() {
	now := time.Now()
	s.mu.RLock()
	rev, compacted := s.rev, s.compacted
	s.mu.RUnlock()
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
	if err := s.Compact(context.Background(), target); err != nil {
		s.log.Error("compact change log", "revision", target, "err", err)
		return
	}
	if _, err := s.db.Exec(`PRAGMA incremental_vacuum(4096)`); err != nil {
		s.log.Error("vacuum database", "err", err)
	}
}
