package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Session is one connected edge as the hub sees it.
type Session struct {
	srv         *Server
	m           muxConn
	node        string
	hello       Hello
	peer        Peer
	connectedAt time.Time
	lastBeat    atomic.Int64 // unix nanoseconds

	ctrl   rawStream
	ctrlMu sync.Mutex // serialises control frames written by the hub

	dials   atomic.Int64 // hub-opened streams now open
	streams atomic.Int64 // edge-opened streams now open (enforced here over TCP)

	edgeBulk    atomic.Bool // the edge opens bulk lanes when asked
	lanesMu     sync.Mutex  // guards the following fields
	lane        *lane       // the lane bulk dials use; nil: none
	lanes       map[*lane]struct{}
	laneChanged chan struct{} // closed and replaced when lane is set
	laneAsked   time.Time     // when the edge was last asked for a lane
	laneFailed  time.Time     // when the edge last failed to open one in time

	ctx      context.Context // done when the session ends
	cancel   context.CancelFunc
	tearOnce sync.Once
}

// Node returns the edge's node name.
func (s *Session) Node() string { return s.node }

// Hello returns what the edge said when it connected.
func (s *Session) Hello() Hello { return s.hello }

// Peer returns the edge's identity and transport.
func (s *Session) Peer() Peer { return s.peer }

// RemoteAddr returns the edge's current public address; over QUIC it
// follows NAT rebinding.
func (s *Session) RemoteAddr() net.Addr { return s.m.remoteAddr() }

// ConnectedAt returns when the session started.
func (s *Session) ConnectedAt() time.Time { return s.connectedAt }

// LastHeartbeat returns when the last heartbeat arrived (ConnectedAt
// before the first one).
func (s *Session) LastHeartbeat() time.Time { return time.Unix(0, s.lastBeat.Load()) }

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// serve runs one connection from hello to its end.
func (s *Server) serve(m muxConn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		m.close(codeShutdown, "hub shutting down")
		return
	}
	s.pending[m] = struct{}{}
	s.mu.Unlock()
	sess, ls, err := s.handshake(m)
	s.mu.Lock()
	delete(s.pending, m)
	s.mu.Unlock()
	if ls != nil {
		s.serveLane(m, ls)
		return
	}
	if err != nil {
		s.sessRefused.Add(1)
		s.log.Info("refused edge", "remote", m.remoteAddr(), "transport", m.transport(), "err", err)
		return
	}
	if s.cfg.OnConnect != nil {
		s.cfg.OnConnect(sess)
	}
	go sess.acceptLoop()
	err = sess.controlLoop()
	sess.teardown(codeProtocol, err)
}

