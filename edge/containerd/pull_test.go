package containerd

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

func waiting(container, reason string) func(*edge.PodStatus) bool {
	return func(st *edge.PodStatus) bool {
		for _, c := range st.Containers {
			if c.Name == container && c.State == edge.ContainerWaiting && c.Reason == reason {
				return true
			}
		}
		return false
	}
}

func containerStatus(st *edge.PodStatus, name string) edge.ContainerStatus {
	for _, c := range st.Containers {
		if c.Name == name {
			return c
		}
	}
	return edge.ContainerStatus{}
}

// TestRegistryPull pulls from a private registry on loopback with the
// pod's image pull secret, and shows the kubelet's reasons and back-off
// when the pull is refused or the image does not exist.
func TestRegistryPull(t *testing.T) {
	e := newTestRuntime(t, "10.231.3.0/24")
	reg, err := images.NewRegistry(testImages(t))
	if err != nil {
		t.Fatal(err)
	}
	reg.User, reg.Password = "edge", "pull-s3cret"
	srv := httptest.NewServer(reg)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	auth := base64.StdEncoding.EncodeToString([]byte("edge:pull-s3cret"))
	e.src.mu.Lock()
	e.src.secrets["default/regcred"] = &corev1.Secret{
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth)},
	}
	e.src.mu.Unlock()
	var mu sync.Mutex
	var events []string
	e.rt.ReportEvents(func(ev edge.PodEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev.Name+" "+ev.Reason+" "+ev.Message)
	})
	sawEvent := func(t *testing.T, pod, reason, fragment string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range events {
			if strings.HasPrefix(ev, pod+" "+reason+" ") && strings.Contains(ev, fragment) {
				return
			}
		}
		t.Errorf("no %s event of pod %s with %q among:\n%s", reason, pod, fragment, strings.Join(events, "\n"))
	}
	withSecret := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		return p
	}

	t.Run("with the pull secret", func(t *testing.T) {
		pod := withSecret(testPod("pulled", corev1.Container{Name: "web", Image: host + "/tether/echo:v1", ImagePullPolicy: corev1.PullAlways}))
		st := e.syncUntil(t, pod, time.Minute, "pulled and running", running("web"))
		if n := reg.Resolves("tether/echo:v1"); n == 0 {
			t.Errorf("the registry was never asked for tether/echo:v1")
		}
		if c := containerStatus(st, "web"); !strings.HasPrefix(c.ImageID, "sha256:") {
			t.Errorf("imageID %q", c.ImageID)
		}
		sawEvent(t, "pulled", "Pulling", "Pulling image")
		sawEvent(t, "pulled", "Pulled", "Successfully pulled image")
		sawEvent(t, "pulled", "Started", "Started container web")
	})

	t.Run("refused without credentials, then back-off", func(t *testing.T) {
		pod := testPod("denied", corev1.Container{Name: "c", Image: host + "/tether/sleeper:v1", ImagePullPolicy: corev1.PullAlways})
		st := e.syncUntil(t, pod, 30*time.Second, "ErrImagePull", waiting("c", "ErrImagePull"))
		if msg := containerStatus(st, "c").Message; !strings.Contains(msg, "authorization failed") {
			t.Errorf("ErrImagePull message does not say the registry refused: %q", msg)
		}
		refused := reg.Refusals()
		st = e.syncUntil(t, pod, 10*time.Second, "ImagePullBackOff", waiting("c", "ImagePullBackOff"))
		if msg := containerStatus(st, "c").Message; !strings.Contains(msg, "Back-off pulling image") {
			t.Errorf("ImagePullBackOff message %q", msg)
		}
		// Within the back-off (1s base in these tests) syncs do not ask
		// the registry again.
		for range 5 {
			if err := e.rt.SyncPod(context.Background(), pod, e.net); err != nil {
				t.Fatalf("SyncPod during the back-off: %v", err)
			}
		}
		if n := reg.Refusals(); n != refused {
			t.Errorf("the registry was asked %d more times during the back-off", n-refused)
		}
		// After it, the pull is tried again (and refused again).
		time.Sleep(1200 * time.Millisecond)
		e.syncUntil(t, pod, 10*time.Second, "ErrImagePull again", waiting("c", "ErrImagePull"))
		if reg.Refusals() == refused {
			t.Error("the pull was not tried again after the back-off")
		}
		sawEvent(t, "denied", "Failed", "Failed to pull image")
		sawEvent(t, "denied", "Failed", "Error: ErrImagePull")
		sawEvent(t, "denied", "BackOff", "Back-off pulling image")
		sawEvent(t, "denied", "Failed", "Error: ImagePullBackOff")
	})

	t.Run("image not in the registry", func(t *testing.T) {
		pod := withSecret(testPod("missing", corev1.Container{Name: "c", Image: host + "/tether/nope:v1", ImagePullPolicy: corev1.PullIfNotPresent}))
		st := e.syncUntil(t, pod, 30*time.Second, "ErrImagePull", waiting("c", "ErrImagePull"))
		if msg := containerStatus(st, "c").Message; !strings.Contains(msg, "not found") {
			t.Errorf("ErrImagePull message for a missing image: %q", msg)
		}
	})
}
