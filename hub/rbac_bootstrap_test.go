package hub_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/auth/rbac/validation"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
)

// rbacControllers runs the controllers the RBAC tests need without the
// workload controllers.
var rbacControllers = []string{"--controllers=garbagecollector,namespace,clusterrole-aggregation", "--disable-scheduler"}

// TestBootstrapPolicy checks the default RBAC policy through a real
// kubectl: it exists after the first start, a restart puts back what was
// deleted or taken away, and a role annotated autoupdate "false" is left
// as its owner made it.
func TestBootstrapPolicy(t *testing.T) {
	h := hubtest.Start(t, rbacControllers...)
	cs := clientFor(t, h)
	ctx := t.Context()

	mustKubectl(t, h, "get", "clusterroles", "cluster-admin", "admin", "edit", "view", "system:basic-user",
		"system:discovery", "system:public-info-viewer", "system:kube-scheduler", "system:controller:replicaset-controller")
	mustKubectl(t, h, "get", "clusterrolebindings", "cluster-admin", "system:basic-user", "system:discovery",
		"system:public-info-viewer", "system:kube-scheduler", "system:controller:replicaset-controller")
	mustKubectl(t, h, "get", "serviceaccount", "-n", "kube-system", "replicaset-controller", "generic-garbage-collector")
	out := mustKubectl(t, h, "get", "clusterrolebinding", "system:public-info-viewer", "-o", "wide")
	if !strings.Contains(out, "system:authenticated") || !strings.Contains(out, "system:unauthenticated") {
		t.Errorf("system:public-info-viewer binding:\n%s", out)
	}
	out = mustKubectl(t, h, "get", "clusterrole", "system:controller:replicaset-controller", "-o",
		`jsonpath={.metadata.labels.kubernetes\.io/bootstrapping} {.metadata.annotations.rbac\.authorization\.kubernetes\.io/autoupdate}`)
	if out != "rbac-defaults true" {
		t.Errorf("replicaset-controller role label and annotation: %q", out)
	}
	// The aggregated roles fill: view's rules reach edit, edit's admin.
	waitFor(t, "admin to hold view's and edit's rules", func() bool {
		return covers(t, cs, "admin", rbacv1.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"pods"}}) &&
			covers(t, cs, "admin", rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{""}, Resources: []string{"secrets"}}) &&
			covers(t, cs, "admin", rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"rolebindings"}})
	})
	if covers(t, cs, "view", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"secrets"}}) {
		t.Error("view may read secrets")
	}

	// Take away, delete and protect, then restart.
	rs, err := cs.RbacV1().ClusterRoles().Get(ctx, "system:controller:replicaset-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs.Rules = slices.DeleteFunc(rs.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "pods") })
	if _, err := cs.RbacV1().ClusterRoles().Update(ctx, rs, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mustKubectl(t, h, "delete", "clusterrole", "system:discovery")
	mustKubectl(t, h, "delete", "clusterrolebinding", "system:basic-user")
	mustKubectl(t, h, "annotate", "--overwrite", "clusterrole", "system:controller:deployment-controller",
		"rbac.authorization.kubernetes.io/autoupdate=false")
	mustKubectl(t, h, "patch", "clusterrole", "system:controller:deployment-controller", "--type=json",
		"-p", `[{"op":"replace","path":"/rules","value":[{"apiGroups":["apps"],"resources":["deployments"],"verbs":["get"]}]}]`)

	h.Stop()
	h.Restart()

	mustKubectl(t, h, "get", "clusterrole", "system:discovery")
	mustKubectl(t, h, "get", "clusterrolebinding", "system:basic-user")
	want := rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{""}, Resources: []string{"pods"}}
	if !covers(t, cs, "system:controller:replicaset-controller", want) {
		t.Error("the restart did not give the ReplicaSet controller back create on pods")
	}
	dc, err := cs.RbacV1().ClusterRoles().Get(ctx, "system:controller:deployment-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dc.Rules) != 1 || dc.Annotations[rbacv1.AutoUpdateAnnotationKey] != "false" {
		t.Errorf("role with autoupdate false was changed: %v %v", dc.Annotations, dc.Rules)
	}
}

// TestClusterRoleAggregation checks that a ClusterRole labelled for
// aggregation to edit shows up in edit, and through edit in admin, within
// a second, and leaves them when it goes.
func TestClusterRoleAggregation(t *testing.T) {
	h := hubtest.Start(t, rbacControllers...)
	cs := clientFor(t, h)
	ctx := t.Context()
	waitFor(t, "edit to aggregate", func() bool {
		return covers(t, cs, "edit", rbacv1.PolicyRule{Verbs: []string{"create"}, APIGroups: []string{""}, Resources: []string{"secrets"}})
	})
	widgets := rbacv1.PolicyRule{Verbs: []string{"get", "list"}, APIGroups: []string{"example.com"}, Resources: []string{"widgets"}}
	_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets-edit", Labels: map[string]string{bootstrap.AggregateToEdit: "true"}},
		Rules:      []rbacv1.PolicyRule{widgets},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for !covers(t, cs, "edit", widgets) || !covers(t, cs, "admin", widgets) {
		if time.Since(start) > time.Second {
			t.Fatalf("widgets-edit not aggregated into edit and admin within 1s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("aggregated into edit and admin in %v", time.Since(start).Round(time.Millisecond))
	if covers(t, cs, "view", widgets) {
		t.Error("widgets-edit aggregated into view")
	}
	out := mustKubectl(t, h, "describe", "clusterrole", "edit")
	if !strings.Contains(out, "widgets.example.com") {
		t.Errorf("kubectl describe clusterrole edit:\n%s", out)
	}

	mustKubectl(t, h, "delete", "clusterrole", "widgets-edit")
	waitFor(t, "widgets to leave edit", func() bool { return !covers(t, cs, "edit", widgets) })
}

// covers reports whether ClusterRole name grants rule.
func covers(t *testing.T, cs kubernetes.Interface, name string, rule rbacv1.PolicyRule) bool {
	t.Helper()
	r, err := cs.RbacV1().ClusterRoles().Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := validation.Covers(r.Rules, []rbacv1.PolicyRule{rule})
	return ok
}
