package apiserver

import (
	"net/http"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/auth"
)

// tokenReview checks a bearer token with the hub's Authenticator, as
// upstream's TokenReview does: for spec.audiences, or the API's own
// audiences when it names none. Service account tokens must carry one of
// them and status.audiences lists those they carry; tokens of
// authenticators that know no audiences (the static token file) are
// valid for the API's audiences only.
func (s *Server) tokenReview(r *http.Request, tr *authenticationv1.TokenReview) (runtime.Object, error) {
	if tr.Spec.Token == "" {
		return nil, apierrors.NewBadRequest("token is required for TokenReview in authentication")
	}
	if s.cfg.Authenticator == nil {
		return tr, nil
	}
	var apiAuds []string
	if s.cfg.ServiceAccountTokens != nil {
		apiAuds = s.cfg.ServiceAccountTokens.APIAudiences()
	}
	auds := tr.Spec.Audiences
	if len(auds) == 0 {
		auds = apiAuds
	}
	// A request that carries nothing but the token.
	req, err := http.NewRequestWithContext(auth.WithAudiences(r.Context(), auds), http.MethodPost, "/", nil)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	req.Header.Set("Authorization", "Bearer "+tr.Spec.Token)
	u, ok, err := s.cfg.Authenticator.Authenticate(req)
	tr.Status = authenticationv1.TokenReviewStatus{}
	if err != nil {
		tr.Status.Error = err.Error()
		ok = false
	}
	if !ok || u == nil {
		return tr, nil
	}
	var got []string
	if sa := s.cfg.ServiceAccountTokens; sa != nil {
		if c, err := sa.Verify(tr.Spec.Token, auds); err == nil {
			got = intersect(c.Audiences, auds)
		} else if got = intersect(apiAuds, auds); len(got) == 0 {
			return tr, nil
		}
	}
	tr.Status.Authenticated = true
	tr.Status.User = userInfo(u)
	tr.Status.Audiences = got
	return tr, nil
}

// intersect returns the elements of a that b holds, in a's order.
func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
