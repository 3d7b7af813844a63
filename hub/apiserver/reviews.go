package apiserver

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/auth"
)

// serveReview answers a create of one of the review kinds (see
// registry.ReviewKinds): it decodes the body, checks it as upstream does,
// fills in the status from the requesting user, the Authenticator or the
// Authorizer, and answers 201 with the review. Nothing is stored.
func (s *Server) serveReview(w http.ResponseWriter, r *http.Request, t target) {
	gvk := t.kind.GVK
	obj, warnings, _, ok := s.postBody(w, r, s.decodeAs(r, gvk))
	if !ok {
		return
	}
	m := objectMeta(obj)
	// The request's namespace wins, as upstream's create handler makes
	// it: set when the body has none, cleared for cluster-scoped kinds.
	switch {
	case !t.kind.Namespaced:
		m.Namespace = ""
	case m.Namespace == "":
		m.Namespace = t.namespace
	case m.Namespace != t.namespace:
		s.writeError(w, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request"))
		return
	}
	u, _ := auth.UserFrom(r.Context())
	if u == nil {
		s.writeError(w, apierrors.NewBadRequest("no user present on request"))
		return
	}
	var out runtime.Object
	var err error
	switch o := obj.(type) {
	case *authorizationv1.SelfSubjectAccessReview:
		out, err = s.selfSubjectAccessReview(u, o)
	case *authorizationv1.SubjectAccessReview:
		out, err = s.subjectAccessReview(o)
	case *authorizationv1.LocalSubjectAccessReview:
		out, err = s.localSubjectAccessReview(t.namespace, o)
	case *authorizationv1.SelfSubjectRulesReview:
		out, err = s.selfSubjectRulesReview(u, o)
	case *authenticationv1.SelfSubjectReview:
		out = selfSubjectReview(u)
	case *authenticationv1.TokenReview:
		out, err = s.tokenReview(r, o)
	default:
		err = apierrors.NewBadRequest(fmt.Sprintf("unexpected review type %T", obj))
	}
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.writeCreated(w, r, warnings, out, gvk.GroupVersion())
}

// objectMeta returns the ObjectMeta of a review.
func objectMeta(obj runtime.Object) *metav1.ObjectMeta {
	switch o := obj.(type) {
	case *authorizationv1.SelfSubjectAccessReview:
		return &o.ObjectMeta
	case *authorizationv1.SubjectAccessReview:
		return &o.ObjectMeta
	case *authorizationv1.LocalSubjectAccessReview:
		return &o.ObjectMeta
	case *authorizationv1.SelfSubjectRulesReview:
		return &o.ObjectMeta
	case *authenticationv1.SelfSubjectReview:
		return &o.ObjectMeta
	case *authenticationv1.TokenReview:
		return &o.ObjectMeta
	}
	return &metav1.ObjectMeta{}
}

// metaEmpty reports whether m is empty but for managedFields and, when
// keepNamespace, the namespace: reviews carry no metadata.
func metaEmpty(m metav1.ObjectMeta, keepNamespace bool) bool {
	m.ManagedFields = nil
	if keepNamespace {
		m.Namespace = ""
	}
	return apiequality.Semantic.DeepEqual(metav1.ObjectMeta{}, m)
}

// validateAttributes checks that a review asks about exactly one of a
// resource request and a non-resource request.
func validateAttributes(ra *authorizationv1.ResourceAttributes, nra *authorizationv1.NonResourceAttributes, spec *field.Path) field.ErrorList {
	var errs field.ErrorList
	if ra != nil && nra != nil {
		errs = append(errs, field.Invalid(spec.Child("nonResourceAttributes"), nra, "cannot be specified in combination with resourceAttributes"))
	}
	if ra == nil && nra == nil {
		errs = append(errs, field.Invalid(spec.Child("resourceAttributes"), nra, "exactly one of nonResourceAttributes or resourceAttributes must be specified"))
	}
	return errs
}

// validateSubjectSpec checks a SubjectAccessReviewSpec.
func validateSubjectSpec(spec authorizationv1.SubjectAccessReviewSpec) field.ErrorList {
	p := field.NewPath("spec")
	errs := validateAttributes(spec.ResourceAttributes, spec.NonResourceAttributes, p)
	if spec.User == "" && len(spec.Groups) == 0 {
		errs = append(errs, field.Invalid(p.Child("user"), spec.User, "at least one of user or group must be specified"))
	}
	return errs
}

// reviewAttributes turns a review's attributes into the Authorizer's; an
// empty version matches every version.
func reviewAttributes(ra *authorizationv1.ResourceAttributes, nra *authorizationv1.NonResourceAttributes) Attributes {
	if ra == nil {
		return Attributes{Verb: nra.Verb, Path: nra.Path}
	}
	a := Attributes{Verb: ra.Verb, Resource: true, Group: ra.Group, Version: ra.Version, Kind: ra.Resource,
		Subresource: ra.Subresource, Namespace: ra.Namespace, Name: ra.Name}
	if a.Version == "" {
		a.Version = "*"
	}
	if ls := ra.LabelSelector; ls != nil {
		a.LabelSelector = ls.RawSelector
		if len(ls.Requirements) > 0 {
			if sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: ls.Requirements}); err == nil {
				a.LabelSelector = sel.String()
			}
		}
	}
	if fs := ra.FieldSelector; fs != nil {
		a.FieldSelector = fs.RawSelector
		if len(fs.Requirements) > 0 {
			a.FieldSelector = fieldRequirements(fs.Requirements)
		}
	}
	return a
}

