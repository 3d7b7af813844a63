package tunnel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// natRelay stands in for a NAT between edge and hub: the edge sends to its
// front socket, and it forwards from a back socket whose port is what the
// hub sees. rebind swaps the back socket, as a NAT does when it drops a
// mapping and allocates a new port.
type natRelay struct {
	front  net.PacketConn
	server *net.UDPAddr

	mu     sync.Mutex // guards back, client
	back   net.PacketConn
	client net.Addr

	rebinds atomic.Int32
}

func newNATRelay(t testing.TB, server string) *natRelay {
	t.Helper()
	front, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	saddr, err := net.ResolveUDPAddr("udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	r := &natRelay{front: front, server: saddr}
	r.rebind(t)
	go r.forwardUp()
	t.Cleanup(func() {
		front.Close()
		r.mu.Lock()
		r.back.Close()
		r.mu.Unlock()
	})
	return r
}

func (r *natRelay) forwardUp() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.front.ReadFrom(buf)
		if err != nil {
			return
		}
		r.mu.Lock()
		r.client = from
		back := r.back
		r.mu.Unlock()
		back.WriteTo(buf[:n], r.server)
	}
}

func (r *natRelay) forwardDown(back net.PacketConn) {
	buf := make([]byte, 64<<10)
	for {
		n, _, err := back.ReadFrom(buf)
		if err != nil {
			return
		}
		r.mu.Lock()
		client := r.client
		r.mu.Unlock()
		if client != nil {
			r.front.WriteTo(buf[:n], client)
		}
	}
}

// rebind moves the edge's traffic to a new source port. The old mapping
// lingers briefly, as in a real NAT, then disappears.
func (r *natRelay) rebind(t testing.TB) {
	back, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go r.forwardDown(back)
	r.mu.Lock()
	old := r.back
	r.back = back
	r.mu.Unlock()
	if old != nil {
		r.rebinds.Add(1)
		time.AfterFunc(200*time.Millisecond, func() { old.Close() })
	}
}

func (r *natRelay) publicPort() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.back.LocalAddr().(*net.UDPAddr).Port
}

// TestNATRebindingMidTransfer moves the edge to a new public port in the
// middle of a multi-megabyte upload; the stream must carry on intact, on
// the same connection.
func TestNATRebindingMidTransfer(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	relay := newNATRelay(t, h.addr)
	c := startClient(t, p, relay.front.LocalAddr().String(), "n1", nil)
	waitConnected(t, c, 5*time.Second)
	sess := h.srv.Session("n1")
	before := sess.RemoteAddr().(*net.UDPAddr).Port

	const size = 16 << 20
	data := make([]byte, size)
	rand.Read(data)
	want := sha256.Sum256(data)
	werr, conn := acceptUpload(t, h, c, data, 1)
	hash := sha256.New()
	if _, err := io.CopyN(hash, conn, 2<<20); err != nil {
		t.Fatal(err)
	}
	relay.rebind(t)
	n, err := io.Copy(hash, conn)
	if err != nil {
		t.Fatalf("transfer broke after rebinding: %v (after %d bytes)", err, 2<<20+n)
	}
	if err := <-werr; err != nil {
		t.Fatalf("edge side: %v", err)
	}
	if [32]byte(hash.Sum(nil)) != want || 2<<20+n != size {
		t.Fatalf("data differs after rebinding (%d bytes)", 2<<20+n)
	}
	after := sess.RemoteAddr().(*net.UDPAddr).Port
	if h.srv.Session("n1") != sess || c.Stats().Connects != 1 {
		t.Fatal("the edge reconnected instead of migrating")
	}
	if after != relay.publicPort() || after == before {
		t.Fatalf("hub sees port %d, relay's public port is %d (was %d)", after, relay.publicPort(), before)
	}
	t.Logf("16 MiB upload intact across a rebinding from port %d to %d", before, after)
}

