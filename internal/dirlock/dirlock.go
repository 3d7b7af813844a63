// Package dirlock keeps one process at a time on a data directory: the hub
// and the edge agent each take an exclusive flock(2) on their directory,
// or on a file in it, before they read or write anything there, and hold
// it until they end. The kernel drops the lock with the process however
// it ends (kill -9 included), so a stale lock never blocks a restart. A
// second process is refused with the holder's process ID, which the
// kernel lists in /proc/locks.
//
// The standard library has no advisory file lock and the kept libraries
// that offer one wrap this same system call, so it is written here.
package dirlock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Lock is a held lock on a data directory.
type Lock struct {
	f *os.File
}

// HeldError is returned by Acquire when another process, or another Lock
// of this process, holds the lock.
type HeldError struct {
	Path string // what is locked: the directory, or the lock file
	PID  int    // the holder's process ID; 0 if unknown
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is locked by %s", e.Path, e.Holder())
}

// Holder names the holder: "process N", or "another process" when its ID
// is unknown.
func (e *HeldError) Holder() string {
	if e.PID > 0 {
		return "process " + strconv.Itoa(e.PID)
	}
	return "another process"
}

// Acquire creates dir if needed and locks it without waiting: the
// directory itself when name is empty, which writes nothing into it, else
// the file name in it, created if needed and given the holder's process
// ID for people who look. It returns a *HeldError at once when the lock
// is held.
func Acquire(dir, name string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	path := dir
	var f *os.File
	var err error
	if name == "" {
		f, err = os.Open(dir)
	} else {
		path = filepath.Join(dir, name)
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid := holder(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: pid}
		}
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	if name != "" {
		// Informational only: a failure leaves the lock held.
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up. A lock file stays: removing it could race
// with a process that opened it and waits to lock it.
func (l *Lock) Release() error {
	return l.f.Close()
}

// holder returns the process ID /proc/locks gives for the flock on f's
// file, or 0.
func holder(f *os.File) int {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer locks.Close()
	// Lines read "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF";
	// waiters' lines carry "->" after the number and are skipped.
	sc := bufio.NewScanner(locks)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && f[1] == "FLOCK" && f[5] == id {
			pid, _ := strconv.Atoi(f[4])
			return pid
		}
	}
	return 0
}
