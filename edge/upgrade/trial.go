package upgrade

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// Request asks the running agent to try a staged executable.
type Request struct {
	Staged
	// Timeout is how long the new agent has to become healthy.
	Timeout time.Duration `json:"timeout"`
	// At is when the request was made.
	At time.Time `json:"at"`
}

// Trial is the record of an agent running a staged executable.
type Trial struct {
	Staged
	// Previous is the version of the agent that started the trial.
	Previous string `json:"previous"`
	// RequireHub says the old agent was connected to the hub, so the new
	// one is healthy only once connected too.
	RequireHub bool      `json:"requireHub"`
	Started    time.Time `json:"started"`
	Deadline   time.Time `json:"deadline"`
}

// Result is how an upgrade request ended.
type Result string

const (
	// Installed: the new executable is the installed one.
	Installed Result = "installed"
	// RolledBack: the trial failed; the old executable runs again.
	RolledBack Result = "rolled back"
	// Refused: the running agent did not start a trial.
	Refused Result = "refused"
)

// Outcome is the end of the last upgrade request.
type Outcome struct {
	Result   Result    `json:"result"`
	Version  string    `json:"version"`
	Digest   string    `json:"digest"`
	Previous string    `json:"previous,omitempty"`
	Release  string    `json:"release,omitempty"` // Staged.Release
	Reason   string    `json:"reason,omitempty"`
	At       time.Time `json:"at"`
	// Reported says a running agent reported it as an event of its
	// node.
	Reported bool `json:"reported,omitempty"`
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%s %s (%s)", o.Result, o.Version, o.Digest)
	if o.Reason != "" {
		s += ": " + o.Reason
	}
	return s
}

// Records are the upgrade records of one agent's data directory.
type Records struct {
	dir string
	log *slog.Logger
}

// Open returns the upgrade records under dataDir.
func Open(dataDir string, log *slog.Logger) *Records {
	if log == nil {
		log = slog.Default()
	}
	return &Records{dir: filepath.Join(dataDir, "upgrade"), log: log.With("component", "upgrade")}
}

const (
	requestFile = "request.json"
	trialFile   = "trial.json"
	outcomeFile = "outcome.json"
	agentFile   = "agent.json"
)

// Agent is what a running agent announces: that it takes requests up.
type Agent struct {
	// PID is the agent's process ID in its own PID namespace.
	PID int `json:"pid"`
	// Start is when the process started, in clock ticks since boot
	// (ProcessStart): the same from every PID namespace, which the PID
	// is not.
	Start   uint64 `json:"start"`
	Version string `json:"version"`
}

// Announce records that the agent takes requests up, so that a request is
// never sent to an agent built before in-place upgrades (whom the signal
// would stop).
func (r *Records) Announce(a Agent) error { return r.write(agentFile, a) }

