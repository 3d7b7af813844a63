package releases

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// blobs keeps executables by digest and the deltas between them.
type blobs struct {
	dir string // the store's directory: sha256/ and deltas/ below it

	mu sync.Mutex
	// flights are the deltas being computed, by "NEWHEX-OLDHEX".
	flights map[string]*flight
	// encoding admits one delta computation at a time: each holds the
	// old executable and a window as large in memory.
	encoding chan struct{}
}

// flight is one delta being computed; done closes when err is set.
type flight struct {
	done chan struct{}
	err  error
}

// tmpPrefix starts the names of files being written; a start removes
// those a crash left.
const tmpPrefix = ".tmp-"

func openBlobs(dir string) (*blobs, error) {
	b := &blobs{dir: dir, flights: map[string]*flight{}, encoding: make(chan struct{}, 1)}
	for _, d := range []string{b.blobDir(), b.deltaDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("release store: %w", err)
		}
		entries, err := os.ReadDir(d)
		if err != nil {
			return nil, fmt.Errorf("release store: %w", err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), tmpPrefix) {
				_ = os.Remove(filepath.Join(d, e.Name()))
			}
		}
	}
	return b, nil
}

func (b *blobs) blobDir() string  { return filepath.Join(b.dir, "sha256") }
func (b *blobs) deltaDir() string { return filepath.Join(b.dir, "deltas") }

// blobPath is where the blob of hex is kept.
func (b *blobs) blobPath(hex string) string { return filepath.Join(b.blobDir(), hex) }

// deltaPath is where the delta from oldHex to newHex is kept; its digest
// is in the same name with ".sha256" added.
func (b *blobs) deltaPath(newHex, oldHex string) string {
	return filepath.Join(b.deltaDir(), newHex+"-"+oldHex+".zst")
}

// has reports whether the blob of hex is held.
func (b *blobs) has(hex string) bool {
	fi, err := os.Stat(b.blobPath(hex))
	return err == nil && fi.Mode().IsRegular()
}

// staged is an executable received into a temporary file of the store,
// with its digest and size.
type staged struct {
	f    *os.File
	hex  string
	size int64
}

// stage writes r, at most limit bytes, to a temporary file, synced, and
// hashes it. errTooLarge when r holds more.
func (b *blobs) stage(r io.Reader, limit int64) (*staged, error) {
	f, err := os.CreateTemp(b.blobDir(), tmpPrefix+"import-*")
	if err != nil {
		return nil, fmt.Errorf("release store: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, limit+1))
	if err == nil && n > limit {
		err = errTooLarge
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return &staged{f: f, hex: hex.EncodeToString(h.Sum(nil)), size: n}, nil
}

var errTooLarge = errors.New("the executable is larger than the hub accepts")

// discard removes a staged file that was not kept.
func (s *staged) discard() {
	s.f.Close()
	os.Remove(s.f.Name())
}

// keep moves a staged file to its blob, unless the blob is already held.
func (b *blobs) keep(s *staged) error {
	defer s.discard() // after the rename, removes nothing
	if b.has(s.hex) {
		return nil
	}
	if err := s.f.Chmod(0o644); err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	if err := os.Rename(s.f.Name(), b.blobPath(s.hex)); err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	return syncDir(b.blobDir())
}

// delta returns the path of the delta from oldHex to newHex and its
// digest ("sha256:HEX"), computing it first if it is not kept yet. One
// computation runs per pair, whoever asks; it goes on when the asker
// leaves, so the next one finds it done.
func (b *blobs) delta(ctx context.Context, newHex, oldHex string) (string, string, error) {
	path := b.deltaPath(newHex, oldHex)
	if d, err := b.deltaDigest(path); err == nil {
		return path, d, nil
	}
	key := newHex + "-" + oldHex
	b.mu.Lock()
	fl := b.flights[key]
	if fl == nil {
		fl = &flight{done: make(chan struct{})}
		b.flights[key] = fl
		go func() {
			fl.err = b.encode(newHex, oldHex)
			b.mu.Lock()
			delete(b.flights, key)
			b.mu.Unlock()
			close(fl.done)
		}()
	}
	b.mu.Unlock()
	select {
	case <-ctx.Done():
		return "", "", ctx.Err()
	case <-fl.done:
	}
	if fl.err != nil {
		return "", "", fl.err
	}
	d, err := b.deltaDigest(path)
	return path, d, err
}

// deltaDigest reads the digest kept beside a delta, or, when the delta is
// there without it (a crash between the two renames), hashes the delta
// and keeps its digest.
func (b *blobs) deltaDigest(path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", err
	}
	if d, err := os.ReadFile(path + ".sha256"); err == nil {
		if _, perr := fleetapi.ParseDigest(string(d)); perr == nil {
			return string(d), nil
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	return d, writeFile(b.deltaDir(), path+".sha256", []byte(d))
}

// encode computes the delta from oldHex to newHex and keeps it: its digest
// first, then the delta, each by rename.
func (b *blobs) encode(newHex, oldHex string) error {
	b.encoding <- struct{}{}
	defer func() { <-b.encoding }()
	path := b.deltaPath(newHex, oldHex)
	if _, err := os.Stat(path); err == nil {
		return nil // computed while this one waited
	}
	old, err := os.ReadFile(b.blobPath(oldHex))
	if err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	cur, err := os.Open(b.blobPath(newHex))
	if err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	defer cur.Close()
	tmp, err := os.CreateTemp(b.deltaDir(), tmpPrefix+"delta-*")
	if err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, removes nothing
	defer tmp.Close()
	h := sha256.New()
	if err := fleetapi.EncodeDelta(io.MultiWriter(tmp, h), old, cur); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	if err := writeFile(b.deltaDir(), path+".sha256", []byte("sha256:"+hex.EncodeToString(h.Sum(nil)))); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	return syncDir(b.deltaDir())
}

// writeFile writes data to path in dir by rename of a synced file.
func writeFile(dir, path string, data []byte) error {
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	return syncDir(dir)
}

// syncDir makes the renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("release store: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("release store: sync %s: %w", dir, err)
	}
	return nil
}
