package rbac

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/storage"
)

// TestFollowsStorage shows the authorizer's view following the changes
// stored: bindings, a binding to a role that does not exist yet, rules
// added to and removed from a role, deletions.
func TestFollowsStorage(t *testing.T) {
	s := newStored(t, "shop", "other")
	bob := user("bob", "clerks")
	listPods := res("list", "", "pods", "shop", "")
	getSecret := res("get", "", "secrets", "shop", "s")
	denied := func(f func() error) func() error {
		return func() error {
			if f() == nil {
				return errString("still allowed")
			}
			return nil
		}
	}
	may := func(at apiserver.Attributes) func() error { return func() error { return s.a.Authorize(bob, at) } }

	if err := s.a.Authorize(bob, listPods); err == nil {
		t.Fatal("allowed before any binding")
	}
	// A binding to a role that does not exist grants nothing...
	s.create(t, nil, roleBinding("shop", "clerks", ref("Role", "clerk"), groupSubject("clerks")))
	eventually(t, "binding seen, with the missing role in the reason", func() error {
		err := s.a.Authorize(bob, listPods)
		if err == nil || !contains(err.Error(), `RBAC: role.rbac.authorization.k8s.io "clerk" not found`) {
			return errString("got " + errText(err))
		}
		return nil
	})
	// ...until the role is created.
	s.create(t, nil, role("shop", "clerk", rule(l("list"), l(""), l("pods"))))
	eventually(t, "role created", (may(listPods)))
	if err := s.a.Authorize(bob, getSecret); err == nil {
		t.Fatal("secrets allowed")
	}
	// A rule added to the role is honoured.
	k := kindOf(resRoles)
	if _, err := s.st.GuaranteedUpdate(s.ctx, k, "shop", "clerk", storage.Options{}, func(cur runtime.Object) (runtime.Object, error) {
		r := cur.(*rbacv1.Role)
		r.Rules = append(r.Rules, rule(l("get"), l(""), l("secrets")))
		return r, nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rule added", (may(getSecret)))
	// Not in another namespace.
	if err := s.a.Authorize(bob, res("get", "", "secrets", "other", "s")); err == nil {
		t.Fatal("allowed in another namespace")
	}
	// A ClusterRoleBinding grants everywhere.
	s.create(t, nil, clusterRole("node-reader", rule(l("get"), l(""), l("nodes"))))
	s.create(t, nil, clusterRoleBinding("bob-nodes", ref("ClusterRole", "node-reader"), userSubject("bob")))
	eventually(t, "cluster binding", (may(res("get", "", "nodes", "", "n1"))))
	// Deleting the role, then the bindings, takes the rights away.
	if _, _, err := s.st.Delete(s.ctx, k, "shop", "clerk", &metav1.DeleteOptions{}, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "role deleted", denied(may(listPods)))
	if _, _, err := s.st.Delete(s.ctx, kindOf(resClusterRoleBindings), "", "bob-nodes", &metav1.DeleteOptions{}, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "cluster binding deleted", denied(may(res("get", "", "nodes", "", "n1"))))
}
