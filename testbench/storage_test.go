package testbench

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestVolumesOnSimEdges: a StatefulSet's volumeClaimTemplates get
// local-path volumes from the default StorageClass on the node the
// scheduler chose for each pod; a recreated pod goes back to its volume's
// node; claims outlive scale-down; deleting a claim deletes its volume. A
// claim of a class without provisioner binds to a matching static volume.
func TestVolumesOnSimEdges(t *testing.T) {
	t.Parallel() // sim edges on loopback: beside the other sim tests
	h := hubtest.Start(t)
	token := joinToken(t, h)
	startSimEdge(t, h, token, "node-a")
	startSimEdge(t, h, token, "node-b")
	waitNodesReady(t, h, 2)
	if out := h.MustRun("get", "storageclass"); !strings.Contains(out, "local-path (default)") || !strings.Contains(out, "tether.io/local-path") ||
		!strings.Contains(out, "WaitForFirstConsumer") {
		t.Fatalf("kubectl get storageclass:\n%s", out)
	}
	applyYAML(t, h, `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: db}}}
      containers:
      - name: db
        image: db
        volumeMounts: [{name: data, mountPath: /var/lib/db}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 2Gi}}
`)
	podNode := map[string]string{}
	waitUntil(t, "both db pods Running with Bound claims", 90*time.Second, func() bool {
		pods, _ := h.Run("get", "pods", "-l", "app=db", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName}={.status.phase} {end}`)
		claims, _ := h.Run("get", "pvc", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`)
		if strings.Count(pods, "=Running") != 2 || strings.Count(claims, "=Bound") != 2 {
			return false
		}
		for _, f := range strings.Fields(pods) {
			p := strings.Split(f, "=")
			podNode[p[0]] = p[1]
		}
		return true
	})
	t.Logf("kubectl get pvc,pv:\n%s", h.MustRun("get", "pvc,pv", "-o", "wide"))
	for _, i := range []string{"0", "1"} {
		claim := "data-db-" + i
		pv := h.MustRun("get", "pvc", claim, "-o", "jsonpath={.spec.volumeName} {.spec.storageClassName} {.status.capacity.storage}")
		f := strings.Fields(pv)
		if len(f) != 3 || !strings.HasPrefix(f[0], "pvc-") || f[1] != "local-path" || f[2] != "2Gi" {
			t.Fatalf("claim %s: %q", claim, pv)
		}
		node := h.MustRun("get", "pv", f[0], "-o", `jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]} {.spec.hostPath.path} {.status.phase} {.spec.claimRef.name}`)
		g := strings.Fields(node)
		if len(g) != 4 || g[0] != podNode["db-"+i] || !strings.HasPrefix(g[1], "/var/lib/tether/storage/pvc-") || g[2] != "Bound" || g[3] != claim {
			t.Errorf("volume of %s: %q (pod on %s)", claim, node, podNode["db-"+i])
		}
	}

	// A recreated pod goes back to the node of its volume.
	h.MustRun("delete", "pod", "db-0", "--wait=true")
	waitUntil(t, "db-0 back and Running", 60*time.Second, func() bool {
		out, _ := h.Run("get", "pod", "db-0", "-o", "jsonpath={.spec.nodeName}={.status.phase}")
		return out == podNode["db-0"]+"=Running"
	})
	// Claims outlive scale-down; a deleted claim takes its volume along.
	h.MustRun("scale", "statefulset", "db", "--replicas=1")
	waitUntil(t, "db-1 gone", 60*time.Second, func() bool {
		out, _ := h.Run("get", "pods", "-l", "app=db", "-o", "name")
		return strings.TrimSpace(out) == "pod/db-0"
	})
	vol := h.MustRun("get", "pvc", "data-db-1", "-o", "jsonpath={.spec.volumeName}")
	if out := h.MustRun("get", "pvc", "data-db-1", "-o", "jsonpath={.status.phase}"); out != "Bound" {
		t.Errorf("data-db-1 after scale-down: %q", out)
	}
	h.MustRun("delete", "pvc", "data-db-1", "--wait=true")
	waitUntil(t, "the released local-path volume deleted", 30*time.Second, func() bool {
		_, err := h.Run("get", "pv", vol)
		return err != nil
	})

	// A static volume of a class without a provisioner.
	applyYAML(t, h, `apiVersion: v1
kind: PersistentVolume
metadata: {name: shelf}
spec:
  storageClassName: manual
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /srv/shelf}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: books}
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`)
	waitUntil(t, "books bound to shelf", 30*time.Second, func() bool {
		out, _ := h.Run("get", "pvc", "books", "-o", "jsonpath={.status.phase}={.spec.volumeName}={.status.capacity.storage}")
		pv, _ := h.Run("get", "pv", "shelf", "-o", "jsonpath={.status.phase}={.spec.claimRef.name}")
		return out == "Bound=shelf=5Gi" && pv == "Bound=books"
	})
	h.MustRun("delete", "pvc", "books", "--wait=true")
	waitUntil(t, "shelf Released and kept (Retain, not provisioned)", 30*time.Second, func() bool {
		out, _ := h.Run("get", "pv", "shelf", "-o", "jsonpath={.status.phase}")
		return out == "Released"
	})
}
