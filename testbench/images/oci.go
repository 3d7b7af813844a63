package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// File is one entry of an image layer.
type File struct {
	// Path inside the image, without a leading slash.
	Path string
	// Mode holds the permission bits.
	Mode int64
	// Data is the content of a regular file.
	Data []byte
	// Link, when set, makes the entry a symbolic link to Link.
	Link string
	// Dir makes the entry a directory.
	Dir bool
}

// Image is one image of an OCI archive.
type Image struct {
	// Name is the full reference, for example
	// docker.io/library/tether-test:v1.
	Name string
	// Entrypoint and Cmd are the image config's defaults.
	Entrypoint, Cmd []string
	// Env is the config's environment, KEY=VALUE.
	Env []string
	// WorkingDir is the config's working directory.
	WorkingDir string
	// Layer is the image's only layer.
	Layer []File
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

// epoch is the time of every file: the layers are reproducible.
var epoch = time.Unix(0, 0)

// layerTar writes files as a gzipped tar and returns it with the digest
// of the uncompressed tar (the config's diff ID).
func layerTar(files []File) (gz []byte, diffID string, err error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	// Parent directories must precede their files.
	dirs := map[string]bool{}
	for _, f := range sorted {
		if f.Dir {
			dirs[f.Path] = true
		}
	}
	var withDirs []File
	for _, f := range sorted {
		for d := path.Dir(f.Path); d != "." && d != "/"; d = path.Dir(d) {
			if !dirs[d] {
				dirs[d] = true
				withDirs = append(withDirs, File{Path: d, Dir: true, Mode: 0o755})
			}
		}
		withDirs = append(withDirs, f)
	}
	sort.SliceStable(withDirs, func(i, j int) bool { return withDirs[i].Path < withDirs[j].Path })
	for _, f := range withDirs {
		h := &tar.Header{Name: f.Path, Mode: f.Mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, f.Path+"/"
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, "", fmt.Errorf("write layer entry %s: %w", f.Path, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, "", fmt.Errorf("write layer entry %s: %w", f.Path, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", fmt.Errorf("close layer: %w", err)
	}
	diffID = digest(raw.Bytes())
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	zw.Write(raw.Bytes())
	if err := zw.Close(); err != nil {
		return nil, "", fmt.Errorf("compress layer: %w", err)
	}
	return out.Bytes(), diffID, nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// WriteArchive writes images as one OCI image-layout tar archive at dst,
// which containerd (and `tether edge images import`) import under the
// images' names. Identical layers are stored once.
func WriteArchive(dst string, images ...Image) error {
	blobs := map[string][]byte{}
	add := func(mediaType string, b []byte) descriptor {
		d := digest(b)
		blobs[d] = b
		return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
	}
	var index struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Manifests     []descriptor `json:"manifests"`
	}
	index.SchemaVersion, index.MediaType = 2, "application/vnd.oci.image.index.v1+json"
	for _, img := range images {
		gz, diffID, err := layerTar(img.Layer)
		if err != nil {
			return fmt.Errorf("build image %s: %w", img.Name, err)
		}
		layer := add("application/vnd.oci.image.layer.v1.tar+gzip", gz)
		cfg := map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"config": map[string]any{
				"Entrypoint": img.Entrypoint, "Cmd": img.Cmd, "Env": img.Env, "WorkingDir": img.WorkingDir,
			},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
			"created": epoch.UTC().Format(time.RFC3339),
		}
		cfgJSON, _ := json.Marshal(cfg)
		config := add("application/vnd.oci.image.config.v1+json", cfgJSON)
		manifest, _ := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     "application/vnd.oci.image.manifest.v1+json",
			"config":        config,
			"layers":        []descriptor{layer},
		})
		md := add("application/vnd.oci.image.manifest.v1+json", manifest)
		tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
		md.Annotations = map[string]string{
			"io.containerd.image.name":          img.Name,
			"org.opencontainers.image.ref.name": tag,
		}
		md.Platform = map[string]string{"architecture": "amd64", "os": "linux"}
		index.Manifests = append(index.Manifests, md)
	}
	indexJSON, _ := json.Marshal(index)

	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("create image archive: %w", err)
	}
	tw := tar.NewWriter(f)
	write := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	err = write("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	if err == nil {
		err = write("index.json", indexJSON)
	}
	digests := make([]string, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err == nil {
			err = write("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d])
		}
	}
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("write image archive %s: %w", dst, err)
	}
	return nil
}
