package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/time/rate"
)

// ALPN is the protocol name the tunnel negotiates, over QUIC and over the
// TCP+TLS fallback alike.
const ALPN = "tether-tunnel/1"

// TargetNode is the dial target for the agent's own node server. Other
// targets are "tcp:HOST:PORT", a TCP address as seen from the edge.
const TargetNode = "node"

// Errors callers branch on.
var (
	// ErrNoSession: the node has no tunnel connected to this hub.
	ErrNoSession = errors.New("tunnel: node not connected")
	// ErrTooManyDials: the node already has MaxDialsPerEdge hub-opened streams.
	ErrTooManyDials = errors.New("tunnel: too many concurrent dials to node")
	// ErrReplaced is passed to OnDisconnect when a newer connection of the
	// same node took over.
	ErrReplaced = errors.New("tunnel: replaced by a newer connection")
	// ErrServerClosed is returned by calls on a closed Server.
	ErrServerClosed = errors.New("tunnel: server closed")
)

// Peer is the authenticated other end of a tunnel connection.
type Peer struct {
	// Node is the edge's node name (empty when the peer is the hub).
	Node string
	// Certificates is the peer's certificate chain, leaf first.
	Certificates []*x509.Certificate
	// Transport is TransportQUIC or TransportTCP.
	Transport string
	// Addr is the hub address the edge dialed (edge side only).
	Addr string
}

// ServerConfig configures the hub side. Zero values mean the documented
// defaults.
type ServerConfig struct {
	// TLS holds the hub certificate and ClientCAs (the node CA). The tunnel
	// works on a clone: it sets NextProtos to ALPN and requires and verifies
	// client certificates itself. Required.
	TLS *tls.Config
	// Identify maps a verified client certificate to a node name; an error
	// refuses the connection during the handshake. If nil, the leaf's
	// common name must read "system:node:NAME".
	Identify func(state tls.ConnectionState) (node string, err error)
	// KeepAlive makes the hub send its own QUIC keepalives. If zero, none:
	// the edge's heartbeat keeps NAT mappings and both idle timers alive, so
	// the hub sends only acknowledgements.
	KeepAlive time.Duration
	// IdleTimeout closes a connection without traffic. If zero, 45s.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the QUIC handshake and the hello. If zero, 10s.
	HandshakeTimeout time.Duration
	// HandshakesPerSecond and HandshakeBurst form a token bucket over new
	// connections (QUIC and TCP). A refused QUIC handshake gets an immediate
	// CONNECTION_REFUSED so the edge backs off. If zero, 500/s and a burst of
	// 100; a negative rate disables the limit.
	HandshakesPerSecond float64
	HandshakeBurst      int
	// MaxStreamsPerEdge caps concurrent edge-opened streams per edge. Over
	// QUIC the edge waits for stream credit; over TCP excess streams are
	// reset. If zero, 1000.
	MaxStreamsPerEdge int
	// MaxDialsPerEdge caps concurrent hub-opened streams per edge; beyond it
	// Dial fails fast with ErrTooManyDials. If zero, 256.
	MaxDialsPerEdge int
	// DialTimeout bounds the wait for the edge's dial status; the stream is
	// reset when it expires. If zero, 10s.
	DialTimeout time.Duration
	// StreamWindow and ConnWindow are the largest receive windows of a
	// stream and of a connection. If zero, 4 MiB and 8 MiB.
	StreamWindow, ConnWindow int
	// MemoryBudget bounds the growth of connection windows across all
	// edges: a window only grows while the sum of all growth stays within
	// it. If zero, 1 GiB; negative means no bound.
	MemoryBudget int64
	// StatelessResetKey, when set, lets the hub answer packets of
	// connections it no longer knows (after a restart) with a stateless
	// reset, so edges notice at once instead of after the idle timeout.
	// Persist it across restarts. If nil, no stateless resets.
	StatelessResetKey *[32]byte
	// DisableFEC turns forward error correction off: no parity packets to
	// edges, and none decoded from them. With it on (the default) the
	// hub's QUIC packets stay at 1280 bytes (no path MTU probing), so that
	// a packet and its parity fit in one datagram.
	DisableFEC bool
	// DisableBulk refuses bulk lanes: streams marked with WithBulk travel
	// on the tunnel, and edges are told not to open lanes.
	DisableBulk bool
	// BulkCongestion is the congestion control set on the hub's end of a
	// bulk lane, which sends the data of hub→edge bulk streams. If empty,
	// "bbr"; where the kernel lacks it the lane keeps the kernel's
	// default, logged and counted in ServerStats.BulkDefaultCongestion.
	BulkCongestion string
	// BulkWindow is the largest receive window of a stream on a bulk
	// lane. If zero, 16 MiB: enough for 200 Mbit/s at 300 ms. It is not
	// held against MemoryBudget.
	BulkWindow int
	// setsockopt sets the lane's congestion control; tests make it fail.
	setsockopt setsockoptString
	// OnConnect and OnDisconnect are called when a session starts and ends.
	// They run on the session's goroutine and must not block for long.
	OnConnect    func(*Session)
	OnDisconnect func(*Session, error)
	// OnHeartbeat is called for each heartbeat received on a control
	// stream, on the session's goroutine; it must not block.
	OnHeartbeat func(*Session)
	// OnReport is called with the payload of each report frame an edge
	// sends (Client.Report), on the session's goroutine; it must not
	// block. The payload is the callee's. If nil, reports are skipped.
	OnReport func(s *Session, payload []byte)
	// OnPush is called with the payload of each push frame an edge sends
	// (Client.Push), in order, on the session's goroutine; it must not
	// block. The payload is the callee's. If nil, pushes are skipped.
	OnPush func(s *Session, payload []byte)
	// Logger receives the server's logs. If nil, slog.Default().
	Logger *slog.Logger
}

