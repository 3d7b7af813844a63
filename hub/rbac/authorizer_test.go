package rbac

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
)

func TestRuleMatching(t *testing.T) {
	all := l("*")
	for _, tc := range []struct {
		name string
		rule rbacv1.PolicyRule
		at   apiserver.Attributes
		want bool
	}{
		{"exact", rule(l("get"), l(""), l("pods")), res("get", "", "pods", "x", "p"), true},
		{"other verb", rule(l("get"), l(""), l("pods")), res("list", "", "pods", "x", ""), false},
		{"verb star", rule(all, l(""), l("pods")), res("deletecollection", "", "pods", "x", ""), true},
		{"other group", rule(l("get"), l(""), l("deployments")), res("get", "apps", "deployments", "x", "d"), false},
		{"group star", rule(l("get"), all, l("deployments")), res("get", "apps", "deployments", "x", "d"), true},
		{"resource star", rule(l("get"), l("apps"), all), res("get", "apps", "deployments/scale", "x", "d"), true},
		{"main resource does not grant subresource", rule(l("get"), l(""), l("pods")), res("get", "", "pods/log", "x", "p"), false},
		{"subresource", rule(l("get"), l(""), l("pods/log")), res("get", "", "pods/log", "x", "p"), true},
		{"subresource does not grant main resource", rule(l("get"), l(""), l("pods/log")), res("get", "", "pods", "x", "p"), false},
		{"other subresource", rule(l("get"), l(""), l("pods/log")), res("get", "", "pods/exec", "x", "p"), false},
		{"star subresource", rule(l("update"), l("apps"), l("*/scale")), res("update", "apps", "deployments/scale", "x", "d"), true},
		{"star subresource is not main", rule(l("update"), l("apps"), l("*/scale")), res("update", "apps", "deployments", "x", "d"), false},
		{"star subresource other", rule(l("update"), l("apps"), l("*/scale")), res("update", "apps", "deployments/status", "x", "d"), false},
		{"prefix resource is not subresource", rule(l("get"), l(""), l("pod/log")), res("get", "", "pods/log", "x", "p"), false},
		{"resource name", rule(l("get"), l(""), l("secrets"), "s1"), res("get", "", "secrets", "x", "s1"), true},
		{"other resource name", rule(l("get"), l(""), l("secrets"), "s1"), res("get", "", "secrets", "x", "s2"), false},
		{"resource name never lists", rule(l("list"), l(""), l("secrets"), "s1"), res("list", "", "secrets", "x", ""), false},
		{"resource name never creates", rule(l("create"), l(""), l("secrets"), "s1"), res("create", "", "secrets", "x", ""), false},
		{"resource name with subresource", rule(l("get"), l(""), l("pods/log"), "p"), res("get", "", "pods/log", "x", "p"), true},
		{"verb escalate", rule(l("escalate"), l("rbac.authorization.k8s.io"), l("roles")), res("escalate", "rbac.authorization.k8s.io", "roles", "x", ""), true},
		{"verb impersonate", rule(l("impersonate"), l(""), l("users"), "alice"), res("impersonate", "", "users", "", "alice"), true},
		{"resource rule is not a path", rule(all, all, all), path("get", "/healthz"), false},
		{"path exact", urlRule(l("get"), "/healthz"), path("get", "/healthz"), true},
		{"path exact only", urlRule(l("get"), "/healthz"), path("get", "/healthz/etcd"), false},
		{"path prefix", urlRule(l("get"), "/healthz/*"), path("get", "/healthz/etcd"), true},
		{"path prefix excludes the bare path", urlRule(l("get"), "/healthz/*"), path("get", "/healthz"), false},
		{"path prefix without slash", urlRule(l("get"), "/api*"), path("get", "/apis/apps"), true},
		{"path star", urlRule(l("get"), "*"), path("get", "/anything"), true},
		{"path verb", urlRule(l("get"), "*"), path("post", "/anything"), false},
		{"path rule is not a resource", urlRule(all, "*"), res("get", "", "pods", "x", ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ruleAllows(&tc.at, &tc.rule); got != tc.want {
				t.Fatalf("ruleAllows(%+v, %+v) = %v, want %v", tc.at, tc.rule, got, tc.want)
			}
		})
	}
}

