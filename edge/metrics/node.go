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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// userHZ is the unit of /proc/stat: the kernel reports CPU time in
// USER_HZ ticks, 100 per second on every Linux architecture.
const userHZ = 100

// ReadNode reads the node's CPU time, memory and pressure from the proc
// file system at procRoot (normally /proc) and the cgroup hierarchy h (see
// the package doc for how the working set is computed).
func ReadNode(procRoot string, h Hierarchy) (Node, error) {
	var n Node
	cpu, err := readProcStatCPU(filepath.Join(procRoot, "stat"))
	if err != nil {
		return n, err
	}
	n.CPU = cpu
	if h.v2 {
		if n.Memory, err = readNodeMemoryV2(procRoot, h.Root); err != nil {
			return n, err
		}
	} else {
		c, err := h.readV1("/")
		if err != nil {
			return n, err
		}
		n.Memory = c.Memory
	}
	if n.CPUPressure, err = readPressure(filepath.Join(procRoot, "pressure", "cpu")); err != nil {
		return n, err
	}
	if n.MemoryPressure, err = readPressure(filepath.Join(procRoot, "pressure", "memory")); err != nil {
		return n, err
	}
	return n, nil
}

// readProcStatCPU sums the busy states of the cpu line of /proc/stat:
// user, nice, system, irq, softirq and steal (guest time is already in
// user and nice).
func readProcStatCPU(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var ticks uint64
		for i, v := range f[1:] {
			switch i {
			case 3, 4, 8, 9: // idle, iowait, guest, guest_nice
				continue
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read %s: %q: %w", path, v, err)
			}
			ticks += n
		}
		return time.Duration(ticks) * (time.Second / userHZ), nil
	}
	return 0, fmt.Errorf("read %s: no cpu line", path)
}

// readNodeMemoryV2 is the root cgroup's memory on cgroup v2.
func readNodeMemoryV2(procRoot, cgroupRoot string) (Memory, error) {
	var m Memory
	info, err := readMeminfo(filepath.Join(procRoot, "meminfo"))
	if err != nil {
		return m, err
	}
	total, free := info["MemTotal"], info["MemFree"]
	if total == 0 {
		return m, fmt.Errorf("read %s: no MemTotal", filepath.Join(procRoot, "meminfo"))
	}
	m.Usage = total - min(free, total)
	inactive := info["Inactive(file)"]
	m.RSS, m.Cache = info["AnonPages"], info["Cached"]
	stat, err := readKeyed(filepath.Join(cgroupRoot, "memory.stat"))
	switch {
	case err == nil:
		inactive, m.RSS, m.Cache = stat["inactive_file"], stat["anon"], stat["file"]
	case errors.Is(err, fs.ErrNotExist):
	default:
		return m, err
	}
	m.WorkingSet = workingSet(m.Usage, inactive)
	return m, nil
}

// readMeminfo reads /proc/meminfo in bytes.
func readMeminfo(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	m := make(map[string]uint64, 64)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		m[k] = n
	}
	return m, nil
}

// ReadFilesystem reads the usage of the file system holding path.
func ReadFilesystem(name, path string) (Filesystem, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Filesystem{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := uint64(st.Bsize)
	return Filesystem{
		Name: name, Path: path,
		Capacity:  st.Blocks * bs,
		Available: st.Bavail * bs,
		Used:      (st.Blocks - st.Bfree) * bs,
		Inodes:    st.Files, InodesFree: st.Ffree,
	}, nil
}

func isNotSupported(err error) bool {
	return errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOTSUP)
}
