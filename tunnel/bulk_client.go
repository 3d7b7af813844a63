package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// clientLanes are the bulk lanes of one client session. At most one is
// current (it takes new bulk streams); retired ones close once their last
// stream ended.
type clientLanes struct {
	mu       sync.Mutex
	cur      *lane
	all      map[*lane]struct{}
	dialing  chan struct{} // closed when the dial in flight ends
	dialErr  error         // why the last dial failed
	failedAt time.Time     // when it failed
	closed   bool
	// bytes of the closed lanes' sockets
	sent, received atomic.Uint64
}

// bytes returns the wire bytes of all lanes, open and closed.
func (cl *clientLanes) bytes() (sent, received uint64) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	sent, received = cl.sent.Load(), cl.received.Load()
	for l := range cl.all {
		sent += l.tcp.sent.Load()
		received += l.tcp.received.Load()
	}
	return sent, received
}

// openStream opens an edge→hub stream: on the bulk lane when bulk is set
// and a lane can be had, else on the tunnel. It reports whether the stream
// is on a lane.
func (cs *clientSession) openStream(ctx context.Context, bulk bool) (rawStream, bool, error) {
	if bulk && cs.hubBulk {
		l, err := cs.bulkLane(ctx, false)
		if err == nil {
			st, err := l.m.openStream(ctx)
			if err == nil {
				return st, true, nil
			}
			cs.retireLane(l)
		}
		cs.c.log.Debug("bulk stream travels on the tunnel", "err", err)
	}
	st, err := cs.m.openStream(ctx)
	return st, false, err
}

