package tunnel

import (
	"context"
	"fmt"
	"time"
)

// laneStart is a connection whose first frame asked for a bulk lane
// rather than a session.
type laneStart struct {
	ctrl rawStream
	node string
}

// serveLane runs a bulk lane of node's session until it ends. Lanes come
// over TCP+TLS only, after the same certificate checks as the fallback,
// and only for a node with a session: the lane is part of it.
func (s *Server) serveLane(m muxConn, ls *laneStart) {
	ym, ok := m.(*yamuxMux)
	sess := s.Session(ls.node)
	var why string
	switch {
	case !ok:
		why = "bulk lane over quic"
	case s.cfg.DisableBulk:
		why = "bulk lanes disabled"
	case sess == nil:
		why = "no session"
	}
	if why != "" {
		s.sessRefused.Add(1)
		s.log.Info("refused bulk lane", "node", ls.node, "remote", m.remoteAddr(), "reason", why)
		m.close(codeRefused, why)
		return
	}
	ym.strict = true
	// Before any stream of the lane is read: yamux reads the window of
	// its config whenever a stream sends a window update.
	ym.cfg.MaxStreamWindowSize = uint32(min(s.cfg.BulkWindow, 1<<31-1))
	cc, ccErr := laneSocket(ym.tc.NetConn(), s.cfg.BulkCongestion, 0, s.cfg.setsockopt)
	if ccErr != nil {
		s.bulkDefaultCC.Add(1)
		s.log.Warn("bulk lane keeps the kernel's congestion control", "node", ls.node, "want", s.cfg.BulkCongestion, "using", cc, "err", ccErr)
	}
	l := newLane(ym, ls.ctrl, cc)
	if err := l.writeControl(frameWelcome, marshalWelcome(welcome{}), s.cfg.HandshakeTimeout); err != nil {
		l.close("write welcome")
		return
	}
	if !sess.addLane(l) {
		l.close("session ended")
		return
	}
	s.bulkLanesOpen.Add(1)
	defer s.bulkLanesOpen.Add(-1)
	s.log.Info("bulk lane open", "node", ls.node, "congestion", cc, "remote", m.remoteAddr())
	go sess.laneAccept(l)
	err := sess.laneControl(l)
	l.close("lane ended")
	sess.removeLane(l)
	s.log.Info("bulk lane closed", "node", ls.node, "err", err)
}

// addLane makes l the lane new bulk dials use; an older one retires. It
// reports false when the session has ended.
func (s *Session) addLane(l *lane) bool {
	s.lanesMu.Lock()
	defer s.lanesMu.Unlock()
	if s.ctx.Err() != nil {
		return false
	}
	if s.lane != nil {
		s.lane.retired.Store(true)
	}
	s.lane = l
	if s.lanes == nil {
		s.lanes = make(map[*lane]struct{})
	}
	s.lanes[l] = struct{}{}
	s.laneFailed = time.Time{}
	close(s.laneChanged)
	s.laneChanged = make(chan struct{})
	return true
}

// laneUnavailable records that the edge could not open a lane and wakes
// the dials waiting for one.
func (s *Session) laneUnavailable() {
	s.lanesMu.Lock()
	defer s.lanesMu.Unlock()
	if s.lane != nil {
		return
	}
	s.laneFailed = time.Now()
	close(s.laneChanged)
	s.laneChanged = make(chan struct{})
}

func (s *Session) retireLane(l *lane) {
	s.lanesMu.Lock()
	defer s.lanesMu.Unlock()
	l.retired.Store(true)
	if s.lane == l {
		s.lane = nil
	}
}

func (s *Session) removeLane(l *lane) {
	s.lanesMu.Lock()
	defer s.lanesMu.Unlock()
	delete(s.lanes, l)
	if s.lane == l {
		s.lane = nil
	}
}

// closeLanes closes the lanes of an ending session.
func (s *Session) closeLanes() {
	s.lanesMu.Lock()
	lanes := make([]*lane, 0, len(s.lanes))
	for l := range s.lanes {
		lanes = append(lanes, l)
	}
	s.lane = nil
	s.lanesMu.Unlock()
	for _, l := range lanes {
		l.close("session ended")
	}
}

// laneAccept hands edge-opened streams of a lane to the listener, like
// those of the tunnel.
func (s *Session) laneAccept(l *lane) {
	max := int64(s.srv.cfg.MaxStreamsPerEdge)
	peer := s.peer
	peer.Transport = TransportBulk
	for {
		st, err := l.m.acceptStream(s.ctx)
		if err != nil {
			return
		}
		if s.streams.Add(1) > max {
			s.streams.Add(-1)
			st.abort(codeTooManyStreams)
			continue
		}
		s.srv.bulkStreams.Add(1)
		go s.handleStream(st, l.m, peer)
	}
}

// laneControl reads a lane's control stream until the lane ends: an idle
// frame retires the lane and is echoed, a promise that no new stream will
// follow it.
func (s *Session) laneControl(l *lane) error {
	r := preambleReader(l.ctrl)
	for {
		typ, _, err := readFrame(r)
		if err != nil {
			return fmt.Errorf("read lane control stream: %w", mapErr(err))
		}
		if typ != frameLaneIdle {
			continue
		}
		s.retireLane(l)
		if err := l.writeControl(frameLaneIdle, nil, s.srv.cfg.HandshakeTimeout); err != nil {
			return fmt.Errorf("echo lane idle: %w", err)
		}
	}
}

// bulkLane returns the lane for a bulk dial. Without one it asks the edge
// to open one and waits, at most HandshakeTimeout; an edge that opened
// none by then has bulk dials travel on the tunnel for laneRetry.
func (s *Session) bulkLane(ctx context.Context) (*lane, error) {
	if s.srv.cfg.DisableBulk || !s.edgeBulk.Load() {
		return nil, errNoLane
	}
	wait := s.srv.cfg.HandshakeTimeout
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.lanesMu.Lock()
		if l := s.lane; l != nil {
			s.lanesMu.Unlock()
			return l, nil
		}
		if !s.laneFailed.IsZero() && time.Since(s.laneFailed) < laneRetry {
			s.lanesMu.Unlock()
			return nil, fmt.Errorf("%w: the edge opened none recently", errNoLane)
		}
		ask := time.Since(s.laneAsked) > wait
		if ask {
			s.laneAsked = time.Now()
		}
		ch := s.laneChanged
		s.lanesMu.Unlock()
		if ask {
			if err := s.writeControl(frameLaneAsk, nil); err != nil {
				return nil, fmt.Errorf("%w: ask edge: %w", errNoLane, err)
			}
		}
		select {
		case <-ch:
		case <-timer.C:
			s.lanesMu.Lock()
			if s.lane == nil {
				s.laneFailed = time.Now()
			}
			s.lanesMu.Unlock()
			return nil, fmt.Errorf("%w: the edge opened none within %v", errNoLane, wait)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", errNoLane, ctx.Err())
		case <-s.ctx.Done():
			return nil, errNoLane
		}
	}
}
