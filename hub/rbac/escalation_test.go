package rbac

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/storage"
)

const rbacGroup = rbacv1.GroupName

// TestEscalation shows upstream's escalation prevention on role and
// binding writes through a real storage.
func TestEscalation(t *testing.T) {
	s := newStored(t, "y", "z")
	bob := user("bob", "g")
	alice := user("alice")
	eve := user("eve")
	// What the users hold, written by the hub itself (no user).
	for _, o := range []runtime.Object{
		clusterRole("rbac-writer", rule(l("create", "update"), l(rbacGroup), l("roles", "rolebindings", "clusterroles", "clusterrolebindings"))),
		clusterRole("escalator", rule(l("escalate"), l(rbacGroup), l("roles", "clusterroles"))),
		clusterRole("secret-reader", rule(l("get"), l(""), l("secrets"))),
		clusterRole("binder", rule(l("bind"), l(rbacGroup), l("clusterroles"), "secret-reader")),
		clusterRole("role-binder", rule(l("bind"), l(rbacGroup), l("roles"))),
		role("y", "secret-lister", rule(l("list"), l(""), l("secrets"))),
		roleBinding("y", "bob-writes", ref("ClusterRole", "rbac-writer"), groupSubject("g")),
		roleBinding("z", "bob-writes", ref("ClusterRole", "rbac-writer"), groupSubject("g")),
		clusterRoleBinding("eve-dangling", ref("ClusterRole", "gone"), userSubject("eve")),
		roleBinding("z", "alice-escalates", ref("ClusterRole", "escalator"), userSubject("alice")),
	} {
		s.create(t, nil, o)
	}
	eventually(t, "bindings seen", func() error {
		return s.a.Authorize(alice, res("escalate", rbacGroup, "roles", "z", ""))
	})
	secretsRole := func(ns, name string) *rbacv1.Role {
		return role(ns, name, rule(l("list"), l(""), l("secrets")))
	}
	wantForbidden := func(t *testing.T, err error, msg string) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Fatalf("want Forbidden, got %v", err)
		}
		if msg != "" && err.Error() != msg {
			t.Fatalf("message\n got %s\nwant %s", err.Error(), msg)
		}
	}
	notStored := func(t *testing.T, resource, ns, name string) {
		t.Helper()
		if _, err := s.st.Get(s.ctx, kindOf(resource), ns, name); !apierrors.IsNotFound(err) {
			t.Fatalf("%s %s/%s stored after a refused write: %v", resource, ns, name, err)
		}
	}

	t.Run("role granting what the user lacks", func(t *testing.T) {
		_, err := s.tryCreate(t, bob, secretsRole("z", "x"))
		wantForbidden(t, err, `roles.rbac.authorization.k8s.io "x" is forbidden: user "bob" (groups=["g" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:`+"\n"+`{APIGroups:[""], Resources:["secrets"], Verbs:["list"]}`)
		notStored(t, resRoles, "z", "x")
	})
	t.Run("missing rules compacted and sorted", func(t *testing.T) {
		_, err := s.tryCreate(t, bob, role("z", "x",
			rule(l("get", "list"), l(""), l("secrets", "configmaps")),
			rule(l("get"), l(""), l("pods"), "a", "b"),
		))
		wantForbidden(t, err, `roles.rbac.authorization.k8s.io "x" is forbidden: user "bob" (groups=["g" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:`+"\n"+
			`{APIGroups:[""], Resources:["configmaps"], Verbs:["get" "list"]}`+"\n"+
			`{APIGroups:[""], Resources:["pods"], ResourceNames:["a"], Verbs:["get"]}`+"\n"+
			`{APIGroups:[""], Resources:["pods"], ResourceNames:["b"], Verbs:["get"]}`+"\n"+
			`{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list"]}`)
	})
	t.Run("role granting what the user holds in the namespace", func(t *testing.T) {
		s.create(t, nil, roleBinding("y", "bob-lists-secrets", ref("Role", "secret-lister"), userSubject("bob")))
		eventually(t, "binding seen", func() error { return s.a.Authorize(bob, res("list", "", "secrets", "y", "")) })
		s.create(t, bob, secretsRole("y", "ok"))
		_, err := s.tryCreate(t, bob, secretsRole("z", "x"))
		wantForbidden(t, err, "")
	})
	t.Run("escalate", func(t *testing.T) {
		s.create(t, nil, roleBinding("z", "alice-writes", ref("ClusterRole", "rbac-writer"), userSubject("alice")))
		s.create(t, alice, secretsRole("z", "by-alice"))
		_, err := s.tryCreate(t, alice, secretsRole("y", "by-alice"))
		wantForbidden(t, err, "")
	})
	t.Run("resolution errors", func(t *testing.T) {
		_, err := s.tryCreate(t, eve, secretsRole("y", "x"))
		wantForbidden(t, err, `roles.rbac.authorization.k8s.io "x" is forbidden: user "eve" (groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:`+"\n"+
			`{APIGroups:[""], Resources:["secrets"], Verbs:["list"]}; resolution errors: [clusterroles.rbac.authorization.k8s.io "gone" not found]`)
	})
	t.Run("update", func(t *testing.T) {
		s.create(t, nil, role("z", "grows"))
		_, err := s.st.GuaranteedUpdate(s.as(bob), kindOf(resRoles), "z", "grows", storage.Options{}, func(cur runtime.Object) (runtime.Object, error) {
			r := cur.(*rbacv1.Role)
			r.Rules = append(r.Rules, rule(l("list"), l(""), l("secrets")))
			return r, nil
		})
		wantForbidden(t, err, "")
		// Owner references and finalizers are the garbage collector's.
		if _, err := s.st.GuaranteedUpdate(s.as(eve), kindOf(resRoleBindings), "z", "bob-writes", storage.Options{}, func(cur runtime.Object) (runtime.Object, error) {
			b := cur.(*rbacv1.RoleBinding)
			b.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: "u1"}}
			return b, nil
		}); err != nil {
			t.Fatalf("owner reference update: %v", err)
		}
	})
	t.Run("server-side apply", func(t *testing.T) {
		patch := []byte(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"applied","namespace":"z"},` +
			`"rules":[{"apiGroups":[""],"resources":["secrets"],"verbs":["list"]}]}`)
		_, _, err := s.st.Apply(s.as(bob), kindOf(resRoles), "z", "applied", patch, storage.Options{FieldManager: "kubectl"})
		wantForbidden(t, err, `roles.rbac.authorization.k8s.io "applied" is forbidden: user "bob" (groups=["g" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:`+"\n"+`{APIGroups:[""], Resources:["secrets"], Verbs:["list"]}`)
		notStored(t, resRoles, "z", "applied")
		// Applied to an existing role, too.
		patch = []byte(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"grows","namespace":"z"},` +
			`"rules":[{"apiGroups":[""],"resources":["secrets"],"verbs":["list"]}]}`)
		_, _, err = s.st.Apply(s.as(bob), kindOf(resRoles), "z", "grows", patch, storage.Options{FieldManager: "kubectl"})
		wantForbidden(t, err, "")
	})
	t.Run("aggregationRule", func(t *testing.T) {
		agg := clusterRole("agg")
		agg.AggregationRule = &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"a": "b"}}}}
		s.create(t, nil, clusterRoleBinding("bob-writes-cluster", ref("ClusterRole", "rbac-writer"), userSubject("bob")))
		eventually(t, "binding seen", func() error { return s.a.Authorize(bob, res("create", rbacGroup, "clusterroles", "", "")) })
		_, err := s.tryCreate(t, bob, agg)
		wantForbidden(t, err, `clusterroles.rbac.authorization.k8s.io "agg" is forbidden: must have cluster-admin privileges to use the aggregationRule`)
		notStored(t, resClusterRoles, "", "agg")
		s.create(t, nil, agg)
		_, err = s.st.GuaranteedUpdate(s.as(bob), kindOf(resClusterRoles), "", "agg", storage.Options{}, func(cur runtime.Object) (runtime.Object, error) {
			r := cur.(*rbacv1.ClusterRole)
			r.AggregationRule = nil
			return r, nil
		})
		wantForbidden(t, err, `clusterroles.rbac.authorization.k8s.io "agg" is forbidden: must have cluster-admin privileges to use the aggregationRule`)
		// escalate on clusterroles skips every check.
		s.create(t, nil, clusterRoleBinding("alice-escalates-cluster", ref("ClusterRole", "escalator"), userSubject("alice")))
		eventually(t, "binding seen", func() error { return s.a.Authorize(alice, res("escalate", rbacGroup, "clusterroles", "", "")) })
		agg2 := agg.DeepCopy()
		agg2.Name = "agg2"
		s.create(t, alice, agg2)
	})
	t.Run("binding without the role's rules", func(t *testing.T) {
		_, err := s.tryCreate(t, bob, roleBinding("y", "b1", ref("ClusterRole", "secret-reader"), userSubject("mallory")))
		wantForbidden(t, err, `rolebindings.rbac.authorization.k8s.io "b1" is forbidden: user "bob" (groups=["g" "system:authenticated"]) is attempting to grant RBAC permissions not currently held:`+"\n"+`{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}`)
		notStored(t, resRoleBindings, "y", "b1")
	})
	t.Run("binding with the role's rules", func(t *testing.T) {
		s.create(t, bob, roleBinding("y", "b2", ref("Role", "secret-lister"), userSubject("mallory")))
		_, err := s.tryCreate(t, bob, roleBinding("z", "b2", ref("ClusterRole", "secret-lister-everywhere"), userSubject("mallory")))
		if !apierrors.IsNotFound(err) || err.Error() != `clusterroles.rbac.authorization.k8s.io "secret-lister-everywhere" not found` {
			t.Fatalf("binding to a missing role without bind: %v", err)
		}
	})
	t.Run("bind", func(t *testing.T) {
		s.create(t, nil, roleBinding("y", "bob-binds", ref("ClusterRole", "binder"), userSubject("bob")))
		eventually(t, "binding seen", func() error {
			return s.a.Authorize(bob, res("bind", rbacGroup, "clusterroles", "y", "secret-reader"))
		})
		s.create(t, bob, roleBinding("y", "b1", ref("ClusterRole", "secret-reader"), userSubject("mallory")))
		_, err := s.tryCreate(t, bob, roleBinding("z", "b1", ref("ClusterRole", "secret-reader"), userSubject("mallory")))
		wantForbidden(t, err, "")
		_, err = s.tryCreate(t, bob, clusterRoleBinding("b1", ref("ClusterRole", "secret-reader"), userSubject("mallory")))
		wantForbidden(t, err, "")
	})
	t.Run("bind to a role that does not exist", func(t *testing.T) {
		_, err := s.tryCreate(t, bob, roleBinding("y", "b3", ref("Role", "nope"), userSubject("mallory")))
		if !apierrors.IsNotFound(err) || err.Error() != `roles.rbac.authorization.k8s.io "nope" not found` {
			t.Fatalf("want NotFound, got %v", err)
		}
		s.create(t, nil, roleBinding("y", "bob-binds-roles", ref("ClusterRole", "role-binder"), userSubject("bob")))
		eventually(t, "binding seen", func() error { return s.a.Authorize(bob, res("bind", rbacGroup, "roles", "y", "nope")) })
		s.create(t, bob, roleBinding("y", "b3", ref("Role", "nope"), userSubject("mallory")))
	})
	t.Run("system:masters and the hub itself", func(t *testing.T) {
		s.create(t, &auth.User{Name: "root", Groups: []string{pki.AdminGroup}}, secretsRole("z", "by-root"))
		s.create(t, nil, secretsRole("z", "by-hub"))
	})
	t.Run("other kinds", func(t *testing.T) {
		if _, err := s.a.Admitter().AdmitCreate(s.as(eve), kindFor(t, nsObj("w")), nsObj("w"), false); err != nil {
			t.Fatal(err)
		}
	})
}
