package testbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on the calling goroutine's thread inside the network
// namespace at path, then moves the thread back to its own namespace and
// unlocks it. The thread must live on: Go ends a locked thread whose
// goroutine exits, and the kernel then sends their parent-death signal to
// every child that thread forked, so lab processes (started with
// Pdeathsig) would die with it. Only if moving back fails is the thread
// left locked, for the runtime to discard rather than reuse in the wrong
// namespace; the caller must therefore run it on a goroutine of its own.
func inNetns(path string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own netns: %w", err)
	}
	defer orig.Close()
	f, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns: %w", err)
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns: %w", err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, fmt.Errorf("leave netns: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

func (l *Lab) site(name string) (*site, error) {
	s := l.sites[name]
	if s == nil {
		return nil, fmt.Errorf("no site %q", name)
	}
	return s, nil
}

// Direction selects which way a partition cuts.
type Direction int

const (
	// Both cuts traffic both ways.
	Both Direction = iota
	// Upstream cuts traffic from the site to the hub.
	Upstream
	// Downstream cuts traffic from the hub to the site.
	Downstream
)

// Partition cuts a site's uplink in the given direction, including packets
// already queued on it. It takes effect before it returns.
func (l *Lab) Partition(siteName string, d Direction) error {
	s, err := l.site(siteName)
	if err != nil {
		return fmt.Errorf("partition: %w", err)
	}
	if d == Both || d == Upstream {
		s.relay.blockUp.Store(true)
	}
	if d == Both || d == Downstream {
		s.relay.blockDown.Store(true)
	}
	l.log.Info("partitioned", "site", siteName, "direction", d)
	return nil
}

// Heal undoes every partition of a site.
func (l *Lab) Heal(siteName string) error {
	s, err := l.site(siteName)
	if err != nil {
		return fmt.Errorf("heal: %w", err)
	}
	s.relay.blockUp.Store(false)
	s.relay.blockDown.Store(false)
	l.log.Info("healed", "site", siteName)
	return nil
}

// Shape replaces the impairment of a site's uplink.
func (l *Lab) Shape(siteName string, p LinkParams) error {
	s, err := l.site(siteName)
	if err != nil {
		return fmt.Errorf("shape: %w", err)
	}
	s.relay.set(p)
	l.log.Info("shaped", "site", siteName, "params", p)
	return nil
}

// Link returns a site's current impairment.
func (l *Lab) Link(siteName string) (LinkParams, error) {
	s, err := l.site(siteName)
	if err != nil {
		return LinkParams{}, fmt.Errorf("get link: %w", err)
	}
	return *s.relay.params.Load(), nil
}

// Rebind changes the site's public NAT mapping: the router moves to a new
// source port range and forgets its connection tracking, so every flow of
// the site, existing ones included, appears at the hub from a new port.
func (l *Lab) Rebind(ctx context.Context, siteName string) error {
	s, err := l.site(siteName)
	if err != nil {
		return fmt.Errorf("rebind: %w", err)
	}
	s.rebind++
	if err := l.setNAT(ctx, s, s.rebind); err != nil {
		return fmt.Errorf("rebind: %w", err)
	}
	// conntrack -F exits 0 with an empty table too.
	if err := nsRun(ctx, s.router.Netns, "conntrack", "-F"); err != nil {
		return fmt.Errorf("rebind: %w", err)
	}
	l.log.Info("rebound", "site", siteName, "generation", s.rebind)
	return nil
}

// FillDisk fills a node's data dir until it is full, leaving free bytes
// unused (0 fills it completely). Remove the file at the returned path to
// free the space again.
func (l *Lab) FillDisk(node string, free int64) (string, error) {
	h := l.hosts[node]
	if h == nil || h.DataDir == "" {
		return "", fmt.Errorf("fill disk: no node %q", node)
	}
	// With a FUSE layer, write to the tmpfs underneath: same space, and
	// no delay from SlowDisk.
	dir := h.DataDir
	l.mu.Lock()
	if d := l.disks[node]; d != nil {
		dir = d.backing
	}
	l.mu.Unlock()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("fill disk: %w", err)
	}
	avail := int64(st.Bavail)*st.Bsize - free
	const name = ".tether-lab-fill"
	path := filepath.Join(h.DataDir, name)
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return "", fmt.Errorf("fill disk: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for avail > 0 {
		n := int64(len(buf))
		if n > avail {
			n = avail
		}
		w, err := f.Write(buf[:n])
		avail -= int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			return path, fmt.Errorf("fill disk: %w", err)
		}
	}
	return path, nil
}
