package bootstrap_test

import (
	"context"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-helpers/auth/rbac/validation"

	"github.com/tether-edge/tether/controllers"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
)

// TestEveryControllerHasARole checks that each controller the hub can run
// has a ServiceAccount and a system:controller: ClusterRole bound to it.
func TestEveryControllerHasARole(t *testing.T) {
	roles := map[string]rbacv1.ClusterRole{}
	for _, r := range bootstrap.ClusterRoles() {
		if _, dup := roles[r.Name]; dup {
			t.Errorf("clusterrole %s twice", r.Name)
		}
		roles[r.Name] = r
		if r.Labels[bootstrap.BootstrappingLabel] != bootstrap.BootstrappingValue {
			t.Errorf("clusterrole %s lacks the bootstrapping label", r.Name)
		}
	}
	for _, name := range controllers.Names() {
		account := bootstrap.AccountFor(name)
		if account == "" {
			t.Errorf("controller %s has no account", name)
			continue
		}
		if _, ok := roles["system:controller:"+account]; !ok {
			t.Errorf("controller %s has no role system:controller:%s", name, account)
		}
	}
	bound := map[string]bool{}
	for _, b := range bootstrap.ClusterRoleBindings() {
		if _, ok := roles[b.RoleRef.Name]; !ok {
			t.Errorf("clusterrolebinding %s refers to missing role %s", b.Name, b.RoleRef.Name)
		}
		for _, s := range b.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind {
				bound[s.Name] = true
			}
		}
	}
	for _, c := range bootstrap.Controllers() {
		if !bound[c.Account] {
			t.Errorf("serviceaccount %s is bound to nothing", c.Account)
		}
	}
	for _, name := range []string{"cluster-admin", "admin", "edit", "view", "system:basic-user", "system:discovery",
		"system:public-info-viewer", "system:kube-scheduler", "system:controller:replicaset-controller"} {
		if _, ok := roles[name]; !ok {
			t.Errorf("no clusterrole %s", name)
		}
	}
}

// TestReconcileRespectsAutoupdate checks that Reconcile creates the
// policy, puts back a rule taken away, and leaves alone a role annotated
// autoupdate "false".
func TestReconcileRespectsAutoupdate(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	if err := bootstrap.Reconcile(ctx, cs); err != nil {
		t.Fatal(err)
	}
	crs, err := cs.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(crs.Items) != len(bootstrap.ClusterRoles()) {
		t.Fatalf("%d clusterroles, want %d", len(crs.Items), len(bootstrap.ClusterRoles()))
	}
	for _, r := range crs.Items {
		if r.Annotations[rbacv1.AutoUpdateAnnotationKey] != "true" {
			t.Errorf("clusterrole %s: autoupdate %q, want true", r.Name, r.Annotations[rbacv1.AutoUpdateAnnotationKey])
		}
	}

	strip := func(name, autoupdate string) {
		r, err := cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.Rules = r.Rules[:1]
		r.Annotations[rbacv1.AutoUpdateAnnotationKey] = autoupdate
		if _, err := cs.RbacV1().ClusterRoles().Update(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	strip("system:controller:replicaset-controller", "true")
	strip("system:controller:deployment-controller", "false")
	if err := bootstrap.Reconcile(ctx, cs); err != nil {
		t.Fatal(err)
	}
	rules := func(name string) []rbacv1.PolicyRule {
		r, err := cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Rules
	}
	want := map[string][]rbacv1.PolicyRule{}
	for _, c := range bootstrap.Controllers() {
		want[c.Account] = c.Rules
	}
	// Reconcile adds what is missing broken down by verb and resource,
	// as upstream does: compare what the rules cover.
	if ok, missing := validation.Covers(rules("system:controller:replicaset-controller"), want["replicaset-controller"]); !ok {
		t.Errorf("replicaset-controller still lacks %v after reconcile", missing)
	}
	if got := rules("system:controller:deployment-controller"); len(got) != 1 {
		t.Errorf("deployment-controller (autoupdate false) has %d rules after reconcile, want 1", len(got))
	}
	sas, err := cs.CoreV1().ServiceAccounts("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sa := range sas.Items {
		names = append(names, sa.Name)
	}
	if !slices.Contains(names, "replicaset-controller") || len(names) != len(bootstrap.Controllers()) {
		t.Errorf("kube-system serviceaccounts %v", names)
	}
}

// TestAggregatedRolesFilled: the default admin, edit and view carry the
// rules they aggregate from the default policy, through each other (view
// into edit into admin), so that they grant before the aggregation
// controller first runs; each rule once.
func TestAggregatedRolesFilled(t *testing.T) {
	roles := map[string]rbacv1.ClusterRole{}
	for _, r := range bootstrap.ClusterRoles() {
		roles[r.Name] = r
	}
	grants := func(role, verb, group, resource string) bool {
		for _, r := range roles[role].Rules {
			if slices.Contains(r.Verbs, verb) && slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		role, verb, group, resource string
		want                        bool
	}{
		{"view", "list", "", "pods", true},
		{"view", "list", "metrics.k8s.io", "pods", true},
		{"view", "get", "", "secrets", false},
		{"edit", "list", "", "pods", true},
		{"edit", "create", "", "secrets", true},
		{"edit", "create", "rbac.authorization.k8s.io", "rolebindings", false},
		{"admin", "list", "", "pods", true},
		{"admin", "create", "", "secrets", true},
		{"admin", "create", "rbac.authorization.k8s.io", "rolebindings", true},
	} {
		if got := grants(c.role, c.verb, c.group, c.resource); got != c.want {
			t.Errorf("%s grants %s %s/%s: %v, want %v", c.role, c.verb, c.group, c.resource, got, c.want)
		}
	}
	for _, name := range []string{"admin", "edit", "view"} {
		rules := roles[name].Rules
		for i := range rules {
			for j := range i {
				if equality.Semantic.DeepEqual(rules[i], rules[j]) {
					t.Errorf("%s holds rule %v twice", name, rules[i])
				}
			}
		}
	}
}