// handshake reads the hello from the first edge-opened stream, registers
// the session (replacing an older one of the same node) and welcomes it.
// A connection that opens with a lane frame instead is a bulk lane: it is
// returned as such, for serveLane.
func (s *Server) handshake(m muxConn) (*Session, *laneStart, error) {
	state := m.tlsState()
	node, err := s.cfg.Identify(state)
	if err != nil {
		m.close(codeIdentity, "unknown node")
		return nil, nil, fmt.Errorf("identify node: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
	defer cancel()
	go func() {
		// Abandon the hello wait when the server closes.
		select {
		case <-ctx.Done():
		case <-s.closedCh:
			cancel()
		}
	}()
	ctrl, err := m.acceptStream(ctx)
	if err != nil {
		m.close(codeProtocol, "no control stream")
		return nil, nil, fmt.Errorf("accept control stream: %w", err)
	}
	ctrl.SetReadDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	typ, payload, err := readFrame(preambleReader(ctrl))
	if err == nil && typ == frameLane {
		ctrl.SetReadDeadline(time.Time{})
		return nil, &laneStart{ctrl: ctrl, node: node}, nil
	}
	if err == nil && typ != frameHello {
		err = fmt.Errorf("first frame has type %#x, want hello", typ)
	}
	var (
		hello    Hello
		features helloFeatures
	)
	if err == nil {
		hello, features, err = unmarshalHello(payload)
	}
	if err != nil {
		m.close(codeProtocol, "bad hello")
		return nil, nil, fmt.Errorf("read hello: %w", err)
	}
	if hello.Node != node {
		m.close(codeIdentity, "hello names another node")
		return nil, nil, fmt.Errorf("hello names node %q, certificate names %q", hello.Node, node)
	}
	ctrl.SetReadDeadline(time.Time{})
	now := time.Now()
	sctx, scancel := context.WithCancel(context.Background())
	sess := &Session{
		srv:   s,
		m:     m,
		node:  node,
		hello: hello,
		peer: Peer{
			Node:         node,
			Certificates: state.PeerCertificates,
			Transport:    m.transport(),
		},
		connectedAt: now,
		ctrl:        ctrl,
		ctx:         sctx,
		cancel:      scancel,
		laneChanged: make(chan struct{}),
	}
	sess.lastBeat.Store(now.UnixNano())
	if features.known {
		// Known before the session can be dialed: a bulk dial right
		// after the connect takes the lane.
		sess.setFeatures(features.flags)
	}

	s.mu.Lock()
	if s.closed || s.draining {
		s.mu.Unlock()
		scancel()
		m.close(codeRefused, "draining")
		return nil, nil, errors.New("draining")
	}
	old := s.sessions[node]
	s.sessions[node] = sess
	s.notifyLocked()
	s.mu.Unlock()
	if old != nil {
		// OnDisconnect of the old session runs before OnConnect of the new.
		old.teardown(codeReplaced, ErrReplaced)
	}

	w := welcome{idleTimeoutMillis: uint64(s.cfg.IdleTimeout.Milliseconds()), echo: m.transport() == TransportTCP}
	if qm, ok := m.(quicMux); ok && qm.fec != nil {
		w.parity = true
	}
	w.bulk = !s.cfg.DisableBulk
	if err := sess.writeControl(frameWelcome, marshalWelcome(w)); err != nil {
		sess.teardown(codeProtocol, err)
		return nil, nil, fmt.Errorf("write welcome: %w", err)
	}
	s.log.Info("edge connected", "node", node, "transport", m.transport(), "remote", m.remoteAddr(), "version", hello.Version)
	return sess, nil, nil
}

// controlLoop reads heartbeats until the connection ends. Over TCP, where
// no transport idle timer exists, its read deadline (the idle timeout) is
// the dead-peer detection. Over QUIC the transport's idle timer is: it
// ends a connection that heard no packet for the idle timeout, and any
// packet counts, a retransmission or a probe too. A heartbeat itself can
// take longer to get through on a path that loses many packets, because
// QUIC doubles its probe timeout after every unanswered probe; a deadline
// of one idle timeout there would drop live edges. So over QUIC the
// deadline is twice the idle timeout, and catches what QUIC cannot: an
// agent whose QUIC stack still answers but which sends no heartbeats.
func (s *Session) controlLoop() error {
	r := preambleReader(s.ctrl)
	idle := s.srv.cfg.IdleTimeout
	if s.m.transport() == TransportQUIC {
		idle *= 2
	}
	for {
		s.ctrl.SetReadDeadline(time.Now().Add(idle))
		typ, payload, err := readFrame(r)
		if err != nil {
			if errors.Is(mapErr(err), os.ErrDeadlineExceeded) {
				return fmt.Errorf("no heartbeat for %v", idle)
			}
			if e := s.m.err(); e != nil {
				return e
			}
			return fmt.Errorf("read control stream: %w", mapErr(err))
		}
		if typ == frameFeatures {
			flags, err := unmarshalFeatures(payload)
			if err != nil {
				return err
			}
			// The same bits again from an edge whose hello had
			// them; the only word from an older edge.
			s.setFeatures(flags)
			continue
		}
		if typ == frameReport {
			if s.srv.cfg.OnReport != nil {
				s.srv.cfg.OnReport(s, payload)
			}
			continue
		}
		if typ == frameLaneAsk {
			// The edge could not open a lane: bulk dials go on QUIC.
			s.laneUnavailable()
			continue
		}
		if typ == framePush {
			if s.srv.cfg.OnPush != nil {
				s.srv.cfg.OnPush(s, payload)
			}
			continue
		}
		if typ != frameHeartbeat {
			continue // unknown control frames are skipped by design
		}
		s.lastBeat.Store(time.Now().UnixNano())
		if s.peer.Transport == TransportTCP {
			s.writeControl(frameHeartbeat, nil)
		}
		if s.srv.cfg.OnHeartbeat != nil {
			s.srv.cfg.OnHeartbeat(s)
		}
	}
}

// setFeatures applies the edge's feature bits to the session.
func (s *Session) setFeatures(flags uint64) {
	if qm, ok := s.m.(quicMux); ok && qm.fec != nil {
		qm.fec.setDecodes(flags&featureParity != 0)
	}
	s.edgeBulk.Store(flags&featureBulk != 0)
}

func (s *Session) writeControl(typ byte, payload []byte) error {
	return s.writeControlBy(time.Now().Add(s.srv.cfg.HandshakeTimeout), typ, payload)
}

// writeControlBy writes a control frame, giving up at deadline.
func (s *Session) writeControlBy(deadline time.Time, typ byte, payload []byte) error {
	s.ctrlMu.Lock()
	defer s.ctrlMu.Unlock()
	s.ctrl.SetWriteDeadline(deadline)
	_, err := s.ctrl.rawWrite(appendFrame(nil, typ, payload))
	return err
}

// goAway tells the edge to reconnect within window, giving up at deadline:
// an edge that does not take the frame by then gets the close frame.
func (s *Session) goAway(deadline time.Time, window time.Duration) {
	if err := s.writeControlBy(deadline, frameGoAway, marshalGoAway(uint64(window.Milliseconds()))); err != nil {
		s.srv.log.Debug("send goaway", "node", s.node, "err", err)
	}
}

// acceptLoop hands edge-opened streams to the server's listener.
func (s *Session) acceptLoop() {
	max := int64(s.srv.cfg.MaxStreamsPerEdge)
	for {
		st, err := s.m.acceptStream(s.ctx)
		if err != nil {
			return
		}
		// QUIC enforces the cap with stream credit; yamux has none, so
		// excess streams are reset here.
		if s.streams.Add(1) > max && s.peer.Transport == TransportTCP {
			s.streams.Add(-1)
			st.abort(codeTooManyStreams)
			continue
		}
		go s.handleStream(st, s.m, s.peer)
	}
}

// handleStream reads the preamble of an edge-opened stream on m (the
// tunnel or a bulk lane) and hands the stream to the listener.
func (s *Session) handleStream(st rawStream, m muxConn, peer Peer) {
	release := func() { s.streams.Add(-1) }
	st.SetReadDeadline(time.Now().Add(s.srv.cfg.HandshakeTimeout))
	typ, _, err := readFrame(preambleReader(st))
	if err != nil || typ != frameOpen {
		s.srv.log.Debug("bad stream preamble", "node", s.node, "type", typ, "err", err)
		st.abort(codeStreamProtocol)
		release()
		return
	}
	st.SetReadDeadline(time.Time{})
	c := &streamConn{
		raw:     st,
		local:   m.localAddr(),
		remote:  m.remoteAddr(),
		peer:    peer,
		hasPeer: true,
		onClose: release,
	}
	s.srv.streams.Add(1)
	if !s.srv.ln.deliver(s.ctx, c) {
		c.abort(codeStreamClosed)
	}
}

// dial opens a hub→edge stream; see Server.Dial.
func (s *Session) dial(ctx context.Context, target string) (net.Conn, error) {
	if s.dials.Add(1) > int64(s.srv.cfg.MaxDialsPerEdge) {
		s.dials.Add(-1)
		s.srv.dialsRefused.Add(1)
		return nil, fmt.Errorf("dial %s on node %s: %w", target, s.node, ErrTooManyDials)
	}
	release := func() { s.dials.Add(-1) }
	m, peer := s.m, s.peer
	var l *lane
	if IsBulk(ctx) {
		var err error
		if l, err = s.bulkLane(ctx); err == nil {
			m, peer.Transport = l.m, TransportBulk
		} else {
			s.srv.log.Debug("bulk dial travels on the tunnel", "node", s.node, "err", err)
		}
	}
	st, err := m.openStream(ctx)
	if err != nil && l != nil {
		s.retireLane(l)
		l, m, peer = nil, s.m, s.peer
		st, err = m.openStream(ctx)
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("dial %s on node %s: open stream: %w", target, s.node, err)
	}
	if _, err := st.rawWrite(appendFrame(nil, frameDial, []byte(target))); err != nil {
		st.abort(codeAborted)
		release()
		return nil, fmt.Errorf("dial %s on node %s: write preamble: %w", target, s.node, mapErr(err))
	}
	s.srv.dials.Add(1)
	if l != nil {
		s.srv.bulkStreams.Add(1)
	}
	ds := &dialState{done: make(chan struct{})}
	c := &streamConn{
		raw:     st,
		local:   m.localAddr(),
		remote:  m.remoteAddr(),
		peer:    peer,
		hasPeer: true,
		dial:    ds,
		onClose: release,
	}
	go s.awaitDialStatus(c, target)
	return c, nil
}

// awaitDialStatus reads the edge's status byte for c. It is the only extra
// goroutine of a dial and lives for about one round trip.
func (s *Session) awaitDialStatus(c *streamConn, target string) {
	ds := c.dial
	var timedOut atomic.Bool
	timer := time.AfterFunc(s.srv.cfg.DialTimeout, func() {
		timedOut.Store(true)
		c.raw.abort(codeDialTimeout)
	})
	ok, msg, err := readDialStatus(preambleReader(c.raw))
	timer.Stop()
	switch {
	case timedOut.Load():
		ds.err = fmt.Errorf("dial %s on node %s: no answer within %v: %w", target, s.node, s.srv.cfg.DialTimeout, os.ErrDeadlineExceeded)
	case err != nil:
		ds.err = fmt.Errorf("dial %s on node %s: read status: %w", target, s.node, mapErr(err))
	case !ok:
		ds.err = &DialError{Node: s.node, Target: target, Msg: msg}
	}
	close(ds.done)
	if ds.err != nil {
		c.abort(codeDialFailed)
	}
}

// teardown ends the session once: it closes the connection, unregisters
// the session if it is still the node's current one, and reports it.
func (s *Session) teardown(code uint64, cause error) {
	s.tearOnce.Do(func() {
		s.cancel()
		msg := "closed"
		if cause != nil {
			msg = cause.Error()
		}
		s.closeLanes()
		s.m.close(code, msg)
		srv := s.srv
		srv.mu.Lock()
		if srv.sessions[s.node] == s {
			delete(srv.sessions, s.node)
			srv.notifyLocked()
		}
		srv.mu.Unlock()
		// A hub that stops closes every session at once and says so in
		// one line (see Close): a line per edge would be thousands, and
		// a slow log sink would hold the stop up writing them.
		level := slog.LevelInfo
		if errors.Is(cause, ErrServerClosed) {
			level = slog.LevelDebug
		}
		srv.log.Log(context.Background(), level, "edge disconnected", "node", s.node, "transport", s.peer.Transport, "err", cause)
		if srv.cfg.OnDisconnect != nil {
			srv.cfg.OnDisconnect(s, cause)
		}
	})
}
