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

// labLifecycle (run by TestLabPodsOnContainerd, on its lab): through the
// hub and kubectl, a postStart hook's file is there once the container is
// Running; a failing postStart hook gives the kubelet's
// FailedPostStartHook event and the container is restarted; a failing
// liveness probe is reported in upstream's words; and dnsPolicy None with
// the concept pages' dnsConfig gives exactly the resolv.conf upstream
// writes.
func labLifecycle(t *testing.T, l *lab) {
	defer l.kubectl(t, "delete", "pod", "hooked", "badhook", "dns-example", "--now", "--wait=true", "--timeout=60s")
	l.apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: hooked}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    imagePullPolicy: Never
    lifecycle: {postStart: {exec: {command: [/bin/sh, -c, "sleep 1; echo done > /tmp/hook"]}}}
    livenessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1, failureThreshold: 1000}
---
apiVersion: v1
kind: Pod
metadata: {name: badhook}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[2]s
    imagePullPolicy: Never
    lifecycle: {postStart: {exec: {command: [/bin/sh, -c, "echo oops; exit 3"]}}}
---
apiVersion: v1
kind: Pod
metadata: {name: dns-example}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: app, image: %[2]s, imagePullPolicy: Never}]
  dnsPolicy: None
  dnsConfig:
    nameservers: [1.2.3.4]
    searches: [ns1.svc.cluster.local, my.dns.search.suffix]
    options: [{name: ndots, value: "2"}, {name: edns0}]
`, images.Echo, images.Sleeper))

	// event returns the type, container and message of pod's events of
	// reason, one a line.
	event := func(pod, reason string) string {
		out, _ := l.hub.Run("get", "events", "--field-selector", "involvedObject.name="+pod+",reason="+reason,
			"-o", `jsonpath={range .items[*]}{.type} {.involvedObject.fieldPath} {.message}{"\n"}{end}`)
		return out
	}
	t.Run("postStart before Running", func(t *testing.T) {
		l.waitFor(t, 60*time.Second, "pod hooked Running", func() (bool, string) {
			out, err := l.hub.Run("get", "pod", "hooked", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].state.running.startedAt}")
			return err == nil && strings.HasPrefix(out, "Running ") && len(out) > len("Running "), out + errString(err)
		})
		if out := l.kubectl(t, "exec", "hooked", "--", "cat", "/tmp/hook"); out != "done\n" {
			t.Errorf("the postStart hook's file when the container is Running: %q", out)
		}
	})
	t.Run("liveness probe failure", func(t *testing.T) {
		l.kubectl(t, "exec", "hooked", "--", "/testapp", "get", "http://127.0.0.1:8080/fail")
		want := "Warning spec.containers{app} Liveness probe failed: HTTP probe failed with statuscode: 500\n"
		l.waitFor(t, 30*time.Second, "the Unhealthy event of pod hooked", func() (bool, string) {
			out := event("hooked", "Unhealthy")
			return out == want, out
		})
	})
	t.Run("failing postStart", func(t *testing.T) {
		uid := l.kubectl(t, "get", "pod", "badhook", "-o", "jsonpath={.metadata.uid}")
		want := `Warning spec.containers{app} Exec lifecycle hook ([/bin/sh -c echo oops; exit 3]) for Container "app" in Pod "badhook_default(` +
			uid + `)" failed - error: command '/bin/sh -c echo oops; exit 3' exited with 3: , message: "oops\n"` + "\n"
		l.waitFor(t, 60*time.Second, "the FailedPostStartHook event of pod badhook", func() (bool, string) {
			out := event("badhook", "FailedPostStartHook")
			return out == want, out
		})
		l.waitFor(t, 60*time.Second, "badhook's container restarted", func() (bool, string) {
			out, err := l.hub.Run("get", "pod", "badhook", "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
			n, _ := strconv.Atoi(out)
			return err == nil && n >= 1, out + errString(err)
		})
		if out := event("badhook", "Killing"); !strings.Contains(out, "FailedPostStartHook") {
			t.Errorf("Killing events of pod badhook: %q, want one for the failed postStart hook", out)
		}
	})
	t.Run("dnsPolicy None", func(t *testing.T) {
		l.waitPodPhase(t, "dns-example", "{.status.phase}", "Running")
		want := "search ns1.svc.cluster.local my.dns.search.suffix\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"
		if out := l.kubectl(t, "exec", "dns-example", "--", "cat", "/etc/resolv.conf"); out != want {
			t.Errorf("resolv.conf of dnsPolicy None:\n%s\nwant:\n%s", out, want)
		}
	})
}
