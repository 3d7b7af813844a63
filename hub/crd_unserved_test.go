package hub_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// gizmosCRD stores its objects as v2, a version it does not serve, and
// serves them as v1.
const gizmosCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gizmos.unserved.example.com}
spec:
  group: unserved.example.com
  scope: Namespaced
  names: {plural: gizmos, singular: gizmo, kind: Gizmo}
  versions:
  - name: v1
    served: true
    storage: false
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
  - name: v2
    served: false
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

// TestCRDUnservedStorageVersion shows that a storage version with
// served: false holds the objects of the served versions but is hidden
// as kube-apiserver hides it: not in discovery, 404 on its paths, not in
// the OpenAPI documents and no APIService of its own.
func TestCRDUnservedStorageVersion(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	mustKubectlIn(t, h, gizmosCRD, "apply", "-f", "-")
	mustKubectl(t, h, "wait", "--for=condition=Established", "crd/gizmos.unserved.example.com", "--timeout=10s")
	mustKubectlIn(t, h, "apiVersion: unserved.example.com/v1\nkind: Gizmo\nmetadata: {name: g, namespace: default}\n", "create", "-f", "-")
	if out := mustKubectl(t, h, "get", "gizmos.v1.unserved.example.com", "g", "-o", "jsonpath={.apiVersion}"); out != "unserved.example.com/v1" {
		t.Errorf("get through v1: apiVersion %q", out)
	}

	out := mustKubectl(t, h, "get", "--raw", "/apis/unserved.example.com")
	if !strings.Contains(out, `"groupVersion":"unserved.example.com/v1"`) || strings.Contains(out, "unserved.example.com/v2") {
		t.Errorf("group discovery: %s", out)
	}
	out = mustKubectl(t, h, "api-resources", "--api-group=unserved.example.com", "-o", "name")
	if strings.TrimSpace(out) != "gizmos.unserved.example.com" {
		t.Errorf("api-resources: %q", out)
	}
	for _, p := range []string{
		"/apis/unserved.example.com/v2",
		"/apis/unserved.example.com/v2/gizmos",
		"/apis/unserved.example.com/v2/namespaces/default/gizmos/g",
		"/openapi/v3/apis/unserved.example.com/v2",
	} {
		if out, err := h.Run("get", "--raw", p); err == nil || !strings.Contains(err.Error(), "NotFound") {
			t.Errorf("GET %s: %v\n%s", p, err, out)
		}
	}
	out = mustKubectl(t, h, "get", "--raw", "/openapi/v3")
	if !strings.Contains(out, `"apis/unserved.example.com/v1"`) || strings.Contains(out, "unserved.example.com/v2") {
		t.Errorf("OpenAPI v3 paths: %s", out)
	}
	out = mustKubectl(t, h, "get", "--raw", "/openapi/v2")
	if !strings.Contains(out, "/apis/unserved.example.com/v1/") || strings.Contains(out, "/apis/unserved.example.com/v2/") {
		t.Errorf("OpenAPI v2 lists gizmos as: v1 %v, v2 %v",
			strings.Contains(out, "/apis/unserved.example.com/v1/"), strings.Contains(out, "/apis/unserved.example.com/v2/"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ = h.Run("get", "apiservices", "-o", "name")
		if strings.Contains(out, "apiservice.apiregistration.k8s.io/v1.unserved.example.com") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(out, "v1.unserved.example.com") || strings.Contains(out, "v2.unserved.example.com") {
		t.Errorf("apiservices:\n%s", out)
	}
}
