package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/postgres/pgtest"
	"github.com/tether-edge/tether/store/storetest"
)

// opener gives each directory the suite hands out its own database, so that
// reopening a directory reopens the same data.
func opener(c *pgtest.Cluster, cfg Config) storetest.Opener {
	var mu sync.Mutex
	dsns := map[string]string{}
	return func(t *testing.T, dir string) store.Store {
		mu.Lock()
		dsn, ok := dsns[dir]
		if !ok {
			dsn = c.NewDatabase()
			dsns[dir] = dsn
		}
		mu.Unlock()
		cfg := cfg
		cfg.DSN = dsn
		s, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	}
}

// TestConformance takes every watch's events through store.Batcher, as
// the hub's storage does; TestConformanceSmallBuffers through Events,
// mostly replayed from the change log past a ring of four events.
func TestConformance(t *testing.T) {
	open := opener(pgtest.Start(t), Config{})
	storetest.Run(t, func(t *testing.T, dir string) store.Store {
		return storetest.Batched(open(t, dir))
	})
}

func TestConformanceSmallBuffers(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	c := pgtest.Start(t)
	storetest.Run(t, opener(c, Config{WatchCache: 4, WatchQueue: 3000, MaxBatch: 32}))
}

func mustOpen(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOpenRefusesUnreachable(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	_, err := Open(context.Background(), Config{DSN: "postgres://postgres@/tether?host=" + dir + "&sslmode=disable", ConnectTimeout: 2 * time.Second})
	if err == nil || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "connect to postgres") {
		t.Fatalf("Open of an unreachable server: %v, want a connect error matching ErrUnavailable", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Open took %v to fail", d)
	}
	_, err = Open(context.Background(), Config{DSN: "postgres://x:secret@host:notaport/db"})
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("Open of a malformed DSN: %v, want an error without the password", err)
	}
}

// dump returns the rows of tether's tables, to show that a refused Open
// wrote nothing.
func dump(t *testing.T, dsn string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var out strings.Builder
	for _, q := range []string{
		`SELECT k || '=' || v FROM tether_meta ORDER BY k`,
		`SELECT rev || '/' || compacted FROM tether_counter`,
		`SELECT rev || ' ' || name FROM tether_log ORDER BY rev`,
		`SELECT name || '@' || rev FROM tether_objects ORDER BY name`,
	} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out.WriteString(s + "\n")
		}
		rows.Close()
	}
	return out.String()
}

