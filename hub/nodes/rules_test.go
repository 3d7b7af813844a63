package nodes

import (
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
)

// ruleLister stands for the authorizer after the node authorizer.
type ruleLister struct{ err string }

func (ruleLister) Authorize(*auth.User, apiserver.Attributes) error { return nil }

func (r ruleLister) RulesFor(u *auth.User, namespace string) authorizationv1.SubjectRulesReviewStatus {
	return authorizationv1.SubjectRulesReviewStatus{
		ResourceRules:   []authorizationv1.ResourceRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{namespace + "-" + u.Name}}},
		EvaluationError: r.err,
	}
}

// silent is a Next authorizer that cannot list rules.
type silent struct{}

func (silent) Authorize(*auth.User, apiserver.Attributes) error { return nil }

func TestRulesFor(t *testing.T) {
	a := NewAuthorizer(Config{Logger: quiet})
	// Without Next, users that are not nodes may do everything
	// (apiserver.AllowAuthenticated), and the list says so.
	if st := a.RulesFor(&auth.User{Name: "bob", Groups: []string{auth.GroupAuthenticated}}, "shop"); len(st.ResourceRules) != 1 || st.ResourceRules[0].Verbs[0] != "*" || st.Incomplete {
		t.Fatalf("without Next: %+v", st)
	}
	a.Next = ruleLister{}
	st := a.RulesFor(&auth.User{Name: "bob"}, "shop")
	if len(st.ResourceRules) != 1 || st.ResourceRules[0].Resources[0] != "shop-bob" || st.Incomplete || st.EvaluationError != "" {
		t.Fatalf("forwarded: %+v", st)
	}
	st = a.RulesFor(nodeUser("n1"), "shop")
	if len(st.ResourceRules) != 1 || !st.Incomplete || st.EvaluationError != "node authorizer does not support user rule resolution" {
		t.Fatalf("node: %+v", st)
	}
	a.Next = silent{}
	if st := a.RulesFor(&auth.User{Name: "bob"}, "shop"); len(st.ResourceRules) != 0 || !st.Incomplete {
		t.Fatalf("Next that lists no rules: %+v", st)
	}
	var _ apiserver.RuleLister = a
	a.Next = ruleLister{err: `role.rbac.authorization.k8s.io "x" not found`}
	st = a.RulesFor(nodeUser("n1"), "shop")
	if want := `[node authorizer does not support user rule resolution, role.rbac.authorization.k8s.io "x" not found]`; st.EvaluationError != want {
		t.Fatalf("node with RBAC errors: %q, want %q", st.EvaluationError, want)
	}
}
