package hub_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// canI runs kubectl auth can-i with args and returns its answer; kubectl
// exits 1 when the answer is no.
func canI(t *testing.T, h *hubtest.Hub, args ...string) string {
	t.Helper()
	out, err := h.Run(append([]string{"auth", "can-i"}, args...)...)
	out = strings.TrimSpace(out)
	if err != nil && out != "no" {
		t.Fatal(err)
	}
	return out
}

// TestKubectlRBACScenario is upstream's walk-through with a real hub and
// kubectl: user bob, holding a certificate signed by the hub's CA, is
// refused with upstream's message until an administrator binds him to
// the view role in namespace y; then he reads pods there but creates
// none, and reads nothing in namespace z. kubectl auth can-i (as bob,
// and as the administrator with --as bob), can-i --list and auth whoami
// answer accordingly.
func TestKubectlRBACScenario(t *testing.T) {
	// The aggregation controller fills the view role.
	h := hubtest.Start(t, "--controllers=garbagecollector,namespace,clusterrole-aggregation", "--disable-scheduler")
	mustKubectl(t, h, "create", "namespace", "y")
	mustKubectl(t, h, "create", "namespace", "z")
	bob := caSignedKubeconfig(t, h, "bob")
	asBob := func(args ...string) (string, error) { return h.Run(append([]string{"--kubeconfig", bob}, args...)...) }
	forbidden := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "Error from server (Forbidden): "+want) {
			t.Errorf("%s: %v\nwant %s", what, err, want)
		}
	}

	_, err := asBob("get", "pods", "-n", "y")
	forbidden("bob lists pods in y before the binding", err, `pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "y"`)
	if got := canI(t, h, "list", "pods", "-n", "y", "--as", "bob"); got != "no" {
		t.Errorf("can-i list pods -n y --as bob before the binding: %q", got)
	}
	if u := whoamiOf(t, h, "--kubeconfig", bob); u.Username != "bob" || !slices.Equal(u.Groups, []string{"system:authenticated"}) {
		t.Errorf("bob whoami: %+v", u)
	}

	mustKubectl(t, h, "create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", "y")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err = asBob("get", "pods", "-n", "y"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("bob lists pods in y after the binding: %v", err)
	}
	_, err = asBob("run", "x", "--image=nginx", "-n", "y")
	forbidden("bob creates a pod in y", err, `pods is forbidden: User "bob" cannot create resource "pods" in API group "" in the namespace "y"`)
	_, err = asBob("get", "pods", "-n", "z")
	forbidden("bob lists pods in z", err, `pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "z"`)
	_, err = asBob("get", "secrets", "-n", "y")
	forbidden("bob lists secrets in y", err, `secrets is forbidden: User "bob" cannot list resource "secrets" in API group "" in the namespace "y"`)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "pods", "-n", "y", "--as", "bob"}, "yes"},
		{[]string{"create", "pods", "-n", "y", "--as", "bob"}, "no"},
		{[]string{"list", "pods", "-n", "z", "--as", "bob"}, "no"},
		{[]string{"--kubeconfig", bob, "watch", "deployments.apps", "-n", "y"}, "yes"},
		{[]string{"--kubeconfig", bob, "delete", "pods", "-n", "y"}, "no"},
		{[]string{"--kubeconfig", bob, "list", "secrets", "-n", "y"}, "no"},
	} {
		if got := canI(t, h, tc.args...); got != tc.want {
			t.Errorf("can-i %s: %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	out, err := asBob("auth", "can-i", "--list", "-n", "y")
	if err != nil {
		t.Fatal(err)
	}
	podsLine := ""
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "pods" {
			podsLine = l
		}
	}
	if !strings.Contains(podsLine, "[get list watch]") || !strings.Contains(out, "selfsubjectaccessreviews.authorization.k8s.io") {
		t.Errorf("bob can-i --list -n y:\n%s", out)
	}
	if out, err := asBob("auth", "can-i", "--list", "-n", "z"); err != nil || strings.Contains(out, "\npods ") {
		t.Errorf("bob can-i --list -n z: %v\n%s", err, out)
	}

	_, err = h.Run("get", "pods", "-n", "y", "--as", "bob", "--as-group", "system:masters")
	if err != nil {
		t.Errorf("admin as bob in system:masters: %v", err)
	}
	_, err = asBob("get", "pods", "-n", "y", "--as", "alice")
	forbidden("bob impersonates alice", err, `users "alice" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the cluster scope`)
}
