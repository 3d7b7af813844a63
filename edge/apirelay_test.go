package edge

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// recordSink keeps the last slice it was given per name.
type recordSink struct {
	slices map[string]*discoveryv1.EndpointSlice
}

func (r *recordSink) UpsertService(*corev1.Service)      {}
func (r *recordSink) DeleteService(string, string)       {}
func (r *recordSink) DeleteEndpointSlice(string, string) {}
func (r *recordSink) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) {
	r.slices[es.Namespace+"/"+es.Name] = es
}

// TestRelaySlice checks that the dataplane gets the relay as the only
// endpoint of default/kubernetes, on its https port, and every other slice
// unchanged.
func TestRelaySlice(t *testing.T) {
	rec := &recordSink{slices: map[string]*discoveryv1.EndpointSlice{}}
	sink := relaySink{next: rec, addr: netip.MustParseAddrPort("169.254.20.10:443"), node: "edge-1"}
	name, port, tcp := "https", int32(6443), corev1.ProtocolTCP
	yes := true
	hub := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
	}
	other := hub.DeepCopy()
	other.Namespace = "shop" // a kubernetes Service of another namespace
	sink.UpsertEndpointSlice(hub)
	sink.UpsertEndpointSlice(other)

	got := rec.slices["default/kubernetes"]
	if len(got.Endpoints) != 1 || got.Endpoints[0].Addresses[0] != "169.254.20.10" ||
		got.Endpoints[0].NodeName == nil || *got.Endpoints[0].NodeName != "edge-1" ||
		got.Endpoints[0].Conditions.Ready == nil || !*got.Endpoints[0].Conditions.Ready {
		t.Errorf("kubernetes endpoints = %+v, want only the relay, ready, on edge-1", got.Endpoints)
	}
	if len(got.Ports) != 1 || *got.Ports[0].Name != "https" || *got.Ports[0].Port != 443 {
		t.Errorf("kubernetes ports = %+v, want https on 443", got.Ports)
	}
	if got.Labels[discoveryv1.LabelServiceName] != "kubernetes" || got.AddressType != discoveryv1.AddressTypeIPv4 {
		t.Errorf("slice lost its service label or address type: %+v", got)
	}
	if hub.Endpoints[0].Addresses[0] != "192.0.2.10" || *hub.Ports[0].Port != 6443 {
		t.Error("the informer's object was modified")
	}
	if rec.slices["shop/kubernetes"] != other {
		t.Error("a slice of another namespace was rewritten")
	}

	// An unnamed single port is mapped too; a slice without an https
	// port among several is emptied rather than left pointing at the hub.
	single := hub.DeepCopy()
	single.Name, single.Ports[0].Name = "kubernetes-x", nil
	sink.UpsertEndpointSlice(single)
	if got := rec.slices["default/kubernetes-x"]; len(got.Ports) != 1 || *got.Ports[0].Port != 443 || len(got.Endpoints) != 1 {
		t.Errorf("single unnamed port: %+v", got)
	}
	a, b := "a", "b"
	multi := hub.DeepCopy()
	multi.Name = "kubernetes-y"
	multi.Ports = []discoveryv1.EndpointPort{{Name: &a, Port: &port}, {Name: &b, Port: &port}}
	sink.UpsertEndpointSlice(multi)
	if got := rec.slices["default/kubernetes-y"]; len(got.Endpoints) != 0 || len(got.Ports) != 0 {
		t.Errorf("no https port: %+v, want no endpoints", got)
	}
}

// startTestRelay runs a relay on the loopback whose streams go to hub.
func startTestRelay(t *testing.T, maxConns int, hub string) (*apiRelay, context.CancelFunc, chan struct{}) {
	t.Helper()
	a := &Agent{cfg: Config{APIRelayAddr: netip.MustParseAddrPort("127.0.0.1:0"), APIRelayMaxConns: maxConns}, log: slog.Default()}
	r, err := a.startAPIRelay()
	if err != nil {
		t.Fatal(err)
	}
	r.dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", hub)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, cancel, done
}

// TestAPIRelay checks the relay: TLS passes through it end to end, each
// direction's end is passed on as a half-close, connections that do not
// start with a ClientHello and those over the bound are refused, and the
// relayed ones are closed when the relay stops.
func TestAPIRelay(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello "+r.URL.Path)
	}))
	defer srv.Close()
	r, _, _ := startTestRelay(t, 4, srv.Listener.Addr().String())

	// TLS through the relay: the client verifies the server's own
	// certificate, so the relay terminated nothing.
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", r.addr.String())
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Get(srv.URL + "/api")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello /api" {
		t.Errorf("body %q", body)
	}
	tr.CloseIdleConnections()

	// Half-close: a peer that answers only after reading everything.
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				b, _ := io.ReadAll(c)
				c.Write(append([]byte("got:"), b...))
				c.Close()
			}()
		}
	}()
	r2, stop, stopped := startTestRelay(t, 1, echo.Addr().String())
	hello := []byte{0x16, 0x03, 0x01, 0x00, 0x10, 0x01, 'x', 'y'}
	conn, err := net.Dial("tcp", r2.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(hello)
	conn.(*net.TCPConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(conn)
	if err != nil || string(b) != "got:"+string(hello) {
		t.Errorf("half-closed exchange: %q, %v", b, err)
	}
	conn.Close()
	waitFor(t, func() bool { return r2.active.Load() == 0 && len(r2.slots) == 0 })

	// Not TLS: refused without reaching the hub.
	plain, _ := net.Dial("tcp", r2.addr.String())
	io.WriteString(plain, "GET /api/v1/secrets HTTP/1.1\r\nHost: hub\r\n\r\n")
	plain.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, _ := io.ReadAll(plain); len(b) != 0 {
		t.Errorf("plain HTTP got an answer: %q", b)
	}
	plain.Close()
	waitFor(t, func() bool { return r2.rejected.Load() == 1 && len(r2.slots) == 0 })

	// Over the bound: one held connection, the next is refused.
	held, err := net.Dial("tcp", r2.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	held.Write(hello)
	waitFor(t, func() bool { return r2.active.Load() == 1 })
	// The reset may come before the dial returns.
	if extra, err := net.Dial("tcp", r2.addr.String()); err == nil {
		extra.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := extra.Read(make([]byte, 1)); err == nil {
			t.Error("a connection over the bound was served")
		}
		extra.Close()
	}
	waitFor(t, func() bool { return r2.rejected.Load() == 2 })

	// Stopping closes the held connection.
	stop()
	<-stopped
	held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(held); err != nil && !isReset(err) {
		t.Errorf("held connection after stop: %v", err)
	}
	held.Close()
	if r2.active.Load() != 0 || r2.relayed.Load() != 2 {
		t.Errorf("active %d relayed %d, want 0 and 2", r2.active.Load(), r2.relayed.Load())
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
