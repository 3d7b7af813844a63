package hub_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// clientFrom is a clientset of a kubeconfig.
func clientFrom(t *testing.T, kubeconfig string) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestControllerRunsUnderItsRole shows that the ReplicaSet controller is
// not an admin: without create on pods in its role it fails with a 403
// naming its ServiceAccount, recorded as an Event on the ReplicaSet, and a
// restart's reconciled policy gives the verb back so the pods get made.
func TestControllerRunsUnderItsRole(t *testing.T) {
	h := hubtest.Start(t, "--controllers=replicaset,serviceaccount,garbagecollector,namespace,clusterrole-aggregation", "--disable-scheduler")
	cs := clientFor(t, h)
	ctx := t.Context()

	role, err := cs.RbacV1().ClusterRoles().Get(ctx, "system:controller:replicaset-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range role.Rules {
		if len(r.Resources) == 1 && r.Resources[0] == "pods" {
			role.Rules[i].Verbs = []string{"list", "watch", "delete", "patch"}
		}
	}
	if _, err := cs.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A probe user bound to the same role shows when the authorizer has
	// seen the change: a server-side dry run is authorized like a create.
	mustKubectl(t, h, "create", "clusterrolebinding", "probe", "--clusterrole=system:controller:replicaset-controller", "--user=probe")
	probe := h.UserKubeconfig("probe")
	mayCreatePods := func() bool {
		_, err := h.Run("--kubeconfig", probe, "run", "p", "--image=busybox", "--dry-run=server")
		return err == nil
	}
	waitFor(t, "the authorizer to see the narrowed role", func() bool { return !mayCreatePods() })

	if _, err := h.RunInput(ctx, `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: busybox}]}
`, nil, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	want := `Error creating: pods is forbidden:`
	forbidden := `is forbidden: User "system:serviceaccount:kube-system:replicaset-controller" cannot create resource "pods" in API group "" in the namespace "default"`
	waitFor(t, "a FailedCreate event naming the forbidden create", func() bool {
		out, err := h.Run("get", "events", "--field-selector", "reason=FailedCreate,involvedObject.name=web", "-o", "jsonpath={.items[*].message}")
		return err == nil && strings.Contains(out, want) && strings.Contains(out, forbidden)
	})
	if out := mustKubectl(t, h, "get", "pods", "-l", "app=web", "-o", "name"); out != "" {
		t.Fatalf("pods created without create on pods:\n%s", out)
	}

	h.Stop()
	h.Restart()
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range strings.Split(h.Logs(), "\n") {
				if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "replicaset") {
					t.Log(l)
				}
			}
		}
	})
	waitFor(t, "the ReplicaSet's two pods after the restart", func() bool {
		out, err := h.Run("get", "pods", "-l", "app=web", "-o", "name")
		return err == nil && strings.Count(out, "pod/") == 2
	})
	if !mayCreatePods() {
		t.Error("after the restart the role still lacks create on pods")
	}
}

