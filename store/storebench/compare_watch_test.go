package storebench_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/postgres"
	"github.com/tether-edge/tether/store/postgres/pgtest"
	"github.com/tether-edge/tether/store/storebench"
)

// watchTarget adapts a store.Store to storebench.WatchTarget.
type watchTarget struct {
	s *postgres.Store
}

func (t watchTarget) Create(ctx context.Context, ns, name string, value []byte) (int64, error) {
	return t.s.Create(ctx, object(ns, name, value))
}

func (t watchTarget) Update(ctx context.Context, ns, name string, value []byte, expected int64) (int64, error) {
	rev, err := t.s.Update(ctx, object(ns, name, value), expected)
	if errors.Is(err, store.ErrConflict) {
		return 0, storebench.ErrConflict
	}
	return rev, err
}

func (t watchTarget) Get(ctx context.Context, ns, name string) (int64, error) {
	o, err := t.s.Get(ctx, key(ns, name))
	return o.Revision, err
}

func (t watchTarget) Watch(ctx context.Context) (<-chan storebench.Change, error) {
	w, err := t.s.Watch(ctx, store.WatchOptions{Resource: "pods", Revision: t.s.Revision(), ReadOnly: true})
	if err != nil {
		return nil, err
	}
	out := make(chan storebench.Change, 1024)
	go func() {
		defer close(out)
		defer w.Stop()
		for ev := range w.Events() {
			select {
			case out <- storebench.Change{Key: ev.Object.Namespace + "/" + ev.Object.Name, Rev: ev.Object.Revision}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// watchRun is one run of the two-writer watch workload: two servers
// sharing a database, rate writes per second between them.
type watchRun struct {
	rate     float64
	duration time.Duration
	// drain is how long the watches may take to deliver after the
	// writes.
	drain time.Duration
}

func (r watchRun) config(id string) storebench.WatchConfig {
	return storebench.WatchConfig{ID: id, Rate: r.rate / 2, Duration: r.duration}
}

// tether runs the workload on two tether stores opened on dsn.
func (r watchRun) tether(t *testing.T, dsn string) storebench.WatchResult {
	ctx := context.Background()
	var (
		targets []watchTarget
		recs    []*storebench.Recorder
	)
	for i := range 2 {
		s, err := postgres.Open(ctx, postgres.Config{DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tt := watchTarget{s: s}
		if i == 0 {
			if err := storebench.PrepareShared(ctx, tt); err != nil {
				t.Fatal(err)
			}
		}
		rec, err := storebench.StartRecorder(ctx, tt)
		if err != nil {
			t.Fatal(err)
		}
		targets, recs = append(targets, tt), append(recs, rec)
	}
	start := time.Now().Add(100 * time.Millisecond)
	logs := make([]storebench.ServerLog, len(targets))
	errs := make(chan error, len(targets))
	for i, tt := range targets {
		go func() {
			var err error
			logs[i], err = storebench.WriteAt(ctx, tt, r.config(string(rune('a'+i))), start)
			errs <- err
		}()
	}
	for range targets {
		if err := <-errs; err != nil {
			t.Fatalf("tether writer: %v", err)
		}
	}
	total := len(logs[0].Writes) + len(logs[1].Writes)
	for i, rec := range recs {
		rec.Wait(total, r.drain)
		rec.Stop(&logs[i])
	}
	return storebench.Analyze("tether-postgres", r.rate, logs)
}

// kineServer is one kinebench process in watch mode.
type kineServer struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	errb  *lockedBuffer
	label string
}

func (k *kineServer) line(t *testing.T) string {
	t.Helper()
	if !k.out.Scan() {
		k.cmd.Process.Kill()
		k.cmd.Wait()
		t.Fatalf("kine server %s ended: %v\n%s", k.label, k.out.Err(), k.errb.String())
	}
	return k.out.Text()
}

// kine runs the workload on two kine processes on dsn.
func (r watchRun) kine(t *testing.T, bin, dsn string) storebench.WatchResult {
	var servers []*kineServer
	for i := range 2 {
		id := string(rune('a' + i))
		c := r.config(id)
		cmd := exec.Command(bin, "-endpoint", dsn, "-dir", t.TempDir(), "-watch-id", id,
			"-watch-rate", strconv.FormatFloat(c.Rate, 'f', -1, 64), "-watch-duration", c.Duration.String(),
			"-watch-prepare="+strconv.FormatBool(i == 0))
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		k := &kineServer{cmd: cmd, in: in, out: bufio.NewScanner(out), errb: &lockedBuffer{}, label: id}
		k.out.Buffer(nil, 64<<20)
		cmd.Stderr = k.errb
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
		if l := k.line(t); l != "ready" {
			t.Fatalf("kine server %s: got %q, want ready", id, l)
		}
		servers = append(servers, k)
	}
	start := time.Now().Add(200 * time.Millisecond)
	for _, k := range servers {
		fmt.Fprintf(k.in, "start %d\n", start.UnixNano())
	}
	total := 0
	for _, k := range servers {
		var n int
		if _, err := fmt.Sscanf(k.line(t), "wrote %d", &n); err != nil {
			t.Fatalf("kine server %s: %v", k.label, err)
		}
		total += n
	}
	var logs []storebench.ServerLog
	for _, k := range servers {
		fmt.Fprintf(k.in, "expect %d %d\n", total, r.drain.Nanoseconds())
	}
	for _, k := range servers {
		var l storebench.ServerLog
		if err := json.Unmarshal([]byte(k.line(t)), &l); err != nil {
			t.Fatalf("kine server %s: decode log: %v", k.label, err)
		}
		k.in.Close()
		if err := k.cmd.Wait(); err != nil {
			t.Fatalf("kine server %s: %v\n%s", k.label, err, k.errb.String())
		}
		logs = append(logs, l)
	}
	return storebench.Analyze("kine-postgres", r.rate, logs)
}

// compareTwoWriterWatch runs the two-writer watch workload on two tether
// stores sharing one database and on two kine servers sharing another, and
// prints what their watches delivered. Every write must reach both of
// tether's watches; with -storebench.full, at the higher rate and for
// longer, without a stall either.
func compareTwoWriterWatch(t *testing.T, pg *pgtest.Cluster, kineBin string) {
	runs := []watchRun{{rate: 100, duration: 2 * time.Second, drain: 3 * time.Second}}
	if *full {
		runs = []watchRun{
			{rate: 100, duration: 30 * time.Second, drain: 15 * time.Second},
			{rate: 300, duration: 30 * time.Second, drain: 15 * time.Second},
		}
	}
	for _, r := range runs {
		teth := r.tether(t, pg.NewDatabase())
		kine := r.kine(t, kineBin, pg.NewDatabase())
		fmt.Fprintf(os.Stdout, "two-writer watch on PostgreSQL:\n  %s\n  %s\n", teth, kine)
		for _, f := range storebench.WatchFigures(teth, kine, benchfmt.Mode(*full)) {
			benchfmt.Report(t, f)
		}
		if teth.Missing() > 0 || len(teth.WatchErrs) > 0 {
			t.Errorf("tether lost watch events: %s", teth)
		}
		if *full && teth.Stalls > 0 {
			t.Errorf("tether's watches stalled: %s", teth)
		}
	}
}

// lockedBuffer collects a process's standard error.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
