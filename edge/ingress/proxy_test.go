package ingress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
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

// BenchmarkProxy measures one bodiless request through the proxy on a
// kept-alive connection, as the load of TestBenchIngressVsNginx sends
// them; the client and the backend run in the same process, so its
// figures are the proxy's plus theirs.
func BenchmarkProxy(b *testing.B) {
	body := strings.Repeat("x", 256)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, body)
	}))
	b.Cleanup(backend.Close)
	url := proxyToBackend(b, backend.Listener.Addr().String())
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	br := bufio.NewReader(conn)
	const req = "GET /a/item HTTP/1.1\r\nHost: bench.example.com\r\nUser-Agent: bench\r\n\r\n"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := io.WriteString(conn, req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("%s, %v", resp.Status, err)
		}
	}
}

// TestProxySetsXForwarded: the backend sees the client's address, the
// Host it asked for and its scheme, and none of the X-Forwarded-* values
// the client sent.
func TestProxySetsXForwarded(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "for=%q host=%q proto=%q forwarded=%q", r.Header.Values("X-Forwarded-For"),
			r.Header.Values("X-Forwarded-Host"), r.Header.Values("X-Forwarded-Proto"), r.Header.Values("Forwarded"))
	}))
	t.Cleanup(backend.Close)
	url := proxyToBackend(t, backend.Listener.Addr().String())
	req, _ := http.NewRequest(http.MethodGet, url+"/", nil)
	req.Host = "app.example.com:8080"
	req.Header.Set("X-Forwarded-For", "10.1.2.3")
	req.Header.Set("X-Forwarded-Host", "evil.example.com")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("Forwarded", "for=10.1.2.3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `for=["127.0.0.1"] host=["app.example.com:8080"] proto=["http"] forwarded=[]`
	if string(b) != want {
		t.Errorf("the backend got %s, want %s", b, want)
	}
}
