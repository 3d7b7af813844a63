package tunnel

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// Stream error codes, sent in QUIC RESET_STREAM/STOP_SENDING frames and in
// the reset frames of the TCP fallback.
const (
	codeStreamClosed   uint64 = 0x201 // the local side closed the conn without reading it to the end
	codeDialFailed     uint64 = 0x202 // the edge could not connect the target
	codeDialTimeout    uint64 = 0x203 // no dial status within DialTimeout
	codeTooManyStreams uint64 = 0x204 // per-edge stream cap reached
	codeAborted        uint64 = 0x205 // the local end of a tunneled connection failed
	codeStreamProtocol uint64 = 0x206 // bad preamble
	codeLaneLost       uint64 = 0x207 // the bulk lane carrying the stream was lost
)

// ResetError is returned by Read and Write on a tunneled connection whose
// stream was reset, by the peer (Remote) or locally. It is never io.EOF: a
// reset means the data may be incomplete.
type ResetError struct {
	Code   uint64
	Remote bool
}

func (e *ResetError) Error() string {
	who := "locally"
	if e.Remote {
		who = "by peer"
	}
	return fmt.Sprintf("tunnel: stream reset %s (code %#x)", who, e.Code)
}

// rawStream is one multiplexed stream of either transport, before the
// tunnel's own preamble handling. Read and Write carry the payload only; on
// the TCP fallback the framing that makes resets visible is already removed.
type rawStream interface {
	io.Reader
	io.Writer
	// rawRead and rawWrite bypass any payload framing; preambles and the
	// dial status use them, before the first payload byte.
	rawRead(p []byte) (int, error)
	rawWrite(p []byte) (int, error)
	// writeWithPreamble writes a raw preamble followed by payload p, in one
	// transport write where possible.
	writeWithPreamble(pre, p []byte) error
	// closeWrite sends a graceful end of stream.
	closeWrite() error
	// abort resets both directions; the peer's reads and writes fail.
	abort(code uint64)
	// stopReading tells the peer we will not read any more.
	stopReading(code uint64)
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// quicStream adapts a QUIC stream: QUIC already has resets and per-stream
// flow control, so this is a thin shim.
type quicStream struct{ s *quic.Stream }

func (q quicStream) Read(p []byte) (int, error)     { return q.s.Read(p) }
func (q quicStream) Write(p []byte) (int, error)    { return q.s.Write(p) }
func (q quicStream) closeWrite() error              { return q.s.Close() }
func (q quicStream) rawRead(p []byte) (int, error)  { return q.s.Read(p) }
func (q quicStream) rawWrite(p []byte) (int, error) { return q.s.Write(p) }
func (q quicStream) writeWithPreamble(pre, p []byte) error {
	_, err := q.s.Write(append(pre, p...))
	return err
}
func (q quicStream) abort(code uint64) {
	q.s.CancelWrite(quic.StreamErrorCode(code))
	q.s.CancelRead(quic.StreamErrorCode(code))
}
func (q quicStream) stopReading(code uint64)            { q.s.CancelRead(quic.StreamErrorCode(code)) }
func (q quicStream) SetDeadline(t time.Time) error      { return q.s.SetDeadline(t) }
func (q quicStream) SetReadDeadline(t time.Time) error  { return q.s.SetReadDeadline(t) }
func (q quicStream) SetWriteDeadline(t time.Time) error { return q.s.SetWriteDeadline(t) }

// mapErr turns transport-specific stream errors into the package's own, so
// callers see the same errors whichever transport carries the stream.
func mapErr(err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	var se *quic.StreamError
	if errors.As(err, &se) {
		return &ResetError{Code: uint64(se.ErrorCode), Remote: se.Remote}
	}
	switch {
	case errors.Is(err, yamux.ErrTimeout):
		return os.ErrDeadlineExceeded
	case errors.Is(err, yamux.ErrConnectionReset):
		return &ResetError{Code: codeAborted, Remote: true}
	}
	return err
}

// streamConn is a tunneled connection: one stream exposed as a net.Conn.
type streamConn struct {
	raw           rawStream
	local, remote net.Addr
	peer          Peer
	hasPeer       bool

	// dial is non-nil on hub-opened streams until the edge's status is in.
	dial *dialState

	// lazy holds a preamble not yet written. Edge-opened streams send it with
	// the first payload write so that preamble and request share a packet.
	lazy atomic.Bool
	wmu  sync.Mutex // guards pending
	// pending is the unsent preamble.
	pending []byte

	// writers counts Write calls in progress. Closing under a blocked
	// Write resets the stream: a graceful end there would let the peer
	// take a truncated write for a complete one.
	writers   atomic.Int32
	closed    atomic.Bool
	closeOnce sync.Once
	onClose   func() // releases caps; may be nil
}

var _ net.Conn = (*streamConn)(nil)

// dialState tracks the edge's answer to a hub-opened stream.
type dialState struct {
	done chan struct{} // closed once err is set
	err  error         // nil: the edge connected the target
}

// DialError is returned by Read or Write on a conn from Server.Dial when the
// edge could not connect the target.
type DialError struct {
	Node, Target string
	Msg          string // the edge's error text
}

func (e *DialError) Error() string {
	return fmt.Sprintf("tunnel: dial %s on node %s: %s", e.Target, e.Node, e.Msg)
}

func (c *streamConn) waitDial() error {
	if c.dial == nil {
		return nil
	}
	<-c.dial.done
	return c.dial.err
}

func (c *streamConn) Read(p []byte) (int, error) {
	if err := c.waitDial(); err != nil {
		return 0, err
	}
	if c.lazy.Load() {
		// A reader that speaks first would otherwise wait forever: the peer
		// only learns of the stream from its preamble.
		if err := c.flush(nil); err != nil {
			return 0, err
		}
	}
	n, err := c.raw.Read(p)
	if err != nil && err != io.EOF {
		if c.closed.Load() {
			return n, net.ErrClosed
		}
		err = mapErr(err)
	}
	return n, err
}

func (c *streamConn) Write(p []byte) (int, error) {
	if c.dial != nil {
		select {
		case <-c.dial.done:
			if c.dial.err != nil {
				return 0, c.dial.err
			}
		default:
			// Optimistic: write before the edge has answered.
		}
	}
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	c.writers.Add(1)
	defer c.writers.Add(-1)
	if c.lazy.Load() {
		if err := c.flush(p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	n, err := c.raw.Write(p)
	if err != nil {
		if c.dial != nil {
			// A failed dial stops our writes; the status that says why is
			// already on its way (bounded by DialTimeout).
			<-c.dial.done
			if c.dial.err != nil {
				return n, c.dial.err
			}
		}
		if c.closed.Load() {
			return n, net.ErrClosed
		}
		err = mapErr(err)
	}
	return n, err
}

// flush writes the pending preamble, followed by p in the same write.
func (c *streamConn) flush(p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.pending == nil {
		if len(p) == 0 {
			return nil
		}
		_, err := c.raw.Write(p)
		return mapErr(err)
	}
	pre := c.pending
	c.pending = nil
	// Writers that find lazy unset write straight to the stream: only
	// once the preamble is out, or their bytes could go before it.
	defer c.lazy.Store(false)
	return mapErr(c.raw.writeWithPreamble(pre, p))
}

// CloseWrite ends the sending direction; the peer reads EOF after the data.
func (c *streamConn) CloseWrite() error {
	if c.lazy.Load() {
		if err := c.flush(nil); err != nil {
			return err
		}
	}
	return mapErr(c.raw.closeWrite())
}

// Close ends both directions: written data is still delivered, then EOF;
// the peer's further writes fail. A Write blocked on flow control is
// interrupted, and the stream is reset instead.
func (c *streamConn) Close() error {
	if c.writers.Load() > 0 {
		c.abort(codeStreamClosed)
		return nil
	}
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if c.lazy.Load() {
			c.wmu.Lock()
			unsent := c.pending != nil
			c.wmu.Unlock()
			if unsent {
				// The peer never heard of this stream; just drop it.
				c.raw.abort(codeStreamClosed)
				if c.onClose != nil {
					c.onClose()
				}
				return
			}
		}
		c.raw.closeWrite()
		c.raw.stopReading(codeStreamClosed)
		if c.onClose != nil {
			c.onClose()
		}
	})
	return nil
}

// abort resets the stream, so the peer sees an error rather than EOF.
func (c *streamConn) abort(code uint64) {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.raw.abort(code)
		if c.onClose != nil {
			c.onClose()
		}
	})
}

func (c *streamConn) LocalAddr() net.Addr                { return c.local }
func (c *streamConn) RemoteAddr() net.Addr               { return c.remote }
func (c *streamConn) SetDeadline(t time.Time) error      { return c.raw.SetDeadline(t) }
func (c *streamConn) SetReadDeadline(t time.Time) error  { return c.raw.SetReadDeadline(t) }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return c.raw.SetWriteDeadline(t) }

// PeerOf returns the peer of a conn handed out by Server.Listener().Accept()
// or Server.Dial; ok is false for any other conn.
func PeerOf(c net.Conn) (Peer, bool) {
	sc, ok := c.(*streamConn)
	if !ok || !sc.hasPeer {
		return Peer{}, false
	}
	return sc.peer, true
}
