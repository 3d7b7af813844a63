package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRefusesUnknownClientCA(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		rogue := newPKI(t)
		h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		c := startMemClient(t, n, p, h.addr, "n1", func(c *ClientConfig) {
			c.TLS = p.clientTLS(rogue.node(t, "n1"))
		})
		time.Sleep(time.Minute)
		if c.Connected() {
			t.Fatal("client with a certificate from an unknown CA connected")
		}
		if n := h.srv.Stats().Sessions; n != 0 {
			t.Fatalf("hub has %d sessions", n)
		}
		// A refusal proves UDP works: no fallback to TCP.
		if f := c.Stats().Fallbacks; f != 0 {
			t.Fatalf("refused client fell back to TCP %d times", f)
		}
	})
}

func TestIdentifyRefuses(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		fakeTime(t, func(t *testing.T) {
			n := newMemNet(10 * time.Millisecond)
			p := newPKI(t)
			h := startMemHub(t, n, p, ServerConfig{
				Identify: func(cs tls.ConnectionState) (string, error) {
					node, err := identifyByCommonName(cs)
					if node == "banned" {
						return "", errors.New("node is banned")
					}
					return node, err
				},
			}, memHubAddr)
			force := func(c *ClientConfig) { c.ForceTCP = tcp }
			bad := startMemClient(t, n, p, h.addr, "banned", force)
			liar := startMemClient(t, n, p, h.addr, "other", func(c *ClientConfig) {
				c.ForceTCP = tcp
				c.TLS = p.clientTLS(p.node(t, "good"))
			})
			good := startMemClient(t, n, p, h.addr, "good2", force)
			waitConnected(t, good, 5*time.Second)
			time.Sleep(time.Minute)
			if bad.Connected() {
				t.Error("banned node connected")
			}
			if liar.Connected() {
				t.Error("node whose hello names another node connected")
			}
			if h.srv.Session("banned") != nil || h.srv.Session("other") != nil || h.srv.Session("good") != nil {
				t.Error("refused node has a session")
			}
			if h.srv.Stats().SessionsRefused == 0 {
				t.Error("no refusal counted")
			}
		})
	})
}

