package tunnel

import (
	"context"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go/testutils/simnet"
)

// memNet is an in-memory network for tests inside a testing/synctest
// bubble, where real sockets do not work and time is fake: UDP endpoints
// are simnet connections (as quic-go tests itself) routed by address, and
// TCP connections are net.Pipe pairs. Every goroutine and timer it starts
// lives in the bubble of its caller.
//
// UDP to an address nobody listens on is dropped silently, like a datagram
// to a host whose firewall drops it; TCP to such an address is refused.
type memNet struct {
	delay time.Duration // one-way latency of every datagram
	// deep makes receive queues apply back-pressure instead of dropping
	// what does not fit in 32 datagrams: in fake time a burst arrives in
	// one instant, which no real socket buffer sees.
	deep bool

	mu        sync.Mutex
	udp       map[string]simnet.PacketReceiver
	tcp       map[string]*pipeListener
	blackhole map[string]bool // UDP to and from these hosts is dropped
	tcpHole   map[string]bool // TCP to these hosts hangs, and their conns stop
	loss      float64         // share of datagrams dropped at random
	frozen    []*freezeConn   // TCP conns that stop while their host is blackholed
	nextPort  int
}

func newMemNet(delay time.Duration) *memNet {
	return &memNet{
		delay:     delay,
		udp:       make(map[string]simnet.PacketReceiver),
		tcp:       make(map[string]*pipeListener),
		blackhole: make(map[string]bool),
		tcpHole:   make(map[string]bool),
		nextPort:  40000,
	}
}

// SendPacket routes a datagram; it implements simnet.Router.
func (n *memNet) SendPacket(p simnet.Packet) error {
	n.mu.Lock()
	to, ok := n.udp[p.To.String()]
	drop := !ok || n.blackhole[host(p.To)] || n.blackhole[host(p.From)] ||
		(n.loss > 0 && rand.Float64() < n.loss)
	n.mu.Unlock()
	if drop {
		return nil
	}
	if n.delay <= 0 {
		to.RecvPacket(p)
		return nil
	}
	time.AfterFunc(n.delay, func() { to.RecvPacket(p) })
	return nil
}

// AddNode binds addr; it implements simnet.Router. A later bind of the
// same address (a restarted hub) replaces the earlier one.
func (n *memNet) AddNode(addr net.Addr, r simnet.PacketReceiver) {
	n.mu.Lock()
	n.udp[addr.String()] = r
	n.mu.Unlock()
}

func host(a net.Addr) string {
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return h
}

// listenUDP opens a UDP endpoint on addr, "HOST:0" for a fresh port.
func (n *memNet) listenUDP(addr string) net.PacketConn {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		panic(err)
	}
	if ua.Port == 0 {
		n.mu.Lock()
		n.nextPort++
		ua.Port = n.nextPort
		n.mu.Unlock()
	}
	if n.deep {
		return simnet.NewBlockingSimConn(ua, n)
	}
	return simnet.NewSimConn(ua, n)
}

// setBlackhole makes the host unreachable (on) or reachable again: UDP to
// and from it is dropped, established TCP conns to it stop carrying bytes
// in either direction, and new TCP dials to it hang.
func (n *memNet) setBlackhole(h string, on bool) {
	n.mu.Lock()
	n.blackhole[h] = on
	n.tcpHole[h] = on
	conns := n.frozen
	n.mu.Unlock()
	for _, c := range conns {
		if c.host == h {
			c.setFrozen(on)
		}
	}
}

// blockUDP drops UDP to and from the host (on) or lets it through again,
// as a firewall that blocks only UDP does.
func (n *memNet) blockUDP(h string, on bool) {
	n.mu.Lock()
	n.blackhole[h] = on
	n.mu.Unlock()
}

func (n *memNet) setLoss(p float64) {
	n.mu.Lock()
	n.loss = p
	n.mu.Unlock()
}