// bulkLane returns the current lane, dialling one if there is none. With
// fresh (the hub asked for a lane: it has none it can use) a new lane is
// dialled even if one is current, and the old one retires. After a failed
// dial, bulk streams travel on the tunnel for laneRetry.
func (cs *clientSession) bulkLane(ctx context.Context, fresh bool) (*lane, error) {
	cl := &cs.lanes
	for {
		cl.mu.Lock()
		if cl.closed {
			cl.mu.Unlock()
			return nil, errNoLane
		}
		if !fresh && cl.cur != nil && !cl.cur.retired.Load() {
			l := cl.cur
			cl.mu.Unlock()
			return l, nil
		}
		if !fresh && cl.dialing == nil && cl.dialErr != nil && time.Since(cl.failedAt) < laneRetry {
			err := cl.dialErr
			cl.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", errNoLane, err)
		}
		if cl.dialing == nil {
			ch := make(chan struct{})
			cl.dialing = ch
			go cs.runLaneDial(ch)
		}
		ch := cl.dialing
		cl.mu.Unlock()
		fresh = false // the dial in flight is fresh enough
		select {
		case <-ch:
			cl.mu.Lock()
			l, err := cl.cur, cl.dialErr
			cl.mu.Unlock()
			if l == nil || l.retired.Load() {
				if err == nil {
					err = errNoLane
				}
				return nil, fmt.Errorf("%w: %w", errNoLane, err)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", errNoLane, ctx.Err())
		case <-cs.done:
			return nil, errNoLane
		}
	}
}

func (cs *clientSession) runLaneDial(ch chan struct{}) {
	c := cs.c
	ctx, cancel := context.WithTimeout(cs.ctx, 2*c.cfg.HandshakeTimeout)
	l, err := cs.dialLane(ctx)
	cancel()
	cl := &cs.lanes
	cl.mu.Lock()
	cl.dialing = nil
	switch {
	case err != nil:
		cl.dialErr, cl.failedAt = err, time.Now()
		c.log.Warn("bulk lane failed; bulk streams travel on the tunnel", "err", err, "retry_in", laneRetry)
		// The hub may be waiting for it: tell it not to.
		go cs.writeControl(frameLaneAsk, nil)
	case cl.closed:
		l.close("session ended")
		l = nil
	default:
		cl.dialErr = nil
		if cl.cur != nil {
			cl.cur.retired.Store(true)
		}
		cl.cur = l
		if cl.all == nil {
			cl.all = make(map[*lane]struct{})
		}
		cl.all[l] = struct{}{}
	}
	cl.mu.Unlock()
	close(ch)
	if l != nil {
		go cs.laneAccept(l)
		go cs.laneControl(l)
		go cs.laneWatch(l)
	}
}

// dialLane opens a lane: TCP with the lane's congestion control, TLS with
// the node's certificate and the tunnel's ALPN, yamux, and the lane frame
// on its first stream, answered by the hub's welcome.
func (cs *clientSession) dialLane(ctx context.Context) (*lane, error) {
	c := cs.c
	raw, err := c.cfg.DialTCP(ctx, cs.addr)
	if err != nil {
		return nil, fmt.Errorf("dial bulk lane %s: %w", cs.addr, err)
	}
	cc, ccErr := laneSocket(raw, c.cfg.BulkCongestion, c.cfg.BulkMaxRate, c.cfg.setsockopt)
	if ccErr != nil {
		c.bulkDefaultCC.Add(1)
		c.log.Warn("bulk lane keeps the kernel's congestion control", "want", c.cfg.BulkCongestion, "using", cc, "err", ccErr)
	}
	cnt := &countingConn{Conn: raw}
	tc := tls.Client(cnt, cs.tlsConf)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("bulk lane tls handshake: %w", err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != ALPN {
		raw.Close()
		return nil, fmt.Errorf("bulk lane tls handshake: hub negotiated %q, not %q", p, ALPN)
	}
	m, err := newYamuxMux(tc, true, c.cfg.BulkWindow)
	if err != nil {
		raw.Close()
		return nil, err
	}
	m.strict = true
	fail := func(what string, err error) (*lane, error) {
		m.close(codeProtocol, what)
		return nil, fmt.Errorf("bulk lane %s: %w", what, err)
	}
	ctrl, err := m.openStream(ctx)
	if err != nil {
		return fail("open control stream", err)
	}
	if _, err := ctrl.rawWrite(appendFrame(nil, frameLane, nil)); err != nil {
		return fail("send lane frame", mapErr(err))
	}
	ctrl.SetReadDeadline(time.Now().Add(c.cfg.HandshakeTimeout))
	typ, _, err := readFrame(preambleReader(ctrl))
	if err == nil && typ != frameWelcome {
		err = fmt.Errorf("got frame type %#x", typ)
	}
	if err != nil {
		return fail("read welcome", mapErr(err))
	}
	ctrl.SetReadDeadline(time.Time{})
	l := newLane(m, ctrl, cc)
	l.tcp = cnt
	c.bulkLanes.Add(1)
	c.bulkCC.Store(&cc)
	c.log.Info("bulk lane open", "congestion", cc)
	return l, nil
}

// laneAccept serves hub-opened streams on a lane like those of the tunnel.
func (cs *clientSession) laneAccept(l *lane) {
	for {
		st, err := l.m.acceptStream(cs.ctx)
		if err != nil {
			l.close("accept: " + err.Error())
			return
		}
		go cs.serveDial(st)
	}
}

// laneControl reads the lane's control stream: the hub's echo of an idle
// frame.
func (cs *clientSession) laneControl(l *lane) {
	r := preambleReader(l.ctrl)
	for {
		typ, _, err := readFrame(r)
		if err != nil {
			l.close("control stream: " + err.Error())
			return
		}
		if typ == frameLaneIdle {
			l.echoOnce.Do(func() { close(l.idleEcho) })
		}
	}
}

// laneWatch closes a lane that stayed without streams for BulkIdle, or
// that retired (a newer lane took over): it tells the hub, which echoes
// once it will open no more streams on the lane, and closes the lane when
// the echo is in and its last stream has ended.
func (cs *clientSession) laneWatch(l *lane) {
	c := cs.c
	idle := c.cfg.BulkIdle
	t := time.NewTicker(min(idle/4, time.Second))
	defer t.Stop()
	defer cs.forgetLane(l)
	idleSince := time.Now()
	var askedAt time.Time
	for {
		select {
		case <-l.done():
			return
		case <-cs.done:
			l.close("session ended")
			return
		case <-t.C:
		}
		now := time.Now()
		if !askedAt.IsZero() {
			echoed := false
			select {
			case <-l.idleEcho:
				echoed = true
			default:
			}
			// The echo first: streams the hub opened before it are
			// already counted by the time it is read.
			if (echoed || now.Sub(askedAt) > c.cfg.HandshakeTimeout) && !l.busy() {
				l.close("idle")
				return
			}
			continue
		}
		if l.busy() {
			idleSince = now
		} else if now.Sub(idleSince) >= idle {
			cs.retireLane(l)
		}
		if l.retired.Load() {
			askedAt = now
			if err := l.writeControl(frameLaneIdle, nil, c.cfg.HandshakeTimeout); err != nil {
				l.close("send idle: " + err.Error())
				return
			}
		}
	}
}

// retireLane stops new bulk streams from using l.
func (cs *clientSession) retireLane(l *lane) {
	cl := &cs.lanes
	cl.mu.Lock()
	defer cl.mu.Unlock()
	l.retired.Store(true)
	if cl.cur == l {
		cl.cur = nil
	}
}

func (cs *clientSession) forgetLane(l *lane) {
	cl := &cs.lanes
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if _, ok := cl.all[l]; !ok {
		return
	}
	delete(cl.all, l)
	if cl.cur == l {
		cl.cur = nil
	}
	cl.sent.Add(l.tcp.sent.Load())
	cl.received.Add(l.tcp.received.Load())
}

// closeLanes closes every lane of a session that ends.
func (cs *clientSession) closeLanes() {
	cl := &cs.lanes
	cl.mu.Lock()
	cl.closed = true
	lanes := make([]*lane, 0, len(cl.all))
	for l := range cl.all {
		lanes = append(lanes, l)
	}
	cl.mu.Unlock()
	for _, l := range lanes {
		l.close("session ended")
	}
}
