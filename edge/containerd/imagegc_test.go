package containerd

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// TestImageGC: past the high threshold, images no container uses are
// removed, and neither an image in use nor an image imported from an
// archive (pinned) is.
func TestImageGC(t *testing.T) {
	e := newTestRuntime(t, "10.231.5.0/24")
	reg, err := images.NewRegistry(testImages(t))
	if err != nil {
		t.Fatal(err)
	}
	reg.User, reg.Password = "edge", "gc"
	srv := httptest.NewServer(reg)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	auth := base64.StdEncoding.EncodeToString([]byte("edge:gc"))
	e.src.mu.Lock()
	e.src.secrets["default/regcred"] = &corev1.Secret{Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth)}}
	e.src.mu.Unlock()
	pulled := func(name, image string) *corev1.Pod {
		p := testPod(name, corev1.Container{Name: "c", Image: host + image, ImagePullPolicy: corev1.PullAlways})
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		return p
	}
	keep := pulled("keep", "/tether/echo:v1")
	e.syncUntil(t, keep, time.Minute, "running", running("c"))
	gone := pulled("gone", "/tether/sleeper:v1")
	e.syncUntil(t, gone, time.Minute, "running", running("c"))
	ctx := context.Background()
	if err := e.rt.KillPod(ctx, gone.UID, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemovePod(ctx, gone.UID); err != nil {
		t.Fatal(err)
	}

	// Below the high threshold nothing goes.
	e.rt.cfg.ImageGCHighThresholdPercent, e.rt.cfg.ImageGCLowThresholdPercent = 101, 100
	if removed, err := e.rt.collectImages(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("below the threshold: removed %v, err %v", removed, err)
	}
	// Past it, with a low threshold nothing can reach, every unused
	// unpinned image goes.
	e.rt.cfg.ImageGCHighThresholdPercent, e.rt.cfg.ImageGCLowThresholdPercent = 0, -1
	removed, err := e.rt.collectImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{host + "/tether/sleeper:v1"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	left, err := e.rt.client.ImageService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, img := range left {
		names = append(names, img.Name)
	}
	for _, want := range []string{host + "/tether/echo:v1", images.Echo, images.Sleeper} {
		if !slices.Contains(names, want) {
			t.Errorf("image %s was removed; images left: %v", want, names)
		}
	}
}
