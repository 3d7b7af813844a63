package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tether-edge/tether/deploy"
	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/upgrade"
	"github.com/tether-edge/tether/internal/bundle"
	"github.com/tether-edge/tether/internal/dirlock"
)

func newEdgeUpgradeCmd() *cobra.Command {
	var (
		dataDir, binary, digest string
		timeout                 time.Duration
		wait, previous          bool
	)
	cmd := &cobra.Command{
		Use:   "upgrade --binary FILE | --previous [--data-dir DIR]",
		Short: "Replace the running agent's executable, keeping its pods running",
		Long: `Replace the running agent's executable with FILE (a tether-edge or tether
binary) without stopping the node's pods; --previous goes back to the
executable the last upgrade replaced, in the same way.

The new executable is copied beside the one the agent runs (the installed
one), checked against --sha256 when given and run once with "version".
The agent then stops as it would on SIGTERM, leaving its pods running, and
runs the new executable in its place (the same process: the service
manager sees no restart). The new agent takes over the running pods; once
its container runtime answers, and its node is registered and connected
to the hub if the old agent was connected, for 10s, it becomes the
installed executable (the old one is kept beside
it as .NAME.previous). When it is not healthy within --timeout, the old
executable runs again; when it dies, the service manager starts the old
executable, which closes the attempt as failed. The installed file
changes only once the new agent proved healthy.

The command waits for the outcome unless --wait=false; it exits non-zero
when the upgrade was rolled back or refused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (binary == "") == !previous {
				return errors.New("give either --binary FILE or --previous")
			}
			if dataDir == "" {
				var err error
				if dataDir, err = (deploy.Layout{}).InstalledDataDir(deploy.Edge); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return requestUpgrade(ctx, cmd, dataDir, binary, previous, digest, timeout, wait)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "the running agent's data directory (default: the installed agent's, from "+deploy.DefaultConfigFile(deploy.Edge)+", else "+deploy.Layout{}.DataDir(deploy.Edge)+")")
	f.StringVar(&binary, "binary", "", "the new executable, or a bundle (tether bundle create) carrying it")
	f.BoolVar(&previous, "previous", false, "go back to the executable the last upgrade replaced (kept beside the installed one as .NAME.previous)")
	f.StringVar(&digest, "sha256", "", "the new executable's SHA-256, checked before anything changes")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "how long the new agent has to become healthy before the old one comes back")
	f.BoolVar(&wait, "wait", true, "wait for the outcome and print it")
	return cmd
}

// requestUpgrade stages the executable (binary, or with previous the one
// the last upgrade replaced), asks the running agent to try it and, with
// wait, waits for the outcome.
func requestUpgrade(ctx context.Context, cmd *cobra.Command, dataDir, binary string, previous bool, digest string, timeout time.Duration, wait bool) error {
	if timeout < upgrade.DefaultSettle+time.Second {
		return fmt.Errorf("--timeout %v: want at least %v (the new agent must stay healthy for %v)", timeout, upgrade.DefaultSettle+time.Second, upgrade.DefaultSettle)
	}
	pid, err := agentPID(dataDir)
	if err != nil {
		return err
	}
	recs := upgrade.Open(dataDir, slog.New(slog.DiscardHandler))
	// The agent may run in another PID namespace: its process is told
	// by its start time, which every namespace sees alike.
	start, err := upgrade.ProcessStart(strconv.Itoa(pid))
	if err != nil {
		return fmt.Errorf("read the agent's process (%d): %w", pid, err)
	}
	if announced, err := awaitAnnouncement(ctx, recs, start, agentStarting); err != nil {
		return err
	} else if !announced {
		return fmt.Errorf("the agent on %s (process %d) does not take upgrades up after %v: it is still starting (try again), or it predates in-place upgrades (install the new version with `tether install edge`)", dataDir, pid, agentStarting)
	}
	installed, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return fmt.Errorf("find the agent's executable: %w", err)
	}
	if strings.HasSuffix(installed, " (deleted)") {
		return fmt.Errorf("the agent (process %d) runs an executable that was removed or replaced (%s): restart it first", pid, installed)
	}
	if previous {
		binary = upgrade.PreviousPath(installed)
		if _, err := os.Stat(binary); err != nil {
			return fmt.Errorf("no previous executable beside %s: %w", installed, err)
		}
	}
	if t, err := recs.Trial(); err != nil {
		return err
	} else if t != nil {
		return fmt.Errorf("an upgrade to %s is in trial until %s", t.Version, t.Deadline.Format(time.RFC3339))
	}
	if bundle.Is(binary) {
		exe, cleanup, err := releaseFromBundle(binary)
		if err != nil {
			return err
		}
		defer cleanup()
		binary = exe
	}
	st, err := upgrade.Stage(ctx, binary, installed, digest)
	if err != nil {
		return err
	}
	asked := time.Now()
	if err := recs.Ask(upgrade.Request{Staged: st, Timeout: timeout, At: asked}); err != nil {
		os.Remove(st.Path)
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
		_ = recs.Withdraw()
		os.Remove(st.Path)
		return fmt.Errorf("signal the agent (process %d): %w", pid, err)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "staged %s (%s) beside %s; the agent (process %d) restarts into it\n", st.Version, st.Digest, installed, pid)
	if !wait {
		return nil
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	give := time.After(timeout + time.Minute)
	for {
		o, err := recs.Outcome()
		if err != nil {
			return err
		}
		if o != nil && o.Digest == st.Digest && !o.At.Before(asked) {
			fmt.Fprintln(out, o.String())
			if o.Result != upgrade.Installed {
				return fmt.Errorf("upgrade to %s %s", o.Version, o.Result)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting; the upgrade goes on: see %s/upgrade/outcome.json", dataDir)
		case <-give:
			return fmt.Errorf("no outcome within %v: see the agent's log", timeout+time.Minute)
		case <-tick.C:
		}
	}
}

// agentStarting bounds how long an upgrade waits for an agent that holds
// its data directory but has not yet said it takes upgrades: one started
// a moment ago (`systemctl restart` returns before the agent is up).
const agentStarting = 30 * time.Second

// awaitAnnouncement waits, for at most timeout, until the agent whose
// process started at start announced itself in recs, and says whether it
// did. It fails only when the records cannot be read or ctx ends.
func awaitAnnouncement(ctx context.Context, recs *upgrade.Records, start uint64, timeout time.Duration) (bool, error) {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		a, err := recs.Announced()
		return a != nil && a.Start == start, err
	})
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case wait.Interrupted(err):
		return false, nil
	}
	return false, err
}

// releaseFromBundle extracts from the bundle at path the executable for
// this machine's architecture, of this executable's build when the bundle
// has it, into a temporary directory that cleanup removes.
func releaseFromBundle(path string) (exe string, cleanup func(), err error) {
	m, err := bundle.Read(path)
	if err != nil {
		return "", nil, err
	}
	var pick *bundle.Release
	for i, r := range m.Releases {
		if r.Arch != goruntime.GOARCH {
			continue
		}
		if pick == nil || r.Build == build && pick.Build != build {
			pick = &m.Releases[i]
		}
	}
	if pick == nil {
		return "", nil, fmt.Errorf("%s carries no release for %s", path, goruntime.GOARCH)
	}
	dir, err := os.MkdirTemp("", "tether-bundle-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	_, paths, err := bundle.Extract(path, dir, func(e bundle.Entry) bool { return e.File == pick.File })
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return paths[pick.File], cleanup, nil
}

// agentPID returns the process ID of the agent running on dataDir.
func agentPID(dataDir string) (int, error) {
	if _, err := os.Stat(dataDir); err != nil {
		return 0, fmt.Errorf("no agent runs on %s: %w", dataDir, err)
	}
	l, err := dirlock.Acquire(dataDir, "agent.lock")
	var held *dirlock.HeldError
	switch {
	case errors.As(err, &held) && held.PID > 0:
		return held.PID, nil
	case errors.As(err, &held):
		return 0, fmt.Errorf("the agent on %s holds its lock but its process is unknown", dataDir)
	case err != nil:
		return 0, err
	}
	_ = l.Release()
	return 0, fmt.Errorf("no agent runs on %s: start it, or install the new executable with `tether install edge`", dataDir)
}

// restartInto is returned by `tether edge` when the agent stopped to run
// another executable in its process: a new one on trial, or the installed
// one back.
type restartInto struct{ path string }

func (r *restartInto) Error() string { return "restart into " + r.path }

// execInto replaces the process with the executable at path, with the
// same arguments and environment. It returns only on failure.
func execInto(path string) error {
	args := append([]string{path}, os.Args[1:]...)
	return fmt.Errorf("run %s: %w", path, syscall.Exec(path, args, os.Environ()))
}

// agentUpgrades follows upgrades from inside a running agent: requests
// made with `tether edge upgrade` (SIGUSR2) and the trial this process
// may be.
type agentUpgrades struct {
	recs    *upgrade.Records
	self    string
	version string
	log     *slog.Logger
	trial   *upgrade.Trial

	mu   sync.Mutex
	next string // the executable to run once the agent stopped

	reporting sync.Mutex // one report at a time
	taking    sync.Mutex // one request taken up at a time
}

// resumeUpgrades reads the upgrade records as the agent starts.
func resumeUpgrades(dataDir, version string, log *slog.Logger) *agentUpgrades {
	u := &agentUpgrades{recs: upgrade.Open(dataDir, log), version: version, log: log}
	self, err := os.Executable()
	if err != nil {
		log.Warn("upgrades: find this executable", "err", err)
		return u
	}
	u.self = self
	if u.trial, err = u.recs.Resume(self, time.Now()); err != nil {
		// A damaged record must not keep the node's pods from
		// running; a new request replaces it.
		log.Warn("upgrades: read the records", "err", err)
	}
	return u
}

// run handles requests and watches the trial until ctx ends; stop is
// called when the agent must stop to exec another executable.
func (u *agentUpgrades) run(ctx context.Context, a *edge.Agent, stop func()) {
	if u.self == "" {
		return
	}
	// Handled for the rest of the process's life: a signal that comes
	// while the agent stops is dropped, never the default action's end.
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	if start, err := upgrade.ProcessStart("self"); err != nil {
		u.log.Warn("upgrades: read this process's start", "err", err)
	} else if err := u.recs.Announce(upgrade.Agent{PID: os.Getpid(), Start: start, Version: u.version}); err != nil {
		u.log.Warn("upgrades: announce this agent", "err", err)
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-usr2:
			}
			if u.take(a, stop) {
				return
			}
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-a.Registered():
		}
		u.report(a)
	}()
	if t := u.trial; t != nil {
		go func() {
			healthy := func() bool {
				if a.NodeName() == "" {
					return false
				}
				s := a.Stats()
				return s.RuntimeUp && (!t.RequireHub || s.Registered && s.Connected)
			}
			back, err := u.recs.Watch(ctx, t, healthy, upgrade.DefaultSettle)
			if err != nil {
				if ctx.Err() == nil {
					u.log.Error("upgrade trial", "err", err)
				}
				return
			}
			if back != "" {
				// The installed agent reports the roll back.
				u.restartInto(back, stop)
				return
			}
			u.report(a)
		}()
	}
}

// take takes up the pending request: the agent stops to exec the staged
// executable (true), or the request is refused and reported (false).
func (u *agentUpgrades) take(a *edge.Agent, stop func()) bool {
	u.taking.Lock()
	defer u.taking.Unlock()
	t, err := u.recs.Accept(currentExecutable(u.self), u.version, a.Stats().Connected, time.Now())
	if err != nil {
		u.log.Warn("upgrade refused", "err", err)
		u.report(a)
		return false
	}
	u.restartInto(t.Path, stop)
	return true
}

// Events of the node that report an upgrade's outcome.
const (
	eventUpgraded   = "AgentUpgraded"
	eventRolledBack = "AgentUpgradeRolledBack"
	eventRefused    = "AgentUpgradeRefused"
)

// report makes the last outcome, when no agent reported it yet, an event
// of the node, so that `kubectl describe node` and `kubectl get events`
// show what became of an upgrade.
func (u *agentUpgrades) report(a *edge.Agent) {
	if a.NodeName() == "" {
		return // the start's report comes once the node registered
	}
	u.reporting.Lock()
	defer u.reporting.Unlock()
	o, err := u.recs.Outcome()
	if err != nil || o == nil || o.Reported {
		return
	}
	reason, warning := eventUpgraded, false
	switch o.Result {
	case upgrade.RolledBack:
		reason, warning = eventRolledBack, true
	case upgrade.Refused:
		reason, warning = eventRefused, true
	}
	msg := fmt.Sprintf("agent %s (%s) %s", o.Version, o.Digest, o.Result)
	if o.Previous != "" {
		msg += "; was " + o.Previous
	}
	if o.Reason != "" {
		msg += ": " + o.Reason
	}
	a.RecordNodeEvent(warning, reason, msg)
	if err := u.recs.MarkReported(*o); err != nil {
		u.log.Warn("upgrades: record the outcome as reported", "err", err)
	}
	u.publish(a)
}

// currentExecutable is the path of this process's executable now:
// os.Executable gives the path at start, which a committed trial renamed.
func currentExecutable(atStart string) string {
	if p, err := os.Readlink("/proc/self/exe"); err == nil {
		return p
	}
	return atStart
}

// restartInto stops the agent to exec path. Until that executable
// handles the signal, a request would stop it: the announcement goes now,
// and the executable makes its own once it does.
func (u *agentUpgrades) restartInto(path string, stop func()) {
	u.mu.Lock()
	if u.next == "" {
		u.next = path
	}
	u.mu.Unlock()
	if err := u.recs.Unannounce(); err != nil {
		u.log.Warn("upgrades: withdraw this agent's announcement", "err", err)
	}
	stop()
}

// after turns the end of the agent's run into a restart when one was
// asked for.
func (u *agentUpgrades) after(err error) error {
	u.mu.Lock()
	next := u.next
	u.mu.Unlock()
	if err != nil || next == "" {
		return err
	}
	return &restartInto{path: next}
}
