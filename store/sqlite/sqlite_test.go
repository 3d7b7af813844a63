package sqlite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/storetest"
)

func openAt(t testing.TB, dir string, cfg Config) *Store {
	t.Helper()
	cfg.Path = filepath.Join(dir, "tether.db")
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// TestConformance takes every watch's events through store.Batcher, as
// the hub's storage does; TestConformanceSmallBuffers through Events,
// mostly replayed from the change log past a ring of four events.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, dir string) store.Store {
		return storetest.Batched(openAt(t, dir, Config{}))
	})
}

func TestConformanceSmallBuffers(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	storetest.Run(t, func(t *testing.T, dir string) store.Store {
		return openAt(t, dir, Config{WatchCache: 4, WatchQueue: 3000, MaxBatch: 7, BatchWait: time.Millisecond})
	})
}

const crashEnv = "TETHER_SQLITE_CRASH_DIR"

// TestMain runs the writer process of TestKillNine when the test binary
// is started as one, and the tests otherwise.
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir)
		return
	}
	os.Exit(m.Run())
}

// crashChild writes and prints every acknowledged write until it is
// killed.
func crashChild(dir string) {
	s, err := Open(Config{Path: filepath.Join(dir, "tether.db")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	var wg sync.WaitGroup
	pid := os.Getpid()
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				k := store.Key{Resource: "pods", Namespace: fmt.Sprint("p", pid), Name: fmt.Sprint(g, "-", i)}
				rev, err := s.Create(ctx, store.Object{Key: k, Value: []byte(strings.Repeat("x", 1500))})
				if err != nil {
					fmt.Fprintln(os.Stderr, "create:", err)
					os.Exit(3)
				}
				mu.Lock()
				fmt.Fprintf(out, "%s %s %d\n", k.Namespace, k.Name, rev)
				out.Flush()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestKillNine kills a writing process with SIGKILL and checks that every
// write it acknowledged survives, several times over the same database.
func TestKillNine(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	dir := t.TempDir()
	var lastRev int64
	for round := range 5 {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), crashEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		type ack struct {
			key store.Key
			rev int64
		}
		var acks []ack
		sc := bufio.NewScanner(stdout)
		deadline := time.Now().Add(time.Duration(200+round*150) * time.Millisecond)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				continue // test framework output
			}
			rev, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				continue
			}
			acks = append(acks, ack{store.Key{Resource: "pods", Namespace: f[0], Name: f[1]}, rev})
			if time.Now().After(deadline) && len(acks) > 100 {
				break
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		// Acknowledgements already in the pipe count too.
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 3 {
				if rev, err := strconv.ParseInt(f[2], 10, 64); err == nil {
					acks = append(acks, ack{store.Key{Resource: "pods", Namespace: f[0], Name: f[1]}, rev})
				}
			}
		}
		cmd.Wait()
		s := openAt(t, dir, Config{})
		ctx := context.Background()
		for _, a := range acks {
			got, err := s.Get(ctx, a.key)
			if err != nil {
				t.Fatalf("round %d: acknowledged write %v at %d lost: %v", round, a.key, a.rev, err)
			}
			if got.Revision != a.rev || len(got.Value) != 1500 {
				t.Fatalf("round %d: %v at %d, acknowledged at %d", round, a.key, got.Revision, a.rev)
			}
			if a.rev <= lastRev {
				t.Fatalf("round %d: revision %d reused after restart at %d", round, a.rev, lastRev)
			}
		}
		if s.Revision() < lastRev {
			t.Fatalf("round %d: revision went back from %d to %d", round, lastRev, s.Revision())
		}
		lastRev = s.Revision()
		t.Logf("round %d: %d acknowledged writes survived, revision %d", round, len(acks), lastRev)
		s.Close()
	}
}
