package memtrim

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// executableRSS is the resident size of the read-only mappings of the
// running executable (those Release pages out), from /proc/self/smaps.
func executableRSS(t *testing.T) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	var total int64
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		if _, _, ok := executableMapping(line, &st); ok {
			in = true
			continue
		}
		f := strings.Fields(string(line))
		if len(f) >= 5 && strings.Contains(f[0], "-") {
			in = false
			continue
		}
		if in && len(f) >= 2 && f[0] == "Rss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}

// cachedExecutable is how much of the executable the page cache holds,
// from mincore on a mapping of the whole file.
func cachedExecutable(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	pages := (len(m) + os.Getpagesize() - 1) / os.Getpagesize()
	vec := make([]byte, pages)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(os.Getpagesize())
}

func TestReleaseExecutable(t *testing.T) {
	// The test binary was just written: the kernel does not page out
	// dirty pages, so write it out first, as an installed binary is.
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if err := exe.Sync(); err != nil {
		t.Fatal(err)
	}
	exe.Close()
	for _, c := range []struct {
		name string
		how  Executable
	}{{"page out", PageOut}, {"unmap", Unmap}} {
		t.Run(c.name, func(t *testing.T) {
			// Make the whole of the read-only mappings resident,
			// whatever ran before (another release) left.
			populate(t)
			before, cachedBefore := executableRSS(t), cachedExecutable(t)
			r, err := Release(c.how)
			if err != nil {
				t.Fatal(err)
			}
			after, cachedAfter := executableRSS(t), cachedExecutable(t)
			t.Logf("executable resident %d KiB → %d KiB, cached %d KiB → %d KiB; advised %d KiB, heap released %d KiB, took %v",
				before>>10, after>>10, cachedBefore>>10, cachedAfter>>10, r.ExecutableAdvised>>10, r.HeapReleased>>10, r.Took)
			if r.ExecutableAdvised == 0 {
				t.Skip("the kernel has no MADV_PAGEOUT (Linux < 5.4)")
			}
			// What the process runs next (the test itself, the
			// runtime) faults back at once: much of a small test
			// binary is hot, and pages still in the page cache come
			// back with their neighbours (fault-around).
			most := before * 3 / 4
			if c.how == Unmap {
				most = before * 7 / 8
			}
			if after > most {
				t.Errorf("executable resident %d KiB after the release, %d KiB before: want at most %d KiB", after>>10, before>>10, most>>10)
			}
			switch c.how {
			case PageOut:
				if cachedAfter > cachedBefore-(before-after)/2 {
					t.Errorf("page cache holds %d KiB of the executable after paging out, %d KiB before: want less", cachedAfter>>10, cachedBefore>>10)
				}
			case Unmap:
				if cachedAfter < cachedBefore*9/10 {
					t.Errorf("page cache holds %d KiB of the executable after unmapping, %d KiB before: want it all", cachedAfter>>10, cachedBefore>>10)
				}
			}
		})
	}
}

// populate maps every page of the executable's read-only mappings
// (MADV_POPULATE_READ, Linux 5.14 and later).
func populate(t *testing.T) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		start, end, ok := executableMapping(sc.Bytes(), &st)
		if !ok {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_POPULATE_READ); errno != 0 {
			t.Logf("populate the executable's mappings: %v", errno)
			return
		}
	}
}

func TestLibraryMapping(t *testing.T) {
	for _, c := range []struct {
		line string
		ok   bool
	}{
		{"7f0a1000-7f0a2000 r-xp 00026000 fe:00 1234 /usr/lib/x86_64-linux-gnu/libc.so.6", true},
		{"7f0a1000-7f0a2000 r--p 00000000 fe:00 1234 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", true},
		{"7f0a1000-7f0a2000 r--p 00000000 fe:00 1234 /usr/lib/libfoo.so", true},
		{"7f0a1000-7f0a2000 rw-p 00000000 fe:00 1234 /usr/lib/x86_64-linux-gnu/libc.so.6", false}, // writable
		{"7f0a1000-7f0a2000 r--s 00000000 fe:00 1234 /usr/lib/libfoo.so", false},                  // shared
		{"7f0a1000-7f0a2000 r--p 00000000 fe:00 1234 /var/lib/tether/state.sqlite", false},
		{"7f0a1000-7f0a2000 r--p 00000000 fe:00 1234 /opt/x.sock", false},
		{"7f0a1000-7f0a2000 r--p 00000000 fe:00 1234 /opt/a.sorted", false},
		{"7f0a1000-7f0a2000 r--p 00000000 00:00 0 [vvar]", false},
		{"7f0a1000-7f0a2000 r--p 00000000 00:00 0 ", false},
	} {
		start, end, ok := libraryMapping([]byte(c.line))
		if ok != c.ok || (ok && (start != 0x7f0a1000 || end != 0x7f0a2000)) {
			t.Errorf("%q: %x-%x %v, want %v", c.line, start, end, ok, c.ok)
		}
	}
}
