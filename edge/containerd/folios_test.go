package containerd

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Bits of /proc/kpageflags (Documentation/admin-guide/mm/pagemap.rst).
const (
	kpfCompoundHead = 1 << 15
	kpfCompoundTail = 1 << 16
)

// exeLargeFolios returns how much of a process's resident executable
// exe sits in large folios: pages with a compound head or tail flag in
// /proc/kpageflags, found through /proc/PID/pagemap (root only). The
// kernel keeps such a folio resident, and where folio-wide access flags
// are set (DAMON sets them) counts it referenced, as a whole: a figure
// of the working set read over a mostly large-folio executable counts
// nearly all of it.
func exeLargeFolios(pid int, exe string) (int64, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return 0, err
	}
	defer pagemap.Close()
	flags, err := os.Open("/proc/kpageflags")
	if err != nil {
		return 0, err
	}
	defer flags.Close()
	page := int64(os.Getpagesize())
	var large int64
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != exe {
			continue
		}
		from, to, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(from, 16, 64)
		end, err2 := strconv.ParseUint(to, 16, 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("/proc/%d/maps: %q", pid, line)
		}
		entries := make([]byte, (int64(end-start)/page)*8)
		if _, err := pagemap.ReadAt(entries, int64(start)/page*8); err != nil {
			return 0, fmt.Errorf("read /proc/%d/pagemap: %w", pid, err)
		}
		var kf [8]byte
		for i := 0; i < len(entries); i += 8 {
			e := binary.LittleEndian.Uint64(entries[i:])
			if e>>63 == 0 { // not present
				continue
			}
			pfn := e & (1<<55 - 1)
			if _, err := flags.ReadAt(kf[:], int64(pfn)*8); err != nil {
				return 0, fmt.Errorf("read /proc/kpageflags: %w", err)
			}
			if binary.LittleEndian.Uint64(kf[:])&(kpfCompoundHead|kpfCompoundTail) != 0 {
				large += page
			}
		}
	}
	return large, nil
}
