package upgrade

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Uncache drops the pages of f, an executable just written and synced,
// from the page cache, so that its first run reads it back through page
// faults.
//
// Why: the write leaves the file cached in the folios the write made,
// which recent kernels make large (up to 2 MiB on ext4, XFS and btrfs).
// A running program keeps a folio of its executable resident as a whole
// while it uses any page of it, and the kernel counts the whole folio as
// referenced wherever folio-wide access flags are set (DAMON sets them).
// The edge agent at rest uses a few megabytes of code spread over nearly
// every folio of its 40 MB executable, so a freshly written executable
// stays almost wholly resident for as long as the agent runs. Read back
// by faults, as after every boot, it comes in readahead-sized folios and
// only the code the agent runs stays. The cost is reading that code from
// disk once, at the first start, as every boot does.
//
// It is advice: pages still dirty or mapped stay, and an error leaves
// the file cached, which costs memory, not correctness.
func Uncache(f *os.File) error {
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", f.Name(), err)
	}
	return nil
}

// Cached reports how many of the file's pages are in the page cache, and
// how many it has (mincore(2) over a mapping of the whole file).
func Cached(path string) (cached, pages int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if st.Size() == 0 {
		return 0, 0, nil
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("map %s: %w", path, err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, 0, fmt.Errorf("mincore %s: %w", path, errno)
	}
	for _, v := range vec {
		cached += int(v & 1)
	}
	return cached, len(vec), nil
}