func TestStreamsBothDirections(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	// The hub echoes edge-opened streams.
	go func() {
		for {
			c, err := h.srv.Listener().Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	echo := echoServer(t)
	transports(t, func(t *testing.T, tcp bool) {
		node := "n-" + map[bool]string{false: "q", true: "t"}[tcp]
		c := startClient(t, p, h.addr, node, func(c *ClientConfig) { c.ForceTCP = tcp })
		waitConnected(t, c, 5*time.Second)
		const streams, size = 100, 64 << 10
		var wg sync.WaitGroup
		errs := make(chan error, 2*streams)
		for i := range 2 * streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				var conn net.Conn
				var err error
				if i%2 == 0 {
					conn, err = c.DialContext(ctx, "tcp", "hub")
				} else {
					conn, err = h.srv.Dial(ctx, node, "tcp:"+echo)
				}
				if err != nil {
					errs <- err
					return
				}
				errs <- roundTrip(conn, size)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if tr := h.srv.Session(node).Peer().Transport; tr != map[bool]string{false: TransportQUIC, true: TransportTCP}[tcp] {
			t.Fatalf("transport %q", tr)
		}
	})
}

// roundTrip writes size random bytes, half-closes, and checks the echo.
func roundTrip(conn net.Conn, size int) error {
	defer conn.Close()
	data := make([]byte, size)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(data)
		if err == nil {
			err = conn.(*streamConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(conn)
	if err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echo differs: got %d bytes, want %d", len(got), len(data))
	}
	return nil
}

func TestHTTPOverTunnel(t *testing.T) {
	p := newPKI(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		peer, ok := r.Context().Value(peerKey{}).(Peer)
		if !ok {
			http.Error(w, "no peer", 500)
			return
		}
		fmt.Fprintf(w, "%s/%s", peer.Node, peer.Transport)
	})
	mux.HandleFunc("/watch", func(w http.ResponseWriter, r *http.Request) {
		// A long-lived streaming response, like a watch.
		for i := range 5 {
			fmt.Fprintf(w, "event %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	h := startHub(t, p, ServerConfig{}, 0, nil)
	api := &http.Server{
		Handler: mux,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			peer, _ := PeerOf(c)
			return context.WithValue(ctx, peerKey{}, peer)
		},
	}
	go api.Serve(h.srv.Listener())
	t.Cleanup(func() { api.Close() })

	transports(t, func(t *testing.T, tcp bool) {
		node := "h-" + map[bool]string{false: "q", true: "t"}[tcp]
		c := startClient(t, p, h.addr, node, func(c *ClientConfig) { c.ForceTCP = tcp })
		waitConnected(t, c, 5*time.Second)
		hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}}
		defer hc.CloseIdleConnections()
		for range 3 { // reuses the idle stream like any HTTP/1.1 connection
			resp, err := hc.Get("http://hub/whoami")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := node + "/" + map[bool]string{false: TransportQUIC, true: TransportTCP}[tcp]
			if string(body) != want {
				t.Fatalf("whoami = %q, want %q", body, want)
			}
		}
		start := time.Now()
		resp, err := hc.Get("http://hub/watch")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "event 0\n" {
			t.Fatalf("first event %q, %v", line, err)
		}
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("first event after %v: the response is not streamed", d)
		}
		rest, _ := io.ReadAll(br)
		if n := strings.Count(string(rest), "event"); n != 4 {
			t.Fatalf("got %d more events, want 4", n)
		}
	})
}

type peerKey struct{}

func TestHelloAndHeartbeat(t *testing.T) {
	p := newPKI(t)
	var beats atomic.Int32
	connected := make(chan *Session, 1)
	h := startHub(t, p, ServerConfig{
		OnConnect:   func(s *Session) { connected <- s },
		OnHeartbeat: func(*Session) { beats.Add(1) },
	}, 0, nil)
	rvs := map[string]string{"pods": "42", "configmaps": "7"}
	startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.HeartbeatInterval = 100 * time.Millisecond
		c.Hello = func() Hello { return Hello{Node: "n1", Version: "v9", ResourceVersions: rvs} }
	})
	var s *Session
	select {
	case s = <-connected:
	case <-time.After(5 * time.Second):
		t.Fatal("no OnConnect")
	}
	hello := s.Hello()
	if hello.Node != "n1" || hello.Version != "v9" || hello.ResourceVersions["pods"] != "42" || hello.ResourceVersions["configmaps"] != "7" {
		t.Fatalf("hello = %+v", hello)
	}
	if s.Node() != "n1" || s.Peer().Node != "n1" || len(s.Peer().Certificates) == 0 || s.RemoteAddr() == nil {
		t.Fatalf("session = node %q peer %+v", s.Node(), s.Peer())
	}
	waitFor(t, 3*time.Second, "3 heartbeats", func() bool { return beats.Load() >= 3 })
	if time.Since(s.LastHeartbeat()) > time.Second || !s.LastHeartbeat().After(s.ConnectedAt()) {
		t.Fatalf("LastHeartbeat %v, ConnectedAt %v", s.LastHeartbeat(), s.ConnectedAt())
	}
}

// TestDrainReconnectsWithinWindow: edges told to go by a draining hub
// that stays up leave within the window, at the points they drew in it,
// and come back to the hub that replaces it.
func TestDrainReconnectsWithinWindow(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		a := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		const edges, window = 8, 30 * time.Second
		var gone events
		clients := make([]*testClient, edges)
		for i := range edges {
			clients[i] = startMemClient(t, n, p, a.addr, fmt.Sprint("d", i), func(c *ClientConfig) {
				c.OnDisconnect = gone.add
			})
		}
		for _, c := range clients {
			waitConnected(t, c, 5*time.Second)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*window)
		defer cancel()
		if err := a.srv.Drain(ctx, window); err != nil {
			t.Fatal(err)
		}
		drained := time.Since(start)
		// An edge leaves when its attempt to reconnect (refused: the
		// hub drains) is answered, a round trip or two after its point.
		for _, g := range gone.times() {
			if d := g.Sub(start); d > window+10*n.delay {
				t.Errorf("an edge left %v after the goaway, window %v", d, window)
			}
		}
		if drained > window+10*n.delay {
			t.Errorf("drain took %v, window %v", drained, window)
		}
		t.Logf("all %d edges left within %v (window %v)", edges, drained, window)
		a.stop()
		b := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		time.Sleep(time.Minute)
		if got := b.srv.Stats().Sessions; got != edges {
			t.Fatalf("%d of %d edges back a minute after the restart", got, edges)
		}
	})
}

