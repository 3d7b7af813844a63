package apiserver

import (
	"strings"
	"testing"
)

func TestRequestTimeoutParameter(t *testing.T) {
	h := newHub(t)
	for _, c := range []struct {
		path string
		code int
		msg  string
	}{
		{"/api/v1/namespaces/default/configmaps?timeout=2s", 200, ""},
		{"/api/v1/namespaces/default/configmaps?timeout=0s", 200, ""},
		{"/api/v1/namespaces/default/configmaps?timeout=10m", 200, ""},
		{"/api/v1/namespaces/default/configmaps?timeout=soon", 400, `invalid timeout specified in the request URL - time: invalid duration \"soon\"`},
		{"/api/v1/namespaces/default/configmaps/nope?timeout=1", 400, `invalid timeout specified in the request URL - time: missing unit in duration \"1\"`},
		// Watches and streams do not take it.
		{"/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1&timeout=soon", 200, ""},
		{"/api/v1/nodes/none/proxy/healthz?timeout=soon", 404, ""},
	} {
		res := do(t, h.srv, "GET", c.path, "good", "", nil, nil)
		if res.code != c.code || c.msg != "" && !strings.Contains(res.body, c.msg) {
			t.Errorf("GET %s: %d %s, want %d %s", c.path, res.code, res.body, c.code, c.msg)
		}
	}
}
