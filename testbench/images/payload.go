package images

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
)

// BuildPayload writes an OCI archive at dst of one image named name (a
// full reference, as Image.Name): a static busybox, whose sleep the image
// runs, and a file /payload of size random bytes, which no compression
// shrinks, so that the image costs about its size on any link. It needs
// the static busybox of HasShell.
func BuildPayload(dst, name string, size int) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil || !isStatic("/bin/busybox") {
		return fmt.Errorf("payload image: needs a static /bin/busybox (%v)", err)
	}
	payload := make([]byte, size)
	if _, err := rand.Read(payload); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	return WriteArchive(dst, Image{
		Name: name, Entrypoint: []string{"/bin/sleep"}, Cmd: []string{"3600"}, Env: []string{"PATH=/bin"},
		Layer: []File{
			{Path: "bin/busybox", Mode: 0o755, Data: bb}, {Path: "bin/sleep", Link: "busybox"}, {Path: "bin/sh", Link: "busybox"},
			{Path: "payload", Mode: 0o644, Data: payload}, {Path: "tmp", Dir: true, Mode: 0o1777},
		},
	})
}

// BlobSizes returns the sizes, by digest, of the blobs (config and
// layers) of the image repo:tag the registry serves; nil if it serves no
// such image.
func (r *Registry) BlobSizes(ref string) map[string]int64 {
	d, ok := r.manifests[ref]
	if !ok {
		return nil
	}
	var m struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(r.blobs[d], &m); err != nil {
		return nil
	}
	out := map[string]int64{m.Config.Digest: m.Config.Size}
	for _, l := range m.Layers {
		out[l.Digest] = l.Size
	}
	return out
}
