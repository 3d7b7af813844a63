package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

// ClientConfig configures the edge side. Zero values mean the documented
// defaults.
type ClientConfig struct {
	// Addr is the hub's host:port: QUIC over UDP to it, and the TCP+TLS
	// fallback to the same host:port. Required.
	Addr string
	// Addrs, when set, returns the host:port of every hub of the fleet
	// the client may use besides Addr (hubs sharing one store). The
	// client keeps one connection, to one hub; when a connect fails, its
	// connection is lost or its hub drains, it moves to the next hub of a
	// shuffled order of Addr and these, so the edges of a lost hub spread
	// over the others. It is called before each move and must not block.
	// The TLS server name of a hub other than Addr's is its host.
	Addrs func() []string
	// TLS holds RootCAs (the pinned hub CA) and GetClientCertificate, which
	// is called on every handshake so that renewed certificates are used.
	// The tunnel works on a clone with NextProtos set to ALPN. Required.
	TLS *tls.Config
	// Hello is called at every connect. Its Node must be the node that the
	// client certificate names, or the hub refuses the connection.
	// Required.
	Hello func() Hello
	// HeartbeatInterval is the period of control-stream heartbeats. They
	// double as the NAT keepalive, so an idle edge sends one small packet
	// per interval and nothing else. If zero, 15s; it is lowered to a third
	// of the hub's idle timeout if that is shorter.
	HeartbeatInterval time.Duration
	// DialTarget connects hub-opened streams to their target (TargetNode or
	// "tcp:HOST:PORT"). If nil, DialTCPTarget is used, which serves only
	// "tcp:" targets.
	DialTarget func(ctx context.Context, target string) (net.Conn, error)
	// QUICAttempts is how many consecutive QUIC handshakes must go
	// unanswered before the client falls back to TCP. If zero, 2. A refusal
	// by the hub (rate limit, drain, bad certificate) does not count: the
	// hub was reachable over UDP.
	QUICAttempts int
	// ForceTCP skips QUIC altogether.
	ForceTCP bool
	// PathMTUDiscovery lets QUIC probe for packets larger than 1280
	// bytes. Off by default: on the thin links edges sit behind the probes
	// cost more uplink in a connection's first minutes (about 6 KB) than
	// the larger packets ever save an idle node.
	PathMTUDiscovery bool
	// DisableFEC turns forward error correction off: no parity packets to
	// the hub, and none decoded from it. With it on (the default), a
	// connection whose packets get lost sends parity that lets the hub
	// rebuild a lost packet without a retransmission or a smaller
	// congestion window; packets larger than 1384 bytes (with
	// PathMTUDiscovery) are not covered.
	DisableFEC bool
	// QUICProbeInterval is how often a client on the TCP fallback tries
	// QUIC again; on success it moves over without dropping the session.
	// If zero, 5m.
	QUICProbeInterval time.Duration
	// BackoffBase, BackoffCap and BackoffReset shape the full-jitter
	// exponential reconnect backoff: the n-th wait is uniform in
	// [0, min(cap, base·2^n)), and n resets after a connection lasted
	// BackoffReset. A session that long shows the hub served: losing it is
	// a new outage, whose first attempt is drawn from the base window. A
	// hub that admits edges and drops them soon after keeps the waits
	// growing; a fleet returning together is spread by the jitter and held
	// to the hub's handshake rate by its admission control. If zero, 1s,
	// 60s and, for BackoffReset, the session's idle timeout: three of its
	// heartbeat intervals, each of which the hub answered.
	BackoffBase, BackoffCap, BackoffReset time.Duration
	// HandshakeTimeout bounds a QUIC handshake without any answer, the
	// TCP+TLS handshake, and the wait for the hub's welcome. If zero, 5s.
	HandshakeTimeout time.Duration
	// DialStagger is how long a connect waits for the hub it dials before
	// it dials the next hub of the fleet as well (Addrs); the first to
	// welcome the edge wins. A dead hub then costs the edge this long,
	// not HandshakeTimeout. If zero, 1s.
	DialStagger time.Duration
	// IdleTimeout closes a connection without traffic; the effective value
	// is the smaller of hub's and edge's. If zero, 45s.
	IdleTimeout time.Duration
	// DialWait bounds how long DialContext waits for a connection while
	// disconnected. If zero, 30s.
	DialWait time.Duration
	// StreamWindow and ConnWindow are the largest receive windows of a
	// stream and of the connection. If zero, 4 MiB and 8 MiB.
	StreamWindow, ConnWindow int
	// ListenPacket opens the UDP socket for one QUIC connection attempt; a
	// fresh socket per attempt. If nil, an ephemeral UDP port.
	ListenPacket func() (net.PacketConn, error)
	// DialTCP opens the TCP connection of the fallback. If nil, a
	// net.Dialer.
	DialTCP func(ctx context.Context, addr string) (net.Conn, error)
	// DisableBulk keeps streams marked with WithBulk on the tunnel: the
	// client opens no bulk lane and tells the hub not to ask for one.
	DisableBulk bool
	// BulkCongestion is the congestion control set on a bulk lane's
	// socket. If empty, "bbr". Where the kernel lacks it the lane keeps
	// the kernel's default; that is logged and counted in ClientStats.
	BulkCongestion string
	// BulkMaxRate, in bit/s, caps the pacing rate of the edge's end of a
	// bulk lane (SO_MAX_PACING_RATE). A lane that fills the uplink fills
	// its queue too, and interactive streams wait in it; a cap a little
	// below the uplink's rate keeps that queue empty. If zero, no cap.
	BulkMaxRate int64
	// BulkIdle closes a bulk lane that carried no stream for this long.
	// If zero, 30s.
	BulkIdle time.Duration
	// BulkWindow is the largest receive window of a stream on a bulk
	// lane. If zero, 16 MiB: enough for 200 Mbit/s at 300 ms.
	BulkWindow int
	// setsockopt sets the lane's congestion control; tests make it fail.
	setsockopt setsockoptString
	// OnConnect and OnDisconnect report connection changes; they run on
	// the client's goroutine and must not block for long.
	OnConnect    func(Peer)
	OnDisconnect func(error)
	// Logger receives the client's logs. If nil, slog.Default().
	Logger *slog.Logger
}

