package staticpods

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Rescan is how often the agent reads the manifest directory in full, as
// the kubelet's file-check frequency.
const Rescan = 20 * time.Second

// Watch calls scan now, after every change of the manifest directory path
// (inotify, settled for 100ms) and at least every rescan, until ctx ends.
// It creates the directory when it is missing; a directory that cannot
// be watched is read every rescan only.
func Watch(ctx context.Context, path string, rescan time.Duration, log *slog.Logger, scan func()) {
	if err := os.MkdirAll(path, 0o755); err != nil {
		log.Warn("create the static pod manifest directory", "path", path, "err", err)
	}
	events := make(chan struct{}, 1)
	var w *dirWatch
	defer func() {
		if w != nil {
			w.close()
		}
	}()
	t := time.NewTicker(rescan)
	defer t.Stop()
	for {
		if w == nil || w.dead() {
			if w != nil {
				w.close()
			}
			w, _ = watchDir(path, events) // nil: the periodic reads do
		}
		scan()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-events:
			// Writers write in steps: read once they are done.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			select {
			case <-events:
			default:
			}
		}
	}
}

// dirWatch is an inotify watch of a directory; it signals every change on
// a channel.
type dirWatch struct {
	f    *os.File
	done chan struct{} // closed when the watch ended (its directory went)
}

func watchDir(dir string, events chan<- struct{}) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	mask := uint32(unix.IN_CREATE | unix.IN_DELETE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB |
		unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF)
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	w := &dirWatch{f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := w.f.Read(buf)
			if err != nil {
				return
			}
			gone := false
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				if ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
					gone = true
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
			select {
			case events <- struct{}{}:
			default:
			}
			if gone {
				return
			}
		}
	}()
	return w, nil
}

func (w *dirWatch) dead() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *dirWatch) close() {
	w.f.Close()
	<-w.done
}
