package deploy

import (
	"bytes"
	"io/fs"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tether-edge/tether/edge/upgrade"
)

// TestWriteFileLeavesExecutablesUncached: the executable install writes
// runs from the disk's copy, not from the large folios the write cached
// (see upgrade.Uncache); other files stay cached.
func TestWriteFileLeavesExecutablesUncached(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs, which keeps every page in memory", dir)
	}
	data := bytes.Repeat([]byte("tether "), 1<<20)
	for _, c := range []struct {
		name     string
		mode     fs.FileMode
		uncached bool
	}{
		{"tether-edge", 0o755, true},
		{"edge.yaml", 0o600, false},
	} {
		path := filepath.Join(dir, c.name)
		changed, err := writeFile(path, data, c.mode)
		if err != nil || !changed {
			t.Fatalf("writeFile %s: changed %v, %v", c.name, changed, err)
		}
		in, all, err := upgrade.Cached(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s (%o): %d of %d pages cached", c.name, c.mode, in, all)
		if c.uncached && in != 0 {
			t.Errorf("%s: %d of %d pages still cached after the install wrote it", c.name, in, all)
		}
		if !c.uncached && in < all/2 {
			t.Errorf("%s: %d of %d pages cached: only executables should be dropped", c.name, in, all)
		}
	}
}
