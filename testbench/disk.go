package testbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// DiskParams describes the impairment of a node's data dir. The zero value
// is a disk at full speed.
type DiskParams struct {
	// Delay is added to every read, write and fsync that reaches the
	// disk. Reads served from the kernel's page cache do not reach it.
	Delay Duration `json:"delay,omitempty"`
	// Rate caps the disk's throughput in bytes per second; zero means
	// unlimited. Reads and writes share it and queue behind each other.
	Rate int64 `json:"rateBytesPerSec,omitempty"`
}

// ErrSlowDiskUnsupported is returned by SlowDisk and ShapeDisk when the
// node's data dir has no FUSE delay layer: /dev/fuse is missing or the lab
// was built with Config.PlainDisks.
var ErrSlowDiskUnsupported = errors.New("slow disk is not supported: the node's data dir has no FUSE delay layer (no /dev/fuse, or Config.PlainDisks)")

// fuseFSType is the subtype of the lab's FUSE mounts: they show up as
// "fuse.tetherlab" in /proc/self/mountinfo, with source "tl<lab id>".
const fuseFSType = "tetherlab"

// slowDisk is a pass-through FUSE file system over a node's real data dir
// that delays the operations reaching it. It is served by the lab process.
type slowDisk struct {
	mnt     string
	backing string
	server  *fuse.Server

	mu        sync.Mutex
	params    DiskParams
	changed   chan struct{} // closed and replaced when params change
	busyUntil time.Time     // end of the last transfer under Rate
}

// mountSlowDisk mounts a loopback of backing at mnt. It mounts the kernel
// file system directly (the lab runs as root), so no fusermount binary is
// needed.
func mountSlowDisk(backing, mnt, source string) (*slowDisk, error) {
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("loopback %s: %w", backing, err)
	}
	d := &slowDisk{mnt: mnt, backing: backing, changed: make(chan struct{})}
	lb, ok := root.(*fs.LoopbackNode)
	if !ok {
		return nil, fmt.Errorf("loopback %s: unexpected root node %T", backing, root)
	}
	// Every access goes through this mount, so the kernel may cache names
	// and attributes.
	sec := time.Second
	// go-fuse opens /dev/fuse without O_CLOEXEC when it mounts directly.
	// A process the lab starts must not inherit it: it would keep the
	// connection alive after the lab dies, and a request it then makes
	// would wait forever. Holding ForkLock keeps forks out until the flag
	// is set.
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	defer closeFuseOnExec()
	d.server, err = fs.Mount(mnt, &slowNode{LoopbackNode: lb, d: d}, &fs.Options{
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
		MountOptions: fuse.MountOptions{
			DirectMount:       true,
			DirectMountStrict: true,
			AllowOther:        true,
			FsName:            source,
			Name:              fuseFSType,
			// The server runs as root; let the kernel check permissions as
			// it would on the tmpfs underneath.
			Options: []string{"default_permissions"},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mount fuse at %s: %w", mnt, err)
	}
	return d, nil
}

func (d *slowDisk) set(p DiskParams) {
	d.mu.Lock()
	d.params = p
	d.busyUntil = time.Time{}
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

func (d *slowDisk) get() DiskParams {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.params
}

// wait delays an operation moving n bytes. A change of the parameters
// while it waits re-times it under the new ones, so healing releases
// operations already waiting. It returns EINTR when the kernel interrupts
// the request (the caller was killed).
func (d *slowDisk) wait(ctx context.Context, n int) syscall.Errno {
	start := time.Now()
	d.mu.Lock()
	p, changed := d.params, d.changed
	end := start
	if p.Rate > 0 {
		if d.busyUntil.After(end) {
			end = d.busyUntil
		}
		end = end.Add(time.Duration(float64(n) / float64(p.Rate) * float64(time.Second)))
		d.busyUntil = end
	}
	d.mu.Unlock()
	end = end.Add(time.Duration(p.Delay))
	for {
		left := time.Until(end)
		if left <= 0 {
			return 0
		}
		t := time.NewTimer(left)
		select {
		case <-t.C:
			return 0
		case <-ctx.Done():
			t.Stop()
			return syscall.EINTR
		case <-changed:
			t.Stop()
			d.mu.Lock()
			p, changed = d.params, d.changed
			d.mu.Unlock()
			end = start.Add(time.Duration(p.Delay))
			if p.Rate > 0 {
				end = end.Add(time.Duration(float64(n) / float64(p.Rate) * float64(time.Second)))
			}
		}
	}
}

// close unmounts the file system and stops serving it. Processes using it
// must be gone. If the kernel still holds the mount busy, it is left to
// the lazy unmount of removeState.
func (d *slowDisk) close() error {
	if err := d.server.Unmount(); err != nil {
		return fmt.Errorf("unmount fuse at %s: %w", d.mnt, err)
	}
	return nil
}

// slowNode is a loopback node whose open files are slowed by its disk.
// Children created through it are wrapped the same way.
type slowNode struct {
	*fs.LoopbackNode
	d *slowDisk
}

var (
	_ fs.NodeWrapChilder = (*slowNode)(nil)
	_ fs.NodeOpener      = (*slowNode)(nil)
	_ fs.NodeCreater     = (*slowNode)(nil)
)

func (n *slowNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &slowNode{LoopbackNode: lb, d: n.d}
	}
	return ops
}

func (n *slowNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fl, errno
}

func (n *slowNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return ch, n.wrap(fh), fl, errno
}

func (n *slowNode) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &slowFile{LoopbackFile: lf, d: n.d}
	}
	return fh
}