// TestFallbackWhenUDPBlackholed blackholes the hub's UDP port: the edge
// must reach the hub over TCP+TLS soon after its first unanswered QUIC
// handshake, use the same API there, and move back to QUIC once UDP works.
func TestFallbackWhenUDPBlackholed(t *testing.T) {
	p := newPKI(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/ping", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pong") })
	unblock := make(chan struct{})
	h := startHubWith(t, p, ServerConfig{}, 0, mux, unblock)
	echo := echoServer(t)
	const handshake = 500 * time.Millisecond
	start := time.Now()
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.HandshakeTimeout = handshake
		c.QUICProbeInterval = time.Second
	})
	waitConnected(t, c, handshake+5*time.Second)
	took := time.Since(start)
	// The first QUIC handshake gives up after HandshakeTimeout without an
	// answer; the fallback must follow within ≈5 s of that.
	t.Logf("connected over %s %v after start (first QUIC handshake failed at ≈%v)", c.Stats().Transport, took.Round(time.Millisecond), handshake)
	if tr := c.Stats().Transport; tr != TransportTCP {
		t.Fatalf("transport %q", tr)
	}
	if st := c.Stats(); st.Fallbacks != 1 {
		t.Fatalf("fallbacks = %d", st.Fallbacks)
	}
	if st := h.srv.Stats(); st.FallbackSessions != 1 {
		t.Fatalf("hub stats %+v", st)
	}
	// The same API over the fallback.
	hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://hub/ping")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "pong" {
		t.Fatalf("ping = %q", body)
	}
	conn, err := h.srv.Dial(context.Background(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	if peer, _ := PeerOf(conn); peer.Transport != TransportTCP {
		t.Fatalf("PeerOf transport %q", peer.Transport)
	}
	if err := roundTrip(conn, 256<<10); err != nil {
		t.Fatal(err)
	}

	// UDP comes back: the next probe moves the edge to QUIC.
	close(unblock)
	waitFor(t, 5*time.Second, "move to QUIC", func() bool {
		s := h.srv.Session("n1")
		return s != nil && s.Peer().Transport == TransportQUIC && c.Stats().Transport == TransportQUIC
	})
	resp, err = hc.Get("http://hub/ping")
	if err != nil {
		t.Fatalf("API after moving to QUIC: %v", err)
	}
	resp.Body.Close()
}

// TestMemoryBudget holds connection-window growth to the global budget and
// returns it when the edge leaves. The budget is smaller than any window
// increase, so every increase must be refused while the transfer still
// completes on the initial windows.
func TestMemoryBudget(t *testing.T) {
	p := newPKI(t)
	const budget = 1 << 10
	h := startHub(t, p, ServerConfig{MemoryBudget: budget}, 0, nil)
	relay := newDelayRelay(t, h.addr, 5*time.Millisecond)
	c := startClient(t, p, relay, "n1", nil)
	waitConnected(t, c, 5*time.Second)
	go func() {
		conn, err := h.srv.Listener().Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		io.Copy(io.Discard, conn)
	}()
	conn, err := c.DialContext(context.Background(), "tcp", "hub")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32<<10)
	var peak int64
	for range 8 << 20 / len(buf) {
		if _, err := conn.Write(buf); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, h.srv.Stats().WindowReserved)
	}
	conn.Close()
	st := h.srv.Stats()
	t.Logf("window growth: peak %d bytes reserved, %d increases refused, budget %d", peak, st.WindowDenied, budget)
	if peak > budget {
		t.Fatalf("reserved %d bytes, budget %d", peak, budget)
	}
	if st.WindowDenied == 0 {
		t.Fatal("window never hit the budget")
	}
	c.stop()
	waitFor(t, 3*time.Second, "budget returned", func() bool { return h.srv.Stats().WindowReserved == 0 })
}

// newDelayRelay forwards UDP to server with a fixed one-way delay each
// way, so that window auto-tuning sees a real round trip.
func newDelayRelay(t testing.TB, server string, delay time.Duration) string {
	t.Helper()
	r := newNATRelay(t, server)
	// Replace the plain forwarding with delayed forwarding: wrap by a
	// second relay hop that delays.
	front, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	target := r.front.LocalAddr()
	up, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	var client atomic.Pointer[net.Addr]
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := front.ReadFrom(buf)
			if err != nil {
				return
			}
			client.Store(&from)
			b := append([]byte(nil), buf[:n]...)
			time.AfterFunc(delay, func() { up.WriteTo(b, target) })
		}
	}()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, _, err := up.ReadFrom(buf)
			if err != nil {
				return
			}
			b := append([]byte(nil), buf[:n]...)
			if a := client.Load(); a != nil {
				to := *a
				time.AfterFunc(delay, func() { front.WriteTo(b, to) })
			}
		}
	}()
	return front.LocalAddr().String()
}

func TestWindowBudgetAccounting(t *testing.T) {
	b := newWindowBudget(100)
	c1, c2 := new(quic.Conn), new(quic.Conn)
	if !b.allow(c1, 60) || b.allow(c2, 50) || !b.allow(c2, 40) {
		t.Fatal("budget granted or refused the wrong increases")
	}
	if b.used.Load() != 100 || b.denied.Load() != 1 {
		t.Fatalf("used %d denied %d", b.used.Load(), b.denied.Load())
	}
	b.release(c1)
	if !b.allow(c2, 60) || b.used.Load() != 100 {
		t.Fatalf("released growth not reusable: used %d", b.used.Load())
	}
	b.release(c2)
	if b.used.Load() != 0 {
		t.Fatalf("used %d after all connections closed", b.used.Load())
	}
}
