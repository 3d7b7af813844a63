// Package rbac is tether's RBAC authorizer: it decides requests from
// Roles, ClusterRoles, RoleBindings and ClusterRoleBindings exactly as
// kube-apiserver's RBAC authorizer does, lists a user's rules for
// SelfSubjectRulesReview, and refuses writes of roles and bindings that
// would grant more than their author holds (escalation prevention).
//
// The authorizer is written here rather than imported: upstream's lives in
// k8s.io/kubernetes (plugin/pkg/auth/authorizer/rbac and
// pkg/registry/rbac), which is not meant to be used as a module. What is
// hand-written follows upstream's behaviour and messages: rule matching
// (verbs, API groups, resources with subresources and "*/sub", resource
// names, non-resource URLs with a trailing "*"), which bindings apply to
// a user, the 403 wording, and the checks on role and binding writes. The
// comparison of rule sets that escalation prevention needs ("does what the
// user holds cover what the role grants") is upstream's own, from
// k8s.io/component-helpers/auth/rbac/validation.
//
// Unlike upstream, which walks every binding on each decision, the view
// is indexed by subject: a decision looks only at the bindings that name
// the user, one of the user's groups, or the service account the user is,
// in the request's namespace and at the cluster scope. Bindings point at
// a shared slot per role, so that a change to a role, or a role created
// after its bindings, takes effect for every binding at once. The roles
// bound to a user (with its groups) in a namespace are merged once per
// change of the bindings, so that a decision costs one lookup.
package rbac
