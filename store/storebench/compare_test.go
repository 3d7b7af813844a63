package storebench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/sqlite"
	"github.com/tether-edge/tether/store/storebench"
)

var (
	full = flag.Bool("storebench.full", false, "run the full comparison (10,000 objects per phase) and check tether's targets")
	runs = flag.Int("storebench.runs", 1, "how many times to run every target; medians are compared")
)

// tetherTarget adapts a store.Store to storebench.Target.
type tetherTarget struct {
	s    store.Store
	size func() (int64, error)
}

func key(ns, name string) store.Key { return store.Key{Resource: "pods", Namespace: ns, Name: name} }

func object(ns, name string, value []byte) store.Object {
	return store.Object{
		Key:    key(ns, name),
		Value:  value,
		Labels: map[string]string{"app": "web", "tier": "frontend", "pod-template-hash": "7c9f8d6b5c"},
		Fields: map[string]string{"metadata.name": name, "metadata.namespace": ns, "spec.nodeName": "edge-001", "status.phase": "Running"},
	}
}

func (t *tetherTarget) Create(ctx context.Context, ns, name string, value []byte) (int64, error) {
	return t.s.Create(ctx, object(ns, name, value))
}

func (t *tetherTarget) Update(ctx context.Context, ns, name string, value []byte, expected int64) (int64, error) {
	return t.s.Update(ctx, object(ns, name, value), expected)
}

func (t *tetherTarget) List(ctx context.Context) (int, error) {
	res, err := t.s.List(ctx, store.ListOptions{Resource: "pods"})
	if err != nil {
		return 0, err
	}
	return len(res.Objects), nil
}

func (t *tetherTarget) Size() (int64, error) { return t.size() }

func (t *tetherTarget) Close() error { return t.s.Close() }

func runTether(ctx context.Context, dir string, cfg storebench.Config) (storebench.Result, error) {
	path := filepath.Join(dir, "tether.db")
	s, err := sqlite.Open(sqlite.Config{Path: path})
	if err != nil {
		return storebench.Result{}, fmt.Errorf("open tether store: %w", err)
	}
	t := &tetherTarget{s: s, size: func() (int64, error) {
		return storebench.FilesSize(path, path+"-wal", path+"-shm")
	}}
	defer t.Close()
	cfg.Name = "tether"
	return storebench.Run(ctx, t, cfg)
}

// buildPeer builds the peer program in bench/<name>, a module of its own.
func buildPeer(t *testing.T, name, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = filepath.Join("..", "..", "bench", name)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build bench/%s: %v\n%s", name, err, b)
	}
}

func runPeer(t *testing.T, bin string, cfg storebench.Config, extra ...string) storebench.Result {
	t.Helper()
	var ws []string
	for _, w := range cfg.Writers {
		ws = append(ws, strconv.Itoa(w))
	}
	args := append([]string{
		"-objects", strconv.Itoa(cfg.Objects),
		"-writers", strings.Join(ws, ","),
		"-lists", strconv.Itoa(cfg.Lists),
		"-dir", t.TempDir(),
	}, extra...)
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("run %s %v: %v\n%s", filepath.Base(bin), extra, err, stderr.Bytes())
	}
	var res storebench.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("decode result of %s: %v\n%s", filepath.Base(bin), err, stdout.Bytes())
	}
	return res
}

// TestCompare measures tether's store, kine over SQLite (default DSN and
// _synchronous=FULL) and embedded etcd with the same workload, one after
// the other, and prints the comparison. By default it is a short run that
// asserts only that every target works; with -storebench.full it runs the
// full workload and fails when a target is missed.
func TestCompare(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("find go tool: %v", err)
	}
	cfg := storebench.Config{Objects: 1000, Writers: []int{1, 16, 64}, Lists: 5}
	if *full {
		cfg = storebench.Config{Objects: 10000, Writers: []int{1, 16, 64}, Lists: 50}
	}
	bin := t.TempDir()
	kineBin, etcdBin := filepath.Join(bin, "kinebench"), filepath.Join(bin, "etcdbench")
	buildPeer(t, "kine", kineBin)
	buildPeer(t, "etcd", etcdBin)

	var teth, kine, kineFull, etcd []storebench.Result
	for i := range max(1, *runs) {
		res, err := runTether(context.Background(), t.TempDir(), cfg)
		if err != nil {
			t.Fatalf("run tether: %v", err)
		}
		teth = append(teth, res)
		kine = append(kine, runPeer(t, kineBin, cfg))
		kineFull = append(kineFull, runPeer(t, kineBin, cfg, "-synchronous", "FULL"))
		etcd = append(etcd, runPeer(t, etcdBin, cfg))
		if *runs > 1 {
			var b bytes.Buffer
			if err := storebench.WriteTable(&b, teth[i], etcd[i], kine[i], kineFull[i]); err != nil {
				t.Fatal(err)
			}
			t.Logf("run %d:\n%s", i+1, b.String())
		}
	}
	mt, me, mk, mkf := storebench.Median(teth), storebench.Median(etcd), storebench.Median(kine), storebench.Median(kineFull)
	var b bytes.Buffer
	if err := storebench.WriteTable(&b, mt, me, mk, mkf); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "store comparison (median of %d run(s)):\n%s", max(1, *runs), b.String())
	for _, f := range storebench.Figures(mt, me, mk, benchfmt.Mode(*full)) {
		benchfmt.Report(t, f)
	}
	for _, g := range storebench.Goals(mt, me, mk) {
		fmt.Fprintln(os.Stdout, g)
		if *full && !g.Pass() {
			t.Errorf("target missed: %s", g)
		}
	}
}
