package tunnel

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// windowBudget caps the memory that connection flow-control windows may
// grow to across all edges. quic-go asks before every increase of a
// connection window; an increase is granted while the sum of all granted
// growth stays within the limit, and a connection's growth is returned when
// it closes. Initial windows are not counted: they are bounded per
// connection by the config.
type windowBudget struct {
	limit  int64 // < 0: unlimited (still accounted)
	used   atomic.Int64
	denied atomic.Uint64

	mu sync.Mutex // guards perConn
	// perConn is the growth granted to each live connection.
	perConn map[*quic.Conn]int64
}

func newWindowBudget(limit int64) *windowBudget {
	return &windowBudget{limit: limit, perConn: make(map[*quic.Conn]int64)}
}

// allow is quic.Config.AllowConnectionWindowIncrease. It must not call
// into the connection.
func (b *windowBudget) allow(c *quic.Conn, delta uint64) bool {
	d := int64(delta)
	if b.limit >= 0 {
		for {
			used := b.used.Load()
			if used+d > b.limit {
				b.denied.Add(1)
				return false
			}
			if b.used.CompareAndSwap(used, used+d) {
				break
			}
		}
	} else {
		b.used.Add(d)
	}
	b.mu.Lock()
	b.perConn[c] += d
	b.mu.Unlock()
	return true
}

// release returns a closed connection's growth to the budget.
func (b *windowBudget) release(c *quic.Conn) {
	b.mu.Lock()
	d := b.perConn[c]
	delete(b.perConn, c)
	b.mu.Unlock()
	b.used.Add(-d)
}

// listener is Server.Listener: edge-opened streams of all edges.
type listener struct {
	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newListener() *listener {
	return &listener{ch: make(chan net.Conn), done: make(chan struct{})}
}

// deliver hands c to Accept; it gives up when the session ends or the
// listener closes.
func (l *listener) deliver(ctx context.Context, c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-ctx.Done():
	case <-l.done:
	}
	return false
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *listener) Addr() net.Addr { return tunnelAddr{} }

// tunnelAddr names the listener's address, which is no socket.
type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "tunnel" }
func (tunnelAddr) String() string  { return "tunnel" }