func TestAuthorize(t *testing.T) {
	a := fixture(
		role("shop", "pod-reader", rule(l("get", "list", "watch"), l(""), l("pods", "pods/log"))),
		role("other", "pod-reader", rule(l("*"), l(""), l("pods"))),
		clusterRole("view", rule(l("get", "list", "watch"), l("", "apps"), l("pods", "deployments", "configmaps"))),
		clusterRole("node-reader", rule(l("get", "list"), l(""), l("nodes"))),
		clusterRole("scaler", rule(l("update", "patch"), l("apps"), l("*/scale"))),
		clusterRole("health", urlRule(l("get"), "/healthz", "/logs/*")),
		clusterRole("impersonator", rule(l("impersonate"), l(""), l("users", "groups"))),
		roleBinding("shop", "bob-reads-pods", ref("Role", "pod-reader"), userSubject("bob")),
		roleBinding("shop", "devs-view", ref("ClusterRole", "view"), groupSubject("devs")),
		roleBinding("shop", "sa-scales", ref("ClusterRole", "scaler"), saSubject("", "builder")),
		roleBinding("shop", "foreign-sa", ref("ClusterRole", "node-reader"), saSubject("ci", "runner")),
		roleBinding("shop", "health-in-ns", ref("ClusterRole", "health"), userSubject("bob")),
		clusterRoleBinding("ops-nodes", ref("ClusterRole", "node-reader"), groupSubject("ops")),
		clusterRoleBinding("everyone-health", ref("ClusterRole", "health"), groupSubject("system:authenticated")),
		clusterRoleBinding("sa-without-namespace", ref("ClusterRole", "view"), saSubject("", "builder")),
		clusterRoleBinding("carol-impersonates", ref("ClusterRole", "impersonator"), userSubject("carol")),
	)
	bob, dev, op := user("bob"), user("dave", "devs"), user("olga", "ops")
	builder := user("system:serviceaccount:shop:builder", "system:serviceaccounts", "system:serviceaccounts:shop")
	runner := user("system:serviceaccount:ci:runner", "system:serviceaccounts")
	admin := user("root", pki.AdminGroup)
	for _, tc := range []struct {
		name  string
		u     string
		at    apiserver.Attributes
		allow bool
	}{
		{"role in its namespace", "bob", res("list", "", "pods", "shop", ""), true},
		{"role subresource", "bob", res("get", "", "pods/log", "shop", "p"), true},
		{"role not in another namespace", "bob", res("list", "", "pods", "other", ""), false},
		{"role binding does not bind a same-named role elsewhere", "bob", res("delete", "", "pods", "shop", "p"), false},
		{"role not cluster-wide", "bob", res("list", "", "pods", "", ""), false},
		{"role other resource", "bob", res("list", "", "secrets", "shop", ""), false},
		{"clusterrole via rolebinding in its namespace", "dave", res("get", "apps", "deployments", "shop", "d"), true},
		{"clusterrole via rolebinding not elsewhere", "dave", res("get", "apps", "deployments", "other", "d"), false},
		{"clusterrole via rolebinding not cluster-wide", "dave", res("list", "apps", "deployments", "", ""), false},
		{"clusterrolebinding everywhere", "olga", res("get", "", "nodes", "", "n1"), true},
		{"clusterrolebinding verbs", "olga", res("delete", "", "nodes", "", "n1"), false},
		{"clusterrolebinding for namespaced resources in any namespace", "olga", res("list", "", "nodes", "shop", ""), true},
		{"service account subject defaults to binding namespace", "builder", res("update", "apps", "deployments/scale", "shop", "d"), true},
		{"service account scale only in binding namespace", "builder", res("update", "apps", "deployments/scale", "other", "d"), false},
		{"service account without namespace in clusterrolebinding binds nobody", "builder", res("get", "", "pods", "other", "p"), false},
		{"service account of another namespace", "runner", res("get", "", "nodes", "shop", "n"), true},
		{"service account of another namespace only there", "runner", res("get", "", "nodes", "", "n"), false},
		{"non-resource via group", "bob", path("get", "/healthz"), true},
		{"non-resource prefix", "olga", path("get", "/logs/kube.log"), true},
		{"non-resource verb", "olga", path("post", "/healthz"), false},
		{"non-resource other path", "olga", path("get", "/metrics"), false},
		{"impersonate", "carol", res("impersonate", "", "users", "", "anyone"), true},
		{"impersonate not granted", "bob", res("impersonate", "", "users", "", "anyone"), false},
		{"system:masters", "root", res("delete", "", "secrets", "kube-system", "x"), true},
		{"system:masters paths", "root", path("delete", "/anything"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			who := map[string]*auth.User{"bob": bob, "dave": dev, "olga": op, "builder": builder, "runner": runner, "root": admin, "carol": user("carol")}[tc.u]
			err := a.Authorize(who, tc.at)
			if tc.allow && err != nil {
				t.Fatalf("want allowed, got %v", err)
			}
			if !tc.allow {
				if err == nil {
					t.Fatal("want forbidden, got allowed")
				}
				if !apierrors.IsForbidden(err) {
					t.Fatalf("want Forbidden, got %v", err)
				}
			}
		})
	}
}

