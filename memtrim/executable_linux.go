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
// The read-only mappings of the shared libraries the process loaded (the
// C library and the dynamic linker of an executable linked with cgo) are
// unmapped (MADV_DONTNEED) the same way: their pages stay in the page
// cache, where other processes use them, and what the process calls again
// faults back.
//
// It returns the bytes of the executable's mappings and of the
// libraries' it advised. A kernel without MADV_PAGEOUT (before Linux 5.4)
// refuses it (EINVAL), which is reported as nothing advised and no error.
// MADV_PAGEOUT leaves, silently, the pages other processes also map
// (another process running the same executable) and those of an
// executable the process could neither write nor owns.
func releaseExecutable(how Executable) (exe, libs int64, err error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, 0, fmt.Errorf("stat executable: %w", err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, 0, err
	}
	advice := unix.MADV_PAGEOUT
	if how == Unmap {
		advice = unix.MADV_DONTNEED
	}
	var (
		start, end uintptr
		in, lib    bool
	)
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Bytes()
		if s, e, ok := executableMapping(line, &st); ok {
			start, end, in, lib = s, e, true, false
			continue
		}
		if s, e, ok := libraryMapping(line); ok {
			start, end, in, lib = s, e, true, true
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
		if lib {
			if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_DONTNEED); errno != 0 {
				return exe, libs, fmt.Errorf("madvise: %w", errno)
			}
			libs += int64(end - start)
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, uintptr(advice)); errno != 0 {
			if errors.Is(errno, unix.EINVAL) && advice == unix.MADV_PAGEOUT && exe == 0 {
				return 0, 0, nil // no MADV_PAGEOUT in this kernel
			}
			return exe, libs, fmt.Errorf("madvise: %w", errno)
		}
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_RANDOM)
		exe += int64(end - start)
	}
	return exe, libs, sc.Err()
}

// libraryMapping parses a line of /proc/self/maps or smaps and returns the
// bounds of the mapping when it is a private, readable and not writable
// mapping of a shared library (a file named *.so or *.so.N).
func libraryMapping(line []byte) (start, end uintptr, ok bool) {
	f := bytes.Fields(line)
	if len(f) < 6 || f[5][0] != '/' {
		return 0, 0, false
	}
	perms := f[1]
	if len(perms) < 4 || perms[0] != 'r' || perms[1] == 'w' || perms[3] != 'p' {
		return 0, 0, false
	}
	base := f[5][bytes.LastIndexByte(f[5], '/')+1:]
	if i := bytes.Index(base, []byte(".so")); i < 0 || (len(base) > i+3 && base[i+3] != '.') {
		return 0, 0, false
	}
	return mappingBounds(f[0])
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
	return mappingBounds(f[0])
}

// mappingBounds parses the start-end field of a line of /proc/self/maps.
func mappingBounds(field []byte) (start, end uintptr, ok bool) {
	lo, hi, ok := bytes.Cut(field, []byte("-"))
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

// residentSize is the process's resident set size, from /proc/self/statm;
// 0 if it cannot be read.
func residentSize() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