func (c *ClientConfig) setDefaults() error {
	if c.Addr == "" {
		return errors.New("tunnel: ClientConfig.Addr is required")
	}
	if c.TLS == nil {
		return errors.New("tunnel: ClientConfig.TLS is required")
	}
	if c.Hello == nil {
		return errors.New("tunnel: ClientConfig.Hello is required")
	}
	if c.DialTarget == nil {
		c.DialTarget = DialTCPTarget
	}
	setDur(&c.HeartbeatInterval, 15*time.Second)
	setInt(&c.QUICAttempts, 2)
	setDur(&c.QUICProbeInterval, 5*time.Minute)
	setDur(&c.BackoffBase, time.Second)
	setDur(&c.BackoffCap, 60*time.Second)
	setDur(&c.HandshakeTimeout, 5*time.Second)
	setDur(&c.DialStagger, time.Second)
	setDur(&c.IdleTimeout, 45*time.Second)
	setDur(&c.DialWait, 30*time.Second)
	setInt(&c.StreamWindow, 4<<20)
	setInt(&c.ConnWindow, 8<<20)
	setDur(&c.BulkIdle, 30*time.Second)
	setInt(&c.BulkWindow, 16<<20)
	if c.BulkCongestion == "" {
		c.BulkCongestion = DefaultBulkCongestion
	}
	if c.setsockopt == nil {
		c.setsockopt = setsockoptStringOS
	}
	if c.ListenPacket == nil {
		c.ListenPacket = func() (net.PacketConn, error) { return net.ListenPacket("udp", ":0") }
	}
	if c.DialTCP == nil {
		c.DialTCP = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// ClientStats are the edge side's counters.
type ClientStats struct {
	// BytesSent and BytesReceived count the wire: for QUIC every UDP
	// datagram including UDP and IP headers; for TCP the TLS bytes (TCP/IP
	// headers and bare ACKs are invisible to user space and not counted).
	BytesSent, BytesReceived uint64
	// PacketsSent and PacketsReceived count QUIC datagrams.
	PacketsSent, PacketsReceived uint64
	Connects                     uint64 // sessions established
	Fallbacks                    uint64 // switches from QUIC to TCP
	Transport                    string // transport of the current session, "" when disconnected
	ReportsSent                  uint64 // report frames written (including the resends after a connect)
	ReportsRefused               uint64 // Report calls refused: payload over MaxReport
	Pushes                       uint64 // push frames written
	// FEC counts parity sent to the hub and what the hub's parity rebuilt.
	FEC FECStats
	// BulkLanes counts bulk lanes opened, BulkStreams the streams the
	// edge opened on them. BulkCongestion is the congestion control of
	// the latest lane's socket; BulkDefaultCongestion counts lanes that
	// kept the kernel's default because BulkCongestion could not be set.
	BulkLanes, BulkStreams uint64
	BulkCongestion         string
	BulkDefaultCongestion  uint64
}

// Client is the edge side of the tunnel. Its methods are safe for
// concurrent use.
type Client struct {
	cfg      ClientConfig
	log      *slog.Logger
	tlsConf  *tls.Config
	quicConf *quic.Config
	running  atomic.Bool

	mu sync.Mutex // guards the following fields
	// cur is the established session, nil while disconnected.
	cur     *clientSession
	changed chan struct{} // closed and replaced whenever cur changes
	// live holds every session that owns sockets, for Stats.
	live   map[*clientSession]struct{}
	folded ClientStats // counters of closed sessions
	// report is the latest payload given to Report; reportGen counts the
	// calls, so that a session knows whether it has sent the latest.
	report    []byte
	reportGen uint64

	connects, fallbacks      atomic.Uint64
	reportsSent, reportsDrop atomic.Uint64
	pushes                   atomic.Uint64
	bulkLanes, bulkStreams   atomic.Uint64
	bulkDefaultCC            atomic.Uint64
	bulkCC                   atomic.Pointer[string]

	// target is the hub address connects dial now; order is the
	// shuffled order of the fleet's addresses moves follow (Run's
	// goroutine only).
	target atomic.Pointer[string]
	order  []string
}

// NewClient checks cfg and returns a client; Run connects it.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	t := cfg.TLS.Clone()
	t.NextProtos = []string{ALPN}
	t.MinVersion = tls.VersionTLS13
	if t.ServerName == "" {
		host, _, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("tunnel: parse hub address: %w", err)
		}
		t.ServerName = host
	}
	cl := &Client{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "tunnel"),
		tlsConf: t,
		quicConf: &quic.Config{
			HandshakeIdleTimeout:           cfg.HandshakeTimeout,
			MaxIdleTimeout:                 cfg.IdleTimeout,
			InitialStreamReceiveWindow:     uint64(min(256<<10, cfg.StreamWindow)),
			MaxStreamReceiveWindow:         uint64(cfg.StreamWindow),
			InitialConnectionReceiveWindow: uint64(min(512<<10, cfg.ConnWindow)),
			MaxConnectionReceiveWindow:     uint64(cfg.ConnWindow),
			// Hub-opened streams; the hub enforces its own, lower cap.
			MaxIncomingStreams:      1024,
			MaxIncomingUniStreams:   -1,
			DisablePathMTUDiscovery: !cfg.PathMTUDiscovery,
		},
		changed: make(chan struct{}),
		live:    make(map[*clientSession]struct{}),
	}
	cl.target.Store(&cl.cfg.Addr)
	return cl, nil
}

