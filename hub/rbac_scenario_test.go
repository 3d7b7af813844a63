package hub_test

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// csrKubeconfig obtains a client certificate for user the documented
// way: a fresh key and certificate request, kubectl create of a
// CertificateSigningRequest for the kube-apiserver-client signer,
// kubectl certificate approve, and status.certificate read back with
// kubectl. It returns the path of a kubeconfig holding that certificate.
func csrKubeconfig(t *testing.T, h *hubtest.Hub, user string, groups ...string) string {
	t.Helper()
	keyPEM, req := newCSR(t, user, groups...)
	name := user + "-csr"
	mustKubectlIn(t, h, csrManifest(name, req, "kubernetes.io/kube-apiserver-client", []string{"digital signature", "client auth"}, 0), "create", "-f", "-")
	mustKubectl(t, h, "certificate", "approve", name)
	var cert []byte
	waitFor(t, user+"'s certificate", func() bool {
		out := mustKubectl(t, h, "get", "csr", name, "-o", "jsonpath={.status.certificate}")
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("decode status.certificate: %v", err)
		}
		cert = b
		return len(cert) > 0
	})
	return userKubeconfig(t, h, cert, keyPEM)
}

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
// kubectl: user bob, whose certificate an administrator issued through
// a CertificateSigningRequest and kubectl certificate approve, is
// refused with upstream's message until an administrator binds him to
// the view role in namespace y; then he reads pods there but creates
// none, and reads nothing in namespace z. kubectl auth can-i (as bob,
// and as the administrator with --as bob), can-i --list and auth whoami
// answer accordingly. kubectl describe prints the view role's rules and
// bob's binding; kubectl auth reconcile creates a Role and RoleBinding,
// changes nothing when run again, and removes extra rules only with
// --remove-extra-permissions.
func TestKubectlRBACScenario(t *testing.T) {
	// The aggregation controller fills the view role.
	h := hubtest.Start(t, "--controllers=garbagecollector,namespace,clusterrole-aggregation", "--disable-scheduler")
	mustKubectl(t, h, "create", "namespace", "y")
	mustKubectl(t, h, "create", "namespace", "z")
	bob := csrKubeconfig(t, h, "bob")
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

	describeRBAC(t, h)
	reconcileRBAC(t, h)
}

// describeRBAC checks that kubectl describe prints the rules of the view
// role and the role and subjects of bob's binding.
func describeRBAC(t *testing.T, h *hubtest.Hub) {
	t.Helper()
	out := mustKubectl(t, h, "describe", "clusterrole", "view")
	for _, want := range []string{"Name:         view", "PolicyRule:", "Resources", "Non-Resource URLs", "Resource Names", "Verbs",
		"[get list watch]", "deployments.apps", "rbac.authorization.k8s.io/aggregate-to-edit=true"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl describe clusterrole view lacks %q:\n%s", want, out)
		}
	}
	if podsLine := lineStarting(out, "pods "); !strings.Contains(podsLine, "[get list watch]") {
		t.Errorf("kubectl describe clusterrole view: pods line %q", podsLine)
	}
	out = mustKubectl(t, h, "describe", "rolebinding", "bob-view", "-n", "y")
	for _, want := range []string{"Name:         bob-view", "Role:", "Kind:  ClusterRole", "Name:  view", "Subjects:", "Kind  Name  Namespace"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl describe rolebinding lacks %q:\n%s", want, out)
		}
	}
	if l := strings.Fields(lineStarting(out, "User ")); !slices.Equal(l, []string{"User", "bob"}) {
		t.Errorf("kubectl describe rolebinding: subject line %q", l)
	}
}

// lineStarting returns the first line of out that, with its indentation
// removed, starts with prefix.
func lineStarting(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

const reconcileManifest = `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: config-editor
  namespace: "y"
rules:
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: bob-config
  namespace: "y"
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: config-editor
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: bob
`

// reconcileRBAC runs kubectl auth reconcile as upstream documents it.
func reconcileRBAC(t *testing.T, h *hubtest.Hub) {
	t.Helper()
	versions := func() string {
		return mustKubectl(t, h, "get", "role/config-editor", "rolebinding/bob-config", "-n", "y", "-o", "jsonpath={.items[*].metadata.resourceVersion}")
	}
	// kubectl prints the objects on stdout and what it changed on stderr.
	out := kubectlCombined(t, h, reconcileManifest, "auth", "reconcile", "-f", "-")
	for _, want := range []string{"role.rbac.authorization.k8s.io/config-editor reconciled", "rolebinding.rbac.authorization.k8s.io/bob-config reconciled",
		"reconciliation required create", "missing rules added:", "missing subjects added:"} {
		if !strings.Contains(out, want) {
			t.Errorf("first kubectl auth reconcile lacks %q:\n%s", want, out)
		}
	}
	waitFor(t, "bob to create configmaps in y", func() bool { return canI(t, h, "create", "configmaps", "-n", "y", "--as", "bob") == "yes" })
	before := versions()
	out = kubectlCombined(t, h, reconcileManifest, "auth", "reconcile", "-f", "-")
	if strings.Contains(out, "reconciliation required") || !strings.Contains(out, "config-editor reconciled") {
		t.Errorf("second kubectl auth reconcile:\n%s", out)
	}
	if after := versions(); after != before {
		t.Errorf("second kubectl auth reconcile changed the objects: resourceVersions %s, then %s", before, after)
	}

	// An extra rule stays unless --remove-extra-permissions is given.
	mustKubectl(t, h, "patch", "role", "config-editor", "-n", "y", "--type=json",
		"-p", `[{"op":"add","path":"/rules/-","value":{"apiGroups":[""],"resources":["secrets"],"verbs":["list"]}}]`)
	rules := func() string {
		return mustKubectl(t, h, "get", "role", "config-editor", "-n", "y", "-o", "jsonpath={.rules[*].resources}")
	}
	if out := kubectlCombined(t, h, reconcileManifest, "auth", "reconcile", "-f", "-"); strings.Contains(out, "reconciliation required") {
		t.Errorf("kubectl auth reconcile with an extra rule:\n%s", out)
	}
	if got := rules(); !strings.Contains(got, "secrets") {
		t.Errorf("kubectl auth reconcile without --remove-extra-permissions removed the extra rule: %s", got)
	}
	out = kubectlCombined(t, h, reconcileManifest, "auth", "reconcile", "--remove-extra-permissions", "-f", "-")
	if !strings.Contains(out, "reconciliation required update") || !strings.Contains(out, "extra rules removed:") {
		t.Errorf("kubectl auth reconcile --remove-extra-permissions:\n%s", out)
	}
	if got := rules(); strings.Contains(got, "secrets") || !strings.Contains(got, "configmaps") {
		t.Errorf("kubectl auth reconcile --remove-extra-permissions left rules %s", got)
	}
}
