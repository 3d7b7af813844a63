package hub_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestKubectlRuntimeClass drives RuntimeClasses with a real kubectl:
// discovery, apply, the table, bad input refused with field causes, and
// pods admitted by their class (overhead, node selector, tolerations) or
// refused with upstream's messages, and ResourceQuota counting the
// overhead.
func TestKubectlRuntimeClass(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	ctx := context.Background()
	apply := func(manifest string) (string, error) {
		return h.RunInput(ctx, manifest, nil, "apply", "-f", "-")
	}

	t.Run("discovery", func(t *testing.T) {
		out := h.MustRun("api-resources", "--api-group", "node.k8s.io")
		if !regexp.MustCompile(`runtimeclasses\s+node.k8s.io/v1\s+false\s+RuntimeClass`).MatchString(out) {
			t.Errorf("api-resources:\n%s", out)
		}
	})

	const kata = `apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: kata
handler: kata
overhead:
  podFixed:
    cpu: 250m
    memory: 120Mi
scheduling:
  nodeSelector:
    sandbox: kata
  tolerations:
  - key: sandbox
    operator: Exists
    effect: NoSchedule
`
	t.Run("apply and get", func(t *testing.T) {
		if out, err := apply(kata); err != nil || !strings.Contains(out, "runtimeclass.node.k8s.io/kata created") {
			t.Fatalf("apply: %q %v", out, err)
		}
		if out, err := apply(kata); err != nil || !strings.Contains(out, "unchanged") {
			t.Errorf("second apply: %q %v", out, err)
		}
		out := h.MustRun("get", "runtimeclass")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME HANDLER AGE" || !regexp.MustCompile(`^kata\s+kata\s+\d+s$`).MatchString(lines[1]) {
			t.Errorf("get runtimeclass:\n%s", out)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		bad := "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: bad\nhandler: Not_A_Label\noverhead:\n  podFixed:\n    cpu: \"-1\"\nscheduling:\n  nodeSelector:\n    \"a b\": c\n"
		out, err := h.RunInput(ctx, bad, nil, "apply", "-f", "-", "-v=6")
		for _, want := range []string{
			`The RuntimeClass "bad" is invalid`,
			`handler: Invalid value: "Not_A_Label": a lowercase RFC 1123 label must consist of`,
			`overhead.limits[cpu]: Invalid value: "-1": must be greater than or equal to 0`,
			`scheduling.nodeSelector: Invalid value: "a b": name part must consist of`,
			"422 Unprocessable Entity",
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("apply of an invalid class: want %q in %q %v", want, out, err)
			}
		}
		if _, err := h.Run("get", "runtimeclass", "bad"); err == nil || !strings.Contains(err.Error(), "NotFound") {
			t.Errorf("invalid class stored: %v", err)
		}
		_, err = apply(strings.Replace(kata, "handler: kata", "handler: other", 1))
		if err == nil || !strings.Contains(err.Error(), `handler: Invalid value: "other": field is immutable`) {
			t.Errorf("handler change: %v", err)
		}
	})

	pod := func(name, extra string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\nspec:\n" + extra +
			"  containers:\n  - name: c\n    image: busybox\n"
	}
	t.Run("pod gets the class's overhead and scheduling", func(t *testing.T) {
		h.MustRun("create", "namespace", "rc")
		// No service account controller runs here.
		h.MustRun("create", "serviceaccount", "default", "-n", "rc")
		if _, err := h.RunInput(ctx, pod("sandboxed", "  runtimeClassName: kata\n  nodeSelector:\n    zone: a\n"), nil, "apply", "-n", "rc", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		out := h.MustRun("get", "pod", "sandboxed", "-n", "rc", "-o",
			`jsonpath={.spec.overhead.cpu} {.spec.overhead.memory} {.spec.nodeSelector.sandbox} {.spec.nodeSelector.zone} {.spec.tolerations[?(@.key=="sandbox")].effect}`)
		if out != "250m 120Mi kata a NoSchedule" {
			t.Errorf("admitted pod: %q", out)
		}
	})

	t.Run("pod refused", func(t *testing.T) {
		cases := []struct{ extra, want string }{
			{"  runtimeClassName: nope\n", `Error from server (Forbidden): error when creating "STDIN": pods "p" is forbidden: pod rejected: RuntimeClass "nope" not found`},
			{"  runtimeClassName: kata\n  overhead:\n    cpu: \"1\"\n", `pods "p" is forbidden: pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead`},
			{"  overhead:\n    cpu: \"1\"\n", `pods "p" is forbidden: pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead`},
			{"  runtimeClassName: kata\n  nodeSelector:\n    sandbox: gvisor\n", `pods "p" is forbidden: conflict: runtimeClass.scheduling.nodeSelector[sandbox] = kata; pod.spec.nodeSelector[sandbox] = gvisor`},
		}
		for _, c := range cases {
			_, err := h.RunInput(ctx, pod("p", c.extra), nil, "apply", "-n", "rc", "-f", "-")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("want %q, got %v", c.want, err)
			}
		}
		if _, err := h.Run("get", "pod", "p", "-n", "rc"); err == nil {
			t.Error("a refused pod was stored")
		}
	})

	t.Run("quota counts the overhead", func(t *testing.T) {
		h.MustRun("create", "namespace", "rcq")
		h.MustRun("create", "serviceaccount", "default", "-n", "rcq")
		h.MustRun("create", "quota", "q", "-n", "rcq", "--hard=requests.cpu=1")
		withRequest := func(name, extra string) string {
			return pod(name, extra) + "    resources:\n      requests:\n        cpu: 800m\n"
		}
		_, err := h.RunInput(ctx, withRequest("sandboxed", "  runtimeClassName: kata\n"), nil, "apply", "-n", "rcq", "-f", "-")
		want := `pods "sandboxed" is forbidden: exceeded quota: q, requested: requests.cpu=1050m, used: requests.cpu=0, limited: requests.cpu=1`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("pod with overhead under a quota: want %q, got %v", want, err)
		}
		if _, err := h.RunInput(ctx, withRequest("plain", ""), nil, "apply", "-n", "rcq", "-f", "-"); err != nil {
			t.Errorf("pod without overhead under the quota: %v", err)
		}
	})
}