func TestOpenRefusesOtherCluster(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase()
	s, err := Open(context.Background(), Config{DSN: dsn, ClusterID: "cluster-a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(context.Background(), store.Object{Key: store.Key{Resource: "pods", Namespace: "ns", Name: "a"}, Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	before := dump(t, dsn)
	_, err = Open(context.Background(), Config{DSN: dsn, ClusterID: "cluster-b"})
	if err == nil || !strings.Contains(err.Error(), "holds cluster cluster-a, not this hub's cluster cluster-b") {
		t.Fatalf("Open of another cluster's database: %v", err)
	}
	if after := dump(t, dsn); after != before {
		t.Fatalf("refused Open changed the database:\n%s\nbefore:\n%s", after, before)
	}
	// The right cluster, and a caller that names none, may open it.
	s = mustOpen(t, Config{DSN: dsn, ClusterID: "cluster-a"})
	if s.ClusterID() != "cluster-a" || s.Revision() != 1 {
		t.Fatalf("reopened cluster %q at revision %d", s.ClusterID(), s.Revision())
	}
	s.Close()
	s = mustOpen(t, Config{DSN: dsn, NewClusterID: "cluster-c"})
	if s.ClusterID() != "cluster-a" {
		t.Fatalf("cluster id %q", s.ClusterID())
	}
	s.Close()
	// An empty database records NewClusterID when no ClusterID is given.
	s = mustOpen(t, Config{DSN: c.NewDatabase(), NewClusterID: "cluster-c"})
	if s.ClusterID() != "cluster-c" {
		t.Fatalf("new database's cluster id %q, want cluster-c", s.ClusterID())
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase()
	mustOpen(t, Config{DSN: dsn}).Close()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE tether_meta SET v = '99' WHERE k = 'schema_version'`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	before := dump(t, dsn)
	_, err = Open(ctx, Config{DSN: dsn})
	if err == nil || !strings.Contains(err.Error(), "schema version 99, newer than this tether's 1") {
		t.Fatalf("Open of a newer schema: %v", err)
	}
	if after := dump(t, dsn); after != before {
		t.Fatalf("refused Open changed the database:\n%s\nbefore:\n%s", after, before)
	}
}

// TestDatabaseRestart stops the server under writes: operations fail with
// ErrUnavailable meanwhile, and once it is back the same Store writes again,
// every acknowledged write is there, and a watch started before the outage
// delivers every acknowledged write without a gap.
func TestDatabaseRestart(t *testing.T) {
	c := pgtest.Start(t)
	s := mustOpen(t, Config{DSN: c.NewDatabase(), ConnectTimeout: time.Second, WriteTimeout: 5 * time.Second})
	ctx := context.Background()
	w, err := s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: s.Revision()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	acked := map[int64]store.Key{}
	var failed []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := store.Key{Resource: "pods", Namespace: "ns", Name: fmt.Sprintf("p%d-%d", g, i)}
				rev, err := s.Create(ctx, store.Object{Key: k, Value: []byte("v")})
				mu.Lock()
				if err == nil {
					acked[rev] = k
				} else {
					failed = append(failed, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked), len(failed)
	}
	waitFor(t, "writes before the outage", func() bool { n, _ := count(); return n >= 50 })
	c.Stop()
	_, f0 := count()
	waitFor(t, "writes failing during the outage", func() bool { _, f := count(); return f >= f0+4 })
	_, err = s.Get(ctx, store.Key{Resource: "pods", Namespace: "ns", Name: "p0-0"})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Get during the outage: %v, want ErrUnavailable", err)
	}
	_, err = s.List(ctx, store.ListOptions{Resource: "pods"})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("List during the outage: %v, want ErrUnavailable", err)
	}
	mu.Lock()
	for _, err := range failed {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("write during the outage: %v, want ErrUnavailable", err)
		}
	}
	t.Logf("during the outage: %v", failed[len(failed)-1])
	mu.Unlock()
	n0, _ := count()
	c.Start()
	waitFor(t, "writes after the outage", func() bool { n, _ := count(); return n >= n0+50 })
	close(stop)
	wg.Wait()
	for rev, k := range acked {
		got, err := s.Get(ctx, k)
		if err != nil || got.Revision != rev {
			t.Fatalf("acknowledged write %v at %d: %v at %d", k, rev, err, got.Revision)
		}
	}
	// A write whose commit the outage cut off is reported as failed but may
	// have been committed: the watch may deliver it too, in order.
	revs := slices.Sorted(maps.Keys(acked))
	var evs []int64
	timeout := time.After(20 * time.Second)
	for len(evs) == 0 || evs[len(evs)-1] < revs[len(revs)-1] {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch ended after %d events: %v", len(evs), w.Err())
			}
			if len(evs) > 0 && ev.Object.Revision <= evs[len(evs)-1] {
				t.Fatalf("watch delivered revision %d after %d", ev.Object.Revision, evs[len(evs)-1])
			}
			evs = append(evs, ev.Object.Revision)
		case <-timeout:
			t.Fatalf("watch delivered %d events, up to %v", len(evs), evs[len(evs)-1:])
		}
	}
	for _, r := range revs {
		if _, ok := slices.BinarySearch(evs, r); !ok {
			t.Fatalf("watch skipped acknowledged revision %d", r)
		}
	}
	if extra := len(evs) - len(revs); extra > 0 {
		t.Logf("%d writes reported as failed were committed", extra)
	}
	t.Logf("%d writes acknowledged across the outage, %d refused", len(acked), len(failed))
}

// TestTwoServersShareRevisions writes through two Stores on one database at
// once, as two hubs would: the revisions they acknowledge are exactly
// 1..n, no gaps and no duplicates, and a watch on either Store delivers all
// of them in order, including the other's.
func TestTwoServersShareRevisions(t *testing.T) {
	c := pgtest.Start(t)
	dsn := c.NewDatabase()
	a := mustOpen(t, Config{DSN: dsn})
	b := mustOpen(t, Config{DSN: dsn})
	ctx := context.Background()
	var watchers []store.Watcher
	for _, s := range []*Store{a, b} {
		w, err := s.Watch(ctx, store.WatchOptions{Resource: "pods"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		watchers = append(watchers, w)
	}
	const each = 150
	var mu sync.Mutex
	var acked []int64
	var wg sync.WaitGroup
	for i, s := range []*Store{a, b} {
		for g := range 6 {
			wg.Go(func() {
				for j := range each {
					k := store.Key{Resource: "pods", Namespace: "ns", Name: fmt.Sprintf("s%d-%d-%d", i, g, j%10)}
					var rev int64
					var err error
					if j < 10 {
						rev, err = s.Create(ctx, store.Object{Key: k, Value: []byte("v0")})
					} else {
						rev, err = s.Update(ctx, store.Object{Key: k, Value: fmt.Appendf(nil, "v%d", j)}, 0)
					}
					if err != nil {
						t.Errorf("write through server %d: %v", i, err)
						return
					}
					mu.Lock()
					acked = append(acked, rev)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.Sort(acked)
	for i, r := range acked {
		if r != int64(i+1) {
			t.Fatalf("acknowledged revisions are not 1..%d: at %d found %d", len(acked), i+1, r)
		}
	}
	for i, w := range watchers {
		for n := range len(acked) {
			select {
			case ev, ok := <-w.Events():
				if !ok {
					t.Fatalf("watch on server %d ended: %v", i, w.Err())
				}
				if ev.Object.Revision != int64(n+1) {
					t.Fatalf("watch on server %d delivered revision %d as event %d", i, ev.Object.Revision, n+1)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("watch on server %d delivered %d of %d events", i, n, len(acked))
			}
		}
	}
	if a.Revision() != int64(len(acked)) || b.Revision() != int64(len(acked)) {
		t.Fatalf("revisions %d and %d after %d writes", a.Revision(), b.Revision(), len(acked))
	}
}

// TestFeedReportsCompactedGap rewinds the change feed below a compaction,
// as if this server had not read the log while another compacted it: the
// feed finds revisions missing and ends with ErrCompacted the watches that
// needed them rather than skipping events silently, while a watch that
// starts above the gap (opened while the feed lagged) needs none of them
// and goes on.
func TestFeedReportsCompactedGap(t *testing.T) {
	c := pgtest.Start(t)
	s := mustOpen(t, Config{DSN: c.NewDatabase()})
	ctx := context.Background()
	k := store.Key{Resource: "pods", Namespace: "ns", Name: "a"}
	rev, err := s.Create(ctx, store.Object{Key: k, Value: []byte("0")})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if rev, err = s.Update(ctx, store.Object{Key: k, Value: fmt.Appendf(nil, "%d", i+1)}, rev); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the feed to catch up", func() bool { return s.feedPosition() == rev })
	needs, err := s.Watch(ctx, store.WatchOptions{Revision: rev - 10})
	if err != nil {
		t.Fatal(err)
	}
	above, err := s.Watch(ctx, store.WatchOptions{Revision: rev})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.feedRev = 5
	s.mu.Unlock()
	s.poke()
	// The ring held (rev-10, rev] before the rewind; then the gap ends it.
	deadline := time.After(20 * time.Second)
	for ended := false; !ended; {
		select {
		case ev, ok := <-needs.Events():
			if ok && ev.Object.Revision > rev {
				t.Fatalf("event at %d from a feed with a gap", ev.Object.Revision)
			}
			ended = !ok
		case <-deadline:
			t.Fatal("watch below the gap not ended")
		}
	}
	if err := needs.Err(); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch ended with %v, want ErrCompacted", err)
	}
	t.Logf("watch ended: %v", needs.Err())
	waitFor(t, "the feed past the gap", func() bool { return s.feedPosition() == rev })
	next, err := s.Update(ctx, store.Object{Key: k, Value: []byte("after")}, rev)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev, ok := <-above.Events():
		if !ok {
			t.Fatalf("watch above the gap ended: %v", above.Err())
		}
		if ev.Object.Revision != next {
			t.Fatalf("watch above the gap got revision %d, want %d", ev.Object.Revision, next)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("watch above the gap got nothing")
	}
	above.Stop()
}
