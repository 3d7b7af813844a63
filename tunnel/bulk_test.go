package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// kernelHas reports whether the kernel offers congestion control cc.
func kernelHas(cc string) bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	return err == nil && strings.Contains(" "+strings.TrimSpace(string(b))+" ", " "+cc+" ")
}

// bulkCtx is a context marked for the bulk lane.
func bulkCtx() context.Context { return WithBulk(context.Background()) }

// echoCheck writes msg on c and reads the echo.
func echoCheck(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	c.SetDeadline(time.Time{})
}

// TestBulkLaneOnDemand: no lane until a stream is marked bulk; then one
// lane, with BBR on the edge's socket, carries bulk streams both ways
// intact and ends them with EOF, while unmarked streams stay on QUIC.
func TestBulkLaneOnDemand(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	c := startClient(t, p, h.addr, "n1", nil)
	waitConnected(t, c, 5*time.Second)
	// The hello said the edge opens lanes: the hub knew it before its
	// welcome, so a bulk dial right after the connect takes a lane.
	if s := h.srv.Session("n1"); s == nil || !s.edgeBulk.Load() {
		t.Fatal("the hub did not know from the hello that the edge opens bulk lanes")
	}
	echo := echoServer(t)

	// Hub→edge first: the hub has no lane, asks the edge for one, and
	// the dial waits for it.
	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	if pe, _ := PeerOf(hc); pe.Transport != TransportBulk {
		t.Fatalf("bulk dial on transport %q", pe.Transport)
	}
	big := make([]byte, 3<<20)
	rand.Read(big)
	go hc.Write(big)
	got := make([]byte, len(big))
	if _, err := io.ReadFull(hc, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("bulk echo: %v (intact %v)", err, bytes.Equal(got, big))
	}
	hc.Close()
	if n := h.srv.Stats().BulkLanes; n != 1 {
		t.Fatalf("hub has %d lanes, want 1", n)
	}

	// Edge→hub on the same lane, ended gracefully.
	werr, conn := acceptUploadCtx(t, h, c, bulkCtx(), big, 2)
	if pe, _ := PeerOf(conn); pe.Transport != TransportBulk || pe.Node != "n1" {
		t.Fatalf("bulk stream peer %+v", pe)
	}
	all, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("read bulk upload: %v", err)
	}
	if len(all) != 2*len(big) || !bytes.Equal(all[:len(big)], big) {
		t.Fatalf("bulk upload: %d bytes", len(all))
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}

	// Unmarked streams stay on QUIC.
	ic, err := h.srv.Dial(context.Background(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close()
	if pe, _ := PeerOf(ic); pe.Transport != TransportQUIC {
		t.Fatalf("interactive dial on transport %q", pe.Transport)
	}
	echoCheck(t, ic, "ping")

	cs, ss := c.Stats(), h.srv.Stats()
	if cs.BulkLanes != 1 || cs.BulkStreams != 1 || ss.BulkStreams != 2 {
		t.Fatalf("lanes %d, edge bulk streams %d, hub bulk streams %d; want 1, 1, 2", cs.BulkLanes, cs.BulkStreams, ss.BulkStreams)
	}
	if kernelHas("bbr") && cs.BulkCongestion != "bbr" {
		t.Fatalf("lane congestion control %q, want bbr", cs.BulkCongestion)
	}
	if cs.BulkDefaultCongestion != 0 || ss.BulkDefaultCongestion != 0 {
		t.Fatalf("fell back to the default congestion control: edge %d, hub %d", cs.BulkDefaultCongestion, ss.BulkDefaultCongestion)
	}
	t.Logf("lane congestion control %s, edge wire bytes sent %d", cs.BulkCongestion, cs.BytesSent)
}

// acceptUploadCtx is acceptUpload with a dial context.
func acceptUploadCtx(t *testing.T, h *testHub, c *testClient, ctx context.Context, data []byte, reps int) (<-chan error, net.Conn) {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		conn, err := c.DialContext(ctx, "tcp", "hub")
		if err != nil {
			werr <- err
			return
		}
		defer conn.Close()
		for range reps {
			if _, err := conn.Write(data); err != nil {
				werr <- err
				return
			}
		}
		werr <- conn.(*streamConn).CloseWrite()
	}()
	conn, err := h.srv.Listener().Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return werr, conn
}