// listenTCP opens a TCP listener on addr.
func (n *memNet) listenTCP(addr string) *pipeListener {
	l := &pipeListener{n: n, addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
	n.mu.Lock()
	n.tcp[addr] = l
	n.mu.Unlock()
	return l
}

// dialTCP connects to a listener on addr: refused when nobody listens, a
// hang until ctx ends when the host is blackholed.
func (n *memNet) dialTCP(ctx context.Context, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.tcp[addr]
	ta, _ := net.ResolveTCPAddr("tcp", addr)
	hole := ta != nil && n.tcpHole[ta.IP.String()]
	n.mu.Unlock()
	if hole {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	a, b := net.Pipe()
	fa := newFreezeConn(a, ta.IP.String())
	fb := newFreezeConn(b, ta.IP.String())
	n.mu.Lock()
	n.frozen = append(n.frozen, fa, fb)
	n.mu.Unlock()
	select {
	case l.conns <- fb:
		return fa, nil
	case <-l.done:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case <-ctx.Done():
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
	}
}

// pipeListener is a net.Listener of net.Pipe conns.
type pipeListener struct {
	n     *memNet
	addr  string
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.n.mu.Lock()
		if l.n.tcp[l.addr] == l {
			delete(l.n.tcp, l.addr)
		}
		l.n.mu.Unlock()
	})
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.addr) }

type pipeAddr string

func (a pipeAddr) Network() string { return "tcp" }
func (a pipeAddr) String() string  { return string(a) }

// freezeConn is one end of a net.Pipe whose bytes stop flowing, without an
// error, while its host is blackholed: both ends swallow their writes, so
// reads wait. Freeze it only while the bubble is idle (after
// synctest.Wait), so that no message is cut in two.
//
// Its writes take no time: yamux reads a frame's body while it holds the
// stream's lock, and a goroutine waiting for a mutex does not count as
// durably blocked, so a body still in flight when the bubble's other
// goroutines wait for that lock would keep fake time from advancing.
type freezeConn struct {
	net.Conn
	host string

	mu       sync.Mutex
	frozen   bool
	closing  sync.Once
	closedCh chan struct{} // closed by Close
}

func newFreezeConn(c net.Conn, host string) *freezeConn {
	return &freezeConn{Conn: c, host: host, closedCh: make(chan struct{})}
}

func (c *freezeConn) setFrozen(on bool) {
	c.mu.Lock()
	c.frozen = on
	c.mu.Unlock()
}

func (c *freezeConn) isFrozen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozen
}

func (c *freezeConn) Write(p []byte) (int, error) {
	if c.isFrozen() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// Read does not pass on the peer's close while frozen: over a dark path
// no FIN arrives. It waits for its own Close instead.
func (c *freezeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF && c.isFrozen() {
		<-c.closedCh
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *freezeConn) Close() error {
	c.closing.Do(func() { close(c.closedCh) })
	return c.Conn.Close()
}

// memHub is a Server on one address of a memNet: QUIC on the UDP endpoint
// and the TCP fallback on the TCP listener, reached through a TLS
// handshake that negotiates ALPN as the hub's API port does.
type memHub struct {
	srv  *Server
	addr string
	pc   net.PacketConn
	ln   *pipeListener
	done chan struct{}
}

// startMemHub starts a hub on addr of n until the test ends or stop.
func startMemHub(t *testing.T, n *memNet, p *testPKI, cfg ServerConfig, addr string) *memHub {
	t.Helper()
	if cfg.TLS == nil {
		cfg.TLS = p.serverTLS()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &memHub{srv: srv, addr: addr, pc: n.listenUDP(addr), ln: n.listenTCP(addr), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		if err := srv.ServeQUIC(context.Background(), h.pc); err != nil {
			t.Errorf("ServeQUIC: %v", err)
		}
	}()
	tc := p.serverTLS()
	tc.NextProtos = []string{ALPN}
	tc.ClientAuth = tls.VerifyClientCertIfGiven
	go func() {
		for {
			c, err := h.ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(tls.Server(c, tc))
		}
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *memHub) stop() {
	h.ln.Close()
	h.srv.Close()
	<-h.done
}

// startMemClient runs a client of node against the hub at addr of n, with
// the tunnel's default timers unless mutate changes them.
func startMemClient(t *testing.T, n *memNet, p *testPKI, addr, node string, mutate func(*ClientConfig)) *testClient {
	t.Helper()
	cfg := ClientConfig{
		Addr:         addr,
		TLS:          p.clientTLS(p.node(t, node)),
		Hello:        func() Hello { return Hello{Node: node, Version: "test"} },
		ListenPacket: func() (net.PacketConn, error) { return n.listenUDP("10.0.1.1:0"), nil },
		DialTCP:      n.dialTCP,
		Logger:       testLogger(t),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testClient{Client: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tc.done)
		c.Run(ctx)
	}()
	t.Cleanup(tc.stop)
	return tc
}

// memHubAddr is where memNet tests run their hub.
const memHubAddr = "10.0.0.1:6443"
