// Package dirlock keeps one process at a time on a data directory: the hub
// and the edge agent each take an exclusive flock(2) on a file of their
// directory before they read or write anything in it, and hold it until
// they end. The kernel drops the lock with the process however it ends
// (kill -9 included), so a stale lock file never blocks a restart; the
// file records the holder's process ID only to name it in the error a
// second process gets.
//
// The standard library has no advisory file lock and the kept libraries
// that offer one wrap this same system call, so it is written here.
package dirlock

import (
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
	Path string // the lock file
	PID  int    // the holder's process ID as it recorded it; 0 if unknown
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is held by %s", e.Path, e.Holder())
}

// Holder names the holder: "process N", or "another process" when the
// lock file records none.
func (e *HeldError) Holder() string {
	if e.PID > 0 {
		return "process " + strconv.Itoa(e.PID)
	}
	return "another process"
}

// Acquire creates dir if needed and takes the lock file name in it without
// waiting: it returns a *HeldError at once when the lock is held.
func Acquire(dir, name string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return nil, &HeldError{Path: path, PID: pid}
		}
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	// The record is informational: a failure to write it leaves the lock
	// held and only the error of a second process less precise.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Release gives the lock up. The file stays: removing it could race with
// a process that opened it and waits to lock it.
func (l *Lock) Release() error {
	return l.f.Close()
}