func TestHubRestartReconnects(t *testing.T) {
	p := newPKI(t)
	key := new([32]byte)
	rand.Read(key[:])
	a := startHub(t, p, ServerConfig{StatelessResetKey: key}, 0, nil)
	c := startClient(t, p, a.addr, "n1", nil)
	waitConnected(t, c, 5*time.Second)
	port := a.port()
	a.stop()
	waitFor(t, 2*time.Second, "disconnect noticed", func() bool { return !c.Connected() })
	b := startHub(t, p, ServerConfig{StatelessResetKey: key}, port, nil)
	// The hub has the session once its welcome is out; the edge counts
	// the connect when the welcome arrives.
	waitFor(t, 10*time.Second, "reconnect", func() bool { return b.srv.Session("n1") != nil && c.Connected() })
	if got := c.Stats().Connects; got != 2 {
		t.Fatalf("connects = %d, want 2", got)
	}
}

func TestSecondConnectionReplacesFirst(t *testing.T) {
	p := newPKI(t)
	var mu sync.Mutex
	var reasons []error
	h := startHub(t, p, ServerConfig{
		OnDisconnect: func(_ *Session, err error) {
			mu.Lock()
			reasons = append(reasons, err)
			mu.Unlock()
		},
	}, 0, nil)
	first := startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.BackoffBase, c.BackoffCap = time.Minute, time.Minute // stay away once replaced
	})
	waitConnected(t, first, 5*time.Second)
	s1 := h.srv.Session("n1")
	second := startClient(t, p, h.addr, "n1", nil)
	waitConnected(t, second, 5*time.Second)
	waitFor(t, 3*time.Second, "first session replaced", func() bool {
		s := h.srv.Session("n1")
		return s != nil && s != s1 && !first.Connected()
	})
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) != 1 || !errors.Is(reasons[0], ErrReplaced) {
		t.Fatalf("OnDisconnect reasons %v, want [ErrReplaced]", reasons)
	}
	if n := h.srv.Stats().Sessions; n != 1 {
		t.Fatalf("%d sessions", n)
	}
}

func TestHandshakeRateLimit(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		const rate, burst, edges = 5.0, 2, 14
		var connects events
		h := startMemHub(t, n, p, ServerConfig{
			HandshakesPerSecond: rate,
			HandshakeBurst:      burst,
			OnConnect:           func(*Session) { connects.add(nil) },
		}, memHubAddr)
		start := time.Now()
		for i := range edges {
			startMemClient(t, n, p, h.addr, fmt.Sprint("r", i), func(c *ClientConfig) {
				c.BackoffBase, c.BackoffCap = 200*time.Millisecond, time.Second
			})
		}
		time.Sleep(time.Minute)
		if got := h.srv.Stats().Sessions; got != edges {
			t.Fatalf("%d of %d edges connected after a minute", got, edges)
		}
		st := h.srv.Stats()
		at := connects.times()
		peak := 0
		for i := range at {
			k := 0
			for j := i; j < len(at) && at[j].Sub(at[i]) < time.Second; j++ {
				k++
			}
			peak = max(peak, k)
		}
		t.Logf("%d edges in %v; peak %d sessions/s (rate %.0f/s, burst %d); %d handshakes admitted, %d refused",
			edges, at[len(at)-1].Sub(start), peak, rate, burst, st.Handshakes, st.HandshakesRefused)
		if peak > int(rate)+burst {
			t.Fatalf("peak %d/s exceeds rate %v + burst %d", peak, rate, burst)
		}
		if st.HandshakesRefused == 0 {
			t.Fatal("no handshake refused")
		}
		if st.Handshakes != edges {
			t.Fatalf("admitted %d handshakes for %d edges", st.Handshakes, edges)
		}
	})
}

