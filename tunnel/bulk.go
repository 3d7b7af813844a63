package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// TransportBulk is Peer.Transport of a stream that travels on a bulk lane.
const TransportBulk = "bulk"

// DefaultBulkCongestion is the congestion control a bulk lane asks for.
const DefaultBulkCongestion = "bbr"

// bulkKey marks a context whose dial should travel on a bulk lane.
type bulkKey struct{}

// WithBulk marks ctx so that a stream opened with it, by Client.DialContext
// or Server.Dial, travels on the node's bulk lane: a TCP+TLS connection
// beside the tunnel whose congestion control is BBR, opened on demand.
// Mark streams that move a lot of data (port-forward, copies); leave
// interactive ones (API requests, exec, logs) unmarked, so they stay on
// QUIC, where no bulk transfer holds them up. The stream is a net.Conn
// like any other; where no lane can be had it travels on the tunnel.
func WithBulk(ctx context.Context) context.Context {
	return context.WithValue(ctx, bulkKey{}, true)
}

// IsBulk reports whether ctx was marked by WithBulk.
func IsBulk(ctx context.Context) bool {
	b, _ := ctx.Value(bulkKey{}).(bool)
	return b
}

// Lane socket settings: a lane is a TCP connection, so without traffic
// only keepalives find a dead peer (after a NAT rebinding, say), and
// with unacknowledged data only the user timeout does.
const (
	laneKeepAliveIdle     = 15 * time.Second
	laneKeepAliveInterval = 5 * time.Second
	laneKeepAliveCount    = 3
	laneUserTimeout       = 30 * time.Second
	// laneRetry is how long bulk streams stay on the tunnel after a lane
	// could not be had, before the next attempt.
	laneRetry = 30 * time.Second
)

// setsockoptString sets a string socket option; ClientConfig and
// ServerConfig carry one so that tests can make it fail.
type setsockoptString func(fd, level, opt int, value string) error

// laneSocket sets a lane's congestion control and liveness options on the
// socket under c. It returns the congestion control in effect afterwards
// (the kernel default when want is unavailable) and, when want could not
// be set, why.
//
// maxRate, in bit/s, caps the socket's pacing rate when positive.
func laneSocket(c net.Conn, want string, maxRate int64, set setsockoptString) (got string, ccErr error) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: laneKeepAliveIdle,
			Interval: laneKeepAliveInterval, Count: laneKeepAliveCount})
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return "", fmt.Errorf("set congestion control: %T is not a socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return "", fmt.Errorf("set congestion control: %w", err)
	}
	if err := rc.Control(func(fd uintptr) {
		setUserTimeout(int(fd), laneUserTimeout)
		if maxRate > 0 {
			setMaxPacingRate(int(fd), maxRate/8)
		}
		if err := set(int(fd), ipprotoTCP, tcpCongestion, want); err != nil {
			ccErr = fmt.Errorf("set congestion control %q: %w", want, err)
		}
		got = congestionOf(int(fd))
	}); err != nil {
		return "", fmt.Errorf("set congestion control: %w", err)
	}
	return got, ccErr
}

// lane is one bulk lane as either end sees it: a TCP+TLS connection with
// yamux whose streams end with fin frames, and a control stream. The edge
// dials it; the hub attaches it to the edge's session.
type lane struct {
	m      *yamuxMux
	ctrl   rawStream
	ctrlMu sync.Mutex
	cc     string        // congestion control in effect on the local socket
	tcp    *countingConn // the edge's socket, for ClientStats; nil on the hub
	// retired lanes take no new streams; the edge closes them once their
	// last stream ended and the hub promised to open no more.
	retired atomic.Bool
	// idleEcho is closed when the hub echoed the edge's idle frame.
	idleEcho chan struct{}
	echoOnce sync.Once
}

func newLane(m *yamuxMux, ctrl rawStream, cc string) *lane {
	return &lane{m: m, ctrl: ctrl, cc: cc, idleEcho: make(chan struct{})}
}

func (l *lane) writeControl(typ byte, payload []byte, timeout time.Duration) error {
	l.ctrlMu.Lock()
	defer l.ctrlMu.Unlock()
	l.ctrl.SetWriteDeadline(time.Now().Add(timeout))
	_, err := l.ctrl.rawWrite(appendFrame(nil, typ, payload))
	return mapErr(err)
}

// busy reports whether any stream besides the control stream is open,
// including streams the peer opened that are not accepted yet.
func (l *lane) busy() bool { return l.m.s.NumStreams() > 1 }

func (l *lane) close(msg string) { l.m.close(codeConnClosed, msg) }

func (l *lane) done() <-chan struct{} { return l.m.done() }

// errNoLane says a bulk stream travels on the tunnel instead.
var errNoLane = errors.New("tunnel: no bulk lane")
