package containerd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/typeurl/v2"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// TestRuntimeClassHandlers runs a pod whose RuntimeClass names a second
// handler, runc through a wrapper program, and checks in containerd that
// its container names the wrapper and that the wrapper ran it; a pod whose
// handler the node does not have stays waiting with the kubelet's
// FailedCreatePodSandBox event, and a pod without a class runs with runc.
func TestRuntimeClassHandlers(t *testing.T) {
	e := newTestRuntime(t, "10.231.41.0/24")
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("needs runc")
	}
	marker := filepath.Join(e.dir, "wrapper-ran")
	wrapper := filepath.Join(e.dir, "runc-wrapper")
	script := "#!/bin/sh\necho \"$@\" >> " + marker + "\nexec " + runc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e.rt.cfg.RuntimeHandlers = map[string]RuntimeHandler{"alt": {Type: RuncV2, BinaryName: wrapper}}
	e.src.mu.Lock()
	e.src.classes = map[string]string{"wrapped": "alt", "missing-handler": "gvisor"}
	e.src.mu.Unlock()
	var mu sync.Mutex
	var events []edge.PodEvent
	e.rt.ReportEvents(func(ev edge.PodEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	})
	ctx := context.Background()
	class := func(p *corev1.Pod, name string) *corev1.Pod {
		p.Spec.RuntimeClassName = &name
		return p
	}

	t.Run("configured handler", func(t *testing.T) {
		pod := class(testPod("wrapped", corev1.Container{Name: "c", Image: images.Sleeper}), "wrapped")
		st := e.syncUntil(t, pod, 30*time.Second, "pod running with the alt handler", running("c"))
		id := strings.TrimPrefix(st.Containers[0].ID, Name+"://")
		cont, err := e.rt.client.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cont.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Runtime.Name != RuncV2 || info.Runtime.Options == nil {
			t.Fatalf("container runtime %+v", info.Runtime)
		}
		v, err := typeurl.UnmarshalAny(info.Runtime.Options)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := v.(*runcoptions.Options); !ok || o.BinaryName != wrapper {
			t.Fatalf("runtime options %+v, want BinaryName %s", v, wrapper)
		}
		b, err := os.ReadFile(marker)
		if err != nil || !strings.Contains(string(b), "create") {
			t.Fatalf("the wrapper did not create the container: %q %v", b, err)
		}
	})

	t.Run("default handler", func(t *testing.T) {
		pod := testPod("plain", corev1.Container{Name: "c", Image: images.Sleeper})
		st := e.syncUntil(t, pod, 30*time.Second, "pod running", running("c"))
		cont, err := e.rt.client.LoadContainer(ctx, strings.TrimPrefix(st.Containers[0].ID, Name+"://"))
		if err != nil {
			t.Fatal(err)
		}
		info, err := cont.Info(ctx)
		if err != nil || info.Runtime.Name != RuncV2 {
			t.Fatalf("plain pod's runtime %+v %v", info.Runtime, err)
		}
		if info.Runtime.Options != nil {
			if v, err := typeurl.UnmarshalAny(info.Runtime.Options); err == nil {
				if o, ok := v.(*runcoptions.Options); ok && o.BinaryName == wrapper {
					t.Fatal("plain pod runs with the wrapper")
				}
			}
		}
	})

	for _, tc := range []struct{ class, msg string }{
		{"missing-handler", `Failed to create pod sandbox: failed to get sandbox runtime: no runtime for "gvisor" is configured`},
		{"no-such-class", `Failed to create pod sandbox: runtimeclass.node.k8s.io "no-such-class" not found`},
	} {
		t.Run(tc.class, func(t *testing.T) {
			pod := class(testPod(tc.class, corev1.Container{Name: "c", Image: images.Sleeper}), tc.class)
			for range 2 {
				if err := e.rt.SyncPod(ctx, pod, e.net); err == nil {
					t.Fatal("SyncPod succeeded")
				}
			}
			st, err := e.rt.PodStatus(ctx, pod.UID)
			if err != nil {
				t.Fatal(err)
			}
			if st.SandboxReady || st.SandboxError == "" || len(st.Containers) != 0 {
				t.Fatalf("status %+v", st)
			}
			mu.Lock()
			defer mu.Unlock()
			found := false
			for _, ev := range events {
				if ev.UID == pod.UID && ev.Warning && ev.Reason == "FailedCreatePodSandBox" && ev.Message == tc.msg {
					found = true
				}
			}
			if !found {
				t.Errorf("no FailedCreatePodSandBox event %q in %+v", tc.msg, events)
			}
		})
	}

	t.Run("classes not known yet", func(t *testing.T) {
		e.rt.SetSources(notReadySources{e.src})
		defer e.rt.SetSources(e.src)
		pod := class(testPod("early", corev1.Container{Name: "c", Image: images.Sleeper}), "wrapped")
		if err := e.rt.SyncPod(ctx, pod, e.net); !errors.Is(err, edge.ErrSourceNotReady) {
			t.Fatalf("SyncPod before the classes are known: %v", err)
		}
	})
}

func (notReadySources) RuntimeHandler(string) (string, error) {
	return "", edge.ErrSourceNotReady
}