func TestDialCap(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{MaxDialsPerEdge: 3}, 0, nil)
	echo := echoServer(t)
	c := startClient(t, p, h.addr, "n1", nil)
	waitConnected(t, c, 5*time.Second)
	ctx := context.Background()
	var conns []net.Conn
	for range 3 {
		conn, err := h.srv.Dial(ctx, "n1", "tcp:"+echo)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	start := time.Now()
	if _, err := h.srv.Dial(ctx, "n1", "tcp:"+echo); !errors.Is(err, ErrTooManyDials) {
		t.Fatalf("4th dial: %v, want ErrTooManyDials", err)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Fatalf("refusal took %v", d)
	}
	conns[0].Close()
	conn, err := h.srv.Dial(ctx, "n1", "tcp:"+echo)
	if err != nil {
		t.Fatalf("dial after a close: %v", err)
	}
	if err := roundTrip(conn, 1000); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns[1:] {
		c.Close()
	}
	if _, err := h.srv.Dial(ctx, "nobody", "tcp:"+echo); !errors.Is(err, ErrNoSession) {
		t.Fatalf("dial to unknown node: %v", err)
	}
	if st := h.srv.Stats(); st.DialsRefused != 1 || st.Dials != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStreamCap(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{MaxStreamsPerEdge: 4}, 0, nil)
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := h.srv.Listener().Accept()
			if err != nil {
				return
			}
			c.Write([]byte("y")) // tell the edge the stream is accepted
			accepted <- c
		}
	}()
	transports(t, func(t *testing.T, tcp bool) {
		node := "s-" + map[bool]string{false: "q", true: "t"}[tcp]
		c := startClient(t, p, h.addr, node, func(c *ClientConfig) { c.ForceTCP = tcp })
		waitConnected(t, c, 5*time.Second)
		open := func(d time.Duration) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			conn, err := c.DialContext(ctx, "tcp", "hub")
			if err != nil {
				return nil, err
			}
			if _, err := conn.Write([]byte("x")); err != nil {
				conn.Close()
				return nil, err
			}
			conn.SetReadDeadline(time.Now().Add(d))
			var b [1]byte
			if _, err := io.ReadFull(conn, b[:]); err != nil {
				conn.Close()
				return nil, err
			}
			conn.SetReadDeadline(time.Time{})
			return conn, nil
		}
		var edgeSide, hubSide []net.Conn
		for range 4 {
			conn, err := open(3 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			edgeSide = append(edgeSide, conn)
			hubSide = append(hubSide, <-accepted)
		}
		_, err := open(500 * time.Millisecond)
		switch {
		case err == nil:
			t.Fatal("a 5th concurrent stream was accepted")
		case tcp:
			// yamux has no stream credit: the hub resets the excess stream.
			var re *ResetError
			if !errors.As(err, &re) || re.Code != codeTooManyStreams {
				t.Fatalf("5th stream: %v, want a reset with code too-many-streams", err)
			}
		default:
			// QUIC withholds stream credit: the edge waits until its ctx ends.
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("5th stream: %v, want a deadline", err)
			}
		}
		edgeSide[0].Close()
		hubSide[0].Close()
		conn, err := open(3 * time.Second)
		if err != nil {
			t.Fatalf("stream after a close: %v", err)
		}
		conn.Close()
		(<-accepted).Close()
		for i := 1; i < 4; i++ {
			edgeSide[i].Close()
			hubSide[i].Close()
		}
	})
}

