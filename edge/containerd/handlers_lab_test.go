package containerd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/testbench/images"
)

// TestLabRuntimeClass: with a real hub, agent and containerd, a pod whose
// RuntimeClass names the node's second handler (runc through a wrapper)
// runs with it, with the class's overhead in its spec; a pod whose class
// names a handler the node lacks stays in ContainerCreating with the
// kubelet's FailedCreatePodSandBox event.
func TestLabRuntimeClass(t *testing.T) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("needs runc")
	}
	requireContainerd(t)
	wrapDir := t.TempDir()
	marker := filepath.Join(wrapDir, "ran")
	wrapper := filepath.Join(wrapDir, "runc-wrapper")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\necho \"$@\" >> "+marker+"\nexec "+runc+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	l := startLabWith(t, labOptions{handlers: map[string]RuntimeHandler{"alt": {Type: RuncV2, BinaryName: wrapper}}})
	l.waitFor(t, 60*time.Second, "node Ready", func() (bool, string) {
		out, err := l.hub.Run("get", "node", "edge-c", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", out + errString(err)
	})
	l.apply(t, fmt.Sprintf(`apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: wrapped
handler: alt
overhead:
  podFixed:
    cpu: 10m
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: sandboxed
handler: gvisor
---
apiVersion: v1
kind: Pod
metadata:
  name: wrapped
spec:
  runtimeClassName: wrapped
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: %[1]s
    imagePullPolicy: Never
---
apiVersion: v1
kind: Pod
metadata:
  name: sandboxed
spec:
  runtimeClassName: sandboxed
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: %[1]s
    imagePullPolicy: Never
`, images.Sleeper))
	l.waitPodPhase(t, "wrapped", "{.status.phase}", "Running")
	if out := l.kubectl(t, "get", "pod", "wrapped", "-o", "jsonpath={.spec.overhead.cpu}"); out != "10m" {
		t.Errorf("overhead %q", out)
	}
	id := strings.TrimPrefix(l.kubectl(t, "get", "pod", "wrapped", "-o", "jsonpath={.status.containerStatuses[0].containerID}"), Name+"://")
	cont, err := l.env.rt.client.LoadContainer(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cont.Info(t.Context())
	if err != nil || info.Runtime.Name != RuncV2 || info.Runtime.Options == nil {
		t.Fatalf("container runtime %+v %v", info.Runtime, err)
	}
	if b, err := os.ReadFile(marker); err != nil || !strings.Contains(string(b), id) {
		t.Errorf("the wrapper did not run the container %s: %q %v", id, b, err)
	}

	l.waitFor(t, 30*time.Second, "FailedCreatePodSandBox event", func() (bool, string) {
		out, err := l.hub.Run("get", "events", "--field-selector", "involvedObject.name=sandboxed,reason=FailedCreatePodSandBox",
			"-o", "jsonpath={.items[*].type} {.items[*].message}")
		return strings.Contains(out, `Warning Failed to create pod sandbox: failed to get sandbox runtime: no runtime for "gvisor" is configured`), out + errString(err)
	})
	// The agent writes the pod's status apart from the event: it may come
	// a moment later.
	l.waitFor(t, 30*time.Second, "pod with an unconfigured handler Pending ContainerCreating", func() (bool, string) {
		out := l.kubectl(t, "get", "pod", "sandboxed", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}")
		return out == "Pending ContainerCreating", out
	})
}
