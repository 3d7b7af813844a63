package admission_test

import (
	"strings"
	"testing"

	"github.com/tether-edge/tether/hub/hubtest"
)

func claim(name, size string) string {
	return `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ` + name + `, namespace: store}
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: ` + size + `
`
}

// TestLimitRangeClaims drives the storage LimitRange of Kubernetes'
// "limit storage consumption" page with kubectl against a real hub: claims
// below the minimum or above the maximum are refused with upstream's
// messages and not stored, and so is a resize past the maximum.
func TestLimitRangeClaims(t *testing.T) {
	h := hubtest.Start(t, "--controllers=garbagecollector,namespace", "--disable-scheduler")
	h.MustRun("create", "namespace", "store")

	// A storage LimitRange needs a minimum or a maximum, the minimum not
	// above the maximum.
	_, err := apply(t, h, `apiVersion: v1
kind: LimitRange
metadata: {name: empty, namespace: store}
spec:
  limits:
  - type: PersistentVolumeClaim
`)
	if err == nil || !strings.Contains(err.Error(), `LimitRange "empty" is invalid: spec.limits[0].limits: Required value: either minimum or maximum storage value is required, but neither was provided`) {
		t.Fatalf("limit range without bounds: %v", err)
	}
	_, err = apply(t, h, `apiVersion: v1
kind: LimitRange
metadata: {name: upside-down, namespace: store}
spec:
  limits:
  - type: PersistentVolumeClaim
    max: {storage: 1Gi}
    min: {storage: 2Gi}
`)
	if err == nil || !strings.Contains(err.Error(), `min value 2Gi is greater than max value 1Gi`) {
		t.Fatalf("limit range with min above max: %v", err)
	}

	if out, err := apply(t, h, `apiVersion: v1
kind: LimitRange
metadata: {name: storagelimits, namespace: store}
spec:
  limits:
  - type: PersistentVolumeClaim
    max:
      storage: 2Gi
    min:
      storage: 1Gi
`); err != nil {
		t.Fatalf("create limit range: %v\n%s", err, out)
	}

	for _, c := range []struct{ name, size, want string }{
		{"pvc-limit-lower", "500Mi", `Error from server (Forbidden): error when creating "` + "%s" + `": persistentvolumeclaims "pvc-limit-lower" is forbidden: minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi`},
		{"pvc-limit-greater", "10Gi", `Error from server (Forbidden): error when creating "` + "%s" + `": persistentvolumeclaims "pvc-limit-greater" is forbidden: maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 10Gi`},
	} {
		_, err := apply(t, h, claim(c.name, c.size))
		if err == nil {
			t.Fatalf("%s was created", c.name)
		}
		// The file name differs per run; compare around it.
		before, after, _ := strings.Cut(c.want, "%s")
		if msg := err.Error(); !strings.Contains(msg, before) || !strings.Contains(msg, after) {
			t.Errorf("%s: got\n%s\nwant %q", c.name, msg, c.want)
		}
		if _, err := h.Run("get", "pvc", c.name, "-n", "store"); err == nil {
			t.Errorf("refused claim %s was stored", c.name)
		}
	}

	// A claim within the bounds is created; bound, it may grow up to the
	// maximum but not past it.
	if out, err := apply(t, h, claim("fits", "1500Mi")); err != nil {
		t.Fatalf("claim within the bounds: %v\n%s", err, out)
	}
	h.MustRun("patch", "pvc", "fits", "-n", "store", "--subresource=status", "--type=merge",
		"-p", `{"status":{"phase":"Bound","capacity":{"storage":"1500Mi"}}}`)
	_, err = h.Run("patch", "pvc", "fits", "-n", "store", "-p", `{"spec":{"resources":{"requests":{"storage":"10Gi"}}}}`)
	if err == nil || !strings.Contains(err.Error(), `Error from server (Forbidden): persistentvolumeclaims "fits" is forbidden: maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 10Gi`) {
		t.Fatalf("resize past the maximum: %v", err)
	}
	if got := h.MustRun("get", "pvc", "fits", "-n", "store", "-o", "jsonpath={.spec.resources.requests.storage}"); got != "1500Mi" {
		t.Errorf("refused resize changed the request to %q", got)
	}
	h.MustRun("patch", "pvc", "fits", "-n", "store", "-p", `{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
	if got := h.MustRun("get", "pvc", "fits", "-n", "store", "-o", "jsonpath={.spec.resources.requests.storage}"); got != "2Gi" {
		t.Errorf("resize to the maximum: request is %q", got)
	}
	// Labels of a claim being within its LimitRange change freely; the
	// status subresource is not checked at all.
	h.MustRun("label", "pvc", "fits", "-n", "store", "tier=gold")
}
