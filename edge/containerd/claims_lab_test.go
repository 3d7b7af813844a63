package containerd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// TestLabClaims runs pods with PersistentVolumeClaims on a containerd edge
// joined to a real hub, driven by kubectl: a StatefulSet's local-path
// volume outlives its pod, a static hostPath volume is mounted read-only,
// a pod whose claim is not bound waits for it, and the data of a deleted
// local-path volume is removed from the node.
func TestLabClaims(t *testing.T) {
	if !images.HasShell() {
		t.Skip("needs a static busybox (busybox-static) for the test image's shell")
	}
	root := filepath.Join(t.TempDir(), "storage")
	l := startLabWith(t, labOptions{localPathRoot: root, agent: func(c *edge.Config) { c.LocalVolumeCheckInterval = time.Second }})
	l.waitFor(t, 60*time.Second, "node Ready", func() (bool, string) {
		out, err := l.hub.Run("get", "node", "edge-c", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", out + errString(err)
	})
	podUID := func(name string) string {
		return l.kubectl(t, "get", "pod", name, "-o", "jsonpath={.metadata.uid}")
	}

	var volumeDir string
	t.Run("statefulset volume outlives its pod", func(t *testing.T) {
		l.apply(t, fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 1
      securityContext: {runAsUser: 1000, fsGroup: 2000}
      containers:
      - name: db
        image: %s
        imagePullPolicy: Never
        command: [/bin/sh, -c, "test -f /data/first || date > /data/first; hostname >> /data/boots; exec sleep 3600"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
`, images.Sleeper))
		l.waitPodPhase(t, "db-0", "{.status.phase}", "Running")
		first := l.kubectl(t, "exec", "db-0", "--", "cat", "/data/first")
		if first == "" {
			t.Fatal("the pod wrote nothing to its volume")
		}
		if out := l.kubectl(t, "exec", "db-0", "--", "stat", "-c", "%g %a", "/data"); out != "2000 2777\n" {
			t.Errorf("volume owner group and mode %q, want the fsGroup 2000 and 2777", out)
		}
		pv := l.kubectl(t, "get", "pvc", "data-db-0", "-o", "jsonpath={.spec.volumeName}")
		volumeDir = filepath.Join(root, pv+"_default_data-db-0")
		if b, err := os.ReadFile(filepath.Join(volumeDir, "first")); err != nil || string(b) != first {
			t.Errorf("volume directory on the node: %q %v", b, err)
		}

		uid := podUID("db-0")
		l.kubectl(t, "delete", "pod", "db-0", "--wait=true", "--timeout=60s")
		l.waitFor(t, 60*time.Second, "a new db-0 Running", func() (bool, string) {
			out, err := l.hub.Run("get", "pod", "db-0", "-o", "jsonpath={.metadata.uid} {.status.phase}")
			return err == nil && !strings.HasPrefix(out, uid) && strings.HasSuffix(out, " Running"), out + errString(err)
		})
		if out := l.kubectl(t, "exec", "db-0", "--", "cat", "/data/first"); out != first {
			t.Errorf("the replacement pod reads %q, its predecessor wrote %q", out, first)
		}
		if out := l.kubectl(t, "exec", "db-0", "--", "cat", "/data/boots"); out != "db-0\ndb-0\n" {
			t.Errorf("boots %q, want two", out)
		}
	})

	shelf := filepath.Join(t.TempDir(), "shelf")
	t.Run("static hostPath volume read-only", func(t *testing.T) {
		if err := os.MkdirAll(shelf, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(shelf, "book.txt"), []byte("chapter one"), 0o644)
		l.apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: shelf}
spec:
  storageClassName: manual
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: %s, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: books}
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: reader
    image: %s
    imagePullPolicy: Never
    volumeMounts: [{name: books, mountPath: /shelf}]
  volumes:
  - {name: books, persistentVolumeClaim: {claimName: books, readOnly: true}}
`, shelf, images.Sleeper))
		l.waitPodPhase(t, "reader", "{.status.phase}", "Running")
		if out := l.kubectl(t, "exec", "reader", "--", "cat", "/shelf/book.txt"); out != "chapter one" {
			t.Errorf("book %q", out)
		}
		if out, err := l.hub.Run("exec", "reader", "--", "touch", "/shelf/scribble"); err == nil || !strings.Contains(out+err.Error(), "Read-only file system") {
			t.Errorf("writing to a read-only claim: %q %v", out, err)
		}
	})

	t.Run("unbound claim waits", func(t *testing.T) {
		later := t.TempDir()
		l.apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: later}
spec:
  storageClassName: manual-later
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: waiter}
spec:
  nodeName: edge-c
  terminationGracePeriodSeconds: 1
  containers:
  - name: waiter
    image: %s
    imagePullPolicy: Never
    command: [/bin/sh, -c, "echo waited > /later/note; exec sleep 3600"]
    volumeMounts: [{name: later, mountPath: /later}]
  volumes:
  - {name: later, persistentVolumeClaim: {claimName: later}}
`, images.Sleeper))
		l.waitPodPhase(t, "waiter", "{.status.containerStatuses[0].state.waiting.reason}", "ContainerCreating")
		l.waitFor(t, 30*time.Second, "a FailedMount event", func() (bool, string) {
			out, err := l.hub.Run("get", "events", "--field-selector", "involvedObject.name=waiter,reason=FailedMount", "-o", "jsonpath={.items[*].message}")
			return strings.Contains(out, "PVC is not bound"), out + errString(err)
		})
		time.Sleep(2 * time.Second)
		if out := l.kubectl(t, "get", "pod", "waiter", "-o", "jsonpath={.status.phase}"); out != "Pending" {
			t.Fatalf("pod with an unbound claim: %s", out)
		}
		l.apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: later}
spec:
  storageClassName: manual-later
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: %s}
`, later))
		l.waitPodPhase(t, "waiter", "{.status.phase}", "Running")
		l.waitFor(t, 10*time.Second, "the pod wrote to its volume", func() (bool, string) {
			b, err := os.ReadFile(filepath.Join(later, "note"))
			return string(b) == "waited\n", fmt.Sprintf("%q %v", b, err)
		})
	})

	t.Run("deleted local-path volume's data removed", func(t *testing.T) {
		if volumeDir == "" {
			t.Skip("no volume from the first subtest")
		}
		l.kubectl(t, "delete", "pod", "reader", "--wait=true", "--timeout=60s")
		l.kubectl(t, "delete", "pvc", "books", "--wait=true", "--timeout=60s")
		l.kubectl(t, "scale", "statefulset", "db", "--replicas=0")
		l.waitFor(t, 60*time.Second, "db-0 gone", func() (bool, string) {
			out, err := l.hub.Run("get", "pods", "-l", "app=db", "-o", "name")
			return err == nil && strings.TrimSpace(out) == "", out
		})
		if _, err := os.Stat(volumeDir); err != nil {
			t.Fatalf("the volume's data went with its pod: %v", err)
		}
		l.kubectl(t, "delete", "pvc", "data-db-0", "--wait=true", "--timeout=60s")
		l.waitFor(t, 30*time.Second, "the volume's directory removed", func() (bool, string) {
			_, err := os.Stat(volumeDir)
			return os.IsNotExist(err), fmt.Sprint(err)
		})
		if _, err := os.Stat(filepath.Join(shelf, "book.txt")); err != nil {
			t.Errorf("the static volume's data (reclaim policy Retain) is gone: %v", err)
		}
		if ents, err := os.ReadDir(root); err != nil || len(ents) != 0 {
			t.Errorf("local-path root after: %v %v", ents, err)
		}
	})
}
