package hub

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-edge/tether/tunnel"
)

// streamDemux splits the streams edges open to the hub in two. The
// agent's own API requests are plain HTTP/1.1, served by the tunnel's HTTP
// server as the node whose certificate the tunnel verified. Connections a
// pod makes to the kubernetes Service are relayed by its node's agent byte
// for byte: they carry the pod's own TLS, which the hub terminates with
// the API port's configuration and handler, so that the pod verifies the
// hub against kube-root-ca.crt, speaks HTTP/2 and authenticates with its
// own credentials (its service account token), never as the node that
// relayed it.
//
// The two are told apart by their first byte: a TLS connection starts with
// a handshake record (0x16), which no HTTP request does. The first byte is
// awaited in a goroutine of each stream, with a deadline, so that a slow
// stream holds up no other.
type streamDemux struct {
	src            net.Listener
	plain, relayed *connListener
	// peekTimeout bounds the wait for a stream's first byte.
	peekTimeout time.Duration
	// relayedTotal counts the relayed pod connections accepted.
	relayedTotal atomic.Int64
}

// tlsRecordHandshake is the content type of a TLS handshake record, the
// first byte of a ClientHello.
const tlsRecordHandshake = 0x16

func newStreamDemux(src net.Listener) *streamDemux {
	return &streamDemux{src: src, plain: newConnListener(src.Addr()), relayed: newConnListener(src.Addr()),
		peekTimeout: 30 * time.Second}
}

// Plain is the listener of the node's own, plain HTTP streams.
func (d *streamDemux) Plain() net.Listener { return d.plain }

// Run hands relayed pod connections to srv, the API's HTTPS server, and
// plain streams to Plain, until the tunnel's listener closes. A relayed
// connection may negotiate only HTTP/2 or HTTP/1.1, not the tunnel's own
// protocol that srv also serves.
func (d *streamDemux) Run(srv *http.Server) error {
	cfg := srv.TLSConfig.Clone()
	cfg.NextProtos = slices.DeleteFunc(slices.Clone(cfg.NextProtos), func(p string) bool { return p == tunnel.ALPN })
	go func() { _ = srv.Serve(d.relayed) }()
	defer d.relayed.Close()
	defer d.plain.Close()
	for {
		c, err := d.src.Accept()
		if err != nil {
			return err
		}
		go d.route(c, cfg)
	}
}

func (d *streamDemux) route(c net.Conn, cfg *tls.Config) {
	peer, hasPeer := tunnel.PeerOf(c)
	first := make([]byte, 1)
	_ = c.SetReadDeadline(time.Now().Add(d.peekTimeout))
	_, err := io.ReadFull(c, first)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	pc := &peekedConn{Conn: c, first: first}
	if first[0] == tlsRecordHandshake {
		d.relayedTotal.Add(1)
		if !d.relayed.push(tls.Server(pc, cfg)) {
			c.Close()
		}
		return
	}
	pc.peer, pc.hasPeer = peer, hasPeer
	if !d.plain.push(pc) {
		c.Close()
	}
}

// streamPeer returns the tunnel peer (the node) of a plain stream that
// streamDemux handed on.
func streamPeer(c net.Conn) (tunnel.Peer, bool) {
	if pc, ok := c.(*peekedConn); ok {
		return pc.peer, pc.hasPeer
	}
	return tunnel.PeerOf(c)
}

// peekedConn is a stream whose first bytes were read already: reads
// return them first.
type peekedConn struct {
	net.Conn
	first   []byte
	peer    tunnel.Peer
	hasPeer bool
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the stream when it can, as net/http expects of
// the connections it serves.
func (c *peekedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// connListener is a net.Listener of connections pushed to it.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// push hands c to Accept; false when the listener closed first.
func (l *connListener) push(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }
