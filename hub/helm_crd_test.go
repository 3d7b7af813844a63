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

// TestHelmChartWithCRDs installs, upgrades and uninstalls a chart that
// brings a CustomResourceDefinition in crds/ and objects of that kind in
// its templates, with the pinned Helm 3 CLI (client-side apply) and then
// the pinned Helm 4 CLI (server-side apply, --wait with its status
// watcher), each in a namespace of its own on one hub. Helm installs the
// CRD before the templates and never upgrades or deletes it; the release's
// custom objects are created, changed in place and removed.
func TestHelmChartWithCRDs(t *testing.T) {
	h := hubtest.Start(t, operatorControllers...)
	chart := filepath.Join(hubtest.RepoRoot(), "hub", "testdata", "gadgets")
	for _, c := range []struct {
		name, bin, ns string
		extra         []string
		manager       string
	}{
		{"helm3", hubtest.Helm3(t), "gadgets-v3", nil, "helm/Update"},
		{"helm4", hubtest.Helm(t), "gadgets-v4", []string{"--server-side=true", "--wait", "--timeout", "60s"}, "helm/Apply"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := append(os.Environ(), hubtest.HelmEnv(t.TempDir())...)
			env = append(env, "KUBECONFIG="+h.Kubeconfig)
			helm := func(args ...string) string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, c.bin, args...)
				cmd.Env = env
				began := time.Now()
				out, err := cmd.CombinedOutput()
				t.Logf("%s %s: %v", c.name, args[0], time.Since(began).Round(time.Millisecond))
				if err != nil {
					t.Fatalf("%s %s: %v\n%s", c.name, strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			if got := helm("version", "--short"); !strings.HasPrefix(got, "v"+c.name[4:]+".") {
				t.Fatalf("%s version: %q", c.name, got)
			}

			helm(append([]string{"install", "gear", chart, "--namespace", c.ns, "--create-namespace"}, c.extra...)...)
			h.MustRun("wait", "--for=condition=Established", "--timeout=10s", "crd/gadgets.charts.tether.dev")
			if got := h.MustRun("get", "gadgets", "-n", c.ns, "-o", "jsonpath={range .items[*]}{.metadata.name}={.spec.size}/{.spec.replicas} {end}"); got != "gear-main=small/1 gear-spare=small/1 " {
				t.Errorf("gadgets after install: %q", got)
			}
			// The default for replicas comes from the schema, not the chart.
			if got := h.MustRun("get", "gdg", "-n", c.ns, "gear-spare", "-o", "jsonpath={.metadata.managedFields[0].manager}/{.metadata.managedFields[0].operation}"); got != c.manager {
				t.Errorf("gadget gear-spare managed by %q, want %s", got, c.manager)
			}

			helm(append([]string{"upgrade", "gear", chart, "--namespace", c.ns, "--set", "size=large", "--set", "replicas=3"}, c.extra...)...)
			if got := h.MustRun("get", "gadget", "-n", c.ns, "gear-main", "-o", "jsonpath={.spec.size}/{.spec.replicas}/{.metadata.generation}"); got != "large/3/2" {
				t.Errorf("gear-main after the upgrade: %q, want large/3/2", got)
			}
			if got := h.MustRun("get", "configmap", "-n", c.ns, "gear-gadgets", "-o", "jsonpath={.data.size}"); got != "large" {
				t.Errorf("configmap after the upgrade: size %q", got)
			}
			if got := helm("list", "--namespace", c.ns, "-o", "json"); !strings.Contains(got, `"revision":"2"`) || !strings.Contains(got, `"status":"deployed"`) {
				t.Errorf("helm list after the upgrade: %s", got)
			}
			// A value the schema refuses fails the upgrade and changes
			// nothing.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			bad := exec.CommandContext(ctx, c.bin, append([]string{"upgrade", "gear", chart, "--namespace", c.ns, "--set", "size=huge"}, c.extra...)...)
			bad.Env = env
			if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "spec.size") {
				t.Errorf("upgrade with size=huge: %v\n%s", err, out)
			}
			if got := h.MustRun("get", "gadget", "-n", c.ns, "gear-main", "-o", "jsonpath={.spec.size}"); got != "large" {
				t.Errorf("gear-main after a refused upgrade: size %q", got)
			}

			uninstall := []string{"uninstall", "gear", "--namespace", c.ns}
			if c.name == "helm4" {
				uninstall = append(uninstall, "--wait", "--timeout", "60s")
			}
			helm(uninstall...)
			if got := h.MustRun("get", "gadgets,configmaps", "-n", c.ns, "-o", "name"); strings.Contains(got, "gear") {
				t.Errorf("left after uninstall: %s", got)
			}
			if got := h.MustRun("get", "secrets", "-n", c.ns, "-o", "name"); strings.Contains(got, "sh.helm.release") {
				t.Errorf("release records left after uninstall: %s", got)
			}
			// Helm leaves the CRDs of crds/ in place, as upstream documents.
			h.MustRun("get", "crd", "gadgets.charts.tether.dev")
		})
	}
}
