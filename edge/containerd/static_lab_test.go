package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// TestLabStaticPods runs static pods from a manifest directory on a
// containerd edge: kubectl sees each as <name>-<node> through its mirror
// pod, reads its logs and execs into it; a static pod starts with the hub
// down and its mirror appears once the hub is back; removing the manifest
// stops the pod and deletes the mirror.
func TestLabStaticPods(t *testing.T) {
	if !images.HasShell() {
		t.Skip("needs a static busybox (busybox-static) for the test image's shell")
	}
	manifests := filepath.Join(t.TempDir(), "manifests")
	l := startLabWith(t, labOptions{agent: func(c *edge.Config) { c.PodManifestPath = manifests }})
	l.waitFor(t, 60*time.Second, "node Ready", func() (bool, string) {
		out, err := l.hub.Run("get", "node", "edge-c", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", out + errString(err)
	})
	write := func(file, content string) {
		t.Helper()
		tmp := filepath.Join(manifests, "."+file)
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(manifests, file)); err != nil {
			t.Fatal(err)
		}
	}
	manifest := func(name, words string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: kube-system, labels: {tier: node}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    command: [/bin/sh, -c, "echo %s; exec sleep 3600"]
`, name, images.Sleeper, words)
	}

	write("agentlet.yaml", manifest("agentlet", "hello from a static pod"))
	l.waitFor(t, 60*time.Second, "kubectl shows the static pod Running", func() (bool, string) {
		out, err := l.hub.Run("get", "pod", "-n", "kube-system", "agentlet-edge-c", "-o",
			`jsonpath={.status.phase} {.metadata.annotations.kubernetes\.io/config\.source} {.metadata.ownerReferences[0].kind}`)
		return out == "Running file Node", out + errString(err)
	})
	if out := l.kubectl(t, "get", "pods", "-n", "kube-system"); !strings.Contains(out, "agentlet-edge-c") || !strings.Contains(out, "Running") {
		t.Errorf("kubectl get pods:\n%s", out)
	}
	l.waitFor(t, 20*time.Second, "kubectl logs of the static pod", func() (bool, string) {
		out, err := l.hub.Run("logs", "-n", "kube-system", "agentlet-edge-c")
		return out == "hello from a static pod\n", out + errString(err)
	})
	if out := l.kubectl(t, "exec", "-n", "kube-system", "agentlet-edge-c", "--", "hostname"); out != "agentlet-edge-c\n" {
		t.Errorf("exec hostname %q", out)
	}
	before := l.kubectl(t, "get", "pod", "-n", "kube-system", "agentlet-edge-c", "-o", "jsonpath={.metadata.uid} {.status.containerStatuses[0].containerID}")
	mirrorUID, containerID, _ := strings.Cut(before, " ")
	l.kubectl(t, "delete", "pod", "-n", "kube-system", "agentlet-edge-c", "--wait=false")
	l.waitFor(t, 30*time.Second, "the mirror pod back, the same container running", func() (bool, string) {
		out, err := l.hub.Run("get", "pod", "-n", "kube-system", "agentlet-edge-c", "-o", "jsonpath={.metadata.uid} {.status.containerStatuses[0].containerID} {.status.phase}")
		return err == nil && !strings.HasPrefix(out, mirrorUID) && out != "" && strings.HasSuffix(out, containerID+" Running"), out + errString(err)
	})

	// Offline: the agent restarts while the hub is down, and finds a new
	// manifest.
	l.hub.Stop()
	l.agent.stop(t)
	l.env.rt.Close()
	late := manifest("late", "started offline")
	write("late.yaml", late)
	l.startAgent(t)
	var uid types.UID
	l.waitFor(t, 30*time.Second, "the new static pod running with the hub down", func() (bool, string) {
		uid = l.env.rt.podNamed("kube-system", "late-edge-c")
		st, err := l.env.rt.PodStatus(context.Background(), uid)
		if err != nil {
			return false, err.Error()
		}
		return len(st.Containers) == 1 && st.Containers[0].State == edge.ContainerRunning, fmt.Sprintf("%+v", st.Containers)
	})
	l.hub.Restart()
	l.waitFor(t, 60*time.Second, "its mirror pod once the hub is back", func() (bool, string) {
		out, err := l.hub.Run("get", "pod", "-n", "kube-system", "late-edge-c", "-o", "jsonpath={.status.phase}")
		return out == "Running", out + errString(err)
	})

	// Removing the manifests stops the pods and deletes their mirrors.
	os.Remove(filepath.Join(manifests, "agentlet.yaml"))
	os.Remove(filepath.Join(manifests, "late.yaml"))
	l.waitFor(t, 30*time.Second, "mirror pods deleted", func() (bool, string) {
		out, err := l.hub.Run("get", "pods", "-n", "kube-system", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", out + errString(err)
	})
	l.waitFor(t, 30*time.Second, "static pods stopped", func() (bool, string) {
		_, err := l.env.rt.PodStatus(context.Background(), uid)
		return err != nil, fmt.Sprint(err)
	})
}

// podNamed returns the UID of the runtime's pod namespace/name, "" when it
// has none.
func (r *Runtime) podNamed(namespace, name string) types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, p := range r.pods {
		if p.namespace == namespace && p.name == name {
			return uid
		}
	}
	return ""
}
