package apiserver

import "net/http"

// kindSubresource serves a subresource that writes the kind's objects
// with rules of their own (registry.Kind.Subresources), such as
// certificatesigningrequests/approval and pods/ephemeralcontainers: get
// returns the object; update and patch write it through the subresource,
// whose rules keep what it does not own. Who may make the change beyond
// the verb on the subresource (approving for a signer, for example) is
// storage admission's to decide.
func (s *Server) kindSubresource(w http.ResponseWriter, r *http.Request, t target, verb string, notAllowed error) {
	switch verb {
	case "get":
		s.get(w, r, t, "")
	case "update":
		s.update(w, r, t, t.subresource)
	case "patch":
		s.patch(w, r, t, t.subresource)
	default:
		s.writeError(w, notAllowed)
	}
}