func (c *ServerConfig) setDefaults() error {
	if c.TLS == nil {
		return errors.New("tunnel: ServerConfig.TLS is required")
	}
	if c.Identify == nil {
		c.Identify = identifyByCommonName
	}
	setDur(&c.IdleTimeout, 45*time.Second)
	setDur(&c.HandshakeTimeout, 10*time.Second)
	setDur(&c.DialTimeout, 10*time.Second)
	if c.HandshakesPerSecond == 0 {
		c.HandshakesPerSecond = 500
	}
	if c.HandshakeBurst <= 0 {
		c.HandshakeBurst = 100
	}
	setInt(&c.MaxStreamsPerEdge, 1000)
	setInt(&c.MaxDialsPerEdge, 256)
	setInt(&c.StreamWindow, 4<<20)
	setInt(&c.ConnWindow, 8<<20)
	if c.MemoryBudget == 0 {
		c.MemoryBudget = 1 << 30
	}
	if c.BulkCongestion == "" {
		c.BulkCongestion = DefaultBulkCongestion
	}
	setInt(&c.BulkWindow, 16<<20)
	if c.setsockopt == nil {
		c.setsockopt = setsockoptStringOS
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

func setDur(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

func setInt(i *int, def int) {
	if *i <= 0 {
		*i = def
	}
}

// identifyByCommonName is the default Identify.
func identifyByCommonName(state tls.ConnectionState) (string, error) {
	if len(state.PeerCertificates) == 0 {
		return "", errors.New("no client certificate")
	}
	cn := state.PeerCertificates[0].Subject.CommonName
	node, ok := strings.CutPrefix(cn, "system:node:")
	if !ok || node == "" {
		return "", fmt.Errorf("certificate %q does not name a node", cn)
	}
	return node, nil
}

// ServerStats are the hub side's counters.
type ServerStats struct {
	Handshakes        uint64 // connection attempts admitted (QUIC and TCP)
	HandshakesRefused uint64 // attempts refused by the rate limit or a drain
	SessionsRefused   uint64 // admitted connections refused later (identity, hello)
	Sessions          int    // edges connected now
	FallbackSessions  int    // of which over TCP
	StreamsOpened     uint64 // edge-opened streams handed to Listener
	Dials             uint64 // hub-opened streams
	DialsRefused      uint64 // Dial calls refused by MaxDialsPerEdge
	WindowReserved    int64  // connection-window growth held against MemoryBudget
	WindowDenied      uint64 // window increases refused by MemoryBudget
	// PeakHandshakesPerSecond is the most connection attempts admitted
	// within one calendar second since the server started: what the
	// admission token bucket let through at its busiest.
	PeakHandshakesPerSecond uint64
	// FEC counts the parity the hub sent and what it rebuilt from the
	// edges' parity.
	FEC FECStats
	// BulkLanes is the number of bulk lanes open now; BulkStreams counts
	// the streams that travelled on lanes, both ways; and
	// BulkDefaultCongestion counts lanes whose hub end kept the kernel's
	// congestion control because BulkCongestion could not be set.
	BulkLanes             int
	BulkStreams           uint64
	BulkDefaultCongestion uint64
}

// Server is the hub side of the tunnel. Its methods are safe for concurrent
// use.
type Server struct {
	cfg          ServerConfig
	log          *slog.Logger
	quicTLS      *tls.Config
	limiter      *rate.Limiter // nil: no limit
	refusedAddrs refusedSet
	peak         peakMeter
	budget       *windowBudget
	ln           *listener

	closedCh chan struct{}

	mu sync.Mutex // guards the following fields
	// sessions holds the current session of every connected node.
	sessions   map[string]*Session
	changed    chan struct{} // closed and replaced whenever sessions changes
	draining   bool
	closed     bool
	transports map[*quic.Transport]*fecConn // nil value: no FEC on that socket
	pending    map[muxConn]struct{}         // connections not yet sessions
	fecFolded  FECStats                     // counters of closed sockets

	handshakes, refused, sessRefused atomic.Uint64
	streams, dials, dialsRefused     atomic.Uint64
	bulkLanesOpen                    atomic.Int64
	bulkStreams, bulkDefaultCC       atomic.Uint64
}

// NewServer checks cfg and returns a server that serves nothing until
// ServeQUIC or ServeConn is called.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger.With("component", "tunnel"),
		budget:     newWindowBudget(cfg.MemoryBudget),
		ln:         newListener(),
		closedCh:   make(chan struct{}),
		sessions:   make(map[string]*Session),
		changed:    make(chan struct{}),
		transports: make(map[*quic.Transport]*fecConn),
		pending:    make(map[muxConn]struct{}),
	}
	if cfg.HandshakesPerSecond > 0 {
		s.limiter = rate.NewLimiter(rate.Limit(cfg.HandshakesPerSecond), cfg.HandshakeBurst)
	}
	t := cfg.TLS.Clone()
	t.NextProtos = []string{ALPN}
	t.ClientAuth = tls.RequireAndVerifyClientCert
	t.MinVersion = tls.VersionTLS13
	verify := t.VerifyConnection
	t.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		// Refusing inside the handshake sends a TLS alert, which the edge
		// sees as a refusal (back off) rather than as UDP trouble (fall back).
		if _, err := s.cfg.Identify(cs); err != nil {
			s.sessRefused.Add(1)
			return fmt.Errorf("identify node: %w", err)
		}
		return nil
	}
	s.quicTLS = t
	return s, nil
}

