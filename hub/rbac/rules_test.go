package rbac

import (
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/tether-edge/tether/hub/pki"
)

func TestRulesFor(t *testing.T) {
	a := fixture(
		clusterRole("cluster-admin", rule(l("*"), l("*"), l("*")), urlRule(l("*"), "*")),
		clusterRole("basic", urlRule(l("get"), "/healthz", "/version")),
		clusterRole("view", rule(l("get", "list"), l(""), l("pods"))),
		role("shop", "one-secret", rule(l("get"), l(""), l("secrets"), "s1")),
		clusterRoleBinding("authenticated", ref("ClusterRole", "basic"), groupSubject("system:authenticated")),
		clusterRoleBinding("masters", ref("ClusterRole", "cluster-admin"), groupSubject(pki.AdminGroup)),
		roleBinding("shop", "view", ref("ClusterRole", "view"), userSubject("bob"), groupSubject("devs")),
		roleBinding("shop", "secret", ref("Role", "one-secret"), userSubject("bob")),
		roleBinding("shop", "dangling", ref("Role", "gone"), userSubject("carl")),
	)
	basic := []authorizationv1.NonResourceRule{{Verbs: l("get"), NonResourceURLs: l("/healthz", "/version")}}
	full := authorizationv1.SubjectRulesReviewStatus{
		ResourceRules:    []authorizationv1.ResourceRule{{Verbs: l("*"), APIGroups: l("*"), Resources: l("*")}},
		NonResourceRules: []authorizationv1.NonResourceRule{{Verbs: l("*"), NonResourceURLs: l("*")}, basic[0]},
	}
	for _, tc := range []struct {
		name string
		u    string
		ns   string
		want authorizationv1.SubjectRulesReviewStatus
	}{
		{"namespace bindings", "bob", "shop", authorizationv1.SubjectRulesReviewStatus{
			ResourceRules: []authorizationv1.ResourceRule{
				{Verbs: l("get", "list"), APIGroups: l(""), Resources: l("pods")},
				{Verbs: l("get"), APIGroups: l(""), Resources: l("secrets"), ResourceNames: l("s1")},
			},
			NonResourceRules: basic,
		}},
		{"bound through user and group once", "bob+devs", "shop", authorizationv1.SubjectRulesReviewStatus{
			ResourceRules: []authorizationv1.ResourceRule{
				{Verbs: l("get", "list"), APIGroups: l(""), Resources: l("pods")},
				{Verbs: l("get"), APIGroups: l(""), Resources: l("secrets"), ResourceNames: l("s1")},
			},
			NonResourceRules: basic,
		}},
		{"other namespace", "bob", "other", authorizationv1.SubjectRulesReviewStatus{NonResourceRules: basic}},
		{"missing role", "carl", "shop", authorizationv1.SubjectRulesReviewStatus{NonResourceRules: basic,
			EvaluationError: `role.rbac.authorization.k8s.io "gone" not found`}},
		{"system:masters", "root", "shop", full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := map[string]struct {
				name   string
				groups []string
			}{
				"bob": {"bob", nil}, "bob+devs": {"bob", l("devs")}, "carl": {"carl", nil}, "root": {"root", l(pki.AdminGroup)},
			}[tc.u]
			got := a.RulesFor(user(u.name, u.groups...), tc.ns)
			if !apiequality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("RulesFor\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
