package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Hierarchy is a mounted cgroup hierarchy: the unified one (v2) or the
// per-controller one (v1, where the cpuacct and memory controllers are
// read).
type Hierarchy struct {
	// Root is where it is mounted, normally /sys/fs/cgroup.
	Root string
	v2   bool
}

// OpenHierarchy looks at root to tell cgroup v2 (root holds
// cgroup.controllers) from v1.
func OpenHierarchy(root string) Hierarchy {
	_, err := os.Stat(filepath.Join(root, "cgroup.controllers"))
	return Hierarchy{Root: root, v2: err == nil}
}

// V2 tells whether the hierarchy is the unified one.
func (h Hierarchy) V2() bool { return h.v2 }

// Read reads the cgroup at path (relative to the root, "/" for the root
// itself). It fails when the cgroup's CPU or memory counters cannot be
// read (the cgroup is gone); pressure files are optional.
func (h Hierarchy) Read(path string) (Cgroup, error) {
	if h.v2 {
		return readV2(filepath.Join(h.Root, path))
	}
	return h.readV1(path)
}

func readV2(dir string) (Cgroup, error) {
	var c Cgroup
	cpu, err := readKeyed(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return c, err
	}
	usec, ok := cpu["usage_usec"]
	if !ok {
		return c, fmt.Errorf("read %s: no usage_usec", filepath.Join(dir, "cpu.stat"))
	}
	c.CPU = time.Duration(usec) * time.Microsecond
	if c.Memory.Usage, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
		return c, err
	}
	stat, err := readKeyed(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return c, err
	}
	c.Memory.RSS, c.Memory.Cache = stat["anon"], stat["file"]
	c.Memory.WorkingSet = workingSet(c.Memory.Usage, stat["inactive_file"])
	if c.CPUPressure, err = readPressure(filepath.Join(dir, "cpu.pressure")); err != nil {
		return c, err
	}
	if c.MemoryPressure, err = readPressure(filepath.Join(dir, "memory.pressure")); err != nil {
		return c, err
	}
	return c, nil
}

func (h Hierarchy) readV1(path string) (Cgroup, error) {
	var c Cgroup
	var ns uint64
	var err error
	for _, ctl := range []string{"cpuacct", "cpu,cpuacct"} {
		ns, err = readUint(filepath.Join(h.Root, ctl, path, "cpuacct.usage"))
		if err == nil {
			break
		}
	}
	if err != nil {
		return c, err
	}
	c.CPU = time.Duration(ns)
	mem := filepath.Join(h.Root, "memory", path)
	if c.Memory.Usage, err = readUint(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return c, err
	}
	stat, err := readKeyed(filepath.Join(mem, "memory.stat"))
	if err != nil {
		return c, err
	}
	c.Memory.RSS, c.Memory.Cache = stat["total_rss"], stat["total_cache"]
	c.Memory.WorkingSet = workingSet(c.Memory.Usage, stat["total_inactive_file"])
	return c, nil
}

// workingSet is usage minus the inactive file pages, floored at zero as
// the kubelet does.
func workingSet(usage, inactiveFile uint64) uint64 {
	if inactiveFile >= usage {
		return 0
	}
	return usage - inactiveFile
}

// readUint reads a file holding one unsigned integer.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

// readKeyed reads a flat keyed file ("key value" lines, as cpu.stat and
// memory.stat); lines that are not so are skipped.
func readKeyed(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	m := make(map[string]uint64, 48)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			m[k] = n
		}
	}
	return m, nil
}

// readPressure reads a PSI file ("some avg10=.. total=USEC" and "full
// ..."); a missing file, or one the kernel refuses to read (PSI turned
// off), is nil without error.
func readPressure(path string) (*Pressure, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrPermission) || isNotSupported(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var p Pressure
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var dst *time.Duration
		switch f[0] {
		case "some":
			dst = &p.Some
		case "full":
			dst = &p.Full
		default:
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "total="); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("read %s: %q: %w", path, kv, err)
				}
				*dst = time.Duration(n) * time.Microsecond
				found = true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("read %s: no total", path)
	}
	return &p, nil
}
