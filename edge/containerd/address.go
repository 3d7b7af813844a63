package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// addressFile, in the runtime's data directory, holds the socket of the
// containerd the runtime last used, so that `tether edge reset` finds the
// containerd of an agent that ran with another --containerd-address than
// the default (scripts/up.sh runs one under its data directory).
const addressFile = "containerd-address"

// recordAddress writes addr to dataDir's address file, atomically, when it
// holds something else.
func recordAddress(dataDir, addr string) error {
	path := filepath.Join(dataDir, addressFile)
	if old, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(old)) == addr {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o600); err != nil {
		return fmt.Errorf("record containerd address: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("record containerd address: %w", err)
	}
	return nil
}

// RecordedAddress returns the socket of the containerd the runtime used
// last with dataDir, and false when it never ran there.
func RecordedAddress(dataDir string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, addressFile))
	if err != nil {
		return "", false
	}
	addr := strings.TrimSpace(string(b))
	return addr, addr != ""
}
