package apiserver

import (
	"net/http"

	"k8s.io/apimachinery/pkg/util/sets"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/tether-edge/tether/hub/auth"
)

// Aggregated routes the group/versions other servers serve (API
// aggregation, see hub/aggregator).
type Aggregated interface {
	// ProxyFor returns the handler of group/version, or nil when the hub
	// serves it itself.
	ProxyFor(group, version string) http.Handler
}

// requestInfo resolves a request as upstream's filters do, for requests
// whose resource the hub does not know.
var requestInfo = genericrequest.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// serveAggregated hands a request below /apis/<group>/<version>/ to the
// server registered for that group/version, after authorizing it as
// upstream does before proxying; it returns false when the hub serves the
// group/version itself.
func (s *Server) serveAggregated(w http.ResponseWriter, r *http.Request, req *request, u *auth.User, segs []string) bool {
	if s.cfg.Aggregated == nil || segs[0] != "apis" || len(segs) < 4 {
		return false
	}
	h := s.cfg.Aggregated.ProxyFor(segs[1], segs[2])
	if h == nil {
		return false
	}
	info, err := requestInfo.NewRequestInfo(r)
	if err != nil {
		s.writeError(w, notFoundPath())
		return true
	}
	req.attrs = Attributes{Verb: info.Verb, Resource: info.IsResourceRequest, Group: info.APIGroup, Version: info.APIVersion,
		Kind: info.Resource, Namespace: info.Namespace, Name: info.Name, Subresource: info.Subresource, Path: r.URL.Path}
	if err := s.authorize(r, u, req.attrs); err != nil {
		s.writeError(w, toStatus(err))
		return true
	}
	h.ServeHTTP(w, r)
	return true
}