func (s *Server) quicConfig() *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           s.cfg.HandshakeTimeout,
		MaxIdleTimeout:                 s.cfg.IdleTimeout,
		KeepAlivePeriod:                s.cfg.KeepAlive,
		InitialStreamReceiveWindow:     uint64(min(256<<10, s.cfg.StreamWindow)),
		MaxStreamReceiveWindow:         uint64(s.cfg.StreamWindow),
		InitialConnectionReceiveWindow: uint64(min(512<<10, s.cfg.ConnWindow)),
		MaxConnectionReceiveWindow:     uint64(s.cfg.ConnWindow),
		AllowConnectionWindowIncrease:  s.budget.allow,
		// One more than the cap: the control stream is an edge-opened stream too.
		MaxIncomingStreams:      int64(s.cfg.MaxStreamsPerEdge) + 1,
		MaxIncomingUniStreams:   -1,
		DisablePathMTUDiscovery: !s.cfg.DisableFEC,
	}
}

// admit applies the drain state and the handshake token bucket to a new
// connection attempt. from is the attempt's source address for QUIC, whose
// Initial packets a client retransmits until it hears the refusal, and nil
// for TCP.
func (s *Server) admit(from net.Addr) error {
	s.mu.Lock()
	draining, closed := s.draining, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		s.refused.Add(1)
		return ErrServerClosed
	case draining:
		s.refused.Add(1)
		return errors.New("tunnel: draining")
	case from != nil && s.limiter != nil && s.refusedAddrs.recent(from.String(), time.Now()):
		// A refused connection leaves no state in the QUIC server, so a
		// retransmission of its Initial looks like a new attempt. Refuse
		// it again rather than spend a token on a connection whose client
		// has already been told no; clients retry from a new socket.
		s.refused.Add(1)
		return errors.New("tunnel: handshake rate limit")
	case s.limiter != nil && !s.limiter.Allow():
		s.refused.Add(1)
		if from != nil {
			s.refusedAddrs.add(from.String(), time.Now())
		}
		return errors.New("tunnel: handshake rate limit")
	}
	s.handshakes.Add(1)
	s.peak.add(time.Now())
	return nil
}

