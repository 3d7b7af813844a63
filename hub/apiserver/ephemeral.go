package apiserver

import (
	"net/http"
)

// ephemeralContainers serves pods/ephemeralcontainers: get returns the
// pod; update and patch (JSON, merge, strategic merge, apply) write it
// with the subresource's rules (registry.Kind.Subresources), which keep
// everything but spec.ephemeralContainers and only let containers be
// added, as `kubectl debug` does with a strategic merge patch.
func (s *Server) ephemeralContainers(w http.ResponseWriter, r *http.Request, t target, verb string, notAllowed error) {
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
