package registry

import (
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// ReviewKinds returns the create-only kinds of authentication.k8s.io/v1
// (SelfSubjectReview, TokenReview) and authorization.k8s.io/v1 (the access
// and rules reviews). The API server answers their creates from the
// requesting user, the authenticator and the authorizer, and stores
// nothing, so they are not among a Registry's Kinds (which storage holds):
// the API server serves them and discovery lists them alongside.
func ReviewKinds() []*Kind {
	create := []string{"create"}
	review := func(k, resource, singular string, namespaced bool, authz bool) *Kind {
		gvk := authenticationv1.SchemeGroupVersion.WithKind(k)
		if authz {
			gvk = authorizationv1.SchemeGroupVersion.WithKind(k)
		}
		return &Kind{GVK: gvk, Resource: resource, Singular: singular, Namespaced: namespaced, Verbs: create, NotStored: true}
	}
	return []*Kind{
		review("SelfSubjectReview", "selfsubjectreviews", "selfsubjectreview", false, false),
		review("TokenReview", "tokenreviews", "tokenreview", false, false),
		review("LocalSubjectAccessReview", "localsubjectaccessreviews", "localsubjectaccessreview", true, true),
		review("SelfSubjectAccessReview", "selfsubjectaccessreviews", "selfsubjectaccessreview", false, true),
		review("SelfSubjectRulesReview", "selfsubjectrulesreviews", "selfsubjectrulesreview", false, true),
		review("SubjectAccessReview", "subjectaccessreviews", "subjectaccessreview", false, true),
	}
}