// ServeQUIC serves edges over QUIC on pc until ctx is done or Close is
// called; it then closes pc and returns nil. pc must not be used by anyone
// else.
func (s *Server) ServeQUIC(ctx context.Context, pc net.PacketConn) error {
	var fc *fecConn
	sock := pc // what QUIC reads and writes: pc, or pc under forward error correction
	if !s.cfg.DisableFEC {
		fc = newFECConn(pc)
		sock = fc.socket()
	}
	tr := &quic.Transport{
		Conn: sock,
		ConnContext: func(ctx context.Context, info *quic.ClientInfo) (context.Context, error) {
			return ctx, s.admit(info.RemoteAddr)
		},
	}
	if s.cfg.StatelessResetKey != nil {
		k := quic.StatelessResetKey(*s.cfg.StatelessResetKey)
		tr.StatelessResetKey = &k
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		pc.Close()
		return ErrServerClosed
	}
	s.transports[tr] = fc
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.transports, tr)
		if fc != nil {
			s.fecFolded.add(fc.Stats())
		}
		s.mu.Unlock()
		tr.Close()
		sock.Close()
	}()
	ql, err := tr.Listen(s.quicTLS, s.quicConfig())
	if err != nil {
		return fmt.Errorf("listen quic: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closedCh:
		}
		ql.Close()
	}()
	s.log.Info("serving quic", "addr", pc.LocalAddr())
	for {
		conn, err := ql.Accept(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
				return nil
			case <-s.closedCh:
				return nil
			default:
			}
			return fmt.Errorf("accept quic: %w", err)
		}
		go func() {
			defer s.budget.release(conn)
			var t *fecTrack
			if fc != nil {
				t = fc.track(conn, false)
			}
			s.serve(quicMux{c: conn, fec: t})
		}()
	}
}

// ServeConn runs the TCP+TLS fallback on c, whose handshake negotiated
// ALPN; the hub calls it from http.Server.TLSNextProto[ALPN] on its API
// port. It blocks until the session ends and closes c.
func (s *Server) ServeConn(c *tls.Conn) {
	if err := s.admit(nil); err != nil {
		c.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
	err := c.HandshakeContext(ctx)
	cancel()
	if err == nil {
		err = s.verifyFallbackPeer(c.ConnectionState())
	}
	if err != nil {
		s.sessRefused.Add(1)
		s.log.Info("refused tcp tunnel", "remote", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	// The API server's handshake deadlines must not leak into the session.
	c.SetDeadline(time.Time{})
	m, err := newYamuxMux(c, false, s.cfg.StreamWindow)
	if err != nil {
		c.Close()
		return
	}
	s.serve(m)
}

// verifyFallbackPeer checks the client certificate of a fallback
// connection. The API port may only request client certificates (kubectl
// users authenticate with tokens), so the chain is verified here against
// ClientCAs unless the TLS stack already did.
func (s *Server) verifyFallbackPeer(cs tls.ConnectionState) error {
	if cs.NegotiatedProtocol != ALPN {
		return fmt.Errorf("negotiated protocol %q, not %q", cs.NegotiatedProtocol, ALPN)
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	if len(cs.VerifiedChains) == 0 {
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		chains, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots:         s.cfg.TLS.ClientCAs,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return fmt.Errorf("verify client certificate: %w", err)
		}
		cs.VerifiedChains = chains
	}
	if _, err := s.cfg.Identify(cs); err != nil {
		return fmt.Errorf("identify node: %w", err)
	}
	return nil
}

// Listener returns the listener of edge-opened streams from all edges. Its
// conns carry HTTP/1.1 API requests and satisfy PeerOf. Closing it stops
// the delivery of new streams (they are reset) but not the server.
func (s *Server) Listener() net.Listener { return s.ln }

// Session returns the node's current session, or nil.
func (s *Server) Session(node string) *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[node]
}

// Sessions returns all current sessions.
func (s *Server) Sessions() []*Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		out = append(out, ss)
	}
	return out
}

// Dial opens a stream to target on node's edge: TargetNode or
// "tcp:HOST:PORT". It returns as soon as the request is on its way; the
// caller may write at once. A ctx marked with WithBulk puts the stream on
// the node's bulk lane; without one, the hub asks the edge to open one
// and waits for it (at most HandshakeTimeout). If the edge cannot connect the target, Read
// and Write return a *DialError. It fails with ErrNoSession when the node
// is not connected and with ErrTooManyDials at the per-edge cap.
func (s *Server) Dial(ctx context.Context, node, target string) (net.Conn, error) {
	sess := s.Session(node)
	if sess == nil {
		return nil, fmt.Errorf("dial %s on node %s: %w", target, node, ErrNoSession)
	}
	return sess.dial(ctx, target)
}

