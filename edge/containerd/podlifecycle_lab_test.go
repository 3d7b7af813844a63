package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/testbench/images"
)

// labVolumeWaits (run by TestLabPodsOnContainerd, on its lab): through
// the hub and kubectl, a pod whose Secret
// does not exist yet stays Pending in ContainerCreating with the kubelet's
// FailedMount event (one Event object whose count grows as the mount is
// retried) and runs within seconds of the Secret's creation; an optional
// Secret's volume mounts without it; a hostPath of type Directory that is
// not there fails the same way and creates nothing.
func labVolumeWaits(t *testing.T, l *lab) {
	defer l.kubectl(t, "delete", "pod", "later", "optional", "hostdir", "--now", "--wait=true", "--timeout=60s")
	missing := filepath.Join(t.TempDir(), "absent")
	l.apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: later}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: %[1]s, imagePullPolicy: Never, volumeMounts: [{name: v, mountPath: /etc/v}]}
  volumes:
  - {name: v, secret: {secretName: later}}
---
apiVersion: v1
kind: Pod
metadata: {name: optional}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: %[1]s, imagePullPolicy: Never, volumeMounts: [{name: v, mountPath: /etc/v}]}
  volumes:
  - {name: v, secret: {secretName: nowhere, optional: true}}
---
apiVersion: v1
kind: Pod
metadata: {name: hostdir}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: %[1]s, imagePullPolicy: Never, volumeMounts: [{name: h, mountPath: /h}]}
  volumes:
  - {name: h, hostPath: {path: %[2]s, type: Directory}}
`, images.Sleeper, missing))

	failedMount := func(pod, msg string) func() (bool, string) {
		return func() (bool, string) {
			out, err := l.hub.Run("get", "events", "--field-selector", "involvedObject.name="+pod+",reason=FailedMount",
				"-o", `jsonpath={range .items[*]}{.count}{"\t"}{.type}{"\t"}{.message}{"\n"}{end}`)
			if err != nil {
				return false, err.Error()
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			n := 0
			for _, line := range lines {
				if f := strings.SplitN(line, "\t", 3); len(f) == 3 && f[1] == "Warning" && f[2] == msg {
					c, _ := strconv.Atoi(f[0])
					n += c
				}
			}
			// Retried: the count grows on one Event object, not
			// one object per attempt.
			return len(lines) == 1 && n >= 2, out
		}
	}
	t.Run("secret later", func(t *testing.T) {
		l.waitFor(t, 30*time.Second, "FailedMount of pod later, aggregated", failedMount("later",
			`MountVolume.SetUp failed for volume "v" : secret "later" not found`))
		out := l.kubectl(t, "get", "pod", "later", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}")
		if out != "Pending ContainerCreating" {
			t.Fatalf("pod later waiting for its Secret: %q, want Pending ContainerCreating", out)
		}
		l.kubectl(t, "create", "secret", "generic", "later", "--from-literal=k=v")
		created := time.Now()
		l.waitFor(t, 10*time.Second, "pod later Running within 10s of its Secret", func() (bool, string) {
			out, err := l.hub.Run("get", "pod", "later", "-o", "jsonpath={.status.phase}")
			return err == nil && out == "Running", out + errString(err)
		})
		t.Logf("pod later Running %v after its Secret was created", time.Since(created).Round(time.Millisecond))
		if out := l.kubectl(t, "exec", "later", "--", "cat", "/etc/v/k"); out != "v" {
			t.Errorf("the Secret's key in the volume: %q", out)
		}
	})
	t.Run("optional secret", func(t *testing.T) {
		l.waitPodPhase(t, "optional", "{.status.phase}", "Running")
	})
	t.Run("hostPath Directory absent", func(t *testing.T) {
		l.waitFor(t, 30*time.Second, "FailedMount of pod hostdir", failedMount("hostdir",
			fmt.Sprintf(`MountVolume.SetUp failed for volume "h" : hostPath type check failed: %s is not a directory`, missing)))
		out := l.kubectl(t, "get", "pod", "hostdir", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}")
		if out != "Pending ContainerCreating" {
			t.Errorf("pod hostdir: %q, want Pending ContainerCreating", out)
		}
		if _, err := os.Lstat(missing); !os.IsNotExist(err) {
			t.Errorf("the type check created %s (%v)", missing, err)
		}
	})
}
