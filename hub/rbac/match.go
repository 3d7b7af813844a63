package rbac

import (
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/tether-edge/tether/hub/apiserver"
)

// ruleAllows reports whether rule allows the request, as upstream's
// RuleAllows: a resource request needs the verb, the API group, the
// resource (with its subresource) and, when the rule names resources,
// the request's name; a non-resource request needs the verb and the path.
func ruleAllows(at *apiserver.Attributes, rule *rbacv1.PolicyRule) bool {
	if !verbMatches(rule, at.Verb) {
		return false
	}
	if !at.Resource {
		return urlMatches(rule, at.Path)
	}
	return groupMatches(rule, at.Group) &&
		resourceMatches(rule, at.Kind, at.Subresource) &&
		nameMatches(rule, at.Name)
}

func verbMatches(rule *rbacv1.PolicyRule, verb string) bool {
	for _, v := range rule.Verbs {
		if v == rbacv1.VerbAll || v == verb {
			return true
		}
	}
	return false
}

func groupMatches(rule *rbacv1.PolicyRule, group string) bool {
	for _, g := range rule.APIGroups {
		if g == rbacv1.APIGroupAll || g == group {
			return true
		}
	}
	return false
}

// resourceMatches matches "*", the resource itself or "resource/sub", and
// "*/sub" for any resource's subresource sub. It builds no strings.
func resourceMatches(rule *rbacv1.PolicyRule, resource, sub string) bool {
	for _, r := range rule.Resources {
		if r == rbacv1.ResourceAll {
			return true
		}
		if sub == "" {
			if r == resource {
				return true
			}
			continue
		}
		if len(r) == len(resource)+1+len(sub) && strings.HasPrefix(r, resource) && r[len(resource)] == '/' && strings.HasSuffix(r, sub) {
			return true
		}
		if len(r) == len(sub)+2 && strings.HasPrefix(r, "*/") && strings.HasSuffix(r, sub) {
			return true
		}
	}
	return false
}

// nameMatches: a rule without resource names matches every name; one with
// names matches only requests for one of them, so never a create, list,
// watch or deletecollection that carries no name.
func nameMatches(rule *rbacv1.PolicyRule, name string) bool {
	if len(rule.ResourceNames) == 0 {
		return true
	}
	for _, n := range rule.ResourceNames {
		if n == name {
			return true
		}
	}
	return false
}

// urlMatches matches "*", the path itself, or a prefix ending in "*".
func urlMatches(rule *rbacv1.PolicyRule, path string) bool {
	for _, u := range rule.NonResourceURLs {
		if u == rbacv1.NonResourceAll || u == path {
			return true
		}
		if strings.HasSuffix(u, "*") && strings.HasPrefix(path, strings.TrimRight(u, "*")) {
			return true
		}
	}
	return false
}
