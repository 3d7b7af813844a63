package admission_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

func apply(t *testing.T, h *hubtest.Hub, manifest string) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return h.Run("create", "-f", f)
}

func pod(name, resources string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: shop}
spec:
  containers:
  - name: app
    image: app
` + resources
}

// TestLimitRangeAndQuota drives LimitRange defaults and limits and
// ResourceQuota denials with kubectl against a real hub.
func TestLimitRangeAndQuota(t *testing.T) {
	h := hubtest.Start(t, "--controllers=garbagecollector,namespace", "--disable-scheduler")
	h.MustRun("create", "namespace", "shop")
	// Pods need their namespace's default service account, which the
	// serviceaccount controller (not running here) would create.
	h.MustRun("create", "serviceaccount", "default", "-n", "shop")
	if out, err := apply(t, h, `apiVersion: v1
kind: LimitRange
metadata: {name: limits, namespace: shop}
spec:
  limits:
  - type: Container
    default: {cpu: 200m, memory: 128Mi}
    defaultRequest: {cpu: 100m, memory: 64Mi}
    max: {cpu: "1"}
    min: {cpu: 50m}
`); err != nil {
		t.Fatalf("create limit range: %v\n%s", err, out)
	}

	// Defaults fill in what the container leaves out.
	if out, err := apply(t, h, pod("plain", "")); err != nil {
		t.Fatalf("pod without resources: %v\n%s", err, out)
	}
	got := h.MustRun("get", "pod", "plain", "-n", "shop", "-o", `jsonpath={.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.limits.cpu} {.spec.containers[0].resources.limits.memory} {.status.qosClass}`)
	if got != "100m 200m 128Mi Burstable" {
		t.Errorf("defaults: got %q, want %q", got, "100m 200m 128Mi Burstable")
	}
	if a := h.MustRun("get", "pod", "plain", "-n", "shop", "-o", `jsonpath={.metadata.annotations.kubernetes\.io/limit-ranger}`); !strings.Contains(a, "cpu request for container app") {
		t.Errorf("limit-ranger annotation: %q", a)
	}
	// Limits are enforced, with upstream's message, and nothing is stored.
	_, err := apply(t, h, pod("big", `    resources: {limits: {cpu: "2"}, requests: {cpu: "2"}}`))
	if err == nil || !strings.Contains(err.Error(), `pods "big" is forbidden: maximum cpu usage per Container is 1, but limit is 2`) {
		t.Fatalf("pod over the max: %v", err)
	}
	_, err = apply(t, h, pod("tiny", `    resources: {requests: {cpu: 10m}}`))
	if err == nil || !strings.Contains(err.Error(), "minimum cpu usage per Container is 50m, but request is 10m") {
		t.Fatalf("pod under the min: %v", err)
	}
	if _, err := h.Run("get", "pod", "big", "-n", "shop"); err == nil {
		t.Fatal("a refused pod was stored")
	}

	// Quota: two pods of 100m fit in pods=2, requests.cpu=300m; a third
	// does not.
	if out, err := apply(t, h, `apiVersion: v1
kind: ResourceQuota
metadata: {name: compute, namespace: shop}
spec:
  hard: {pods: "2", requests.cpu: 300m, count/deployments.apps: "1"}
`); err != nil {
		t.Fatalf("create quota: %v\n%s", err, out)
	}
	if out, err := apply(t, h, pod("second", "")); err != nil {
		t.Fatalf("second pod within quota: %v\n%s", err, out)
	}
	_, err = apply(t, h, pod("third", ""))
	if err == nil || !strings.Contains(err.Error(), `pods "third" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=2, limited: pods=2`) {
		t.Fatalf("third pod: %v", err)
	}
	// Status follows usage.
	deadline := time.Now().Add(15 * time.Second)
	for {
		used := h.MustRun("get", "resourcequota", "compute", "-n", "shop", "-o", `jsonpath={.status.used.pods} {.status.used.requests\.cpu}`)
		if used == "2 200m" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quota status used = %q, want %q", used, "2 200m")
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("kubectl describe quota:\n%s", h.MustRun("describe", "quota", "compute", "-n", "shop"))

	// Freeing a pod frees its share.
	h.MustRun("delete", "pod", "plain", "-n", "shop", "--grace-period=0", "--force")
	if out, err := apply(t, h, pod("third", "")); err != nil {
		t.Fatalf("pod after a deletion: %v\n%s", err, out)
	}

	// Object counts.
	h.MustRun("create", "deployment", "one", "--image=app", "-n", "shop")
	if out, err := h.Run("create", "deployment", "two", "--image=app", "-n", "shop"); err == nil ||
		!strings.Contains(err.Error(), "exceeded quota: compute, requested: count/deployments.apps=1, used: count/deployments.apps=1, limited: count/deployments.apps=1") {
		t.Fatalf("second deployment: %v\n%s", err, out)
	}

	// A quota on limits needs every container to say them.
	h.MustRun("create", "namespace", "strict")
	h.MustRun("create", "serviceaccount", "default", "-n", "strict")
	f := filepath.Join(t.TempDir(), "q.yaml")
	if err := os.WriteFile(f, []byte(`apiVersion: v1
kind: ResourceQuota
metadata: {name: mem, namespace: strict}
spec: {hard: {limits.memory: 1Gi}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustRun("create", "-f", f)
	_, err = h.Run("run", "nolimit", "--image=app", "-n", "strict")
	if err == nil || !strings.Contains(err.Error(), "failed quota: mem: must specify limits.memory") {
		t.Fatalf("pod without a memory limit: %v", err)
	}
}

// TestStorageProtectionFinalizers checks that claims and volumes carry
// their protection finalizers from creation, before any controller has
// seen them: with no volume controller running, a deleted claim stays.
func TestStorageProtectionFinalizers(t *testing.T) {
	h := hubtest.Start(t, "--controllers=garbagecollector,namespace", "--disable-scheduler")
	if out, err := apply(t, h, `apiVersion: v1
kind: PersistentVolume
metadata: {name: disk}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /srv/disk}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	if got := h.MustRun("get", "pv", "disk", "-o", "jsonpath={.metadata.finalizers}"); got != `["kubernetes.io/pv-protection"]` {
		t.Errorf("volume finalizers %s", got)
	}
	if got := h.MustRun("get", "pvc", "data", "-o", "jsonpath={.metadata.finalizers}"); got != `["kubernetes.io/pvc-protection"]` {
		t.Errorf("claim finalizers %s", got)
	}
	h.MustRun("delete", "pvc", "data", "--wait=false")
	time.Sleep(time.Second)
	if got := h.MustRun("get", "pvc", "data", "-o", "jsonpath={.status.phase} {.metadata.deletionTimestamp}"); !strings.HasPrefix(got, "Pending 20") {
		t.Errorf("deleted claim: %q, want it kept with a deletion timestamp", got)
	}
}
