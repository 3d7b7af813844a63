package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// maxRequestTimeout bounds the `timeout` a client asks for, as
// kube-apiserver's --request-timeout does by default.
const maxRequestTimeout = 60 * time.Second

// longRunning reports whether a request is one that upstream lets run
// beyond any request timeout: watches, and the log, exec, attach,
// port-forward and proxy streams. Watches end by timeoutSeconds or the
// server's own randomised bound instead (see watch.go).
func longRunning(verb, subresource string) bool {
	if verb == "watch" {
		return true
	}
	switch subresource {
	case "proxy", "log", "exec", "attach", "portforward":
		return true
	}
	return false
}

// withRequestDeadline bounds a short request by the `timeout` query
// parameter client-go sends with its own request timeout (kubectl's
// --request-timeout), capped at maxRequestTimeout; zero means the cap.
// A timeout Go cannot parse is refused as upstream refuses it.
func withRequestDeadline(r *http.Request) (*http.Request, context.CancelFunc, error) {
	v := r.URL.Query().Get("timeout")
	if v == "" {
		return r, func() {}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return r, func() {}, apierrors.NewBadRequest(fmt.Sprintf("invalid timeout specified in the request URL - %v", err))
	}
	if d <= 0 || d > maxRequestTimeout {
		d = maxRequestTimeout
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return r.WithContext(ctx), cancel, nil
}
