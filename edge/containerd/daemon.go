package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
)

// daemon is a containerd the runtime started itself because none answered
// at the configured address.
type daemon struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// daemonConfig is containerd's configuration: no CRI plugin (the agent
// does what CRI would), state under the agent's data directory.
func daemonConfig(dir, address string) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q
[ttrpc]
  address = ""
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), address)
}

// connect returns a client of the containerd at address, starting one
// when nothing answers and startDir is set.
func connect(ctx context.Context, address, startDir, bin string, log *slog.Logger) (*containerd.Client, *daemon, error) {
	if c, err := dial(ctx, address, time.Second); err == nil {
		log.Info("using running containerd", "address", address)
		return c, nil, nil
	}
	if startDir == "" {
		return nil, nil, fmt.Errorf("connect to containerd at %s: nothing answers", address)
	}
	d, err := startDaemon(startDir, address, bin, log)
	if err != nil {
		return nil, nil, err
	}
	c, err := dial(ctx, address, 20*time.Second)
	if err != nil {
		d.stop()
		return nil, nil, fmt.Errorf("connect to the containerd the agent started: %w", err)
	}
	return c, d, nil
}

func dial(ctx context.Context, address string, wait time.Duration) (*containerd.Client, error) {
	deadline := time.Now().Add(wait)
	for {
		if _, err := os.Stat(address); err == nil {
			c, err := containerd.New(address, containerd.WithDefaultNamespace(Namespace), containerd.WithTimeout(2*time.Second))
			if err == nil {
				sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				ok, serr := c.IsServing(sctx)
				cancel()
				if ok && serr == nil {
					return c, nil
				}
				c.Close()
				err = serr
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
			}
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startDaemon starts containerd in its own session so that it (and the
// containers' shims) outlive the agent: an agent restart must not stop
// the node's containers.
func startDaemon(dir, address, bin string, log *slog.Logger) (*daemon, error) {
	if bin == "" {
		bin = "containerd"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(address), 0o711); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte(daemonConfig(dir, address)), 0o644); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	defer logf.Close()
	// A stale socket of a dead containerd would make it refuse to start.
	_ = os.Remove(address)
	cmd := exec.Command(path, "--config", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	_ = os.WriteFile(filepath.Join(dir, "containerd.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	d := &daemon{dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.done) }()
	log.Info("started containerd", "address", address, "pid", cmd.Process.Pid, "dir", dir)
	return d, nil
}

// stop terminates the daemon and waits for it.
func (d *daemon) stop() {
	if d == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// errNoDaemon means the runtime did not start the containerd it uses.
var errNoDaemon = errors.New("the agent did not start this containerd")