var (
	errGoAway        = errors.New("tunnel: hub asked to reconnect (goaway)")
	errMovedToQUIC   = errors.New("tunnel: moved from the TCP fallback to QUIC")
	errClientStopped = errors.New("tunnel: client stopped")
)

// Run keeps a connection to the hub up until ctx is done, then returns
// nil. It may be called once.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("tunnel: Client.Run called twice")
	}
	defer c.setCurrent(nil)
	bo := backoff{base: c.cfg.BackoffBase, cap: c.cfg.BackoffCap}
	var (
		wait      time.Duration // the very first connect goes at once
		next      *clientSession
		quicFails int
		onTCP     = c.cfg.ForceTCP
		fellBack  time.Time
	)
	for {
		if next == nil {
			if !sleepCtx(ctx, wait) {
				return nil
			}
			transport := TransportQUIC
			if onTCP && (c.cfg.ForceTCP || time.Since(fellBack) < c.cfg.QUICProbeInterval) {
				transport = TransportTCP
			}
			cs, err := c.connectFleet(ctx, transport)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				c.log.Info("connect failed", "transport", transport, "addr", c.Addr(), "err", err)
				c.moveOn()
				if transport == TransportQUIC && unanswered(err) {
					quicFails++
					if onTCP || quicFails >= c.cfg.QUICAttempts {
						if !onTCP {
							c.fallbacks.Add(1)
							c.log.Warn("quic unanswered, falling back to tcp", "attempts", quicFails)
						}
						onTCP, fellBack, quicFails = true, time.Now(), 0
						wait = 0
						continue
					}
					// Still jittered, but kept short: nothing reached the hub,
					// and a UDP-blocked edge should reach the fallback fast.
					wait = rand.N(c.cfg.BackoffBase)
					continue
				}
				wait = bo.next()
				continue
			}
			if transport == TransportQUIC {
				onTCP, quicFails = false, 0
			}
			next = cs
		}
		cs := next
		next = nil
		cs.seq = c.connects.Add(1)
		c.setCurrent(cs)
		if c.cfg.OnConnect != nil {
			c.cfg.OnConnect(cs.peer)
		}
		start := time.Now()
		replacement, resumeAt, err := c.hold(ctx, cs)
		if replacement == nil {
			c.setCurrent(nil)
		}
		if c.cfg.OnDisconnect != nil {
			c.cfg.OnDisconnect(err)
		}
		if ctx.Err() != nil {
			if replacement != nil {
				replacement.close(codeConnClosed, errClientStopped)
			}
			return nil
		}
		if time.Since(start) >= c.backoffReset(cs) {
			bo.reset()
		}
		if replacement != nil {
			if replacement.m.transport() == TransportQUIC {
				onTCP, quicFails = false, 0
			}
			next = replacement
			continue
		}
		c.log.Info("disconnected", "addr", cs.addr, "err", err)
		// Another hub of the fleet takes the edge while this one may be
		// gone; with a single hub this keeps Addr.
		c.moveOn()
		// The first attempt after a detected loss is jittered as well, so a
		// fleet that lost the hub together does not return together. A hub
		// that drained before it closed has spread the fleet already: the
		// edge keeps the point in the window it drew.
		wait = bo.next()
		if !resumeAt.IsZero() {
			wait = max(time.Until(resumeAt), 0)
		}
	}
}

