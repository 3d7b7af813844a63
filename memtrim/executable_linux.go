package memtrim

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// releaseExecutable releases the resident pages of the executable's
// read-only mappings (code, read-only data, the runtime's tables), as how
// says (see Executable), and turns off read-ahead for them (MADV_RANDOM),
// so that a page read from the disk again comes back alone instead of with
// its neighbours, which would bring most of what was released back.
// Mappings holding private copies of pages (the relocations the dynamic
// linker wrote before making them read-only) are left alone: unmapping
// would lose the copies.
//
// It returns the bytes of mapping it advised. A kernel without
// MADV_PAGEOUT (before Linux 5.4) refuses it (EINVAL), which is reported as
// nothing advised and no error. MADV_PAGEOUT leaves, silently, the pages
// other processes also map (another process running the same executable)
// and those of an executable the process could neither write nor owns.
func releaseExecutable(how Executable) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, fmt.Errorf("stat executable: %w", err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	advice := unix.MADV_PAGEOUT
	if how == Unmap {
		advice = unix.MADV_DONTNEED
	}
	var (
		advised    int64
		start, end uintptr
		in         bool
	)
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Bytes()
		if s, e, ok := executableMapping(line, &st); ok {
			start, end, in = s, e, true
			continue
		}
		// The mapping's header is followed by its counters, one of
		// them the size of its private copies.
		copies, ok := bytes.CutPrefix(line, []byte("Anonymous:"))
		if !in || !ok {
			continue
		}
		in = false
		if f := bytes.Fields(copies); len(f) == 0 || string(f[0]) != "0" {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, uintptr(advice)); errno != 0 {
			if errors.Is(errno, unix.EINVAL) && advice == unix.MADV_PAGEOUT && advised == 0 {
				return 0, nil // no MADV_PAGEOUT in this kernel
			}
			return advised, fmt.Errorf("madvise: %w", errno)
		}
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_RANDOM)
		advised += int64(end - start)
	}
	return advised, sc.Err()
}

// executableMapping parses a line of /proc/self/maps or smaps and returns the
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
