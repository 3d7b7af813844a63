package apiserver

import (
	"net/http"
	"net/http/pprof"
	"strings"
)

// servePprof answers /debug/pprof/ and its profiles with net/http/pprof.
// path is the cleaned request path; the index needs its trailing slash,
// which only the raw path still has.
func servePprof(w http.ResponseWriter, r *http.Request, path string) {
	switch name := strings.TrimPrefix(strings.TrimPrefix(path, "/debug/pprof"), "/"); name {
	case "":
		if !strings.HasSuffix(r.URL.Path, "/") {
			http.Redirect(w, r, "/debug/pprof/", http.StatusMovedPermanently)
			return
		}
		pprof.Index(w, r)
	case "cmdline":
		pprof.Cmdline(w, r)
	case "profile":
		pprof.Profile(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "trace":
		pprof.Trace(w, r)
	default:
		pprof.Handler(name).ServeHTTP(w, r)
	}
}