// TestBulkLaneIdleClose: a lane that carries a stream stays open however
// quiet the stream; one without streams for BulkIdle closes, and the next
// bulk stream opens a new one.
func TestBulkLaneIdleClose(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) { c.BulkIdle = 200 * time.Millisecond })
	waitConnected(t, c, 5*time.Second)
	echo := echoServer(t)

	conn, err := c.DialContext(bulkCtx(), "tcp", "hub")
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("x"))
	hubSide, err := h.srv.Listener().Accept()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // five idle periods with a quiet stream open
	if n := h.srv.Stats().BulkLanes; n != 1 {
		t.Fatalf("lane with an open stream: hub has %d lanes", n)
	}
	if _, err := io.ReadFull(hubSide, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	go io.Copy(hubSide, hubSide)
	echoCheck(t, conn, "still there")
	conn.Close()
	hubSide.Close()
	waitFor(t, 5*time.Second, "the idle lane to close", func() bool { return h.srv.Stats().BulkLanes == 0 })

	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	echoCheck(t, hc, "new lane")
	if n := c.Stats().BulkLanes; n != 2 {
		t.Fatalf("edge opened %d lanes, want 2", n)
	}
}

// TestBulkLaneAuthentication: a lane authenticates like the tunnel. A
// certificate from another CA is refused, and so is a valid node
// certificate of a node that has no session; the refused edge's bulk
// streams travel on QUIC.
func TestBulkLaneAuthentication(t *testing.T) {
	p := newPKI(t)
	rogue := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	good, bad := p.node(t, "n1"), rogue.node(t, "n1")
	var cert atomic.Pointer[tls.Certificate]
	cert.Store(&good)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.TLS.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Load(), nil }
	})
	waitConnected(t, c, 5*time.Second)
	cert.Store(&bad) // the lane's handshake presents the rogue certificate

	werr, conn := acceptUploadCtx(t, h, c, bulkCtx(), []byte("payload"), 1)
	if pe, _ := PeerOf(conn); pe.Transport != TransportQUIC {
		t.Fatalf("stream of a refused lane on transport %q, want quic", pe.Transport)
	}
	if b, err := io.ReadAll(conn); err != nil || string(b) != "payload" {
		t.Fatalf("read %q, %v", b, err)
	}
	<-werr
	if n := h.srv.Stats().BulkLanes; n != 0 {
		t.Fatalf("rogue lane: hub has %d lanes", n)
	}
	if n := c.Stats().BulkLanes; n != 0 {
		t.Fatalf("edge counts %d lanes", n)
	}

	// A genuine certificate of a node without a session.
	refused := h.srv.Stats().SessionsRefused
	m := dialLaneRaw(t, p, h.addr, p.node(t, "n2"))
	defer m.close(codeConnClosed, "")
	ctrl, err := m.openStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctrl.rawWrite(appendFrame(nil, frameLane, nil))
	ctrl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if typ, _, err := readFrame(preambleReader(ctrl)); err == nil {
		t.Fatalf("lane of a node without a session answered with frame %#x", typ)
	}
	if s := h.srv.Stats(); s.BulkLanes != 0 || s.SessionsRefused != refused+1 {
		t.Fatalf("lane without a session: hub has %d lanes, %d refusals (was %d)", s.BulkLanes, s.SessionsRefused, refused)
	}
}