func TestResetAndDialErrors(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	// A local server that resets every connection after reading a line.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				bufio.NewReader(c).ReadString('\n')
				c.Write([]byte("partial"))
				abortConn(c)
			}()
		}
	}()
	closed, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := closed.Addr().String()
	closed.Close()
	transports(t, func(t *testing.T, tcp bool) {
		node := "e-" + map[bool]string{false: "q", true: "t"}[tcp]
		c := startClient(t, p, h.addr, node, func(c *ClientConfig) { c.ForceTCP = tcp })
		waitConnected(t, c, 5*time.Second)
		ctx := context.Background()

		conn, err := h.srv.Dial(ctx, node, "tcp:"+ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write([]byte("hello\n"))
		got, err := io.ReadAll(conn)
		var re *ResetError
		if !errors.As(err, &re) || !re.Remote {
			t.Fatalf("read after the edge-local conn was reset: %q, %v; want a remote *ResetError", got, err)
		}

		conn2, err := h.srv.Dial(ctx, node, "tcp:"+refusedAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn2.Close()
		conn2.Write([]byte("GET / HTTP/1.1\r\n\r\n")) // optimistic write before the status
		_, err = conn2.Read(make([]byte, 10))
		var de *DialError
		if !errors.As(err, &de) || !strings.Contains(de.Msg, "refused") {
			t.Fatalf("read on a refused dial: %v, want *DialError", err)
		}

		conn3, err := h.srv.Dial(ctx, node, "bogus")
		if err != nil {
			t.Fatal(err)
		}
		defer conn3.Close()
		if _, err := conn3.Read(make([]byte, 1)); !errors.As(err, &de) {
			t.Fatalf("read on an unsupported target: %v", err)
		}
	})
}

func TestDeadlines(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	transports(t, func(t *testing.T, tcp bool) {
		node := "dl-" + map[bool]string{false: "q", true: "t"}[tcp]
		c := startClient(t, p, h.addr, node, func(c *ClientConfig) { c.ForceTCP = tcp })
		waitConnected(t, c, 5*time.Second)
		conn, err := c.DialContext(context.Background(), "tcp", "hub")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write([]byte("x"))
		hub, err := h.srv.Listener().Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer hub.Close()
		if _, err := io.ReadFull(hub, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if peer, ok := PeerOf(hub); !ok || peer.Node != node {
			t.Fatalf("PeerOf = %+v, %v", peer, ok)
		}
		if _, ok := PeerOf(conn); ok {
			t.Fatal("PeerOf on an edge-side conn")
		}
		for _, side := range []net.Conn{conn, hub} {
			side.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			start := time.Now()
			_, err := side.Read(make([]byte, 10))
			if !isTimeout(err) || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past deadline: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("deadline fired after %v", d)
			}
			side.SetReadDeadline(time.Time{})
		}
		// After a deadline the conn still works.
		hub.Write([]byte("ok"))
		b := make([]byte, 2)
		if _, err := io.ReadFull(conn, b); err != nil || string(b) != "ok" {
			t.Fatalf("read after deadline: %q, %v", b, err)
		}
		// Close: the peer reads EOF after the data.
		hub.Write([]byte("bye"))
		hub.Close()
		rest, err := io.ReadAll(conn)
		if err != nil || string(rest) != "bye" {
			t.Fatalf("after peer close: %q, %v", rest, err)
		}
		if _, err := hub.Read(b); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read after local close: %v", err)
		}
	})
}

// A QUIC server keeps no state for a refused connection, so when a client
// retransmits its Initial before the refusal reaches it, the retransmission
// arrives as a new attempt. It must be refused again without spending a
// token that a waiting edge could use.
func TestRefusedInitialRetransmitSpendsNoToken(t *testing.T) {
	// In fake time: the bucket refills exactly as the sleeps say.
	fakeTime(t, func(t *testing.T) {
		p := newPKI(t)
		s, err := NewServer(ServerConfig{TLS: p.serverTLS(), HandshakesPerSecond: 20, HandshakeBurst: 1})
		if err != nil {
			t.Fatal(err)
		}
		a := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4000}
		b := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4001}
		if err := s.admit(a); err != nil {
			t.Fatalf("first attempt: %v", err)
		}
		if err := s.admit(b); err == nil {
			t.Fatal("second attempt admitted with an empty bucket")
		}
		time.Sleep(100 * time.Millisecond) // the bucket refills (one token per 50 ms)
		if err := s.admit(b); err == nil {
			t.Fatal("retransmission of a refused attempt admitted")
		}
		c := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4002}
		if err := s.admit(c); err != nil {
			t.Fatalf("new attempt after the refill: %v", err)
		}
		st := s.Stats()
		if st.Handshakes != 2 || st.HandshakesRefused != 2 {
			t.Fatalf("admitted %d refused %d, want 2 and 2", st.Handshakes, st.HandshakesRefused)
		}
		// TCP attempts carry no address to remember and are judged by the
		// bucket alone.
		time.Sleep(100 * time.Millisecond)
		if err := s.admit(nil); err != nil {
			t.Fatalf("tcp attempt: %v", err)
		}
	})
}
