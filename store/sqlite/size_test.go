package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-edge/tether/store/internal/rowcodec"
)

// fileSize is the size of path, 0 if it does not exist.
func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestSizeUnderSustainedWrites writes pods one commit at a time without
// pause, as a busy hub does, and checks that the database and its
// write-ahead log stay within a small multiple of the rows the store must
// keep, and that pages freed by compaction are used again.
func TestSizeUnderSustainedWrites(t *testing.T) {
	objects := 2000
	if testing.Short() {
		objects = 500
	}
	dir := t.TempDir()
	s := openAt(t, dir, Config{})
	defer s.Close()
	path := filepath.Join(dir, "tether.db")
	ctx := context.Background()
	var peak, peakWAL, rowBytes int64
	measure := func() {
		wal := fileSize(t, path+"-wal")
		peak = max(peak, fileSize(t, path)+wal)
		peakWAL = max(peakWAL, wal)
	}
	revs := make([]int64, objects)
	// write creates (gen 0) or updates every pod once and returns the
	// bytes of the rows written.
	write := func(gen int) int64 {
		var n int64
		for i := range objects {
			o := benchPod(int64(i))
			o.Value = fmt.Appendf(append([]byte(nil), o.Value[:len(o.Value)-1]...), `,"gen":%d}`, gen)
			var err error
			if gen == 0 {
				revs[i], err = s.Create(ctx, o)
			} else {
				revs[i], err = s.Update(ctx, o, revs[i])
			}
			if err != nil {
				t.Fatal(err)
			}
			n += int64(len(o.Value) + len(rowcodec.EncodeMap(o.Labels)) + len(rowcodec.EncodeMap(o.Fields)) + len(o.Name))
			if i%50 == 0 {
				measure()
			}
		}
		measure()
		return n
	}
	// Two versions of every pod: nothing is compacted yet, so the log
	// holds both.
	rowBytes += write(0)
	rowBytes += write(1)
	twoVersions := fileSize(t, path)
	// Pages are at most half empty after splits; anything beyond a few
	// times the rows plus the WAL bound is an unbounded WAL.
	const slack = 3
	limit := slack*rowBytes + walCheckpointBytes + walCheckpointBytes/2
	t.Logf("%d writes, %d bytes of rows, peak size on disk %d bytes (peak WAL %d), limit %d",
		2*objects, rowBytes, peak, peakWAL, limit)
	if peak > limit {
		t.Fatalf("database and WAL reached %d bytes for %d bytes of rows; limit %d", peak, rowBytes, limit)
	}
	if peakWAL > 2*walCheckpointBytes {
		t.Fatalf("WAL reached %d bytes; bound %d", peakWAL, walCheckpointBytes)
	}
	// Compaction down to the current versions frees half the log; the
	// next round of updates must fill those pages rather than grow the
	// file.
	for gen := 2; gen < 4; gen++ {
		if err := s.Compact(ctx, s.Revision()); err != nil {
			t.Fatal(err)
		}
		// Only the current version of each pod is left: its previous
		// one is below the compacted revision, however far back.
		var rows int
		if err := s.db.QueryRow(`SELECT count(*) FROM log`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows != objects {
			t.Fatalf("change log holds %d rows after compacting to the current revision, want %d", rows, objects)
		}
		write(gen)
	}
	after := fileSize(t, path)
	t.Logf("database file %d bytes with two versions of each pod, %d after two more rounds of compaction and updates", twoVersions, after)
	if after > twoVersions+twoVersions/4 {
		t.Fatalf("database grew from %d to %d bytes holding as many rows: freed pages are not reused", twoVersions, after)
	}
	var check string
	if err := s.db.QueryRow(`PRAGMA quick_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("quick_check: %q, %v", check, err)
	}
}

// TestWALRestartWaitsForReaders holds a read transaction on an old snapshot,
// as a watch replaying the change log to a slow consumer does, while writes
// go on: the writes must not stall, and once the reader is done the WAL must
// come back within its bound.
func TestWALRestartWaitsForReaders(t *testing.T) {
	dir := t.TempDir()
	s := openAt(t, dir, Config{})
	defer s.Close()
	wal := filepath.Join(dir, "tether.db-wal")
	ctx := context.Background()
	i := int64(0)
	create := func() {
		t.Helper()
		if _, err := s.Create(ctx, benchPod(i)); err != nil {
			t.Fatal(err)
		}
		i++
	}
	create()
	tx, err := s.rdb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM log`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	for fileSize(t, wal) <= 2*walCheckpointBytes {
		create()
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for fileSize(t, wal) > walCheckpointBytes {
		if time.Now().After(deadline) {
			t.Fatalf("WAL still %d bytes after the reader ended; bound %d", fileSize(t, wal), walCheckpointBytes)
		}
		create()
	}
	t.Logf("%d creates; WAL back to %d bytes", i, fileSize(t, wal))
}
