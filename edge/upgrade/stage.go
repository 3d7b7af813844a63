package upgrade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Staged is an executable ready for a trial.
type Staged struct {
	// Path is the staged file, beside Installed.
	Path string `json:"path"`
	// Installed is the executable the agent's service starts.
	Installed string `json:"installed"`
	// Digest is the staged file's SHA-256, "sha256:HEX".
	Digest string `json:"digest"`
	// Version is what the staged executable says it is.
	Version string `json:"version"`
	// Release names the hub's Release the executable came from, when a
	// rollout asked for it; "" when a user staged a file.
	Release string `json:"release,omitempty"`
}

// versionTimeout bounds the check that a staged executable runs.
const versionTimeout = 20 * time.Second

// Stage copies the executable src beside installed, checks its digest
// against want ("sha256:HEX" or bare HEX; "" checks nothing) and runs it
// with `version` to learn its version and that it runs on this machine.
// Nothing is left beside installed when it fails.
func Stage(ctx context.Context, src, installed, want string) (Staged, error) {
	want = strings.TrimPrefix(strings.ToLower(want), "sha256:")
	if want != "" {
		if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
			return Staged{}, fmt.Errorf("digest %q: want 64 hexadecimal digits, optionally after sha256:", want)
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return Staged{}, err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return Staged{}, err
	} else if !fi.Mode().IsRegular() {
		return Staged{}, fmt.Errorf("%s is not a regular file", src)
	}
	dir, name := filepath.Split(installed)
	tmp, err := os.CreateTemp(dir, "."+name+".staging-*")
	if err != nil {
		return Staged{}, fmt.Errorf("stage beside %s: %w", installed, err)
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		return Staged{}, fmt.Errorf("copy %s: %w", src, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && sum != want {
		return Staged{}, fmt.Errorf("%s has digest sha256:%s, not the sha256:%s asked for", src, sum, want)
	}
	if cur, err := FileDigest(installed); err == nil && cur == "sha256:"+sum {
		return Staged{}, fmt.Errorf("%s is the installed executable already (sha256:%s)", src, sum)
	}
	if err := tmp.Chmod(0o755); err != nil {
		return Staged{}, err
	}
	if err := tmp.Sync(); err != nil {
		return Staged{}, err
	}
	_ = Uncache(tmp) // advice: see Uncache
	if err := tmp.Close(); err != nil {
		return Staged{}, err
	}
	path := filepath.Join(dir, "."+name+"."+sum[:16])
	if err := os.Rename(tmp.Name(), path); err != nil {
		return Staged{}, err
	}
	keep = true
	version, err := runVersion(ctx, path)
	if err != nil {
		os.Remove(path)
		return Staged{}, fmt.Errorf("%s does not run here: %w", src, err)
	}
	if err := syncDir(dir); err != nil {
		os.Remove(path)
		return Staged{}, err
	}
	return Staged{Path: path, Installed: installed, Digest: "sha256:" + sum, Version: version}, nil
}

// Leftovers returns the files upgrades keep or may leave beside the
// installed executable: the previous executable, staged ones and
// unfinished copies (.NAME.*). Removing the installation removes them.
func Leftovers(installed string) ([]string, error) {
	dir, name := filepath.Split(installed)
	es, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), "."+name+".") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// ProcessStart returns when a process started, in clock ticks since boot
// (the 22nd field of /proc/PID/stat); pid "self" is the caller. An exec
// keeps it, as it keeps the PID.
func ProcessStart(pid string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// After the name: state (field 3) ... starttime (field 22).
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%s/stat: %d fields after the command name", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// runVersion runs `path version` and returns the version it prints
// ("tether VERSION (...)").
func runVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "version")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s version: %w: %s", filepath.Base(path), err, bytes.TrimSpace(out.Bytes()))
	}
	f := strings.Fields(out.String())
	if len(f) < 2 || f[0] != "tether" {
		return "", fmt.Errorf("%s version printed %q, not tether's version", filepath.Base(path), bytes.TrimSpace(out.Bytes()))
	}
	return f[1], nil
}

// FileDigest returns a file's SHA-256 as "sha256:HEX".
func FileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