// Probe asks node's agent to answer over its current session: it opens a
// stream to TargetNode and waits for the agent's dial status. Nil means the
// agent answered; an error means it did not before ctx ended or its
// session could not carry the stream. Heartbeats only say the agent was
// alive up to its last one; a probe asks now.
func (s *Server) Probe(ctx context.Context, node string) error {
	c, err := s.Dial(ctx, node, TargetNode)
	if err != nil {
		return err
	}
	sc := c.(*streamConn)
	defer sc.Close()
	answered := make(chan error, 1)
	go func() { answered <- sc.waitDial() }()
	select {
	case err := <-answered:
		return err
	case <-ctx.Done():
		return fmt.Errorf("probe node %s: %w", node, ctx.Err())
	}
}

// goAwayWriters bounds the goaways Drain writes at once.
const goAwayWriters = 32

// Drain sends every edge a GoAway with the reconnect window, refuses new
// connections, and returns once all edges are gone or ctx is done.
func (s *Server) Drain(ctx context.Context, window time.Duration) error {
	s.mu.Lock()
	s.draining = true
	sessions := make([]*Session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	s.log.Info("draining", "sessions", len(sessions), "window", window)
	// The goaways go out a few at a time, each bounded by ctx: over TCP a
	// write waits for the edge's window, and one stuck edge must not hold
	// up the others or the drain.
	began := time.Now()
	deadline := time.Now().Add(s.cfg.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	next := make(chan *Session)
	var wg sync.WaitGroup
	for range min(goAwayWriters, len(sessions)) {
		wg.Go(func() {
			for ss := range next {
				ss.goAway(deadline, window)
			}
		})
	}
	for _, ss := range sessions {
		next <- ss
	}
	close(next)
	wg.Wait()
	s.log.Debug("sent goaways", "sessions", len(sessions), "took", time.Since(began).Round(time.Millisecond))
	for {
		s.mu.Lock()
		n, ch := len(s.sessions), s.changed
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("drain with %d edges left: %w", n, ctx.Err())
		}
	}
}

// closeWait bounds how long Close waits for the sessions' close frames.
const closeWait = 3 * time.Second

// Close disconnects every edge and stops all serving; it is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	began := time.Now()
	sessions := make([]*Session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	pending := make([]muxConn, 0, len(s.pending))
	for m := range s.pending {
		pending = append(pending, m)
	}
	s.mu.Unlock()
	for _, m := range pending {
		m.close(codeShutdown, "hub shutting down")
	}
	// Sessions first, each with its close frame: closedCh stops the QUIC
	// transports, which would drop their connections without one.
	// The wait is bounded: a session whose close is stuck on its peer
	// must not hold up the hub's stop; closing the transports below ends
	// it without a close frame.
	var left atomic.Int64
	left.Store(int64(len(sessions)))
	allClosed := make(chan struct{})
	for _, ss := range sessions {
		go func() {
			ss.teardown(codeShutdown, ErrServerClosed)
			if left.Add(-1) == 0 {
				close(allClosed)
			}
		}()
	}
	if len(sessions) > 0 {
		t := time.NewTimer(closeWait)
		select {
		case <-allClosed:
		case <-t.C:
		}
		t.Stop()
	}
	s.log.Info("closed sessions", "sessions", len(sessions), "unfinished", left.Load(), "took", time.Since(began).Round(time.Millisecond))
	close(s.closedCh)
	s.ln.Close()
	return nil
}

// Stats returns the server's counters; it is cheap.
func (s *Server) Stats() ServerStats {
	st := ServerStats{
		Handshakes:              s.handshakes.Load(),
		PeakHandshakesPerSecond: s.peak.max(),
		HandshakesRefused:       s.refused.Load(),
		SessionsRefused:         s.sessRefused.Load(),
		StreamsOpened:           s.streams.Load(),
		Dials:                   s.dials.Load(),
		DialsRefused:            s.dialsRefused.Load(),
		WindowReserved:          s.budget.used.Load(),
		WindowDenied:            s.budget.denied.Load(),
		BulkLanes:               int(s.bulkLanesOpen.Load()),
		BulkStreams:             s.bulkStreams.Load(),
		BulkDefaultCongestion:   s.bulkDefaultCC.Load(),
	}
	s.mu.Lock()
	st.FEC = s.fecFolded
	for _, fc := range s.transports {
		if fc != nil {
			st.FEC.add(fc.Stats())
		}
	}
	st.Sessions = len(s.sessions)
	for _, ss := range s.sessions {
		if ss.peer.Transport == TransportTCP {
			st.FallbackSessions++
		}
	}
	s.mu.Unlock()
	return st
}

// notifyLocked wakes Drain; s.mu must be held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}
