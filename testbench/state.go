package testbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// state is what a lab created, written before each object is used so that
// Sweep can undo it after the owner died.
type state struct {
	ID         string     `json:"id"`
	OwnerPID   int        `json:"ownerPid"`
	OwnerStart uint64     `json:"ownerStart"`
	Netns      []string   `json:"netns"`
	Mounts     []string   `json:"mounts"`
	Procs      []procInfo `json:"procs"`
}

type procInfo struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // start time in clock ticks, guards against PID reuse
	Name  string `json:"name"`
}

func (l *Lab) saveState() error {
	l.mu.Lock()
	b, err := json.MarshalIndent(l.state, "", "  ")
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	tmp := filepath.Join(l.dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(l.dir, "state.json")); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

// procStart returns the start time of pid from /proc, or 0 if it is gone.
func procStart(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// alive reports whether pid still is the process that started at start.
// Zombies count as dead: they run nothing and whoever adopted them reaps
// them in its own time.
func alive(pid int, start uint64) bool {
	if pid <= 0 || start == 0 || procStart(pid) != start {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}

// Sweep removes every lab under RuntimeRoot whose owning process is gone,
// and returns the ids it removed. Labs whose owner still runs are left
// alone.
func Sweep(log *slog.Logger) ([]string, error) {
	if log == nil {
		log = slog.Default()
	}
	ents, err := os.ReadDir(RuntimeRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read lab root: %w", err)
	}
	var ids []string
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(RuntimeRoot, e.Name(), "state.json"))
		if err != nil {
			errs = append(errs, fmt.Errorf("read state of %s: %w", e.Name(), err))
			continue
		}
		var st state
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, fmt.Errorf("decode state of %s: %w", e.Name(), err))
			continue
		}
		if st.ID != e.Name() || alive(st.OwnerPID, st.OwnerStart) {
			continue
		}
		log.Info("sweeping dead lab", "lab", st.ID, "owner", st.OwnerPID)
		if err := removeState(st); err != nil {
			errs = append(errs, err)
			continue
		}
		ids = append(ids, st.ID)
	}
	return ids, errors.Join(errs...)
}

// removeState kills the recorded processes, unmounts, deletes the
// namespaces (which takes their links, tuns, bridges and nftables tables
// with them) and finally the runtime directory.
func removeState(st state) error {
	var errs []error
	for _, p := range st.Procs {
		if alive(p.PID, p.Start) {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	for _, p := range st.Procs {
		for i := 0; i < 100 && alive(p.PID, p.Start); i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := abortFuse(st.Mounts, filepath.Join(RuntimeRoot, st.ID, "fusectl")); err != nil {
		errs = append(errs, err)
	}
	// Newest first: a mount may sit on top of, or be served from, an
	// older one.
	for i := len(st.Mounts) - 1; i >= 0; i-- {
		m := st.Mounts[i]
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for _, ns := range st.Netns {
		if !strings.HasPrefix(ns, "tl"+st.ID+"-") {
			continue // never delete what does not carry the lab's prefix
		}
		if _, err := os.Stat(nsPath(ns)); err != nil {
			continue
		}
		if err := run(bg, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && st.ID != "" {
		if err := os.RemoveAll(filepath.Join(RuntimeRoot, st.ID)); err != nil {
			errs = append(errs, fmt.Errorf("remove lab dir: %w", err))
		}
	}
	return errors.Join(errs...)
}
