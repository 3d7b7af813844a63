package sqlite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tether-edge/tether/store"
)

func TestPragmas(t *testing.T) {
	s := openAt(t, t.TempDir(), Config{})
	defer s.Close()
	for _, tt := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"synchronous", "2"},
		{"auto_vacuum", "2"},
		{"wal_autocheckpoint", "0"},
		{"journal_size_limit", fmt.Sprint(walCheckpointBytes)},
	} {
		var got string
		if err := s.db.QueryRow("PRAGMA " + tt.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", tt.pragma, err)
		}
		if got != tt.want {
			t.Errorf("PRAGMA %s = %s, want %s", tt.pragma, got, tt.want)
		}
	}
}

func TestBackgroundCompaction(t *testing.T) {
	dir := t.TempDir()
	s := openAt(t, dir, Config{Retain: 100, CompactInterval: 20 * time.Millisecond})
	defer s.Close()
	ctx := context.Background()
	hot := store.Object{Key: store.Key{Resource: "leases", Namespace: "ns", Name: "hot"}, Value: []byte("0")}
	rev, err := s.Create(ctx, hot)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := s.Create(ctx, store.Object{Key: store.Key{Resource: "pods", Namespace: "ns", Name: fmt.Sprint(i)}, Value: []byte("p")}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		hot.Value = []byte(fmt.Sprint(i))
		if rev, err = s.Update(ctx, hot, rev); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.CompactedRevision() < s.Revision()-100 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if c := s.CompactedRevision(); c < s.Revision()-100 {
		t.Fatalf("compacted revision %d, current %d, retain 100", c, s.Revision())
	}
	var rows int
	if err := s.db.QueryRow(`SELECT count(*) FROM log`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	// Retained revisions plus current states and their previous states.
	if rows > 100+51+51 {
		t.Fatalf("change log holds %d rows after compaction", rows)
	}
	// Everything current survives compaction and a restart.
	s.Close()
	s = openAt(t, dir, Config{})
	defer s.Close()
	res, err := s.List(ctx, store.ListOptions{Resource: "pods"})
	if err != nil || len(res.Objects) != 50 {
		t.Fatalf("List after compaction: %d objects, %v", len(res.Objects), err)
	}
	got, err := s.Get(ctx, hot.Key)
	if err != nil || string(got.Value) != "999" || got.Revision != rev {
		t.Fatalf("Get hot: %q at %d, %v", got.Value, got.Revision, err)
	}
}
