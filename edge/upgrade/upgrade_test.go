package upgrade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeTether writes an executable that prints a tether version line for
// `version` and exits with code 3 otherwise.
func fakeTether(t *testing.T, path, version string) string {
	t.Helper()
	script := "#!/bin/sh\nif [ \"$1\" = version ]; then echo 'tether " + version + " (Kubernetes API v1.37.2, go1.26, linux/amd64)'; exit 0; fi\nexit 3\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func digestOf(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// host is an installed executable in a directory of its own and a data
// directory.
type host struct {
	bin, installed, data string
}

func newHost(t *testing.T) host {
	dir := t.TempDir()
	h := host{bin: filepath.Join(dir, "bin"), data: filepath.Join(dir, "data")}
	if err := os.Mkdir(h.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	h.installed = fakeTether(t, filepath.Join(h.bin, "tether-edge"), "v1")
	return h
}

// entries lists a directory's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestStage(t *testing.T) {
	ctx := context.Background()
	h := newHost(t)
	src := fakeTether(t, filepath.Join(t.TempDir(), "new"), "v2")

	st, err := Stage(ctx, src, h.installed, digestOf(t, src))
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "v2" || st.Digest != digestOf(t, src) || st.Installed != h.installed || filepath.Dir(st.Path) != h.bin {
		t.Errorf("staged: %+v", st)
	}
	if fi, err := os.Stat(st.Path); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("staged file: %v %v", fi, err)
	}
	os.Remove(st.Path)

	bad := []struct {
		name, src, digest, want string
	}{
		{"wrong digest", src, strings.Repeat("ab", 32), "not the sha256:abab"},
		{"malformed digest", src, "sha256:xyz", "64 hexadecimal digits"},
		{"the installed one", h.installed, "", "is the installed executable already"},
		{"not tether", writeFile(t, "#!/bin/sh\necho hello\n"), "", "not tether's version"},
		{"does not run", writeFile(t, "\x7fELF garbage"), "", "does not run here"},
		{"missing", filepath.Join(t.TempDir(), "nothing"), "", "no such file"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := Stage(ctx, c.src, h.installed, c.digest)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
			if got := entries(t, h.bin); len(got) != 1 {
				t.Errorf("left beside the installed executable: %v", got)
			}
		})
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// begin stages v2, asks for it and accepts the request as the agent
// running the installed executable would.
func begin(t *testing.T, h host, r *Records, timeout time.Duration) *Trial {
	t.Helper()
	src := fakeTether(t, filepath.Join(t.TempDir(), "new"), "v2")
	st, err := Stage(context.Background(), src, h.installed, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ask(Request{Staged: st, Timeout: timeout, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	tr, err := r.Accept(h.installed, "v1", true, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if tr.Version != "v2" || tr.Previous != "v1" || !tr.RequireHub || tr.Path != st.Path {
		t.Fatalf("trial: %+v", tr)
	}
	return tr
}

func outcome(t *testing.T, r *Records) Outcome {
	t.Helper()
	o, err := r.Outcome()
	if err != nil || o == nil {
		t.Fatalf("outcome: %v %v", o, err)
	}
	return *o
}

func TestTrialCommitted(t *testing.T) {
	h := newHost(t)
	r := Open(h.data, nil)
	old := digestOf(t, h.installed)
	tr := begin(t, h, r, time.Minute)
	if err := r.Ask(Request{Staged: tr.Staged}); err == nil || !strings.Contains(err.Error(), "in trial") {
		t.Errorf("a second request during a trial: %v", err)
	}

	// The new agent starts from the staged executable.
	got, err := r.Resume(tr.Path, time.Now())
	if err != nil || got == nil || got.Digest != tr.Digest {
		t.Fatalf("resume as the trial: %+v %v", got, err)
	}
	rollBackTo, err := r.Watch(context.Background(), got, func() bool { return true }, 0)
	if err != nil || rollBackTo != "" {
		t.Fatalf("watch: %q %v", rollBackTo, err)
	}
	if d := digestOf(t, h.installed); d != tr.Digest {
		t.Errorf("installed %s, want the new %s", d, tr.Digest)
	}
	if d := digestOf(t, PreviousPath(h.installed)); d != old {
		t.Errorf("previous %s, want the old %s", d, old)
	}
	if left, err := Leftovers(h.installed); err != nil || len(left) != 1 || filepath.Base(left[0]) != ".tether-edge.previous" {
		t.Errorf("leftovers: %v %v", left, err)
	}
	if o := outcome(t, r); o.Result != Installed || o.Version != "v2" || o.Previous != "v1" {
		t.Errorf("outcome: %+v", o)
	}
	if tr, err := r.Trial(); tr != nil || err != nil {
		t.Errorf("trial after commit: %+v %v", tr, err)
	}
	o := outcome(t, r)
	if o.Reported {
		t.Error("a fresh outcome is marked reported")
	}
	stale := o
	stale.At = stale.At.Add(-time.Second)
	if err := r.MarkReported(stale); err != nil || outcome(t, r).Reported {
		t.Errorf("another outcome's report marked this one: %v", err)
	}
	if err := r.MarkReported(o); err != nil || !outcome(t, r).Reported {
		t.Errorf("mark reported: %v", err)
	}
	// The service manager restarting the agent later changes nothing.
	if tr, err := r.Resume(h.installed, time.Now()); tr != nil || err != nil {
		t.Errorf("resume after commit: %+v %v", tr, err)
	}
}

func TestTrialDeadlineRollsBack(t *testing.T) {
	h := newHost(t)
	r := Open(h.data, nil)
	old := digestOf(t, h.installed)
	tr := begin(t, h, r, 0)
	rollBackTo, err := r.Watch(context.Background(), tr, func() bool { return false }, time.Second)
	if err != nil || rollBackTo != h.installed {
		t.Fatalf("watch: %q %v", rollBackTo, err)
	}
	rolledBack(t, h, r, old, "connected to the hub")
	if tr, err := r.Resume(h.installed, time.Now()); tr != nil || err != nil {
		t.Errorf("resume after the roll back: %+v %v", tr, err)
	}
}

func TestTrialStoppedRollsBack(t *testing.T) {
	h := newHost(t)
	r := Open(h.data, nil)
	old := digestOf(t, h.installed)
	tr := begin(t, h, r, time.Minute)

	// Stopping the new agent leaves the trial open.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Watch(ctx, tr, func() bool { return false }, time.Second); err == nil {
		t.Fatal("watch returned no error when stopped")
	}
	if open, _ := r.Trial(); open == nil {
		t.Fatal("trial closed by a stop")
	}
	// The service manager starts the installed executable again.
	if got, err := r.Resume(h.installed, time.Now()); got != nil || err != nil {
		t.Fatalf("resume as the old agent: %+v %v", got, err)
	}
	rolledBack(t, h, r, old, "stopped before it became healthy")
}

// rolledBack checks that a trial ended rolled back: the installed
// executable is still old, nothing is left beside it, and the outcome
// says why.
func rolledBack(t *testing.T, h host, r *Records, old, why string) {
	t.Helper()
	if d := digestOf(t, h.installed); d != old {
		t.Errorf("installed executable changed")
	}
	if got := entries(t, h.bin); len(got) != 1 {
		t.Errorf("left beside the installed executable: %v", got)
	}
	if o := outcome(t, r); o.Result != RolledBack || !strings.Contains(o.Reason, why) {
		t.Errorf("outcome: %+v", o)
	}
}

// TestResumeAfterCommitCut: a commit cut between its rename and its
// record ends as installed at the next start.
func TestResumeAfterCommitCut(t *testing.T) {
	h := newHost(t)
	r := Open(h.data, nil)
	tr := begin(t, h, r, time.Minute)
	if err := os.Rename(tr.Path, h.installed); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Resume(h.installed, time.Now()); got != nil || err != nil {
		t.Fatalf("resume: %+v %v", got, err)
	}
	if o := outcome(t, r); o.Result != Installed {
		t.Errorf("outcome: %+v", o)
	}
}

func TestAcceptRefusesAChangedFile(t *testing.T) {
	h := newHost(t)
	r := Open(h.data, nil)
	src := fakeTether(t, filepath.Join(t.TempDir(), "new"), "v2")
	st, err := Stage(context.Background(), src, h.installed, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ask(Request{Staged: st, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	fakeTether(t, st.Path, "v3")
	if _, err := r.Accept(h.installed, "v1", true, time.Now()); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("accept: %v", err)
	}
	if o := outcome(t, r); o.Result != Refused {
		t.Errorf("outcome: %+v", o)
	}
	if tr, _ := r.Trial(); tr != nil {
		t.Errorf("trial recorded: %+v", tr)
	}
	if got := entries(t, h.bin); len(got) != 1 {
		t.Errorf("left beside the installed executable: %v", got)
	}
	if _, err := r.Accept(h.installed, "v1", true, time.Now()); err == nil {
		t.Error("a request accepted twice")
	}
}

func TestProcessStart(t *testing.T) {
	self, err := ProcessStart("self")
	if err != nil || self == 0 {
		t.Fatalf("self: %d %v", self, err)
	}
	if byPID, err := ProcessStart(strconv.Itoa(os.Getpid())); err != nil || byPID != self {
		t.Errorf("by PID: %d %v, want %d", byPID, err, self)
	}
	if init, err := ProcessStart("1"); err != nil || init > self {
		t.Errorf("init started at %d (%v), after this process (%d)", init, err, self)
	}
	if _, err := ProcessStart("0"); err == nil {
		t.Error("process 0 read")
	}
}

func TestAnnounceAndWithdraw(t *testing.T) {
	h := newHost(t)
	r := Open(h.data, nil)
	if a, err := r.Announced(); a != nil || err != nil {
		t.Fatalf("announced before any agent: %+v %v", a, err)
	}
	if err := r.Announce(Agent{PID: 42, Version: "v1"}); err != nil {
		t.Fatal(err)
	}
	if a, err := r.Announced(); err != nil || a == nil || *a != (Agent{PID: 42, Version: "v1"}) {
		t.Fatalf("announced: %+v %v", a, err)
	}
	if err := r.Unannounce(); err != nil {
		t.Fatal(err)
	}
	if a, err := r.Announced(); a != nil || err != nil {
		t.Fatalf("announced after withdrawing: %+v %v", a, err)
	}
	src := fakeTether(t, filepath.Join(t.TempDir(), "new"), "v2")
	st, err := Stage(context.Background(), src, h.installed, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ask(Request{Staged: st, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := r.Withdraw(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Accept(h.installed, "v1", true, time.Now()); err == nil {
		t.Error("a withdrawn request accepted")
	}
}
