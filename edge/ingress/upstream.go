package ingress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"
)

// upstreamIdleTimeout is how long a kept-alive backend connection may
// wait for its next request.
const upstreamIdleTimeout = 90 * time.Second

// upstream is the reverse proxies' RoundTripper. A request without a body
// that asks for no protocol upgrade, nearly every request a web
// application gets, is written on a kept-alive HTTP/1.1 connection to the
// backend and its answer read on the calling goroutine: the handler's.
// http.Transport hands every request to two goroutines of the connection
// (one writes it, one reads the answer) and waits for them on channels;
// here the proxy does the same reads and writes without those hand-offs.
// The rest (request bodies, WebSocket and other upgrades) goes through
// the Transport, which streams a body while the answer comes in and hands
// an upgraded connection over.
type upstream struct {
	tr   *http.Transport
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu   sync.Mutex
	idle map[string][]*backendConn // by address, the longest idle first
}

// backendConn is one kept-alive connection to a backend address.
type backendConn struct {
	addr      string
	conn      net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
}

func newUpstream(tr *http.Transport, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *upstream {
	return &upstream{tr: tr, dial: dial, idle: map[string][]*backendConn{}}
}

// RoundTrip implements http.RoundTripper.
func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody || req.URL.Scheme != "http" ||
		req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
		return u.tr.RoundTrip(req)
	}
	ctx := req.Context()
	addr := canonicalAddr(req.URL.Host)
	for {
		bc, reused, err := u.get(ctx, addr)
		if err != nil {
			return nil, err
		}
		resp, sent, err := u.roundTrip(bc, req)
		if err == nil {
			return resp, nil
		}
		bc.conn.Close()
		// A kept-alive connection the backend closed while it was
		// idle fails before any answer: the request is sent again on
		// the next one, as http.Transport does, when it is safe to.
		if !reused || sent || !idempotent(req) || ctx.Err() != nil {
			return nil, err
		}
	}
}

// roundTrip writes req on bc and reads the answer's header. sent reports
// whether any byte of an answer came back, after which the request is not
// sent again.
func (u *upstream) roundTrip(bc *backendConn, req *http.Request) (resp *http.Response, sent bool, err error) {
	ctx := req.Context()
	// Cancelling the request (the client went away) unblocks the
	// connection's reads and writes; the connection is then dropped.
	stop := context.AfterFunc(ctx, func() { _ = bc.conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, bool, error) {
		stop()
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		return nil, sent, err
	}
	if err := req.Write(bc.bw); err != nil {
		return fail(fmt.Errorf("write request to %s: %w", bc.addr, err))
	}
	if err := bc.bw.Flush(); err != nil {
		return fail(fmt.Errorf("write request to %s: %w", bc.addr, err))
	}
	trace := httptrace.ContextClientTrace(ctx)
	for {
		if _, err := bc.br.Peek(1); err != nil {
			return fail(fmt.Errorf("read answer from %s: %w", bc.addr, err))
		}
		sent = true
		resp, err = http.ReadResponse(bc.br, req)
		if err != nil {
			return fail(fmt.Errorf("read answer from %s: %w", bc.addr, err))
		}
		// Interim answers (100 Continue, 103 Early Hints) go to the
		// proxy's trace, which passes them to the client; the final
		// answer follows on the connection.
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
				return fail(err)
			}
		}
	}
	b := &upstreamBody{u: u, bc: bc, body: resp.Body, stop: stop, keep: !resp.Close}
	if resp.Body == http.NoBody {
		b.finish(true)
		return resp, true, nil
	}
	resp.Body = b
	return resp, true, nil
}

// upstreamBody is an answer's body read from a kept-alive connection: the
// connection is kept for the next request when the body is read to its
// end, and closed when the body is closed before.
type upstreamBody struct {
	u    *upstream
	bc   *backendConn
	body io.ReadCloser
	stop func() bool
	keep bool // the backend keeps the connection open
	done bool
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		b.finish(false)
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	if !b.done {
		b.finish(false)
	}
	return nil
}

// finish gives the connection back when the whole answer was read and
// the request was not cancelled meanwhile, and closes it otherwise.
func (b *upstreamBody) finish(read bool) {
	b.done = true
	if b.stop() && read && b.keep {
		b.u.put(b.bc)
		return
	}
	b.bc.conn.Close()
}

// get returns an idle connection to addr, the last one given back, or
// dials one; reused reports which.
func (u *upstream) get(ctx context.Context, addr string) (bc *backendConn, reused bool, err error) {
	now := time.Now()
	u.mu.Lock()
	for {
		conns := u.idle[addr]
		if len(conns) == 0 {
			break
		}
		bc = conns[len(conns)-1]
		conns[len(conns)-1] = nil
		u.idle[addr] = conns[:len(conns)-1]
		if now.Sub(bc.idleSince) < upstreamIdleTimeout {
			u.mu.Unlock()
			return bc, true, nil
		}
		bc.conn.Close()
	}
	u.mu.Unlock()
	conn, err := u.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return &backendConn{addr: addr, conn: conn, br: bufio.NewReader(conn), bw: bufio.NewWriter(conn)}, false, nil
}

// put keeps bc for the next request to its address, and closes the
// connections idle for longer than upstreamIdleTimeout or beyond
// maxIdlePerBackend.
func (u *upstream) put(bc *backendConn) {
	now := time.Now()
	bc.idleSince = now
	u.mu.Lock()
	conns := u.idle[bc.addr]
	stale := 0
	for stale < len(conns) && (now.Sub(conns[stale].idleSince) >= upstreamIdleTimeout || len(conns)-stale >= maxIdlePerBackend) {
		conns[stale].conn.Close()
		stale++
	}
	if stale > 0 {
		conns = append(conns[:0], conns[stale:]...)
	}
	u.idle[bc.addr] = append(conns, bc)
	u.mu.Unlock()
}

// reap closes the connections idle for upstreamIdleTimeout or longer, of
// every address, and forgets addresses left with none: a backend that no
// request goes to any more (an endpoint removed, a route gone quiet) does
// not keep a connection and its descriptor open. It returns how many it
// closed.
func (u *upstream) reap(now time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	closed := 0
	for addr, conns := range u.idle {
		stale := 0
		for stale < len(conns) && now.Sub(conns[stale].idleSince) >= upstreamIdleTimeout {
			conns[stale].conn.Close()
			conns[stale] = nil
			stale++
		}
		closed += stale
		if stale == len(conns) {
			delete(u.idle, addr)
		} else if stale > 0 {
			u.idle[addr] = append(conns[:0], conns[stale:]...)
		}
	}
	return closed
}

// reapEvery reaps every interval until ctx ends.
func (u *upstream) reapEvery(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			u.reap(now)
		}
	}
}

// closeIdle closes the idle connections.
func (u *upstream) closeIdle() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for addr, conns := range u.idle {
		for _, bc := range conns {
			bc.conn.Close()
		}
		delete(u.idle, addr)
	}
	u.tr.CloseIdleConnections()
}

// idempotent reports whether req may be sent again after a connection
// failed before any answer.
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// canonicalAddr is host:port of a URL's host, port 80 when it has none.
func canonicalAddr(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	return net.JoinHostPort(host, "80")
}
