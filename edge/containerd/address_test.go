package containerd

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRecordedAddress(t *testing.T) {
	dir := t.TempDir()
	if addr, ok := RecordedAddress(dir); ok {
		t.Fatalf("a data directory no runtime used has %q recorded", addr)
	}
	sock := filepath.Join(dir, "containerd.sock")
	for range 2 {
		if err := recordAddress(dir, sock); err != nil {
			t.Fatal(err)
		}
		if addr, ok := RecordedAddress(dir); !ok || addr != sock {
			t.Fatalf("recorded %q, %v; want %q", addr, ok, sock)
		}
	}
	if err := recordAddress(dir, "/run/containerd/containerd.sock"); err != nil {
		t.Fatal(err)
	}
	if addr, _ := RecordedAddress(dir); addr != "/run/containerd/containerd.sock" {
		t.Fatalf("after a change: %q", addr)
	}
	if _, err := os.Stat(filepath.Join(dir, addressFile+".tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary file stayed: %v", err)
	}
}
