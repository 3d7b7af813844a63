package testbench

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func requireFUSE(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if !fuseAvailable() {
		t.Skip("slow disks need FUSE and /dev/fuse is missing")
	}
}

// syncedWrite times writing 4 KiB at the start of f and fsyncing it, the
// pattern of a database commit.
func syncedWrite(t *testing.T, f *os.File) time.Duration {
	t.Helper()
	buf := make([]byte, 4096)
	start := time.Now()
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	return time.Since(start)
}

// syncedWrites returns the minimum and median of n timed synced writes.
func syncedWrites(t *testing.T, f *os.File, n int) (minimum, median time.Duration) {
	t.Helper()
	ds := make([]time.Duration, n)
	for i := range ds {
		ds[i] = syncedWrite(t, f)
	}
	slices.Sort(ds)
	return ds[0], ds[n/2]
}

func TestSlowDisk(t *testing.T) {
	requireFUSE(t)
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}, DiskSize: 8})
	dir := l.Host("shop-n1").DataDir
	// Opened before the disk is slowed: the delay applies to open files.
	f, err := os.OpenFile(filepath.Join(dir, "db"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	const delay = 20 * time.Millisecond
	_, fast := syncedWrites(t, f, 9)
	t.Logf("full speed: 4 KiB write+fsync median %v", fast)
	if fast >= delay/2 {
		t.Errorf("4 KiB write+fsync at full speed took %v, want well under %v", fast, delay)
	}

	if err := l.SlowDisk("shop-n1", delay); err != nil {
		t.Fatal(err)
	}
	if p, err := l.Disk("shop-n1"); err != nil || time.Duration(p.Delay) != delay {
		t.Errorf("Disk = %+v, %v; want delay %v", p, err, delay)
	}
	slowMin, slowMed := syncedWrites(t, f, 5)
	t.Logf("delay %v: 4 KiB write+fsync min %v, median %v", delay, slowMin, slowMed)
	if slowMin < delay {
		t.Errorf("4 KiB write+fsync with a %v disk delay took %v, want at least that", delay, slowMin)
	}
	// A new file and an uncached read are slowed too.
	start := time.Now()
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < delay {
		t.Errorf("creating and writing a file took %v, want at least %v", d, delay)
	}

	// Healing releases a write that is already waiting.
	if err := l.SlowDisk("shop-n1", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		if _, err := f.WriteAt(make([]byte, 4096), 0); err != nil {
			t.Errorf("write: %v", err)
		}
		done <- time.Since(start)
	}()
	time.Sleep(50 * time.Millisecond)
	if err := l.SlowDisk("shop-n1", 0); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-done:
		t.Logf("write waiting on a 10 s delay finished %v after it started, healed after 50 ms", d)
	case <-time.After(2 * time.Second):
		t.Fatal("healing did not release a waiting write")
	}
	_, healed := syncedWrites(t, f, 9)
	t.Logf("healed: 4 KiB write+fsync median %v", healed)
	if healed >= delay/2 {
		t.Errorf("4 KiB write+fsync after healing took %v, want well under %v", healed, delay)
	}

	// A rate cap: 512 KiB at 4 MiB/s takes at least 125 ms.
	if err := l.ShapeDisk("shop-n1", DiskParams{Rate: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := f.WriteAt(make([]byte, 512<<10), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 125*time.Millisecond {
		t.Errorf("512 KiB at 4 MiB/s took %v, want at least 125ms", d)
	} else {
		t.Logf("512 KiB at 4 MiB/s: %v", d)
	}
	if err := l.SlowDisk("shop-n1", 0); err != nil {
		t.Fatal(err)
	}

	// Processes inside the node see the same data dir.
	p, err := l.Start("shop-n1", "writer", "sh", "-c", `echo hi > "$1/from-node"`, "sh", dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("writer in the node: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "from-node")); err != nil || string(b) != "hi\n" {
		t.Errorf("file written inside the node: %q, %v", b, err)
	}

	if err := l.SlowDisk("nope", delay); err == nil {
		t.Errorf("SlowDisk of an unknown node succeeded")
	}
}

func TestSlowDiskPlain(t *testing.T) {
	requireRoot(t)
	l, err := Up(t.Context(), Config{Spec: Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}}, PlainDisks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	if bytes.Contains(mountinfo(), []byte("fuse."+fuseFSType+" tl"+l.ID()+" ")) {
		t.Errorf("lab with plain disks mounted FUSE")
	}
	if err := l.SlowDisk("shop-n1", time.Millisecond); !errors.Is(err, ErrSlowDiskUnsupported) {
		t.Errorf("SlowDisk on a plain disk: %v, want ErrSlowDiskUnsupported", err)
	}
}