// Unannounce withdraws an announcement: the agent is about to exec
// another executable, which announces itself once it takes requests up.
func (r *Records) Unannounce() error {
	if err := os.Remove(filepath.Join(r.dir, agentFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Announced returns the last agent that announced itself, or nil.
func (r *Records) Announced() (*Agent, error) {
	var a Agent
	if ok, err := r.read(agentFile, &a); !ok {
		return nil, err
	}
	return &a, nil
}

// Withdraw removes a request no agent will take up.
func (r *Records) Withdraw() error {
	if err := os.Remove(filepath.Join(r.dir, requestFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Ask records a request for the running agent to take up.
func (r *Records) Ask(req Request) error {
	if t, err := r.Trial(); err != nil {
		return err
	} else if t != nil {
		return fmt.Errorf("an upgrade to %s is in trial until %s", t.Version, t.Deadline.Format(time.RFC3339))
	}
	return r.write(requestFile, req)
}

// Trial returns the trial in progress, or nil.
func (r *Records) Trial() (*Trial, error) {
	var t Trial
	if ok, err := r.read(trialFile, &t); !ok {
		return nil, err
	}
	return &t, nil
}

// Outcome returns the outcome of the last request, or nil.
func (r *Records) Outcome() (*Outcome, error) {
	var o Outcome
	if ok, err := r.read(outcomeFile, &o); !ok {
		return nil, err
	}
	return &o, nil
}

// MarkReported records that the outcome o was reported, unless another
// outcome replaced it meanwhile.
func (r *Records) MarkReported(o Outcome) error {
	cur, err := r.Outcome()
	if err != nil || cur == nil || cur.Digest != o.Digest || !cur.At.Equal(o.At) {
		return err
	}
	cur.Reported = true
	return r.write(outcomeFile, cur)
}

// Accept takes up the pending request: it checks the staged executable
// again and records the trial, which starts when the caller execs the
// returned trial's Path. self is the running agent's executable and
// version its version; connected says it is connected to the hub now. A
// request that cannot be tried is refused: its outcome says why and its
// staged file is removed.
func (r *Records) Accept(self, version string, connected bool, now time.Time) (*Trial, error) {
	var req Request
	ok, err := r.read(requestFile, &req)
	if !ok {
		if err == nil {
			err = errors.New("no upgrade request")
		}
		return nil, err
	}
	refuse := func(reason string) (*Trial, error) {
		os.Remove(req.Path)
		o := Outcome{Result: Refused, Version: req.Version, Digest: req.Digest, Release: req.Release, Previous: version, Reason: reason, At: now}
		if err := r.finish(requestFile, o); err != nil {
			return nil, err
		}
		return nil, errors.New(reason)
	}
	if d, err := FileDigest(req.Path); err != nil {
		return refuse(fmt.Sprintf("read the staged executable: %v", err))
	} else if d != req.Digest {
		return refuse(fmt.Sprintf("the staged executable changed: digest %s, staged as %s", d, req.Digest))
	}
	if filepath.Clean(self) != filepath.Clean(req.Installed) {
		return refuse(fmt.Sprintf("this agent runs %s, not the installed %s", self, req.Installed))
	}
	t := Trial{Staged: req.Staged, Previous: version, RequireHub: connected, Started: now, Deadline: now.Add(req.Timeout)}
	if err := r.write(trialFile, t); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(r.dir, requestFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	r.log.Info("trying a new agent", "version", t.Version, "digest", t.Digest, "until", t.Deadline.Format(time.RFC3339))
	return &t, nil
}

// Resume looks at the trial record when an agent starts from the
// executable self. It returns the trial when self is the trial's staged
// executable. When self is another (the service manager restarted the
// installed executable: the new agent died, or the machine rebooted), it
// closes the trial as failed, or as installed when the commit's rename
// was done, and returns nil.
func (r *Records) Resume(self string, now time.Time) (*Trial, error) {
	t, err := r.Trial()
	if err != nil || t == nil {
		return nil, err
	}
	if filepath.Clean(self) == filepath.Clean(t.Path) {
		return t, nil
	}
	if d, err := FileDigest(t.Installed); err == nil && d == t.Digest {
		// The rename was done; its record was not.
		return nil, r.finish(trialFile, Outcome{Result: Installed, Version: t.Version, Digest: t.Digest, Release: t.Release, Previous: t.Previous, At: now})
	}
	os.Remove(t.Path)
	o := Outcome{Result: RolledBack, Version: t.Version, Digest: t.Digest, Release: t.Release, Previous: t.Previous, At: now,
		Reason: "the new agent stopped before it became healthy (it exited, was killed or the machine restarted)"}
	r.log.Warn("upgrade rolled back", "version", t.Version, "reason", o.Reason)
	return nil, r.finish(trialFile, o)
}

// Refuse records that the agent refused to try the release named
// release (version, digest) before anything was staged: its signature or
// digest did not check, it is for another machine, its download failed
// for good. previous is the running agent's version.
func (r *Records) Refuse(release, version, digest, previous, reason string, now time.Time) error {
	r.log.Warn("upgrade refused", "release", release, "version", version, "reason", reason)
	return r.write(outcomeFile, Outcome{Result: Refused, Release: release, Version: version, Digest: digest,
		Previous: previous, Reason: reason, At: now})
}

// PreviousPath is where the executable an upgrade replaced is kept:
// .NAME.previous beside the installed one.
func PreviousPath(installed string) string {
	dir, name := filepath.Split(installed)
	return filepath.Join(dir, "."+name+".previous")
}

// Commit makes the trial's executable the installed one, keeping the old
// one as .NAME.previous beside it.
func (r *Records) Commit(t *Trial, now time.Time) error {
	dir := filepath.Dir(t.Installed)
	prev := PreviousPath(t.Installed)
	if err := os.Remove(prev); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Link(t.Installed, prev); err != nil {
		// The old executable is kept only as a courtesy.
		r.log.Warn("keep the previous executable", "err", err)
	}
	if err := os.Rename(t.Path, t.Installed); err != nil {
		return fmt.Errorf("install %s: %w", t.Installed, err)
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	r.log.Info("upgrade installed", "version", t.Version, "previous", t.Previous, "took", now.Sub(t.Started).Round(time.Millisecond))
	return r.finish(trialFile, Outcome{Result: Installed, Version: t.Version, Digest: t.Digest, Release: t.Release, Previous: t.Previous, At: now})
}

// RollBack closes a failed trial; the caller then execs t.Installed.
func (r *Records) RollBack(t *Trial, reason string, now time.Time) error {
	r.log.Warn("upgrade rolled back", "version", t.Version, "reason", reason)
	if err := r.finish(trialFile, Outcome{Result: RolledBack, Version: t.Version, Digest: t.Digest, Release: t.Release, Previous: t.Previous, Reason: reason, At: now}); err != nil {
		return err
	}
	// Still running from it: the name goes, the file when we exec.
	if err := os.Remove(t.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// finish records an outcome, then removes the record it closes.
func (r *Records) finish(record string, o Outcome) error {
	if err := r.write(outcomeFile, o); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(r.dir, record)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return syncDir(r.dir)
}

// read decodes a record; false with a nil error when there is none.
func (r *Records) read(name string, v any) (bool, error) {
	b, err := os.ReadFile(filepath.Join(r.dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("read %s: %w", filepath.Join(r.dir, name), err)
	}
	return true, nil
}

// write replaces a record durably.
func (r *Records) write(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(r.dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), filepath.Join(r.dir, name)); err != nil {
		return err
	}
	return syncDir(r.dir)
}
