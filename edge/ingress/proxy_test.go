package ingress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestProxyPassesAcceptEncoding: the backend sees the client's
// Accept-Encoding, none when it sent none, and the client gets the body
// as the backend wrote it.
func TestProxyPassesAcceptEncoding(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "accept-encoding=%q", r.Header.Get("Accept-Encoding"))
	}))
	t.Cleanup(backend.Close)
	c, err := New(Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, backend.Listener.Addr().String())
	}})
	if err != nil {
		t.Fatal(err)
	}
	s := testState()
	svc1 := types.NamespacedName{Namespace: "default", Name: "svc-1"}
	c.UpsertService(s.services[svc1])
	for _, es := range s.slices[svc1] {
		c.UpsertEndpointSlice(es)
	}
	c.UpsertIngressClass(s.classes["tether"])
	c.UpsertIngress(ingress("web", "tether", 0, networkingv1.IngressSpec{DefaultBackend: ptr.To(be("svc-1"))}))
	c.Rebuild()
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	for _, enc := range []string{"", "br"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
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
