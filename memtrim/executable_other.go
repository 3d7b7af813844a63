//go:build !linux

package memtrim

// releaseExecutable does nothing where MADV_PAGEOUT and the smaps file do
// not exist.
func releaseExecutable(Executable) (exe, libs int64, err error) { return 0, 0, nil }

// residentSize is not known here: releases after growth never happen.
func residentSize() uint64 { return 0 }
