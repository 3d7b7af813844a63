package containerd

import (
	"context"
	"crypto/rand"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// TestStagedImages: a staged image is pulled at the cap asked, listed for
// status.images with its size, kept by image garbage collection while
// staged, and collected once no staging names it.
func TestStagedImages(t *testing.T) {
	e := newTestRuntime(t, "10.231.6.0/24")
	// Bytes of its own: nothing the runtime imported shares its blobs.
	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)
	archive := filepath.Join(t.TempDir(), "staged.tar")
	if err := images.WriteArchive(archive, images.Image{Name: "docker.io/tether/staged:v1", Entrypoint: []string{"/payload"},
		Layer: []images.File{{Path: "payload", Mode: 0o755, Data: payload}}}); err != nil {
		t.Fatal(err)
	}
	reg, err := images.NewRegistry(archive)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/tether/staged:v1"
	var size int64
	for _, s := range reg.BlobSizes("tether/staged:v1") {
		size += s
	}
	ctx := context.Background()
	// A cap of a third of the image's blobs per second: the pull takes
	// about three seconds (the limiter's first burst is free).
	limit := size / 3
	began := time.Now()
	pulled, err := e.rt.StageImage(ctx, ref, limit)
	if err != nil || !pulled {
		t.Fatalf("stage %s: pulled %v, %v", ref, pulled, err)
	}
	if took := time.Since(began); took < 2*time.Second {
		t.Errorf("a %d-byte image at %d bytes/s took %v", size, limit, took)
	}
	if pulled, err := e.rt.StageImage(ctx, ref, 0); err != nil || pulled {
		t.Errorf("staging a held image: pulled %v, %v", pulled, err)
	}
	list, err := e.rt.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(c corev1.ContainerImage) bool { return slices.Contains(c.Names, ref) })
	if i < 0 || list[i].SizeBytes < size {
		t.Fatalf("images %+v: want %s of at least %d bytes", list, ref, size)
	}

	e.rt.cfg.ImageGCHighThresholdPercent, e.rt.cfg.ImageGCLowThresholdPercent = 0, -1
	if removed, err := e.rt.collectImages(ctx); err != nil || slices.Contains(removed, ref) {
		t.Fatalf("garbage collection removed %v (%v): the staged image must stay", removed, err)
	}
	if err := e.rt.SetStaged(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if removed, err := e.rt.collectImages(ctx); err != nil || !slices.Contains(removed, ref) {
		t.Errorf("garbage collection removed %v (%v): the image no longer staged must go", removed, err)
	}
}
