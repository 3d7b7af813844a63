package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

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

func TestConformance(t *testing.T) {
	c := pgtest.Start(t)
	storetest.Run(t, opener(c, Config{}))
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
