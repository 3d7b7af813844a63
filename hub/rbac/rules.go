package rbac

import (
	"slices"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
)

// fullAuthority is what system:masters may do, and what cluster-admin
// grants: everything.
var fullAuthority = []rbacv1.PolicyRule{
	{Verbs: []string{rbacv1.VerbAll}, APIGroups: []string{rbacv1.APIGroupAll}, Resources: []string{rbacv1.ResourceAll}},
	{Verbs: []string{rbacv1.VerbAll}, NonResourceURLs: []string{rbacv1.NonResourceAll}},
}

// rulesFor returns the rules of every binding that applies to u in
// namespace (cluster bindings first), each binding once, and the roles
// that applicable bindings reference but that do not exist.
func (a *Authorizer) rulesFor(u *auth.User, namespace string) ([]rbacv1.PolicyRule, []*roleSlot) {
	var rules []rbacv1.PolicyRule
	var missing []*roleSlot
	seen := map[*binding]bool{}
	a.mu.RLock()
	defer a.mu.RUnlock()
	a.idx.visit(u.Name, u.Groups, namespace, func(b *binding) bool {
		if seen[b] {
			return true
		}
		seen[b] = true
		if !b.role.exists {
			missing = append(missing, b.role)
			return true
		}
		rules = append(rules, b.role.rules...)
		return true
	})
	return rules, missing
}

// RulesFor lists what u may do in namespace, for SelfSubjectRulesReview
// (copies, which the caller owns):
// the rules of the cluster's and the namespace's bindings that apply to
// u, as upstream's RBAC rule resolver, plus everything for members of
// system:masters. Roles that bindings reference but that do not exist
// are named in EvaluationError; the list is complete all the same.
func (a *Authorizer) RulesFor(u *auth.User, namespace string) authorizationv1.SubjectRulesReviewStatus {
	var st authorizationv1.SubjectRulesReviewStatus
	rules, missing := a.rulesFor(u, namespace)
	if u.InGroup(pki.AdminGroup) {
		rules = append(append([]rbacv1.PolicyRule{}, fullAuthority...), withoutFull(rules)...)
	}
	for i := range rules {
		r := &rules[i]
		if len(r.Resources) > 0 {
			st.ResourceRules = append(st.ResourceRules, authorizationv1.ResourceRule{
				Verbs: slices.Clone(r.Verbs), APIGroups: slices.Clone(r.APIGroups),
				Resources: slices.Clone(r.Resources), ResourceNames: slices.Clone(r.ResourceNames),
			})
		}
		if len(r.NonResourceURLs) > 0 {
			st.NonResourceRules = append(st.NonResourceRules, authorizationv1.NonResourceRule{
				Verbs: slices.Clone(r.Verbs), NonResourceURLs: slices.Clone(r.NonResourceURLs),
			})
		}
	}
	if len(missing) > 0 {
		st.EvaluationError = notFound(missing, false).Error()
	}
	return st
}

// withoutFull drops rules equal to one of fullAuthority's (cluster-admin's
// own, when system:masters is bound to it as usual), which RulesFor lists
// once already for system:masters.
func withoutFull(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	out := rules[:0:0]
	for _, r := range rules {
		if !isFull(r) {
			out = append(out, r)
		}
	}
	return out
}

func isFull(r rbacv1.PolicyRule) bool {
	one := func(l []string, v string) bool { return len(l) == 1 && l[0] == v }
	if !one(r.Verbs, rbacv1.VerbAll) || len(r.ResourceNames) > 0 {
		return false
	}
	if len(r.NonResourceURLs) == 0 {
		return one(r.APIGroups, rbacv1.APIGroupAll) && one(r.Resources, rbacv1.ResourceAll)
	}
	return len(r.APIGroups) == 0 && len(r.Resources) == 0 && one(r.NonResourceURLs, rbacv1.NonResourceAll)
}