// slowFile delays reads, writes and fsyncs of a loopback file and forwards
// everything else unchanged.
type slowFile struct {
	*fs.LoopbackFile
	d *slowDisk
}

var (
	_ fs.FileReader          = (*slowFile)(nil)
	_ fs.FileWriter          = (*slowFile)(nil)
	_ fs.FileWritever        = (*slowFile)(nil)
	_ fs.FileFsyncer         = (*slowFile)(nil)
	_ fs.FilePassthroughFder = (*slowFile)(nil)
)

// PassthroughFd refuses kernel passthrough: reads and writes must come
// to the server to be delayed.
func (f *slowFile) PassthroughFd() (int, bool) { return -1, false }

func (f *slowFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := f.d.wait(ctx, len(dest)); errno != 0 {
		return nil, errno
	}
	return f.LoopbackFile.Read(ctx, dest, off)
}

func (f *slowFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.d.wait(ctx, len(data)); errno != 0 {
		return 0, errno
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *slowFile) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	n := 0
	for _, b := range data {
		n += len(b)
	}
	if errno := f.d.wait(ctx, n); errno != 0 {
		return 0, errno
	}
	return f.LoopbackFile.Writev(ctx, data, off)
}

func (f *slowFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := f.d.wait(ctx, 0); errno != 0 {
		return errno
	}
	return f.LoopbackFile.Fsync(ctx, flags)
}

// closeFuseOnExec sets close-on-exec on every /dev/fuse descriptor of the
// process.
func closeFuseOnExec() {
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if t, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && t == "/dev/fuse" {
			syscall.CloseOnExec(fd)
		}
	}
}

// fuseAvailable reports whether the kernel offers FUSE.
func fuseAvailable() bool {
	_, err := os.Stat("/dev/fuse")
	return err == nil
}

func (l *Lab) disk(node string) (*Host, *slowDisk, error) {
	h := l.hosts[node]
	if h == nil || h.DataDir == "" {
		return nil, nil, fmt.Errorf("no node %q", node)
	}
	l.mu.Lock()
	d := l.disks[node]
	l.mu.Unlock()
	if d == nil {
		return h, nil, ErrSlowDiskUnsupported
	}
	return h, d, nil
}

// SlowDisk adds delay to every read, write and fsync that reaches a node's
// data dir, and removes any rate cap; SlowDisk(node, 0) restores full
// speed. It applies at once, to files already open too.
func (l *Lab) SlowDisk(node string, delay time.Duration) error {
	if err := l.ShapeDisk(node, DiskParams{Delay: Duration(delay)}); err != nil {
		return fmt.Errorf("slow disk: %w", err)
	}
	return nil
}

// ShapeDisk replaces the impairment of a node's data dir.
func (l *Lab) ShapeDisk(node string, p DiskParams) error {
	if p.Delay < 0 || p.Rate < 0 {
		return fmt.Errorf("shape disk of %s: negative delay or rate", node)
	}
	_, d, err := l.disk(node)
	if err != nil {
		return fmt.Errorf("shape disk of %s: %w", node, err)
	}
	d.set(p)
	l.log.Info("shaped disk", "node", node, "params", p)
	return nil
}

// Disk returns the current impairment of a node's data dir.
func (l *Lab) Disk(node string) (DiskParams, error) {
	_, d, err := l.disk(node)
	if err != nil {
		return DiskParams{}, fmt.Errorf("get disk of %s: %w", node, err)
	}
	return d.get(), nil
}

// abortFuse aborts the FUSE connections of those mounts that are FUSE
// mounts, so that no process waits on a server that is gone. The kernel
// does that by itself when the server's last /dev/fuse descriptor closes;
// this covers a descriptor that leaked into another process. scratch is a
// directory to mount fusectl on when /sys/fs/fuse/connections is not.
func abortFuse(mounts []string, scratch string) error {
	want := map[string]bool{}
	for _, m := range mounts {
		want[m] = true
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	var conns []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+1 >= len(f) || !want[f[4]] || !strings.HasPrefix(f[sep+1], "fuse") {
			continue
		}
		if _, minor, ok := strings.Cut(f[2], ":"); ok {
			conns = append(conns, minor)
		}
	}
	if len(conns) == 0 {
		return nil
	}
	ctl := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(ctl, conns[0])); err != nil {
		if err := os.MkdirAll(scratch, 0o755); err != nil {
			return fmt.Errorf("abort fuse: %w", err)
		}
		if err := syscall.Mount("fusectl", scratch, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("abort fuse: mount fusectl: %w", err)
		}
		defer syscall.Unmount(scratch, syscall.MNT_DETACH)
		ctl = scratch
	}
	var errs []error
	for _, c := range conns {
		f, err := os.OpenFile(filepath.Join(ctl, c, "abort"), os.O_WRONLY, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue // already gone
		}
		if err == nil {
			_, err = f.WriteString("1")
			f.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("abort fuse connection %s: %w", c, err))
		}
	}
	return errors.Join(errs...)
}
