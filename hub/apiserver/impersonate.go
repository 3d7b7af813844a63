package apiserver

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"

	"github.com/tether-edge/tether/hub/auth"
)

// Prefix and groups of service account user names.
const (
	saUserPrefix = "system:serviceaccount:"
	saGroup      = "system:serviceaccounts"
)

// splitServiceAccount returns the namespace and name of a service account
// user name (system:serviceaccount:<ns>:<name>, both valid names).
func splitServiceAccount(user string) (string, string, bool) {
	rest, ok := strings.CutPrefix(user, saUserPrefix)
	if !ok {
		return "", "", false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 2 {
		return "", "", false
	}
	if len(apivalidation.ValidateNamespaceName(parts[0], false)) > 0 || len(apivalidation.ValidateServiceAccountName(parts[1], false)) > 0 {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// impersonation is one thing a request asks to act as, in the form
// upstream's impersonation filter authorizes it.
type impersonation struct {
	ref  corev1.ObjectReference
	attr Attributes
}

// impersonations lists what r's Impersonate-* headers ask for, in the
// order upstream checks them: the user (or service account), each group,
// each extra value, the UID.
func impersonations(h http.Header) ([]impersonation, error) {
	var out []impersonation
	user := h.Get(authenticationv1.ImpersonateUserHeader)
	if user != "" {
		if ns, name, ok := splitServiceAccount(user); ok {
			out = append(out, impersonation{corev1.ObjectReference{Kind: "ServiceAccount", Namespace: ns, Name: name},
				Attributes{Verb: "impersonate", Resource: true, Kind: "serviceaccounts", Namespace: ns, Name: name}})
		} else {
			out = append(out, impersonation{corev1.ObjectReference{Kind: "User", Name: user},
				Attributes{Verb: "impersonate", Resource: true, Kind: "users", Name: user}})
		}
	}
	groups := h.Values(authenticationv1.ImpersonateGroupHeader)
	for _, g := range groups {
		out = append(out, impersonation{corev1.ObjectReference{Kind: "Group", Name: g},
			Attributes{Verb: "impersonate", Resource: true, Kind: "groups", Name: g}})
	}
	var extraHeaders []string
	for k := range h {
		if strings.HasPrefix(k, authenticationv1.ImpersonateUserExtraHeaderPrefix) {
			extraHeaders = append(extraHeaders, k)
		}
	}
	slices.Sort(extraHeaders)
	for _, k := range extraHeaders {
		key := strings.ToLower(k[len(authenticationv1.ImpersonateUserExtraHeaderPrefix):])
		if unescaped, err := url.PathUnescape(key); err == nil {
			key = unescaped
		}
		for _, v := range h[k] {
			out = append(out, impersonation{corev1.ObjectReference{Kind: "UserExtra", APIVersion: "authentication.k8s.io/v1", Name: v, FieldPath: key},
				Attributes{Verb: "impersonate", Resource: true, Group: "authentication.k8s.io", Version: "v1", Kind: "userextras", Subresource: key, Name: v}})
		}
	}
	uid := h.Get(authenticationv1.ImpersonateUIDHeader)
	if uid != "" {
		out = append(out, impersonation{corev1.ObjectReference{Kind: "UID", APIVersion: "authentication.k8s.io/v1", Name: uid},
			Attributes{Verb: "impersonate", Resource: true, Group: "authentication.k8s.io", Version: "v1", Kind: "uids", Name: uid}})
	}
	if user == "" && len(out) > 0 {
		refs := make([]corev1.ObjectReference, len(out))
		for i, o := range out {
			refs[i] = o.ref
		}
		return nil, apierrors.NewBadRequest(fmt.Sprintf("requested %v without impersonating a user", refs))
	}
	return out, nil
}

// impersonate returns the user r acts as: u itself when r carries no
// Impersonate-* headers; otherwise, once the Authorizer allowed u the
// impersonate verb on each requested user (or service account), group,
// extra value and UID, the requested identity, with system:authenticated
// (or system:unauthenticated for system:anonymous) added as upstream adds
// it, and a service account's groups when no group is requested. The
// headers are removed from r.
func (s *Server) impersonate(r *http.Request, u *auth.User) (*auth.User, error) {
	reqs, err := impersonations(r.Header)
	if err != nil || len(reqs) == 0 {
		return u, err
	}
	groupsGiven := len(r.Header.Values(authenticationv1.ImpersonateGroupHeader)) > 0
	as := &auth.User{Groups: []string{}}
	for _, im := range reqs {
		switch im.ref.Kind {
		case "ServiceAccount":
			as.Name = saUserPrefix + im.ref.Namespace + ":" + im.ref.Name
			if !groupsGiven {
				as.Groups = []string{saGroup, saGroup + ":" + im.ref.Namespace}
			}
		case "User":
			as.Name = im.ref.Name
		case "Group":
			as.Groups = append(as.Groups, im.ref.Name)
		case "UserExtra":
			if as.Extra == nil {
				as.Extra = map[string][]string{}
			}
			as.Extra[im.ref.FieldPath] = append(as.Extra[im.ref.FieldPath], im.ref.Name)
		case "UID":
			as.UID = im.ref.Name
		}
		if err := s.authz.Authorize(u, im.attr); err != nil {
			return nil, toStatus(err)
		}
	}
	if as.Name != auth.Anonymous {
		if !slices.Contains(as.Groups, auth.GroupAuthenticated) && !slices.Contains(as.Groups, auth.GroupUnauthenticated) {
			as.Groups = append(as.Groups, auth.GroupAuthenticated)
		}
	} else if !slices.Contains(as.Groups, auth.GroupUnauthenticated) {
		as.Groups = append(as.Groups, auth.GroupUnauthenticated)
	}
	r.Header.Del(authenticationv1.ImpersonateUserHeader)
	r.Header.Del(authenticationv1.ImpersonateGroupHeader)
	r.Header.Del(authenticationv1.ImpersonateUIDHeader)
	for k := range r.Header {
		if strings.HasPrefix(k, authenticationv1.ImpersonateUserExtraHeaderPrefix) {
			r.Header.Del(k)
		}
	}
	s.log.Debug("apiserver: impersonating", "user", u.Name, "as", as.Name, "groups", as.Groups)
	return as, nil
}
