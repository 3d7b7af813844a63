package ingress

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestProxyPassesAcceptEncoding: the backend sees the client's
// Accept-Encoding, none when it sent none, and the client gets the body
// as the backend wrote it.
func TestProxyPassesAcceptEncoding(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "accept-encoding=%q", r.Header.Get("Accept-Encoding"))
	}))
	t.Cleanup(backend.Close)
	url := proxyToBackend(t, backend.Listener.Addr().String())
	for _, enc := range []string{"", "br"} {
		req, _ := http.NewRequest(http.MethodGet, url+"/", nil)
		if enc != "" {
			req.Header.Set("Accept-Encoding", enc)
		}
		// A Transport without compression sends no Accept-Encoding
		// of its own.
		resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("accept-encoding=%q", enc); string(b) != want {
			t.Errorf("client sent Accept-Encoding %q: the backend got %s, want %s", enc, b, want)
		}
	}
}
