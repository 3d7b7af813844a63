package apiserver

import (
	"fmt"
	"net/http"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
)

// Limits of requested token lifetimes, as upstream's TokenRequest.
const (
	minTokenSeconds     = 10 * 60
	defaultTokenSeconds = 60 * 60
	maxTokenSeconds     = 365 * 24 * 60 * 60
)

var (
	podsKindRef  = registry.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	nodesKindRef = registry.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "nodes"})
)

// requestToken serves serviceaccounts/token (TokenRequest): a signed,
// audience-bound, expiring token for the service account, optionally bound
// to a pod or node so that it dies with it.
func (s *Server) requestToken(w http.ResponseWriter, r *http.Request, t target) {
	if s.cfg.ServiceAccountTokens == nil {
		s.writeError(w, notFoundPath())
		return
	}
	obj, warnings, _, ok := s.postBody(w, r, s.decodeAs(r, authenticationv1.SchemeGroupVersion.WithKind("TokenRequest")))
	if !ok {
		return
	}
	req := obj.(*authenticationv1.TokenRequest)
	ctx := r.Context()
	// Admission sees the request before the account is read, as
	// upstream's NodeRestriction does.
	if ca, ok := s.authz.(CreateAuthorizer); ok {
		if u, _ := auth.UserFrom(ctx); u != nil {
			attrs := Attributes{Verb: "create", Resource: true, Version: "v1", Kind: t.kind.Resource,
				Namespace: t.namespace, Name: t.name, Subresource: "token", Path: r.URL.Path}
			if err := ca.AuthorizeCreate(u, attrs, req); err != nil {
				s.writeError(w, toStatus(err))
				return
			}
		}
	}
	saObj, err := s.cfg.Storage.Get(ctx, t.kind, t.namespace, t.name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	sa := saObj.(*corev1.ServiceAccount)

	spec := field.NewPath("spec")
	var errs field.ErrorList
	if req.Spec.ExpirationSeconds == nil {
		v := int64(defaultTokenSeconds)
		req.Spec.ExpirationSeconds = &v
	}
	if exp := *req.Spec.ExpirationSeconds; exp < minTokenSeconds {
		errs = append(errs, field.Invalid(spec.Child("expirationSeconds"), exp, "may not specify a duration less than 10 minutes"))
	} else if exp > maxTokenSeconds {
		errs = append(errs, field.Invalid(spec.Child("expirationSeconds"), exp, "may not specify a duration larger than 2^32 seconds"))
	}
	if len(req.Spec.Audiences) == 0 {
		req.Spec.Audiences = []string{s.cfg.ServiceAccountTokens.Issuer()}
	}
	now := time.Now()
	claims := auth.Claims{Namespace: sa.Namespace, ServiceAccount: sa.Name, ServiceAccountUID: string(sa.UID),
		Audiences: req.Spec.Audiences, IssuedAt: now}
	if ref := req.Spec.BoundObjectRef; ref != nil {
		refPath := spec.Child("boundObjectRef")
		switch ref.Kind {
		case "Pod":
			o, err := s.cfg.Storage.Get(ctx, podsKindRef, t.namespace, ref.Name)
			if err != nil {
				s.writeError(w, err)
				return
			}
			pod := o.(*corev1.Pod)
			if ref.UID != "" && ref.UID != pod.UID {
				s.writeError(w, apierrors.NewConflict(schema.GroupResource{Resource: "Pod"}, ref.Name, fmt.Errorf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID)))
				return
			}
			if pod.Spec.ServiceAccountName != sa.Name {
				s.writeError(w, apierrors.NewBadRequest(fmt.Sprintf("cannot bind token for serviceaccount %q to pod running with different serviceaccount name.", sa.Name)))
				return
			}
			claims.PodName, claims.PodUID = pod.Name, string(pod.UID)
		case "Node":
			o, err := s.cfg.Storage.Get(ctx, nodesKindRef, "", ref.Name)
			if err != nil {
				s.writeError(w, err)
				return
			}
			claims.NodeName, claims.NodeUID = ref.Name, string(o.(*corev1.Node).UID)
		default:
			errs = append(errs, field.NotSupported(refPath.Child("kind"), ref.Kind, []string{"Pod", "Node"}))
		}
	}
	if len(errs) > 0 {
		s.writeError(w, apierrors.NewInvalid(schema.GroupKind{Group: "authentication.k8s.io", Kind: "TokenRequest"}, t.name, errs))
		return
	}
	claims.Expiry = now.Add(time.Duration(*req.Spec.ExpirationSeconds) * time.Second)
	token, err := s.cfg.ServiceAccountTokens.Issue(claims)
	if err != nil {
		s.writeError(w, apierrors.NewInternalError(err))
		return
	}
	req.Name, req.Namespace = sa.Name, sa.Namespace
	req.CreationTimestamp = metav1.NewTime(now)
	req.Status = authenticationv1.TokenRequestStatus{Token: token, ExpirationTimestamp: metav1.NewTime(claims.Expiry)}
	s.writeCreated(w, r, warnings, req, authenticationv1.SchemeGroupVersion)
}
