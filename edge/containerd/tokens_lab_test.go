package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/testbench/images"
)

// shortTokens are fakeSources whose tokens live a few seconds.
type shortTokens struct {
	*fakeSources
	mu     sync.Mutex
	issued int
}

func (s *shortTokens) ServiceAccountToken(context.Context, *corev1.Pod, string, int64) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.issued++
	return fmt.Sprintf("token-%d", s.issued), time.Now().Add(5 * time.Second), nil
}

// TestRuntimeRefreshesTokens checks that the runtime wakes a running pod
// when its projected token is due, so that the token file changes while
// the container runs, as the kubelet refreshes it.
func TestRuntimeRefreshesTokens(t *testing.T) {
	e := newTestRuntime(t, "10.231.23.0/24")
	src := &shortTokens{fakeSources: e.src}
	e.rt.SetSources(src)
	// Wake-ups are served one at a time once the test's own syncs are
	// done, as the agent's pod worker serves them.
	woken := make(chan types.UID, 64)
	e.rt.Notify(func(uid types.UID) {
		select {
		case woken <- uid:
		default:
		}
	})
	seconds := int64(3600)
	p := testPod("tok", corev1.Container{Name: "app", Image: images.Sleeper,
		VolumeMounts: []corev1.VolumeMount{{Name: "tok", MountPath: "/var/run/secrets/tok"}}})
	p.Spec.Volumes = []corev1.Volume{{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: &seconds, Path: "token"}}},
	}}}}
	e.syncUntil(t, p, 30*time.Second, "tok running", running("app"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case uid := <-woken:
				if uid == p.UID {
					e.rt.SyncPod(ctx, p, e.net)
				}
			}
		}
	}()
	file := filepath.Join(e.rt.podDir(p.UID), "volumes", "tok", "token")
	first, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// The token lives 5s: refreshed after 4s without another SyncPod
	// from the test.
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile(file)
		if err == nil && string(b) != string(first) {
			t.Logf("token %s replaced by %s while the pod runs", first, b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("token file still %q after 15s", first)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
