package testbench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

var bg = context.Background()

// Process is a process the lab started inside one of its hosts.
type Process struct {
	// Name is unique in the lab; it names the log file.
	Name string
	// Host is where the process runs.
	Host string

	l       *Lab
	args    []string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	samples []Sample
}

// Sample is one measurement of a process.
type Sample struct {
	Time   time.Time     `json:"time"`
	RSS    int64         `json:"rssBytes"`
	CPU    time.Duration `json:"cpu"`
	Exited bool          `json:"exited,omitempty"`
}

// Start runs args inside host, with output appended to
// <lab dir>/logs/<name>.log and copied to Config.Output.
func (l *Lab) Start(host, name string, args ...string) (*Process, error) {
	h := l.hosts[host]
	if h == nil {
		return nil, fmt.Errorf("start %s: no host %q", name, host)
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("start %s: no command", name)
	}
	l.mu.Lock()
	if _, ok := l.procs[name]; ok {
		l.mu.Unlock()
		return nil, fmt.Errorf("start %s: name in use", name)
	}
	p := &Process{Name: name, Host: host, l: l, args: args,
		logPath: filepath.Join(l.dir, "logs", name+".log")}
	l.procs[name] = p
	l.mu.Unlock()
	if err := p.start(); err != nil {
		l.mu.Lock()
		delete(l.procs, name)
		l.mu.Unlock()
		return nil, err
	}
	return p, nil
}

// Process returns the named process or nil.
func (l *Lab) Process(name string) *Process {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.procs[name]
}

type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			io.WriteString(p.w, p.prefix+line)
		}
	}
	return len(b), nil
}

var outMu sync.Mutex

var (
	spawnOnce sync.Once
	spawnReqs chan func()
)

// startFromSpawner starts cmd from one OS thread that lives as long as the
// test process. Pdeathsig fires when the thread that forked a child exits,
// not the process, and the runtime destroys any thread whose goroutine ends
// while locked to it (InHost's, when it cannot leave the namespace it
// entered; openTun's on the same failure; any library's): a child forked
// from such a thread would be killed in the middle of a test.
func startFromSpawner(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread stays ours
			for f := range spawnReqs {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnReqs <- func() { errc <- cmd.Start() }
	return <-errc
}

func (p *Process) start() error {
	h := p.l.hosts[p.Host]
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	var w io.Writer = f
	if p.l.cfg.Output != nil {
		w = io.MultiWriter(f, prefixWriter{&outMu, p.l.cfg.Output, "[" + p.Host + "/" + p.Name + "] "})
	}
	// ip netns exec enters the namespace and execs the command, so the
	// PID we get is the command's own.
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.Netns}, p.args...)...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startFromSpawner(cmd); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err = cmd, done, nil
	p.mu.Unlock()
	p.l.mu.Lock()
	p.l.state.Procs = append(p.l.state.Procs, procInfo{PID: cmd.Process.Pid, Start: procStart(cmd.Process.Pid), Name: p.Name})
	p.l.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return p.l.saveState()
}

// PID returns the process id of the current incarnation.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// LogPath returns the file the process's output goes to.
func (p *Process) LogPath() string { return p.logPath }

// Signal sends sig to the process (SIGKILL, SIGSTOP, SIGCONT, SIGTERM...).
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	return nil
}

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() error {
	p.kill()
	return nil
}

func (p *Process) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return // never started, or its start failed
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Stop sends SIGTERM and waits up to timeout before killing.
func (p *Process) Stop(timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	cmd.Process.Signal(syscall.SIGCONT)
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		p.kill()
	}
	return nil
}

// Wait waits for the current incarnation to exit and returns its error.
func (p *Process) Wait() error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Restart kills the process if it still runs and starts it again with the
// same command and log file.
func (p *Process) Restart() error {
	p.kill()
	return p.start()
}

// Exec runs a command to completion inside host and returns its combined
// output.
func (l *Lab) Exec(ctx context.Context, host string, args ...string) ([]byte, error) {
	h := l.hosts[host]
	if h == nil {
		return nil, fmt.Errorf("exec: no host %q", host)
	}
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Netns}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("exec in %s: %w", host, err)
	}
	return out, nil
}

// InHost runs fn on a locked OS thread that has entered host's network
// namespace, so sockets fn opens live there. The thread goes back to the
// lab's namespace afterwards and is reused, never ended: that would kill
// the lab processes it started (see inNetns).
func (l *Lab) InHost(host string, fn func() error) error {
	h := l.hosts[host]
	if h == nil {
		return fmt.Errorf("enter host: no host %q", host)
	}
	errc := make(chan error, 1)
	go func() { errc <- inNetns(nsPath(h.Netns), fn) }()
	return <-errc
}
