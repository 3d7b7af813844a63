package apiserver

import (
	"errors"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/auth"
)

// RuleLister is implemented by Authorizers that can list what a user may do
// in a namespace, for SelfSubjectRulesReview (`kubectl auth can-i --list`).
// An Authorizer that does not implement it answers such reviews with
// status.incomplete set and no rules.
type RuleLister interface {
	RulesFor(u *auth.User, namespace string) authorizationv1.SubjectRulesReviewStatus
}

// AllowAuthenticated is the Authorizer of a hub without an authorization
// policy: authenticated users may do everything; requests without
// credentials may only read the public information upstream's
// system:public-info-viewer role grants (/healthz, /livez, /readyz,
// /version and their sub-paths).
type AllowAuthenticated struct{}

// Authorize implements Authorizer.
func (AllowAuthenticated) Authorize(u *auth.User, a Attributes) error {
	if !u.InGroup(auth.GroupUnauthenticated) {
		return nil
	}
	if !a.Resource && (a.Verb == "get" || a.Verb == "head") && PublicInfoPath(a.Path) {
		return nil
	}
	return Forbidden(u, a, "")
}

// RulesFor implements RuleLister.
func (AllowAuthenticated) RulesFor(u *auth.User, _ string) authorizationv1.SubjectRulesReviewStatus {
	if u.InGroup(auth.GroupUnauthenticated) {
		return authorizationv1.SubjectRulesReviewStatus{
			ResourceRules: []authorizationv1.ResourceRule{},
			NonResourceRules: []authorizationv1.NonResourceRule{{Verbs: []string{"get"},
				NonResourceURLs: []string{"/healthz", "/livez", "/readyz", "/version", "/healthz/*", "/livez/*", "/readyz/*"}}},
		}
	}
	return authorizationv1.SubjectRulesReviewStatus{
		ResourceRules:    []authorizationv1.ResourceRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}},
		NonResourceRules: []authorizationv1.NonResourceRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
	}
}

// PublicInfoPath reports whether path is one of those upstream's
// system:public-info-viewer role lets everyone read.
func PublicInfoPath(path string) bool {
	switch {
	case path == "/version", path == "/healthz", path == "/livez", path == "/readyz":
		return true
	case strings.HasPrefix(path, "/healthz/"), strings.HasPrefix(path, "/livez/"), strings.HasPrefix(path, "/readyz/"):
		return true
	}
	return false
}

// ForbiddenMessage is upstream's description of a denied request: `User
// "u" cannot <verb> resource "<resource>[/<subresource>]" in API group
// "<group>" in the namespace "<ns>"` (or "at the cluster scope"), or `User
// "u" cannot <verb> path "<path>"` for requests outside the resource tree.
func ForbiddenMessage(u *auth.User, a Attributes) string {
	name := ""
	if u != nil {
		name = u.Name
	}
	if !a.Resource {
		return fmt.Sprintf("User %q cannot %s path %q", name, a.Verb, a.Path)
	}
	res := a.Kind
	if a.Subresource != "" {
		res += "/" + a.Subresource
	}
	if a.Namespace != "" {
		return fmt.Sprintf("User %q cannot %s resource %q in API group %q in the namespace %q", name, a.Verb, res, a.Group, a.Namespace)
	}
	return fmt.Sprintf("User %q cannot %s resource %q in API group %q at the cluster scope", name, a.Verb, res, a.Group)
}

// Forbidden is the 403 upstream answers a denied request with; reason, when
// not empty, follows the message after a colon.
func Forbidden(u *auth.User, a Attributes, reason string) *apierrors.StatusError {
	msg := ForbiddenMessage(u, a)
	if reason != "" {
		msg += ": " + reason
	}
	gr := schema.GroupResource{}
	if a.Resource {
		gr = schema.GroupResource{Group: a.Group, Resource: a.Kind}
	}
	return apierrors.NewForbidden(gr, a.Name, errors.New(msg))
}

// decide asks the Authorizer about a, as the access reviews do, and
// returns the review's status: allowed when it allows; when it denies
// with a 403, the reason it gave beyond upstream's standard message (RBAC
// gives none); any other error becomes the evaluation error.
func (s *Server) decide(u *auth.User, a Attributes) authorizationv1.SubjectAccessReviewStatus {
	err := s.authz.Authorize(u, a)
	if err == nil {
		return authorizationv1.SubjectAccessReviewStatus{Allowed: true}
	}
	st := toStatus(err).ErrStatus
	if st.Reason != metav1.StatusReasonForbidden {
		return authorizationv1.SubjectAccessReviewStatus{EvaluationError: err.Error()}
	}
	reason := ""
	std := ForbiddenMessage(u, a)
	if i := strings.Index(st.Message, std); i >= 0 {
		reason = strings.TrimPrefix(st.Message[i+len(std):], ": ")
	} else if _, why, ok := strings.Cut(st.Message, "forbidden: "); ok {
		reason = why
	}
	return authorizationv1.SubjectAccessReviewStatus{Reason: reason}
}

// rulesFor lists what u may do in namespace, from the Authorizer when it
// is a RuleLister.
func (s *Server) rulesFor(u *auth.User, namespace string) authorizationv1.SubjectRulesReviewStatus {
	rl, ok := s.authz.(RuleLister)
	if !ok {
		return authorizationv1.SubjectRulesReviewStatus{ResourceRules: []authorizationv1.ResourceRule{},
			NonResourceRules: []authorizationv1.NonResourceRule{}, Incomplete: true}
	}
	st := rl.RulesFor(u, namespace)
	if st.ResourceRules == nil {
		st.ResourceRules = []authorizationv1.ResourceRule{}
	}
	if st.NonResourceRules == nil {
		st.NonResourceRules = []authorizationv1.NonResourceRule{}
	}
	return st
}
