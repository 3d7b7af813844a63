// Package bundle is tether's air-gap bundle: one archive that carries
// container image archives and tether executables to sites without a way
// to a registry or to the hub's release store, on a USB stick or by any
// copy an operator has.
//
// A bundle is a tar file whose first entry, bundle.json, lists every
// other entry with its SHA-256 and size: image archives (OCI image
// layouts or `docker save` tarballs, as `tether edge images import`
// takes) under images/, and executables of tether under releases/, each
// with the version, architecture and build its Go build information
// names. Reading a bundle checks every entry against the list, so a
// truncated or altered copy is refused rather than half imported.
//
// The format is written here rather than taken from an OCI tool because
// it carries two kinds of things that no image format holds (executables
// beside images) and because its reader must work on the edge build,
// which links no registry client.
package bundle

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// ManifestName is the first entry of every bundle.
const ManifestName = "bundle.json"

// Format is the version of the layout this package writes and reads.
const Format = 1

// Manifest lists a bundle's entries.
type Manifest struct {
	Format   int       `json:"format"`
	Created  time.Time `json:"created"`
	Images   []Entry   `json:"images,omitempty"`
	Releases []Release `json:"releases,omitempty"`
}

// Entry is one file of a bundle.
type Entry struct {
	// File is the entry's name in the archive.
	File string `json:"file"`
	// Digest is "sha256:HEX" of its bytes.
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Release is an executable of tether in a bundle.
type Release struct {
	Entry
	fleetapi.Executable
}

// Create writes a bundle of the image archives images and the tether
// executables releases to w. Names in the bundle are the files' base
// names; two inputs of one kind with the same base name are an error.
func Create(w io.Writer, images, releases []string, now time.Time) (Manifest, error) {
	m := Manifest{Format: Format, Created: now.UTC().Truncate(time.Second)}
	var files []string
	seen := map[string]bool{}
	add := func(dir, src string) (Entry, error) {
		name := path.Join(dir, filepath.Base(src))
		if seen[name] {
			return Entry{}, fmt.Errorf("two inputs named %s", filepath.Base(src))
		}
		seen[name] = true
		d, size, err := digestFile(src)
		if err != nil {
			return Entry{}, err
		}
		files = append(files, src)
		return Entry{File: name, Digest: d, Size: size}, nil
	}
	for _, img := range images {
		if err := checkImageArchive(img); err != nil {
			return m, err
		}
		e, err := add("images", img)
		if err != nil {
			return m, err
		}
		m.Images = append(m.Images, e)
	}
	for _, rel := range releases {
		exe, err := readExecutable(rel)
		if err != nil {
			return m, err
		}
		e, err := add("releases", rel)
		if err != nil {
			return m, err
		}
		m.Releases = append(m.Releases, Release{Entry: e, Executable: exe})
	}
	if len(files) == 0 {
		return m, errors.New("an empty bundle: give image archives, executables or both")
	}
	head, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, err
	}
	tw := tar.NewWriter(w)
	hdr := func(name string, size int64, mode int64) *tar.Header {
		return &tar.Header{Name: name, Size: size, Mode: mode, ModTime: m.Created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	}
	if err := tw.WriteHeader(hdr(ManifestName, int64(len(head)), 0o644)); err != nil {
		return m, err
	}
	if _, err := tw.Write(head); err != nil {
		return m, err
	}
	entries := m.entries()
	for i, src := range files {
		e := entries[i]
		mode := int64(0o644)
		if strings.HasPrefix(e.File, "releases/") {
			mode = 0o755
		}
		if err := tw.WriteHeader(hdr(e.File, e.Size, mode)); err != nil {
			return m, err
		}
		f, err := os.Open(src)
		if err != nil {
			return m, err
		}
		n, err := io.Copy(tw, f)
		f.Close()
		if err != nil {
			return m, err
		}
		if n != e.Size {
			return m, fmt.Errorf("%s changed while the bundle was written", src)
		}
	}
	return m, tw.Close()
}

// entries lists every entry, images first, in the archive's order.
func (m Manifest) entries() []Entry {
	out := append([]Entry(nil), m.Images...)
	for _, r := range m.Releases {
		out = append(out, r.Entry)
	}
	return out
}

// Is reports whether the file at p is a bundle (its first entry is the
// manifest), without reading further.
func Is(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	h, err := tar.NewReader(f).Next()
	return err == nil && h.Name == ManifestName
}

// Read reads the manifest of the bundle at p.
func Read(p string) (Manifest, error) {
	f, err := os.Open(p)
	if err != nil {
		return Manifest{}, err
	}
	defer f.Close()
	m, _, err := readManifest(tar.NewReader(f), p)
	return m, err
}

func readManifest(tr *tar.Reader, p string) (Manifest, *tar.Reader, error) {
	h, err := tr.Next()
	if err != nil || h.Name != ManifestName {
		return Manifest{}, nil, fmt.Errorf("%s is not a tether bundle: its first entry is not %s", p, ManifestName)
	}
	var m Manifest
	dec := json.NewDecoder(io.LimitReader(tr, 4<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, nil, fmt.Errorf("%s: read %s: %w", p, ManifestName, err)
	}
	if m.Format != Format {
		return Manifest{}, nil, fmt.Errorf("%s: bundle format %d; this tether reads format %d", p, m.Format, Format)
	}
	for _, e := range m.entries() {
		if _, err := fleetapi.ParseDigest(e.Digest); err != nil {
			return Manifest{}, nil, fmt.Errorf("%s: entry %s: %w", p, e.File, err)
		}
		if e.File != path.Clean(e.File) || path.IsAbs(e.File) || strings.HasPrefix(e.File, "../") || path.Dir(e.File) == "." {
			return Manifest{}, nil, fmt.Errorf("%s: bad entry name %q", p, e.File)
		}
	}
	return m, tr, nil
}

// Extract writes the entries of the bundle at p that want accepts into
// dir (each at dir/ENTRY-NAME), checking every entry of the bundle, those
// not extracted included, against the manifest. It returns the manifest
// and the paths written, by entry name. Nothing is left in dir when it
// fails.
func Extract(p, dir string, want func(Entry) bool) (Manifest, map[string]string, error) {
	f, err := os.Open(p)
	if err != nil {
		return Manifest{}, nil, err
	}
	defer f.Close()
	m, tr, err := readManifest(tar.NewReader(f), p)
	if err != nil {
		return m, nil, err
	}
	byName := map[string]Entry{}
	for _, e := range m.entries() {
		byName[e.File] = e
	}
	out := map[string]string{}
	fail := func(err error) (Manifest, map[string]string, error) {
		for _, w := range out {
			os.Remove(w)
		}
		return m, nil, err
	}
	done := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", p, err))
		}
		e, ok := byName[h.Name]
		if !ok || done[h.Name] {
			return fail(fmt.Errorf("%s: entry %s is not in its manifest", p, h.Name))
		}
		done[h.Name] = true
		var dst io.Writer = io.Discard
		var file *os.File
		if want(e) {
			target := filepath.Join(dir, filepath.FromSlash(e.File))
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return fail(err)
			}
			mode := os.FileMode(0o644)
			if strings.HasPrefix(e.File, "releases/") {
				mode = 0o755
			}
			if file, err = os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode); err != nil {
				return fail(err)
			}
			out[e.File] = target
			dst = file
		}
		hash := sha256.New()
		n, err := io.Copy(io.MultiWriter(dst, hash), io.LimitReader(tr, e.Size+1))
		if file != nil {
			if cerr := file.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %s: %w", p, e.File, err))
		}
		if got := "sha256:" + hex.EncodeToString(hash.Sum(nil)); n != e.Size || got != e.Digest {
			return fail(fmt.Errorf("%s: %s does not match the manifest (%d bytes, %s; want %d bytes, %s): the bundle is damaged", p, e.File, n, got, e.Size, e.Digest))
		}
	}
	for name := range byName {
		if !done[name] {
			return fail(fmt.Errorf("%s: entry %s is missing: the bundle is truncated", p, name))
		}
	}
	return m, out, nil
}

func digestFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

func readExecutable(p string) (fleetapi.Executable, error) {
	f, err := os.Open(p)
	if err != nil {
		return fleetapi.Executable{}, err
	}
	defer f.Close()
	e, err := fleetapi.ReadExecutable(f)
	if err != nil {
		return e, fmt.Errorf("%s: %w", p, err)
	}
	return e, nil
}

// checkImageArchive refuses a file that is neither an OCI image layout
// nor a `docker save` archive: a tar holding index.json or manifest.json.
func checkImageArchive(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return fmt.Errorf("%s is not an image archive (a tar with index.json or manifest.json)", p)
		}
		switch path.Clean(h.Name) {
		case "index.json", "manifest.json":
			return nil
		}
	}
}
