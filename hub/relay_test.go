package hub

import (
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/tunnel"
)

// TestStreamDemux: plain streams reach Plain even while another stream
// has not sent its first byte; streams that start with a ClientHello are
// served by the HTTPS server, counted, and may not negotiate the tunnel's
// own protocol.
func TestStreamDemux(t *testing.T) {
	authority, err := pki.LoadOrCreate(pki.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: authority.ServerTLSConfig(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "served "+r.Proto) })}
	srv.TLSConfig.NextProtos = append(srv.TLSConfig.NextProtos, tunnel.ALPN)
	defer srv.Close()
	src := newConnListener(&net.TCPAddr{})
	d := newStreamDemux(src)
	d.peekTimeout = time.Second
	go func() { _ = d.Run(srv) }()
	defer src.Close()
	dial := func() net.Conn {
		client, server := net.Pipe()
		if !src.push(server) {
			t.Fatal("demux stopped accepting")
		}
		return client
	}

	silent := dial()
	defer silent.Close()
	plain := dial()
	defer plain.Close()
	go func() { _, _ = plain.Write([]byte("GET / HTTP/1.1\r\n")) }()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := d.Plain().Accept()
		if err == nil {
			accepted <- c
		}
	}()
	select {
	case c := <-accepted:
		buf := make([]byte, 3)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "GET" {
			t.Errorf("plain stream reads %q, %v", buf, err)
		}
	case <-time.After(500 * time.Millisecond):
		t.Fatal("a silent stream held up a plain one")
	}

	relayed := func(protos ...string) (*tls.Conn, error) {
		c := tls.Client(dial(), &tls.Config{ServerName: "kubernetes.default.svc", RootCAs: authority.CAPool(), NextProtos: protos})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		return c, c.Handshake()
	}
	c, err := relayed("h2", "http/1.1")
	if err != nil || c.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("relayed handshake: %v, protocol %q", err, c.ConnectionState().NegotiatedProtocol)
	}
	c.Close()
	c, err = relayed("http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: kubernetes.default.svc\r\nConnection: close\r\n\r\n")
	if b, _ := io.ReadAll(c); !containsAll(string(b), "200 OK", "served HTTP/1.1") {
		t.Errorf("relayed HTTP/1.1 answer: %q", b)
	}
	if c, err := relayed(tunnel.ALPN); err == nil {
		t.Errorf("a relayed stream negotiated %q", c.ConnectionState().NegotiatedProtocol)
	}
	if n := d.relayedTotal.Load(); n != 3 {
		t.Errorf("relayed %d connections, want 3", n)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
