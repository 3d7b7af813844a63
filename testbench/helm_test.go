package testbench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

// helmChart is a chart as its authors ship them: it brings its own
// ServiceAccount, a Role that allows reading ConfigMaps and getting (not
// listing) pods of the release's namespace, the RoleBinding between them,
// a ConfigMap and a pod that runs as the ServiceAccount.
var helmChart = map[string]string{
	"Chart.yaml": `apiVersion: v2
name: shelf
description: A shop's shelf reader, with the permissions it needs
type: application
version: 0.1.0
appVersion: "1.0"
`,
	"values.yaml": `image: ""
`,
	"templates/serviceaccount.yaml": `apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .Release.Name }}-reader
  labels: {app.kubernetes.io/managed-by: {{ .Release.Service }}}
`,
	"templates/role.yaml": `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .Release.Name }}-reader
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .Release.Name }}-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .Release.Name }}-reader
subjects:
- kind: ServiceAccount
  name: {{ .Release.Name }}-reader
  namespace: {{ .Release.Namespace }}
`,
	"templates/configmap.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-shelves
data:
  shelves: "12"
`,
	"templates/pod.yaml": `apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-client
spec:
  serviceAccountName: {{ .Release.Name }}-reader
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {{ required "image is required" .Values.image }}
    imagePullPolicy: Never
`,
}

// helmChartRBAC installs helmChart with the pinned upstream Helm (server-
// side apply, as Helm 4 does by default) into a namespace of its own,
// waits for its pod, checks from inside the pod that it may do exactly
// what the chart's Role allows and nothing more, and uninstalls it,
// which removes every object the chart made.
func helmChartRBAC(t *testing.T, h *labHub) {
	chart := filepath.Join(t.TempDir(), "shelf")
	for name, text := range helmChart {
		p := filepath.Join(chart, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	helm := h.helm(t)
	out := helm("install", "shelf", chart, "--namespace", "shop", "--create-namespace",
		"--set", "image="+images.Sleeper, "--wait", "--timeout", "120s")
	t.Logf("helm install:\n%s", out)
	if out := helm("list", "--namespace", "shop", "--short"); strings.TrimSpace(out) != "shelf" {
		t.Errorf("helm list: %q, want shelf", out)
	}

	sa := "system:serviceaccount:shop:shelf-reader"
	inClusterChecks(t, h, "shop/shelf-client", map[string]string{
		"discovery":                            "OK",
		"list:configmaps":                      "OK",
		"get:configmaps/shelf-shelves":         "OK",
		"get:pods/shelf-client":                "OK",
		"list:pods":                            forbidden(sa, "list", "pods", "", "", "shop"),
		"list:secrets":                         forbidden(sa, "list", "secrets", "", "", "shop"),
		"get:secrets/anything":                 forbidden(sa, "get", "secrets", "", "anything", "shop"),
		"delete:configmaps/nonexistent":        forbidden(sa, "delete", "configmaps", "", "nonexistent", "shop"),
		"list:configmaps@default":              forbidden(sa, "list", "configmaps", "", "", "default"),
		"list:roles.rbac.authorization.k8s.io": forbidden(sa, "list", "roles", "rbac.authorization.k8s.io", "", "shop"),
	})

	out = helm("uninstall", "shelf", "--namespace", "shop", "--wait", "--timeout", "60s")
	t.Logf("helm uninstall:\n%s", out)
	left := h.must(t, "get", "-n", "shop", "pods,serviceaccounts,roles,rolebindings,configmaps,secrets", "-o", "name")
	for _, obj := range strings.Fields(left) {
		if strings.Contains(obj, "shelf") {
			t.Errorf("%s is left after helm uninstall", obj)
		}
	}
}

// helm returns a function that runs the pinned Helm CLI as the admin
// from the hub's namespace, with its own configuration and cache, and
// fails t when it fails.
func (h *labHub) helm(t *testing.T) func(args ...string) string {
	bin := hubtest.Helm(t)
	env := hubtest.HelmEnv(t.TempDir())
	return func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		full := append(append([]string{"env"}, env...), bin, "--kubeconfig", h.kubeconfig())
		out, err := h.l.Exec(ctx, "hub", append(full, args...)...)
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
}
