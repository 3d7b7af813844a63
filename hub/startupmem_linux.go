package hub

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pageOutExecutable releases the pages of the executable that start-up
// alone used. For each read-only mapping of the executable (code, read-only
// data, the runtime's tables) it
//
//   - asks the kernel to reclaim the resident pages (madvise MADV_PAGEOUT,
//     Linux 5.4 and later): they are clean, so nothing is written, and
//     those no other process maps are unmapped and freed;
//   - turns off read-ahead for the mapping (MADV_RANDOM), so that a page
//     needed again faults back alone instead of with its neighbours, which
//     would bring most of what was just released back;
//
// The pages stay in the page cache as clean, unmapped pages that the
// kernel reclaims when memory is short; a page the hub needs again faults
// back from the cache without disk I/O. (Dropping them from the cache as
// well was measured: every later fault then read the disk, and pod
// creates ran at a quarter of their rate for thousands of requests.)
//
// It returns the bytes of mapping it advised. A kernel without
// MADV_PAGEOUT refuses it (EINVAL), which is reported as nothing advised
// and no error. The kernel ignores the advice, silently, for pages other
// processes also map (another process running the same executable) and
// for an executable the process could neither write nor owns.
func pageOutExecutable() (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("stat executable: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	var advised int64
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		start, end, ok := executableMapping(sc.Bytes(), &st)
		if !ok {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_PAGEOUT); errno != 0 {
			if errors.Is(errno, unix.EINVAL) && advised == 0 {
				return 0, nil // no MADV_PAGEOUT in this kernel
			}
			return advised, fmt.Errorf("madvise: %w", errno)
		}
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_RANDOM)
		advised += int64(end - start)
	}
	if err := sc.Err(); err != nil {
		return advised, err
	}
	return advised, nil
}

// executableMapping parses a line of /proc/self/maps and returns the
// bounds of the mapping when it is a private, readable and not writable
// mapping of the file st describes.
func executableMapping(line []byte, st *unix.Stat_t) (start, end uintptr, ok bool) {
	// start-end perms offset major:minor inode path
	f := bytes.Fields(line)
	if len(f) < 6 {
		return 0, 0, false
	}
	perms := f[1]
	if len(perms) < 4 || perms[0] != 'r' || perms[1] == 'w' || perms[3] != 'p' {
		return 0, 0, false
	}
	if ino, err := strconv.ParseUint(string(f[4]), 10, 64); err != nil || ino != st.Ino {
		return 0, 0, false
	}
	major, minor, ok := bytes.Cut(f[3], []byte(":"))
	if !ok {
		return 0, 0, false
	}
	maj, err1 := strconv.ParseUint(string(major), 16, 32)
	mnr, err2 := strconv.ParseUint(string(minor), 16, 32)
	if err1 != nil || err2 != nil || unix.Mkdev(uint32(maj), uint32(mnr)) != uint64(st.Dev) {
		return 0, 0, false
	}
	lo, hi, ok := bytes.Cut(f[0], []byte("-"))
	if !ok {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(string(lo), 16, 64)
	e, err2 := strconv.ParseUint(string(hi), 16, 64)
	if err1 != nil || err2 != nil || e <= s {
		return 0, 0, false
	}
	return uintptr(s), uintptr(e), true
}