// fieldRequirements renders the requirements of a review's field selector
// as a selector string, as upstream reads them: In and NotIn with one
// value each; others are left out, which only widens the check.
func fieldRequirements(reqs []metav1.FieldSelectorRequirement) string {
	var parts []string
	for _, r := range reqs {
		if len(r.Values) != 1 {
			continue
		}
		switch r.Operator {
		case metav1.FieldSelectorOpIn:
			parts = append(parts, r.Key+"="+r.Values[0])
		case metav1.FieldSelectorOpNotIn:
			parts = append(parts, r.Key+"!="+r.Values[0])
		}
	}
	return strings.Join(parts, ",")
}

// subjectOf is the user a SubjectAccessReviewSpec asks about.
func subjectOf(spec authorizationv1.SubjectAccessReviewSpec) *auth.User {
	u := &auth.User{Name: spec.User, UID: spec.UID, Groups: slices.Clone(spec.Groups)}
	if spec.Extra != nil {
		u.Extra = map[string][]string{}
		for k, v := range spec.Extra {
			u.Extra[k] = slices.Clone([]string(v))
		}
	}
	return u
}

func (s *Server) selfSubjectAccessReview(u *auth.User, sar *authorizationv1.SelfSubjectAccessReview) (runtime.Object, error) {
	errs := validateAttributes(sar.Spec.ResourceAttributes, sar.Spec.NonResourceAttributes, field.NewPath("spec"))
	if !metaEmpty(sar.ObjectMeta, false) {
		errs = append(errs, field.Invalid(field.NewPath("metadata"), sar.ObjectMeta, "must be empty"))
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationv1.SchemeGroupVersion.WithKind("SelfSubjectAccessReview").GroupKind(), "", errs)
	}
	sar.Status = s.decide(u, reviewAttributes(sar.Spec.ResourceAttributes, sar.Spec.NonResourceAttributes))
	return sar, nil
}

func (s *Server) subjectAccessReview(sar *authorizationv1.SubjectAccessReview) (runtime.Object, error) {
	errs := validateSubjectSpec(sar.Spec)
	if !metaEmpty(sar.ObjectMeta, false) {
		errs = append(errs, field.Invalid(field.NewPath("metadata"), sar.ObjectMeta, "must be empty"))
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationv1.SchemeGroupVersion.WithKind("SubjectAccessReview").GroupKind(), "", errs)
	}
	sar.Status = s.decide(subjectOf(sar.Spec), reviewAttributes(sar.Spec.ResourceAttributes, sar.Spec.NonResourceAttributes))
	return sar, nil
}

func (s *Server) localSubjectAccessReview(namespace string, sar *authorizationv1.LocalSubjectAccessReview) (runtime.Object, error) {
	errs := validateSubjectSpec(sar.Spec)
	if !metaEmpty(sar.ObjectMeta, true) {
		errs = append(errs, field.Invalid(field.NewPath("metadata"), sar.ObjectMeta, "must be empty except for namespace"))
	}
	if ra := sar.Spec.ResourceAttributes; ra != nil && ra.Namespace != sar.Namespace {
		errs = append(errs, field.Invalid(field.NewPath("spec", "resourceAttributes", "namespace"), ra.Namespace, "must match metadata.namespace"))
	}
	if sar.Spec.NonResourceAttributes != nil {
		errs = append(errs, field.Invalid(field.NewPath("spec", "nonResourceAttributes"), sar.Spec.NonResourceAttributes, "disallowed on this kind of request"))
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationv1.SchemeGroupVersion.WithKind("LocalSubjectAccessReview").GroupKind(), "", errs)
	}
	if namespace == "" {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("namespace is required on this type: %v", namespace))
	}
	if namespace != sar.Namespace {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("spec.resourceAttributes.namespace must match namespace: %v", namespace))
	}
	sar.Status = s.decide(subjectOf(sar.Spec), reviewAttributes(sar.Spec.ResourceAttributes, sar.Spec.NonResourceAttributes))
	return sar, nil
}

func (s *Server) selfSubjectRulesReview(u *auth.User, srr *authorizationv1.SelfSubjectRulesReview) (runtime.Object, error) {
	if srr.Spec.Namespace == "" {
		return nil, apierrors.NewBadRequest("no namespace on request")
	}
	// Upstream answers with a new review that carries only the status.
	return &authorizationv1.SelfSubjectRulesReview{Status: s.rulesFor(u, srr.Spec.Namespace)}, nil
}

// userInfo is u as the authentication API reports it.
func userInfo(u *auth.User) authenticationv1.UserInfo {
	ui := authenticationv1.UserInfo{Username: u.Name, UID: u.UID, Groups: slices.Clone(u.Groups)}
	if len(u.Extra) > 0 {
		ui.Extra = make(map[string]authenticationv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			ui.Extra[k] = slices.Clone(v)
		}
	}
	return ui
}

// selfSubjectReview reports who the requesting user is (`kubectl auth
// whoami`): after impersonation, the impersonated identity.
func selfSubjectReview(u *auth.User) runtime.Object {
	return &authenticationv1.SelfSubjectReview{
		ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(time.Now())},
		Status:     authenticationv1.SelfSubjectReviewStatus{UserInfo: userInfo(u)},
	}
}
