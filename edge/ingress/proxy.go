package ingress

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
)

// maxIdlePerBackend is how many idle connections to one backend address
// the controller keeps: as many as clients it may serve at once, so that
// a burst does not end in closing connections it would dial again.
const maxIdlePerBackend = 1024

// proxyBufferSize is the size of the buffers bodies are copied through.
const proxyBufferSize = 32 << 10

// proxyTo returns the reverse proxy to the backend address target
// (ClusterIP:port), made on first use and kept: one per address, so that
// a request needs no per-request state to say where it goes. There are as
// many as Service ports ever routed to; they share one RoundTripper
// (upstream.go) and its connections.
func (c *Controller) proxyTo(target string) *httputil.ReverseProxy {
	if p, ok := c.proxies.Load(target); ok {
		return p.(*httputil.ReverseProxy)
	}
	u := &url.URL{Scheme: "http", Host: target}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			setXForwarded(pr)
		},
		Transport: c.up,
		// No FlushInterval: a response of known length goes out in
		// one write when the handler returns, while streamed ones
		// (no Content-Length, text/event-stream) are flushed at each
		// write, as ReverseProxy does by itself. Flushing every
		// response at once cost a timer, a goroutine and a write of
		// its own for the headers.
		BufferPool: &c.buffers,
		ErrorLog:   c.errorLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			c.log.Debug("backend failed", "host", r.Host, "path", r.URL.Path, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	actual, _ := c.proxies.LoadOrStore(target, p)
	return actual.(*httputil.ReverseProxy)
}

// setXForwarded sets X-Forwarded-For to the client's address,
// X-Forwarded-Host to the Host it asked for and X-Forwarded-Proto to its
// scheme, as ProxyRequest.SetXForwarded does for a request whose
// X-Forwarded-* headers the reverse proxy has removed before Rewrite: the
// three values share one allocation, where Header.Set makes one each.
func setXForwarded(pr *httputil.ProxyRequest) {
	vals := make([]string, 3)
	if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		vals[0] = ip
		pr.Out.Header["X-Forwarded-For"] = vals[0:1:1]
	}
	vals[1] = pr.In.Host
	pr.Out.Header["X-Forwarded-Host"] = vals[1:2:2]
	vals[2] = "http"
	if pr.In.TLS != nil {
		vals[2] = "https"
	}
	pr.Out.Header["X-Forwarded-Proto"] = vals[2:3:3]
}

// bufferPool lends the reverse proxies their copy buffers
// (httputil.BufferPool). It keeps them as array pointers, which a buffer
// given back converts to without allocating, where a pointer to its slice
// would be a new allocation at every Put.
type bufferPool struct{ p sync.Pool }

// Get returns a buffer of proxyBufferSize bytes.
func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[proxyBufferSize]byte); ok {
		return buf[:]
	}
	return make([]byte, proxyBufferSize)
}

// Put takes a buffer back.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == proxyBufferSize {
		b.p.Put((*[proxyBufferSize]byte)(buf[:proxyBufferSize]))
	}
}