func TestDenialMessages(t *testing.T) {
	a := fixture(
		roleBinding("y", "dangling", ref("Role", "gone"), userSubject("carl")),
		clusterRoleBinding("dangling-cluster", ref("ClusterRole", "gone-too"), groupSubject("g")),
	)
	for _, tc := range []struct {
		name string
		u    *auth.User
		at   apiserver.Attributes
		want string
	}{
		{"namespaced list", user("bob", "g2"), res("list", "", "secrets", "y", ""),
			`secrets is forbidden: User "bob" cannot list resource "secrets" in API group "" in the namespace "y"`},
		{"named get", user("bob"), res("get", "apps", "deployments", "y", "web"),
			`deployments.apps "web" is forbidden: User "bob" cannot get resource "deployments" in API group "apps" in the namespace "y"`},
		{"subresource", user("bob"), res("get", "", "pods/log", "y", "p"),
			`pods "p" is forbidden: User "bob" cannot get resource "pods/log" in API group "" in the namespace "y"`},
		{"cluster scope", user("bob"), res("list", "", "nodes", "", ""),
			`nodes is forbidden: User "bob" cannot list resource "nodes" in API group "" at the cluster scope`},
		{"non-resource", user("bob"), path("get", "/foo"),
			`forbidden: User "bob" cannot get path "/foo"`},
		{"escaped", user("<b>&"), path("get", "/foo"),
			`forbidden: User "&lt;b&gt;&amp;" cannot get path "/foo"`},
		{"missing role", user("carl"), res("list", "", "pods", "y", ""),
			`pods is forbidden: User "carl" cannot list resource "pods" in API group "" in the namespace "y": RBAC: role.rbac.authorization.k8s.io "gone" not found`},
		{"missing roles", user("carl", "g"), res("list", "", "pods", "y", ""),
			`pods is forbidden: User "carl" cannot list resource "pods" in API group "" in the namespace "y": RBAC: [clusterrole.rbac.authorization.k8s.io "gone-too" not found, role.rbac.authorization.k8s.io "gone" not found]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := a.Authorize(tc.u, tc.at)
			var as apierrors.APIStatus
			if !errors.As(err, &as) || !apierrors.IsForbidden(err) {
				t.Fatalf("want a Forbidden APIStatus, got %T %v", err, err)
			}
			st := as.Status()
			if st.Code != http.StatusForbidden || st.Reason != "Forbidden" {
				t.Fatalf("status %d %s", st.Code, st.Reason)
			}
			if got := st.Message; got != tc.want || err.Error() != tc.want {
				t.Fatalf("message\n got %s\n     %s\nwant %s", got, err.Error(), tc.want)
			}
			if n := testing.AllocsPerRun(100, func() { _ = a.Authorize(tc.u, tc.at) }); n > 1 && !strings.HasPrefix(tc.name, "missing") {
				t.Errorf("a denial costs %v allocations, want 1", n)
			}
		})
	}
}

// TestIndexBySubject shows that a decision looks only at the bindings
// that name the user or one of its groups.
func TestIndexBySubject(t *testing.T) {
	a := fixture(clusterRole("view", rule(l("get"), l(""), l("pods"))))
	for i := range 2000 {
		a.idx.set(roleBinding(fmt.Sprintf("ns%d", i%20), fmt.Sprintf("b%d", i), ref("ClusterRole", "view"), userSubject(fmt.Sprintf("u%d", i))))
	}
	a.idx.set(roleBinding("ns3", "mine", ref("ClusterRole", "view"), userSubject("me"), groupSubject("team"), userSubject("me")))
	a.idx.set(roleBinding("ns4", "team", ref("ClusterRole", "view"), groupSubject("team")))
	a.idx.set(clusterRoleBinding("team-everywhere", ref("ClusterRole", "view"), groupSubject("team")))
	count := func(ns string) (n int) {
		a.idx.visit("me", []string{"team", "system:authenticated"}, ns, func(*binding) bool { n++; return true })
		return n
	}
	// ns3: the cluster binding, and "mine" through the user and the group.
	if n := count("ns3"); n != 3 {
		t.Fatalf("visited %d bindings in ns3, want 3", n)
	}
	if n := count("ns4"); n != 2 {
		t.Fatalf("visited %d bindings in ns4, want 2", n)
	}
	if n := count(""); n != 1 {
		t.Fatalf("visited %d bindings at cluster scope, want 1", n)
	}
	// Removing bindings empties the index.
	for i := range 2000 {
		a.idx.remove(roleBinding(fmt.Sprintf("ns%d", i%20), fmt.Sprintf("b%d", i), rbacv1.RoleRef{}))
	}
	a.idx.remove(roleBinding("ns3", "mine", rbacv1.RoleRef{}))
	a.idx.remove(roleBinding("ns4", "team", rbacv1.RoleRef{}))
	a.idx.remove(clusterRoleBinding("team-everywhere", rbacv1.RoleRef{}))
	if len(a.idx.users) != 0 || len(a.idx.groups) != 0 || len(a.idx.bindings) != 0 {
		t.Fatalf("index not empty: %d users, %d groups, %d bindings", len(a.idx.users), len(a.idx.groups), len(a.idx.bindings))
	}
	if s := a.idx.cluster["view"]; s == nil || s.refs != 0 || !s.exists {
		t.Fatalf("view slot %+v", s)
	}
}

// TestRoleSlots shows that role changes reach the bindings that reference
// the role, and that a binding to a missing role grants nothing until the
// role exists.
func TestRoleSlots(t *testing.T) {
	a := fixture(roleBinding("shop", "b", ref("Role", "later"), userSubject("bob")))
	bob := user("bob")
	list := res("list", "", "pods", "shop", "")
	if err := a.Authorize(bob, list); err == nil {
		t.Fatal("binding to a missing role granted")
	}
	a.idx.set(role("shop", "later", rule(l("list"), l(""), l("pods"))))
	if err := a.Authorize(bob, list); err != nil {
		t.Fatalf("role created: %v", err)
	}
	a.idx.set(role("shop", "later", rule(l("get"), l(""), l("pods"))))
	if err := a.Authorize(bob, list); err == nil {
		t.Fatal("rule removed from the role still grants")
	}
	a.idx.set(role("shop", "later", rule(l("get", "list"), l(""), l("pods"))))
	a.idx.remove(role("shop", "later"))
	if err := a.Authorize(bob, list); err == nil {
		t.Fatal("deleted role still grants")
	}
	a.idx.remove(roleBinding("shop", "b", rbacv1.RoleRef{}))
	if len(a.idx.roles) != 0 {
		t.Fatalf("slots kept: %v", a.idx.roles)
	}
}

// TestForbiddenAsUpstream compares the 403 with the one upstream's
// wording gives through apierrors.NewForbidden and fmt.
func TestForbiddenAsUpstream(t *testing.T) {
	upstream := func(u *auth.User, at apiserver.Attributes, reason string) error {
		var msg string
		gr := schema.GroupResource{}
		switch {
		case !at.Resource:
			msg = fmt.Sprintf("User %q cannot %s path %q", u.Name, at.Verb, at.Path)
		case at.Namespace != "":
			gr = schema.GroupResource{Group: at.Group, Resource: at.Kind}
			msg = fmt.Sprintf("User %q cannot %s resource %q in API group %q in the namespace %q", u.Name, at.Verb, strings.TrimSuffix(at.Kind+"/"+at.Subresource, "/"), at.Group, at.Namespace)
		default:
			gr = schema.GroupResource{Group: at.Group, Resource: at.Kind}
			msg = fmt.Sprintf("User %q cannot %s resource %q in API group %q at the cluster scope", u.Name, at.Verb, strings.TrimSuffix(at.Kind+"/"+at.Subresource, "/"), at.Group)
		}
		msg = sanitizer.Replace(msg)
		if reason != "" {
			msg += ": " + reason
		}
		return apierrors.NewForbidden(gr, at.Name, errors.New(msg))
	}
	for _, u := range []*auth.User{user("bob"), user("ä \"x\"\n<&>"), user("")} {
		for _, at := range []apiserver.Attributes{
			res("list", "", "secrets", "y", ""),
			res("get", "apps", "deployments/scale", "y", "we\"b"),
			res("get", "", "nodes", "", "n<1>"),
			res("list", "example.com", "widgets", "", ""),
			path("get", "/foo"),
			path("get", "/a<b>&\"c\""),
		} {
			for _, reason := range []string{"", "RBAC: x"} {
				err, want := forbidden(u, at, reason), upstream(u, at, reason)
				// What the API server answers: the APIStatus as a
				// StatusError, and the error's text.
				got := &apierrors.StatusError{ErrStatus: err.(apierrors.APIStatus).Status()}
				if !reflect.DeepEqual(got, want) || err.Error() != want.Error() {
					t.Errorf("forbidden(%q, %+v)\n got %#v\n     %q\nwant %#v", u.Name, at, got, err.Error(), want)
				}
				if !apierrors.IsForbidden(err) || apierrors.ReasonForError(err) != metav1.StatusReasonForbidden {
					t.Errorf("forbidden(%q, %+v) is not a Forbidden API error", u.Name, at)
				}
			}
		}
	}
}

// TestConcurrentDecisions decides from several goroutines while the
// bindings and roles change, for the race detector.
func TestConcurrentDecisions(t *testing.T) {
	a := fixture(role("shop", "r", rule(l("get"), l(""), l("pods"))))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := user(fmt.Sprintf("u%d", g%2), "team")
			for {
				select {
				case <-done:
					return
				default:
				}
				_ = a.Authorize(u, res("get", "", "pods", "shop", "p"))
				_ = a.Authorize(u, res("get", "", "pods", "", "p"))
				_ = a.RulesFor(u, "shop")
			}
		}()
	}
	for i := range 300 {
		a.mu.Lock()
		a.idx.set(roleBinding("shop", fmt.Sprintf("b%d", i%7), ref("Role", "r"), userSubject(fmt.Sprintf("u%d", i%2)), groupSubject("team")))
		a.idx.set(role("shop", "r", rule(l("get", "list"), l(""), l("pods"))))
		if i%3 == 0 {
			a.idx.remove(roleBinding("shop", fmt.Sprintf("b%d", (i+3)%7), rbacv1.RoleRef{}))
		}
		a.mu.Unlock()
	}
	close(done)
	wg.Wait()
	a.mu.Lock()
	for i := range 7 {
		a.idx.set(roleBinding("shop", fmt.Sprintf("b%d", i), ref("Role", "r"), userSubject("u0")))
	}
	a.mu.Unlock()
	if err := a.Authorize(user("u0"), res("list", "", "pods", "shop", "")); err != nil {
		t.Fatalf("after the changes: %v", err)
	}
	if err := a.Authorize(user("u1", "team"), res("list", "", "pods", "shop", "")); err == nil {
		t.Fatal("u1 still allowed after its bindings changed")
	}
}