// dialLaneRaw opens TCP+TLS+yamux to the hub with cert, as a lane would.
func dialLaneRaw(t *testing.T, p *testPKI, addr string, cert tls.Certificate) *yamuxMux {
	t.Helper()
	cfg := p.clientTLS(cert)
	cfg.NextProtos = []string{ALPN}
	tc, err := tls.Dial("tcp4", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := newYamuxMux(tc, true, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestBulkLaneLossResets: when a lane's TCP connection dies (as after a
// NAT rebinding), the bulk streams on it fail with a *ResetError on both
// ends, never io.EOF; a QUIC stream carries on, and the next bulk stream
// opens a new lane.
func TestBulkLaneLossResets(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	var (
		mu    sync.Mutex
		socks []net.Conn
	)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.DialTCP = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				mu.Lock()
				socks = append(socks, conn)
				mu.Unlock()
			}
			return conn, err
		}
	})
	waitConnected(t, c, 5*time.Second)
	echo := echoServer(t)
	ic, err := h.srv.Dial(context.Background(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close()
	echoCheck(t, ic, "before")

	stop := new(atomic.Bool)
	werr := make(chan error, 1)
	go func() {
		conn, err := c.DialContext(bulkCtx(), "tcp", "hub")
		if err != nil {
			werr <- err
			return
		}
		defer conn.Close()
		buf := make([]byte, 32<<10)
		for {
			if _, err := conn.Write(buf); err != nil {
				werr <- err
				return
			}
			if stop.Load() {
				werr <- nil
				return
			}
		}
	}()
	conn, err := h.srv.Listener().Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.ReadFull(conn, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	lost := socks[0]
	mu.Unlock()
	lost.(*net.TCPConn).SetLinger(0)
	lost.Close() // a reset, as the hub's kernel sends to a rebound edge

	_, rerr := io.Copy(io.Discard, conn)
	var re *ResetError
	if !errors.As(rerr, &re) || re.Code != codeLaneLost {
		t.Fatalf("hub's read of a lost lane's stream: %v, want a *ResetError with code %#x", rerr, codeLaneLost)
	}
	select {
	case err := <-werr:
		if !errors.As(err, &re) {
			t.Fatalf("edge's write on a lost lane: %v, want a *ResetError", err)
		}
	case <-time.After(5 * time.Second):
		stop.Store(true)
		t.Fatal("edge's write did not fail")
	}
	echoCheck(t, ic, "after")
	waitFor(t, 5*time.Second, "the hub to drop the lost lane", func() bool { return h.srv.Stats().BulkLanes == 0 })

	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	echoCheck(t, hc, "on a new lane")
	if pe, _ := PeerOf(hc); pe.Transport != TransportBulk {
		t.Fatalf("bulk dial after the loss on transport %q", pe.Transport)
	}
}

// TestBulkLaneDefaultCongestion: where the congestion control cannot be
// set (the kernel lacks BBR), the lane still opens with the kernel's
// default on both ends, and says so in the counters.
func TestBulkLaneDefaultCongestion(t *testing.T) {
	p := newPKI(t)
	missing := func(int, int, int, string) error { return syscall.ENOENT }
	h := startHub(t, p, ServerConfig{setsockopt: missing}, 0, nil)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) { c.setsockopt = missing })
	waitConnected(t, c, 5*time.Second)
	echo := echoServer(t)
	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	echoCheck(t, hc, "on the default")
	if pe, _ := PeerOf(hc); pe.Transport != TransportBulk {
		t.Fatalf("dial on transport %q", pe.Transport)
	}
	cs, ss := c.Stats(), h.srv.Stats()
	if cs.BulkDefaultCongestion != 1 || ss.BulkDefaultCongestion != 1 {
		t.Fatalf("default congestion control counted %d times on the edge, %d on the hub; want 1 each", cs.BulkDefaultCongestion, ss.BulkDefaultCongestion)
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control"); err == nil {
		if want := strings.TrimSpace(string(b)); cs.BulkCongestion != want {
			t.Fatalf("lane runs %q, want the kernel default %q", cs.BulkCongestion, want)
		}
	}
}

// TestBulkDisabled: an edge that opens no lanes has its bulk dials sent on
// QUIC at once, without the hub waiting for a lane.
func TestBulkDisabled(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) { c.DisableBulk = true })
	waitConnected(t, c, 5*time.Second)
	echo := echoServer(t)
	start := time.Now()
	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	echoCheck(t, hc, "quic")
	if pe, _ := PeerOf(hc); pe.Transport != TransportQUIC {
		t.Fatalf("dial on transport %q", pe.Transport)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("bulk dial to an edge without lanes took %v", d)
	}
	if n := c.Stats().BulkLanes; n != 0 {
		t.Fatalf("edge opened %d lanes", n)
	}
}

// TestBulkLaneUnavailable: an edge that cannot reach the hub over TCP
// tells the hub so, and the hub's bulk dial goes on QUIC without waiting
// out its timeout.
func TestBulkLaneUnavailable(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.DialTCP = func(context.Context, string) (net.Conn, error) { return nil, syscall.ECONNREFUSED }
	})
	waitConnected(t, c, 5*time.Second)
	echo := echoServer(t)
	start := time.Now()
	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	echoCheck(t, hc, "quic")
	if pe, _ := PeerOf(hc); pe.Transport != TransportQUIC {
		t.Fatalf("dial on transport %q", pe.Transport)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("bulk dial to an edge that cannot open a lane took %v", d)
	}
}
