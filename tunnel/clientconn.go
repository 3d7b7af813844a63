package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// clientSession is one established connection as the edge sees it.
type clientSession struct {
	c    *Client
	m    muxConn
	peer Peer

	ctrl   rawStream
	ctrlMu sync.Mutex // serialises control frames

	heartbeat time.Duration
	echo      bool // the hub echoes heartbeats (TCP): use them for dead-peer detection
	hubBulk   bool // the hub accepts bulk lanes
	lanes     clientLanes
	goAway    chan time.Duration
	// reportKick wakes reports() when Report was called.
	reportKick chan struct{}
	// seq numbers the client's sessions from 1 (Client.Conn); set before
	// the session becomes current.
	seq uint64

	// Sockets owned by the session, for cleanup and Stats.
	qconn  *quic.Conn
	tr     *quic.Transport
	pc     net.PacketConn
	tcp    *countingConn
	fec    *fecConn // the QUIC socket when it does forward error correction
	hdrLen uint64   // IP+UDP header bytes per datagram

	// addr is the hub this session dialed, tlsConf its TLS configuration.
	addr    string
	tlsConf *tls.Config

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	err    error // why the session ended; set before done is closed
	once   sync.Once
}

// connect dials the hub at addr over one transport and runs the hello
// exchange.
func (c *Client) connect(ctx context.Context, transport, addr string) (*clientSession, error) {
	hctx, cancel := context.WithTimeout(ctx, 3*c.cfg.HandshakeTimeout)
	defer cancel()
	cs := &clientSession{
		c:          c,
		addr:       addr,
		tlsConf:    c.tlsFor(addr),
		goAway:     make(chan time.Duration, 1),
		reportKick: make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
	var err error
	if transport == TransportQUIC {
		err = cs.dialQUIC(hctx)
	} else {
		err = cs.dialTCP(hctx)
	}
	if err != nil {
		return nil, err
	}
	cs.ctx, cs.cancel = context.WithCancel(context.Background())
	c.mu.Lock()
	c.live[cs] = struct{}{}
	c.mu.Unlock()
	state := cs.m.tlsState()
	cs.peer = Peer{Certificates: state.PeerCertificates, Transport: transport, Addr: addr}
	if err := cs.hello(hctx); err != nil {
		cs.close(codeProtocol, err)
		// Prefer the transport's reason (e.g. a refusal by the hub).
		if e := cs.m.err(); e != nil {
			return nil, fmt.Errorf("hello over %s: %w", transport, e)
		}
		return nil, fmt.Errorf("hello over %s: %w", transport, err)
	}
	go cs.readControl()
	go cs.heartbeats()
	go cs.reports()
	go cs.acceptLoop()
	return cs, nil
}

func (cs *clientSession) dialQUIC(ctx context.Context) error {
	c := cs.c
	raddr, err := net.ResolveUDPAddr("udp", cs.addr)
	if err != nil {
		return fmt.Errorf("resolve hub address: %w", err)
	}
	pc, err := c.cfg.ListenPacket()
	if err != nil {
		return fmt.Errorf("open udp socket: %w", err)
	}
	if !c.cfg.DisableFEC {
		cs.fec = newFECConn(pc)
		pc = cs.fec.socket()
	}
	tr := &quic.Transport{Conn: pc}
	conn, err := tr.Dial(ctx, raddr, cs.tlsConf, c.quicConf)
	if err != nil {
		tr.Close()
		pc.Close()
		return fmt.Errorf("dial quic %s: %w", cs.addr, err)
	}
	cs.m, cs.qconn, cs.tr, cs.pc = quicMux{c: conn}, conn, tr, pc
	cs.hdrLen = 28 // IPv4 + UDP
	if raddr.IP.To4() == nil {
		cs.hdrLen = 48
	}
	return nil
}

func (cs *clientSession) dialTCP(ctx context.Context) error {
	c := cs.c
	// The connect and the TLS handshake together get HandshakeTimeout,
	// not the whole connect's budget: a hub that takes a TCP connection
	// and never answers is given up on as soon as one that ignores a
	// QUIC handshake.
	ctx, cancel := context.WithTimeout(ctx, c.cfg.HandshakeTimeout)
	defer cancel()
	raw, err := c.cfg.DialTCP(ctx, cs.addr)
	if err != nil {
		return fmt.Errorf("dial tcp %s: %w", cs.addr, err)
	}
	cc := &countingConn{Conn: raw}
	tc := tls.Client(cc, cs.tlsConf)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return fmt.Errorf("tls handshake with %s: %w", cs.addr, err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != ALPN {
		raw.Close()
		return fmt.Errorf("tls handshake with %s: hub negotiated %q, not %q", cs.addr, p, ALPN)
	}
	m, err := newYamuxMux(tc, true, c.cfg.StreamWindow)
	if err != nil {
		raw.Close()
		return err
	}
	cs.m, cs.tcp = m, cc
	return nil
}

// hello opens the control stream, sends the hello and waits for the
// welcome.
func (cs *clientSession) hello(ctx context.Context) error {
	st, err := cs.m.openStream(ctx)
	if err != nil {
		return fmt.Errorf("open control stream: %w", err)
	}
	cs.ctrl = st
	var features uint64
	if cs.fec != nil {
		features |= featureParity
	}
	if !cs.c.cfg.DisableBulk {
		features |= featureBulk
	}
	if err := cs.writeControl(frameHello, marshalHello(cs.c.cfg.Hello(), features)); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	if features != 0 {
		// Again in a frame of their own, for a hub that reads no
		// features in the hello; one that does applies the same bits
		// again. A hub that does not know the frame skips it.
		if err := cs.writeControl(frameFeatures, marshalFeatures(features)); err != nil {
			return fmt.Errorf("send features: %w", err)
		}
	}
	st.SetReadDeadline(time.Now().Add(cs.c.cfg.HandshakeTimeout))
	typ, payload, err := readFrame(preambleReader(st))
	if err != nil {
		return fmt.Errorf("read welcome: %w", mapErr(err))
	}
	if typ != frameWelcome {
		return fmt.Errorf("read welcome: got frame type %#x", typ)
	}
	w, err := unmarshalWelcome(payload)
	if err != nil {
		return err
	}
	st.SetReadDeadline(time.Time{})
	cs.echo = w.echo
	cs.hubBulk = w.bulk && !cs.c.cfg.DisableBulk
	if cs.fec != nil {
		cs.fec.track(cs.qconn, w.parity)
	}
	cs.heartbeat = cs.c.cfg.HeartbeatInterval
	if idle := time.Duration(w.idleTimeoutMillis) * time.Millisecond; idle > 0 && idle/3 < cs.heartbeat {
		cs.heartbeat = idle / 3
	}
	return nil
}

func (cs *clientSession) writeControl(typ byte, payload []byte) error {
	cs.ctrlMu.Lock()
	defer cs.ctrlMu.Unlock()
	cs.ctrl.SetWriteDeadline(time.Now().Add(cs.c.cfg.HandshakeTimeout))
	_, err := cs.ctrl.rawWrite(appendFrame(nil, typ, payload))
	return mapErr(err)
}

func (cs *clientSession) readControl() {
	r := preambleReader(cs.ctrl)
	idle := cs.c.cfg.IdleTimeout
	for {
		if cs.echo {
			cs.ctrl.SetReadDeadline(time.Now().Add(idle))
		}
		typ, payload, err := readFrame(r)
		if err != nil {
			if e := cs.m.err(); e != nil {
				err = e
			}
			cs.close(codeProtocol, fmt.Errorf("read control stream: %w", mapErr(err)))
			return
		}
		if typ == frameGoAway {
			ms, err := unmarshalGoAway(payload)
			if err != nil {
				cs.close(codeProtocol, err)
				return
			}
			select {
			case cs.goAway <- time.Duration(ms) * time.Millisecond:
			default:
			}
		}
		if typ == frameLaneAsk && cs.hubBulk {
			go cs.bulkLane(cs.ctx, true)
		}
		// Heartbeat echoes only refresh the deadline; unknown frames are
		// skipped by design.
	}
}

func (cs *clientSession) heartbeats() {
	t := time.NewTicker(cs.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := cs.writeControl(frameHeartbeat, nil); err != nil {
				cs.close(codeProtocol, fmt.Errorf("send heartbeat: %w", err))
				return
			}
		case <-cs.done:
			return
		}
	}
}

// reports sends the client's latest report when the session starts and
// whenever Report is called during it. Being the session's only writer of
// reports, it sends them in order, and skips those superseded meanwhile.
func (cs *clientSession) reports() {
	var sent uint64
	for {
		if p, gen := cs.c.latestReport(); gen != sent {
			if err := cs.writeControl(frameReport, p); err != nil {
				cs.close(codeProtocol, fmt.Errorf("send report: %w", err))
				return
			}
			cs.c.reportsSent.Add(1)
			sent = gen
		}
		select {
		case <-cs.reportKick:
		case <-cs.done:
			return
		}
	}
}

// acceptLoop serves hub-opened streams; it also notices the connection's
// end.
func (cs *clientSession) acceptLoop() {
	for {
		st, err := cs.m.acceptStream(cs.ctx)
		if err != nil {
			if e := cs.m.err(); e != nil {
				err = e
			}
			cs.close(codeConnClosed, err)
			return
		}
		go cs.serveDial(st)
	}
}

// serveDial connects one hub-opened stream to its target and answers with
// the status byte.
func (cs *clientSession) serveDial(st rawStream) {
	st.SetReadDeadline(time.Now().Add(cs.c.cfg.HandshakeTimeout))
	typ, payload, err := readFrame(preambleReader(st))
	if err != nil || typ != frameDial {
		st.abort(codeStreamProtocol)
		return
	}
	st.SetReadDeadline(time.Time{})
	target := string(payload)
	ctx, cancel := context.WithTimeout(cs.ctx, 10*time.Second)
	local, err := cs.c.cfg.DialTarget(ctx, target)
	cancel()
	if err != nil {
		cs.c.log.Debug("dial target failed", "target", target, "err", err)
		st.SetWriteDeadline(time.Now().Add(cs.c.cfg.HandshakeTimeout))
		st.rawWrite(appendDialFailure(nil, err.Error()))
		st.closeWrite()
		st.stopReading(codeDialFailed)
		return
	}
	if _, err := st.rawWrite([]byte{statusOK}); err != nil {
		local.Close()
		st.abort(codeAborted)
		return
	}
	pipe(local, &streamConn{raw: st, local: cs.m.localAddr(), remote: cs.m.remoteAddr()})
}

// pipe copies both ways between a local conn and a stream: one io.Copy
// pair per tunneled connection, so each stream's flow control reaches the
// local socket and no connection waits on another. A graceful end is
// passed on as a half-close, a failure as a reset.
//
// A local end that closed while the peer was still sending is not a
// failure of what it wrote before: a node server that writes an exec's
// exit status and closes must have that status delivered, though the
// client's last frames arrive after the close. The rest of the peer's data
// is then read and dropped, for at most drainGrace, and the stream ends
// gracefully; a reset would discard the status still in flight.
func pipe(local net.Conn, sc *streamConn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		lw := &localWriter{w: local}
		if _, err := io.Copy(lw, sc); err != nil {
			if lw.err != nil {
				_ = sc.SetReadDeadline(time.Now().Add(drainGrace))
				_, _ = io.Copy(io.Discard, sc)
				return
			}
			abortConn(local)
			sc.abort(codeAborted)
			return
		}
		if cw, ok := local.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	if _, err := io.Copy(sc, local); err != nil {
		sc.abort(codeAborted)
		abortConn(local)
	} else {
		sc.CloseWrite()
	}
	<-done
	local.Close()
	sc.Close()
}

// drainGrace bounds how long pipe reads and drops a peer's data once the
// local end can take no more.
const drainGrace = 5 * time.Second

// localWriter remembers the error of a write to the local end, which tells
// pipe that the local end, not the stream, failed.
type localWriter struct {
	w   io.Writer
	err error
}

func (l *localWriter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if err != nil {
		l.err = err
	}
	return n, err
}

// abortConn closes a TCP conn with a reset so the local peer, too, sees an
// error rather than EOF.
func abortConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// DialTCPTarget connects "tcp:HOST:PORT" targets and refuses all others.
// Agents with their own DialTarget can hand "tcp:" targets to it.
func DialTCPTarget(ctx context.Context, target string) (net.Conn, error) {
	addr, ok := strings.CutPrefix(target, "tcp:")
	if !ok {
		return nil, fmt.Errorf("unsupported target %q", target)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// close ends the session once and releases its sockets.
func (cs *clientSession) close(code uint64, cause error) {
	cs.once.Do(func() {
		if cause == nil {
			cause = errors.New("tunnel: connection closed")
		}
		cs.err = cause
		if cs.cancel != nil {
			cs.cancel()
		}
		cs.closeLanes()
		cs.m.close(code, cause.Error())
		if cs.tr != nil {
			cs.tr.Close()
			cs.pc.Close()
		}
		c := cs.c
		c.mu.Lock()
		if _, ok := c.live[cs]; ok {
			delete(c.live, cs)
			cs.addStats(&c.folded)
		}
		c.mu.Unlock()
		close(cs.done)
	})
}

// addStats adds the session's wire counters to st.
func (cs *clientSession) addStats(st *ClientStats) {
	if cs.qconn != nil {
		q := cs.qconn.ConnectionStats()
		st.BytesSent += q.BytesSent + q.PacketsSent*cs.hdrLen
		st.BytesReceived += q.BytesReceived + q.PacketsReceived*cs.hdrLen
		st.PacketsSent += q.PacketsSent
		st.PacketsReceived += q.PacketsReceived
	}
	if cs.fec != nil {
		// Parity is wire traffic QUIC does not see; a rebuilt packet is
		// one QUIC counted but the wire never delivered.
		f := cs.fec.Stats()
		st.FEC.add(f)
		st.BytesSent += f.ParityBytes + f.ParityPackets*cs.hdrLen
		st.PacketsSent += f.ParityPackets
		st.BytesReceived += f.ParityRxBytes + f.ParityReceived*cs.hdrLen
		st.BytesReceived -= min(st.BytesReceived, f.RecoveredBytes+f.Recovered*cs.hdrLen)
		st.PacketsReceived += f.ParityReceived
		st.PacketsReceived -= min(st.PacketsReceived, f.Recovered)
	}
	if cs.tcp != nil {
		st.BytesSent += cs.tcp.sent.Load()
		st.BytesReceived += cs.tcp.received.Load()
	}
	sent, received := cs.lanes.bytes()
	st.BytesSent += sent
	st.BytesReceived += received
}

// countingConn counts the bytes of the fallback's TCP connection.
type countingConn struct {
	net.Conn
	sent, received atomic.Uint64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.received.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.sent.Add(uint64(n))
	return n, err
}
