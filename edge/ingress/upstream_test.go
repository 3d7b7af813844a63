package ingress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// proxyToBackend serves the controller, with svc-1 as the default
// backend, dialling backendAddr for it.
func proxyToBackend(t testing.TB, backendAddr string) string {
	t.Helper()
	c, err := New(Config{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, backendAddr)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.up.closeIdle)
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
	return srv.URL
}

// TestUpstreamClosedWhileIdle: a backend that closes each connection after
// one answer, without saying so, still answers every request: the request
// sent on a connection closed while idle goes again on a new one.
func TestUpstreamClosedWhileIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan int, 100)
	go func() {
		for n := 1; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- n
			go func() {
				defer conn.Close()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				body := fmt.Sprintf("conn %d %s", n, req.URL.Path)
				fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	url := proxyToBackend(t, ln.Addr().String())
	client := &http.Client{}
	for i := 0; i < 4; i++ {
		resp, err := client.Get(fmt.Sprintf("%s/r%d", url, i))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasSuffix(string(b), fmt.Sprintf(" /r%d", i)) {
			t.Fatalf("request %d: %s %q", i, resp.Status, b)
		}
	}
	if len(conns) < 4 {
		t.Errorf("%d backend connections for 4 requests, each on a connection of its own", len(conns))
	}
}

// TestUpstreamAnswers: answers of every shape pass through, and a kept
// backend connection serves the next request: interim answers, HEAD, no
// content, chunked bodies, trailers, and request bodies (through the
// Transport).
func TestUpstreamAnswers(t *testing.T) {
	var mu sync.Mutex
	var remotes []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes = append(remotes, r.RemoteAddr)
		mu.Unlock()
		switch r.URL.Path {
		case "/hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			io.WriteString(w, "after hints")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/chunked":
			w.Header().Set("Trailer", "X-Sum")
			io.WriteString(w, "part one, ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
			w.Header().Set("X-Sum", "2")
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s", r.Method, b)
		default:
			io.WriteString(w, r.Method+" "+r.URL.Path)
		}
	}))
	t.Cleanup(backend.Close)
	url := proxyToBackend(t, backend.Listener.Addr().String())
	client := &http.Client{}
	for _, tt := range []struct {
		method, path, body string
		code               int
		want, trailer      string
	}{
		{"GET", "/a", "", 200, "GET /a", ""},
		{"HEAD", "/a", "", 200, "", ""},
		{"GET", "/hints", "", 200, "after hints", ""},
		{"GET", "/empty", "", 204, "", ""},
		{"GET", "/chunked", "", 200, "part one, part two", "2"},
		{"POST", "/echo", "posted", 200, "POST posted", ""},
		{"GET", "/b", "", 200, "GET /b", ""},
	} {
		req, _ := http.NewRequest(tt.method, url+tt.path, strings.NewReader(tt.body))
		if tt.body == "" {
			req.Body = nil
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || string(b) != tt.want || resp.Trailer.Get("X-Sum") != tt.trailer {
			t.Errorf("%s %s: %s %q trailer %q, want %d %q trailer %q",
				tt.method, tt.path, resp.Status, b, resp.Trailer.Get("X-Sum"), tt.code, tt.want, tt.trailer)
		}
	}
	// The bodiless requests one after the other share one connection.
	mu.Lock()
	defer mu.Unlock()
	if remotes[0] != remotes[len(remotes)-1] {
		t.Errorf("the backend saw the first request from %s and the last from %s, want one kept connection", remotes[0], remotes[len(remotes)-1])
	}
}

// TestUpstreamClientGone: a client that goes away while the backend is
// slow to answer cancels the request to the backend.
func TestUpstreamClientGone(t *testing.T) {
	asked, gone := make(chan struct{}), make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(asked)
		<-r.Context().Done()
		close(gone)
	}))
	t.Cleanup(backend.Close)
	url := proxyToBackend(t, backend.Listener.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/slow", nil)
	done := make(chan error, 1)
	go func() {
		_, err := http.DefaultClient.Do(req)
		done <- err
	}()
	<-asked
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	<-gone
}

// TestUpstreamReap: connections idle for the idle timeout are closed
// whether or not a request goes to their address again, the fresher ones
// are kept, and an address left with none is forgotten.
func TestUpstreamReap(t *testing.T) {
	u := newUpstream(&http.Transport{}, nil)
	now := time.Now()
	var ends []net.Conn
	conn := func(addr string, idle time.Duration) *backendConn {
		a, b := net.Pipe()
		ends = append(ends, b)
		return &backendConn{addr: addr, conn: a, idleSince: now.Add(-idle)}
	}
	t.Cleanup(func() {
		for _, c := range ends {
			c.Close()
		}
	})
	old, fresh := conn("10.0.0.1:80", 2*upstreamIdleTimeout), conn("10.0.0.1:80", time.Second)
	gone := conn("10.0.0.2:80", upstreamIdleTimeout)
	u.idle = map[string][]*backendConn{"10.0.0.1:80": {old, fresh}, "10.0.0.2:80": {gone}}
	if n := u.reap(now); n != 2 {
		t.Fatalf("reaped %d connections, want 2", n)
	}
	if got := u.idle["10.0.0.1:80"]; len(got) != 1 || got[0] != fresh {
		t.Fatalf("kept %v for 10.0.0.1:80, want only the fresh one", got)
	}
	if _, ok := u.idle["10.0.0.2:80"]; ok {
		t.Fatal("an address with no idle connection left is still kept")
	}
	closed := func(c *backendConn) bool {
		_, err := c.conn.Write([]byte{0})
		return errors.Is(err, io.ErrClosedPipe)
	}
	if !closed(old) || !closed(gone) {
		t.Fatal("a reaped connection is still open")
	}
	go io.Copy(io.Discard, ends[1])
	if closed(fresh) {
		t.Fatal("the fresh connection was closed")
	}
	if n := u.reap(now); n != 0 {
		t.Fatalf("a second reap closed %d, want none", n)
	}
}
