//go:build !linux

package hub

// pageOutExecutable does nothing where MADV_PAGEOUT does not exist.
func pageOutExecutable() (int64, error) { return 0, nil }