// backoffReset returns how long cs must have lasted to reset the reconnect
// backoff: BackoffReset, or by default the session's idle timeout.
func (c *Client) backoffReset(cs *clientSession) time.Duration {
	if c.cfg.BackoffReset > 0 {
		return c.cfg.BackoffReset
	}
	return 3 * cs.heartbeat
}

// hold watches an established session. It returns a replacement session
// when it moved to a new one without a gap (after a goaway or a successful
// QUIC probe), and the reason the old one ended. When the hub closed the
// session after a goaway and before the edge reconnected, resumeAt is the
// time the edge drew in the goaway's window to come back.
func (c *Client) hold(ctx context.Context, cs *clientSession) (replacement *clientSession, resumeAt time.Time, _ error) {
	var probeC <-chan time.Time
	if cs.m.transport() == TransportTCP && !c.cfg.ForceTCP {
		t := time.NewTimer(c.cfg.QUICProbeInterval)
		defer t.Stop()
		probeC = t.C
	}
	probe := make(chan *clientSession, 1)
	probing := false
	for {
		select {
		case <-ctx.Done():
			cs.close(codeConnClosed, errClientStopped)
			return nil, time.Time{}, errClientStopped
		case <-cs.done:
			if probing {
				// The hub drops the old session as soon as the probe's
				// session registers, so the probe may be what ended it.
				if ns := <-probe; ns != nil {
					return ns, time.Time{}, errMovedToQUIC
				}
			}
			return nil, time.Time{}, cs.err
		case w := <-cs.goAway:
			d := time.Duration(0)
			if w > 0 {
				d = rand.N(w)
			}
			c.log.Info("hub draining", "window", w, "reconnect_in", d)
			at := time.Now().Add(d)
			select {
			case <-time.After(d):
			case <-ctx.Done():
				cs.close(codeConnClosed, errClientStopped)
				return nil, time.Time{}, errClientStopped
			case <-cs.done:
				// The hub let go first (it is shutting down): the
				// session is gone, the reconnect stays where it was drawn.
				return nil, at, fmt.Errorf("%w; then closed: %w", errGoAway, cs.err)
			}
			// Make before break: another hub replica may take us now.
			c.moveOn()
			ns, err := c.connectFleet(ctx, cs.m.transport())
			cs.close(codeConnClosed, errGoAway)
			if err != nil {
				return nil, time.Time{}, fmt.Errorf("%w; reconnect: %w", errGoAway, err)
			}
			return ns, time.Time{}, errGoAway
		case <-probeC:
			probing = true
			go func() {
				ns, err := c.connect(ctx, TransportQUIC, cs.addr)
				if err != nil {
					c.log.Debug("quic probe failed", "err", err)
					ns = nil
				}
				probe <- ns
			}()
		case ns := <-probe:
			probing = false
			if ns == nil {
				t := time.NewTimer(c.cfg.QUICProbeInterval)
				defer t.Stop()
				probeC = t.C
				continue
			}
			c.log.Info("quic reachable again, leaving the tcp fallback")
			cs.close(codeConnClosed, errMovedToQUIC)
			return ns, time.Time{}, errMovedToQUIC
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// unanswered reports whether a QUIC connect failed without any answer from
// the hub, the signature of blocked UDP; a refusal proves the opposite.
func unanswered(err error) bool {
	var te *quic.TransportError
	if errors.As(err, &te) && te.Remote {
		return false
	}
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		return false
	}
	var he *quic.HandshakeTimeoutError
	var ie *quic.IdleTimeoutError
	var oe *net.OpError
	return errors.As(err, &he) || errors.As(err, &ie) || errors.As(err, &oe) ||
		errors.Is(err, context.DeadlineExceeded)
}

func (c *Client) setCurrent(cs *clientSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == cs {
		return
	}
	c.cur = cs
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Client) current() (*clientSession, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}

// Connected reports whether a session with the hub is established.
func (c *Client) Connected() bool {
	cs, _ := c.current()
	return cs != nil
}

// WaitConnected blocks until a session is established or ctx is done.
func (c *Client) WaitConnected(ctx context.Context) error {
	for {
		cs, ch := c.current()
		if cs != nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for tunnel: %w", ctx.Err())
		}
	}
}

// errDisconnected is what DialContext returns when no session came up in
// time. It wraps ECONNREFUSED so that client-go treats it as a refused
// connection: reflectors then retry their watch instead of relisting.
func errDisconnected(cause error) error {
	if cause != nil {
		return fmt.Errorf("dial tunnel: hub not connected (%w): %w", cause, syscall.ECONNREFUSED)
	}
	return fmt.Errorf("dial tunnel: hub not connected: %w", syscall.ECONNREFUSED)
}

// DialContext opens an edge→hub stream; it fits rest.Config.Dial, with
// client-go talking plain HTTP/1.1 over it (Host "http://hub"). network and
// addr are ignored: every stream goes to the hub's Listener. While
// disconnected it waits for a session, bounded by ctx and DialWait, then
// fails with an error wrapping syscall.ECONNREFUSED. A ctx marked with
// WithBulk puts the stream on the bulk lane, opening the lane first if
// none is open.
func (c *Client) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, c.cfg.DialWait)
	defer cancel()
	for {
		cs, ch := c.current()
		if cs == nil {
			select {
			case <-ch:
				continue
			case <-wctx.Done():
				return nil, errDisconnected(ctx.Err())
			}
		}
		st, bulk, err := cs.openStream(wctx, IsBulk(ctx))
		if err != nil {
			select {
			case <-cs.done:
				continue // the session died under us: wait for the next one
			default:
			}
			return nil, fmt.Errorf("open tunnel stream: %w", err)
		}
		sc := &streamConn{
			raw:     st,
			local:   cs.m.localAddr(),
			remote:  cs.m.remoteAddr(),
			pending: appendFrame(nil, frameOpen, nil),
		}
		sc.lazy.Store(true)
		if bulk {
			c.bulkStreams.Add(1)
		}
		return sc, nil
	}
}

// Stats returns the client's counters; it is cheap.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	st := c.folded
	for cs := range c.live {
		cs.addStats(&st)
	}
	if c.cur != nil {
		st.Transport = c.cur.m.transport()
	}
	c.mu.Unlock()
	st.Connects = c.connects.Load()
	st.Fallbacks = c.fallbacks.Load()
	st.ReportsSent = c.reportsSent.Load()
	st.ReportsRefused = c.reportsDrop.Load()
	st.Pushes = c.pushes.Load()
	st.BulkLanes = c.bulkLanes.Load()
	st.BulkStreams = c.bulkStreams.Load()
	st.BulkDefaultCongestion = c.bulkDefaultCC.Load()
	if cc := c.bulkCC.Load(); cc != nil {
		st.BulkCongestion = *cc
	}
	return st
}

// Report hands the hub a payload through ServerConfig.OnReport. The client
// remembers only the latest payload: it is sent at once if connected, and
// again on every new connection, so a hub that restarted or that the edge
// moved to learns it too; a payload superseded before it could be sent is
// never sent. Report does not block on the network. A payload larger than
// MaxReport is refused (logged and counted in ClientStats.ReportsRefused)
// and the previous one stays. The caller may reuse payload afterwards.
func (c *Client) Report(payload []byte) {
	if len(payload) > MaxReport {
		c.reportsDrop.Add(1)
		c.log.Error("report refused: payload too large", "bytes", len(payload), "max", MaxReport)
		return
	}
	p := append([]byte{}, payload...)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.report = p
	c.reportGen++
	for cs := range c.live {
		select {
		case cs.reportKick <- struct{}{}:
		default:
		}
	}
}

// latestReport returns the latest payload and its generation (0: none yet).
func (c *Client) latestReport() ([]byte, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.report, c.reportGen
}

// ErrConnChanged is returned by Push when the connection it was given is
// no longer the current one.
var ErrConnChanged = errors.New("tunnel: the connection changed")

// Conn numbers the current connection (from 1, one more for every
// connection the client established), or returns 0 while disconnected.
// A caller that sends a stream of payloads with Push, each encoded against
// the ones before, starts its stream afresh when the number changes: the
// hub sees every connection as new.
func (c *Client) Conn() uint64 {
	cs, _ := c.current()
	if cs == nil {
		return 0
	}
	return cs.seq
}

// Push sends payload to the hub's ServerConfig.OnPush on connection conn
// (a number from Conn), after every payload pushed on it before. It
// returns ErrConnChanged, without sending, when conn is not the current
// connection, and an error when payload is larger than MaxPush or the
// write fails (the connection is then closed). A payload is never resent
// on another connection. Push blocks until the frame is written; the
// caller may reuse payload afterwards.
func (c *Client) Push(conn uint64, payload []byte) error {
	if len(payload) > MaxPush {
		return fmt.Errorf("tunnel: push of %d bytes, at most %d", len(payload), MaxPush)
	}
	cs, _ := c.current()
	if cs == nil || cs.seq != conn {
		return ErrConnChanged
	}
	if err := cs.writeControl(framePush, payload); err != nil {
		cs.close(codeProtocol, fmt.Errorf("send push: %w", err))
		return fmt.Errorf("tunnel: push: %w", err)
	}
	c.pushes.Add(1)
	return nil
}
