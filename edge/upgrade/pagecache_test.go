package upgrade

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// resident is Cached, failing the test on an error.
func resident(t *testing.T, path string) (in, all int) {
	t.Helper()
	in, all, err := Cached(path)
	if err != nil {
		t.Fatal(err)
	}
	return in, all
}

// skipOnTmpfs skips where dir is on tmpfs, whose files live in memory
// only: there is no disk copy for a dropped page to be read back from,
// so the kernel keeps them.
func skipOnTmpfs(t *testing.T, dir string) {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs, which keeps every page in memory", dir)
	}
}

func TestUncacheDropsAWrittenExecutable(t *testing.T) {
	dir := t.TempDir()
	skipOnTmpfs(t, dir)
	path := filepath.Join(dir, "tether-edge")
	b := make([]byte, 8<<20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if in, all := resident(t, path); in < all/2 {
		t.Fatalf("%d of %d pages cached after the write: the check below would prove nothing", in, all)
	}
	if err := Uncache(f); err != nil {
		t.Fatal(err)
	}
	if in, all := resident(t, path); in != 0 {
		t.Errorf("%d of %d pages still cached after Uncache", in, all)
	}
}

func TestStageLeavesTheStagedExecutableUncached(t *testing.T) {
	h := newHost(t)
	skipOnTmpfs(t, h.bin)
	// A staged executable as large as a small agent's: `version` runs a
	// shell script that reads only its first page or so.
	src := fakeTether(t, filepath.Join(t.TempDir(), "new"), "v2")
	pad := make([]byte, 4<<20)
	for i := range pad {
		pad[i] = '#'
	}
	f, err := os.OpenFile(src, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(append(pad, '\n')); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Stage(t.Context(), src, h.installed, "")
	if err != nil {
		t.Fatal(err)
	}
	in, all := resident(t, s.Path)
	t.Logf("staged %s: %d of %d pages cached after its version check", s.Path, in, all)
	if in > all/4 {
		t.Errorf("%d of %d pages of the staged executable cached: Stage left the copy's pages in the page cache", in, all)
	}
}
