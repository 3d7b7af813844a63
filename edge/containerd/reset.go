package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/types"
)

// Reset removes what the runtime put on the node, for `tether edge
// reset`: every pod it adopted (containers, network namespace and
// address, pod directory, logs), every container left in tether's
// containerd namespace, the generated network's bridge, and the
// containerd that serves the node from DataDir, whether this runtime or
// an earlier agent started it. A containerd the node runs for itself is
// left running. Images stay with it. The Runtime is closed afterwards.
func (r *Runtime) Reset(ctx context.Context) error {
	var errs []error
	r.mu.Lock()
	uids := make([]types.UID, 0, len(r.pods))
	for uid := range r.pods {
		uids = append(uids, uid)
	}
	r.mu.Unlock()
	for _, uid := range uids {
		if err := r.RemovePod(ctx, uid); err != nil {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", uid, err))
		}
	}
	// Containers of pods whose start was cut short.
	conts, err := r.client.Containers(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list containers: %w", err))
	}
	for _, c := range conts {
		r.deleteContainer(ctx, c)
	}
	if r.cfg.CNIConfDir == "" {
		if l, err := netlink.LinkByName(r.cfg.Bridge); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete bridge %s: %w", r.cfg.Bridge, err))
			}
		}
	}
	if err := r.StopDaemon(); errors.Is(err, errNoDaemon) {
		// An earlier agent's containerd, still serving the node.
		if err := stopDaemonOf(filepath.Join(r.cfg.DataDir, "containerd")); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.Close(); err != nil && !errdefs.IsCanceled(err) {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	return errors.Join(errs...)
}

// stopDaemonOf stops the containerd whose process ID the runtime wrote to
// dir when it started it, if that process still runs containerd on dir.
func stopDaemonOf(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "containerd.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop containerd: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("stop containerd: bad process ID in %s", filepath.Join(dir, "containerd.pid"))
	}
	// The process ID may have been reused since: check that it is
	// containerd, started with its root under dir.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "containerd") || !strings.Contains(string(cmdline), dir) {
		return nil
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return nil
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p.Signal(syscall.Signal(0)) != nil {
			return nil
		}
	}
	if err := p.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop containerd %d: %w", pid, err)
	}
	return nil
}
