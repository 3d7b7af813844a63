package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// Transport names, as reported in Peer.Transport.
const (
	TransportQUIC = "quic"
	TransportTCP  = "tcp"
)

// Connection close codes (QUIC application error codes). Over the TCP
// fallback the connection is just closed.
const (
	codeConnClosed uint64 = 0x000 // orderly close
	codeReplaced   uint64 = 0x101 // a newer connection of the same node took over
	codeRefused    uint64 = 0x102 // draining or overloaded: back off and retry
	codeProtocol   uint64 = 0x103 // the peer broke the protocol
	codeIdentity   uint64 = 0x104 // hello names another node than the certificate
	codeShutdown   uint64 = 0x105 // the hub is shutting down
)

// muxConn is one hub↔edge connection of either transport.
type muxConn interface {
	openStream(ctx context.Context) (rawStream, error)
	acceptStream(ctx context.Context) (rawStream, error)
	// close ends the connection; code and msg reach a QUIC peer.
	close(code uint64, msg string)
	// done is closed when the connection is gone; err then says why.
	done() <-chan struct{}
	err() error
	localAddr() net.Addr
	remoteAddr() net.Addr
	transport() string
	tlsState() tls.ConnectionState
}

// quicMux is a QUIC connection; fec follows its loss when its socket does
// forward error correction, and is nil otherwise.
type quicMux struct {
	c   *quic.Conn
	fec *fecTrack
}

func (m quicMux) openStream(ctx context.Context) (rawStream, error) {
	s, err := m.c.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	return quicStream{s}, nil
}

func (m quicMux) acceptStream(ctx context.Context) (rawStream, error) {
	s, err := m.c.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	return quicStream{s}, nil
}

func (m quicMux) close(code uint64, msg string) {
	m.c.CloseWithError(quic.ApplicationErrorCode(code), msg)
}
func (m quicMux) done() <-chan struct{}         { return m.c.Context().Done() }
func (m quicMux) err() error                    { return context.Cause(m.c.Context()) }
func (m quicMux) localAddr() net.Addr           { return m.c.LocalAddr() }
func (m quicMux) remoteAddr() net.Addr          { return m.c.RemoteAddr() }
func (m quicMux) transport() string             { return TransportQUIC }
func (m quicMux) tlsState() tls.ConnectionState { return m.c.ConnectionState().TLS }

// yamuxMux is the TCP+TLS fallback.
type yamuxMux struct {
	s  *yamux.Session
	tc *tls.Conn
	// strict: a bulk lane, whose streams end with fin frames.
	strict bool
	// cfg is the session's yamux config, which yamux reads as it goes: a
	// hub that learns a connection is a lane widens its stream window.
	cfg *yamux.Config

	mu       sync.Mutex // guards closeErr
	closeErr error
}

// yamuxConfig tunes yamux for the tunnel: no yamux keepalives (the control
// stream heartbeat already does that job, and every extra packet costs
// metered links), and a stream window matching the QUIC one.
func yamuxConfig(window int) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	if window > int(cfg.MaxStreamWindowSize) {
		cfg.MaxStreamWindowSize = uint32(min(window, 1<<31-1))
	}
	cfg.StreamCloseTimeout = 30 * time.Second
	return cfg
}

func newYamuxMux(tc *tls.Conn, client bool, window int) (*yamuxMux, error) {
	var (
		s   *yamux.Session
		err error
		cfg = yamuxConfig(window)
	)
	if client {
		s, err = yamux.Client(tc, cfg)
	} else {
		s, err = yamux.Server(tc, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("start yamux: %w", err)
	}
	return &yamuxMux{s: s, tc: tc, cfg: cfg}, nil
}

func (m *yamuxMux) openStream(ctx context.Context) (rawStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := m.s.OpenStream()
	if err != nil {
		return nil, m.wrap(err)
	}
	return newYamuxStream(s, m.s, m.strict), nil
}

func (m *yamuxMux) acceptStream(ctx context.Context) (rawStream, error) {
	s, err := m.s.AcceptStreamWithContext(ctx)
	if err != nil {
		return nil, m.wrap(err)
	}
	return newYamuxStream(s, m.s, m.strict), nil
}

// wrap reports why the session closed when yamux only says it did.
func (m *yamuxMux) wrap(err error) error {
	if errors.Is(err, yamux.ErrSessionShutdown) {
		if e := m.err(); e != nil {
			return e
		}
	}
	return err
}

func (m *yamuxMux) close(code uint64, msg string) {
	m.mu.Lock()
	if m.closeErr == nil {
		m.closeErr = &connClosedError{code: code, msg: msg}
	}
	m.mu.Unlock()
	// yamux's close, and TLS's close_notify after it, wait for a write in
	// progress; a peer that reads nothing (its buffers full, its process
	// stalled) would hold them for as long as it stalls. Give them a
	// moment, then drop the socket under them.
	drop := time.AfterFunc(yamuxCloseGrace, func() { _ = m.tc.NetConn().Close() })
	defer drop.Stop()
	m.s.Close()
	m.tc.Close()
}

// yamuxCloseGrace is how long closing a yamux session may wait for the
// writes in progress before its socket is closed under them.
const yamuxCloseGrace = time.Second

func (m *yamuxMux) done() <-chan struct{} { return m.s.CloseChan() }

func (m *yamuxMux) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closeErr != nil {
		return m.closeErr
	}
	if m.s.IsClosed() {
		return yamux.ErrSessionShutdown
	}
	return nil
}

func (m *yamuxMux) localAddr() net.Addr           { return m.tc.LocalAddr() }
func (m *yamuxMux) remoteAddr() net.Addr          { return m.tc.RemoteAddr() }
func (m *yamuxMux) transport() string             { return TransportTCP }
func (m *yamuxMux) tlsState() tls.ConnectionState { return m.tc.ConnectionState() }

// connClosedError records a local close of a fallback connection.
type connClosedError struct {
	code uint64
	msg  string
}

func (e *connClosedError) Error() string {
	return fmt.Sprintf("tunnel: connection closed locally (code %#x): %s", e.code, e.msg)
}

// rawReader reads a stream without payload framing, for preambles.
type rawReader struct{ s rawStream }

func (r rawReader) Read(p []byte) (int, error) { return r.s.rawRead(p) }

// preambleReader returns a reader that consumes a preamble byte by byte, so
// nothing after it is swallowed.
func preambleReader(s rawStream) *byteReader { return &byteReader{r: rawReader{s}} }
