package hub_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// shelfChart is a chart that brings its own ServiceAccount, Role and
// RoleBinding, and a ConfigMap whose data comes from the values.
var shelfChart = map[string]string{
	"Chart.yaml":  "apiVersion: v2\nname: shelf\nversion: 0.1.0\n",
	"values.yaml": "shelves: 12\n",
	"templates/rbac.yaml": `apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .Release.Name }}-reader
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .Release.Name }}-reader
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
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
  shelves: {{ .Values.shelves | quote }}
`,
}

// TestHelmChartLifecycle installs, upgrades and uninstalls a chart with
// the pinned upstream Helm 4, which applies objects with server-side
// apply: the objects are created with helm as their field manager, an
// upgrade changes them in place, and uninstall removes them and the
// release's record. A user who is admin of one namespace installs the
// same chart, with its own Role and RoleBinding, there.
func TestHelmChartLifecycle(t *testing.T) {
	h := hubtest.Start(t)
	bin := hubtest.Helm(t)
	chart := filepath.Join(t.TempDir(), "shelf")
	for name, text := range shelfChart {
		p := filepath.Join(chart, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), hubtest.HelmEnv(t.TempDir())...)
	kubeconfig := h.Kubeconfig
	helm := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(env, "KUBECONFIG="+kubeconfig)
		began := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("helm %s: %v", args[0], time.Since(began).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	helm("install", "shelf", chart, "--namespace", "shop", "--create-namespace", "--wait", "--timeout", "60s")
	for _, obj := range []string{"serviceaccount/shelf-reader", "role/shelf-reader", "rolebinding/shelf-reader", "configmap/shelf-shelves"} {
		got := h.MustRun("get", "-n", "shop", obj, "-o",
			`jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation} {end}`)
		if strings.TrimSpace(got) != "helm/Apply" {
			t.Errorf("%s: managed fields %q, want helm/Apply (server-side apply)", obj, got)
		}
	}
	if got := h.MustRun("get", "-n", "shop", "rolebinding", "shelf-reader", "-o", "jsonpath={.subjects[0].name}/{.roleRef.name}"); got != "shelf-reader/shelf-reader" {
		t.Errorf("rolebinding: %q", got)
	}

	helm("upgrade", "shelf", chart, "--namespace", "shop", "--set", "shelves=13", "--wait", "--timeout", "60s")
	if got := h.MustRun("get", "-n", "shop", "configmap", "shelf-shelves", "-o", "jsonpath={.data.shelves}"); got != "13" {
		t.Errorf("after the upgrade shelves = %q, want 13", got)
	}
	if got := helm("list", "--namespace", "shop", "-o", "json"); !strings.Contains(got, `"revision":"2"`) || !strings.Contains(got, `"status":"deployed"`) {
		t.Errorf("helm list after the upgrade: %s", got)
	}

	helm("uninstall", "shelf", "--namespace", "shop", "--wait", "--timeout", "60s")
	noShelf(t, h, "shop")

	// A user who is admin of one namespace only, through a RoleBinding to
	// the admin ClusterRole, installs the chart there: the chart's Role
	// grants nothing the user does not hold, so RBAC lets them create it
	// and bind it.
	h.MustRun("create", "namespace", "tenant")
	h.MustRun("create", "rolebinding", "alice-admin", "-n", "tenant", "--clusterrole", "admin", "--user", "alice")
	kubeconfig = h.UserKubeconfig("alice")
	helm("install", "shelf", chart, "--namespace", "tenant", "--wait", "--timeout", "60s")
	if got := h.MustRun("get", "-n", "tenant", "role", "shelf-reader", "-o", "jsonpath={.rules[0].verbs}"); got != `["get","list","watch"]` {
		t.Errorf("role made by the namespace admin: verbs %s", got)
	}
	helm("uninstall", "shelf", "--namespace", "tenant", "--wait", "--timeout", "60s")
	noShelf(t, h, "tenant")
}

// noShelf fails t if an object of the shelf chart is left in ns.
func noShelf(t *testing.T, h *hubtest.Hub, ns string) {
	t.Helper()
	left := h.MustRun("get", "-n", ns, "serviceaccounts,roles,rolebindings,configmaps,secrets", "-o", "name")
	for _, obj := range strings.Fields(left) {
		if strings.Contains(obj, "shelf") {
			t.Errorf("%s is left in %s after helm uninstall", obj, ns)
		}
	}
}