// TestRoleEscalation shows escalation prevention through kubectl: a user
// who may create roles but not list secrets cannot create a Role granting
// list on secrets, and can once given escalate.
func TestRoleEscalation(t *testing.T) {
	h := hubtest.Start(t, rbacControllers...)
	cs := clientFor(t, h)
	ctx := t.Context()
	mustKubectl(t, h, "create", "namespace", "esc")
	mustKubectl(t, h, "create", "role", "role-writer", "-n", "esc", "--verb=create,get,list", "--resource=roles.rbac.authorization.k8s.io")
	mustKubectl(t, h, "create", "rolebinding", "alice-writes-roles", "-n", "esc", "--role=role-writer", "--user=alice")
	alice := h.UserKubeconfig("alice", "dev")

	waitFor(t, "alice to be allowed to create roles", func() bool {
		_, err := h.Run("--kubeconfig", alice, "get", "roles", "-n", "esc")
		return err == nil
	})
	_, err := h.Run("--kubeconfig", alice, "create", "role", "secret-reader", "-n", "esc", "--verb=list", "--resource=secrets")
	want := `roles.rbac.authorization.k8s.io "secret-reader" is forbidden: user "alice" (groups=["dev" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:`
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `Resources:["secrets"], Verbs:["list"]`) {
		t.Fatalf("create role granting list secrets without holding it: %v\nwant %q", err, want)
	}
	if _, err := cs.RbacV1().Roles("esc").Get(ctx, "secret-reader", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("refused role was stored: %v", err)
	}

	mustKubectl(t, h, "create", "role", "role-escalator", "-n", "esc", "--verb=escalate", "--resource=roles.rbac.authorization.k8s.io")
	mustKubectl(t, h, "create", "rolebinding", "alice-escalates", "-n", "esc", "--role=role-escalator", "--user=alice")
	waitFor(t, "alice to create the role with escalate", func() bool {
		_, err := h.Run("--kubeconfig", alice, "create", "role", "secret-reader", "-n", "esc", "--verb=list", "--resource=secrets")
		return err == nil
	})
	// Holding escalate on roles lets alice write the role, not use it.
	if _, err := h.Run("--kubeconfig", alice, "get", "secrets", "-n", "esc"); err == nil || !strings.Contains(err.Error(), `User "alice" cannot list resource "secrets" in API group "" in the namespace "esc"`) {
		t.Errorf("alice lists secrets: %v", err)
	}
}

// TestRoleBindingToMissingRoleAndBadRules covers bad input: a RoleBinding
// to a role that does not exist is accepted and grants nothing, as
// upstream; malformed rules are refused with 422 and field causes and
// nothing is stored.
func TestRoleBindingToMissingRoleAndBadRules(t *testing.T) {
	h := hubtest.Start(t, rbacControllers...)
	cs := clientFor(t, h)
	ctx := t.Context()
	mustKubectl(t, h, "create", "namespace", "ghosts")
	mustKubectl(t, h, "create", "rolebinding", "bob-ghost", "-n", "ghosts", "--role=ghost", "--user=bob")
	mustKubectl(t, h, "create", "rolebinding", "bob-ghost-cluster", "-n", "ghosts", "--clusterrole=ghost", "--user=bob")
	bob := h.UserKubeconfig("bob")
	_, err := h.Run("--kubeconfig", bob, "get", "pods", "-n", "ghosts")
	if err == nil || !strings.Contains(err.Error(), `pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "ghosts"`) {
		t.Errorf("bob bound to a missing role lists pods: %v", err)
	}

	bad := []struct {
		name  string
		rules []rbacv1.PolicyRule
		field string
	}{
		{"no-verbs", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}}}, "rules[0].verbs"},
		{"no-groups", []rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}}}, "rules[0].apiGroups"},
		{"urls-in-role", []rbacv1.PolicyRule{{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}}}, "rules[0].nonResourceURLs"},
	}
	for _, b := range bad {
		_, err := cs.RbacV1().Roles("ghosts").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: b.name}, Rules: b.rules}, metav1.CreateOptions{})
		var se *apierrors.StatusError
		if !apierrors.IsInvalid(err) || !asStatus(err, &se) || se.ErrStatus.Details == nil || !hasCause(se, b.field) {
			t.Errorf("role %s: %v, want 422 with a cause on %s", b.name, err, b.field)
		}
		if _, err := cs.RbacV1().Roles("ghosts").Get(ctx, b.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("invalid role %s was stored: %v", b.name, err)
		}
	}
	_, err = h.RunInput(ctx, `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: no-verbs, namespace: ghosts}
rules: [{apiGroups: [""], resources: [pods]}]
`, nil, "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), `The Role "no-verbs" is invalid: rules[0].verbs: Required value`) {
		t.Errorf("kubectl apply of a role without verbs: %v", err)
	}
	if out, err := h.Run("get", "roles", "-n", "ghosts", "-o", "name"); err != nil || out != "" {
		t.Errorf("roles stored in ghosts: %q %v", out, err)
	}
}

func asStatus(err error, se **apierrors.StatusError) bool { return errors.As(err, se) }

func hasCause(se *apierrors.StatusError, field string) bool {
	for _, c := range se.ErrStatus.Details.Causes {
		if c.Field == field {
			return true
		}
	}
	return false
}
