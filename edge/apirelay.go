package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Pods reach the hub's API as in-cluster clients do, through the
// kubernetes Service, behind any NAT: the agent feeds its dataplane the
// relay's address as the only endpoint of default/kubernetes, and the relay
// pipes each connection to a stream of the tunnel. The hub serves a stream
// that starts with a TLS ClientHello with its HTTPS server, as if the pod
// had dialled it: the pod's service account token authenticates it, never
// the node's identity. The relay terminates nothing; it only checks that a
// connection starts with a ClientHello, so that no plain request reaches
// the hub on the node's behalf.

const (
	// relayHelloTimeout bounds the wait for a connection's first bytes.
	relayHelloTimeout = 10 * time.Second
	// relayDialTimeout bounds the wait for a tunnel stream.
	relayDialTimeout = 30 * time.Second
)

// apiRelay relays pods' connections to the hub over the tunnel.
type apiRelay struct {
	ln    net.Listener
	addr  netip.AddrPort // where it listens
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	log   *slog.Logger
	slots chan struct{} // one per connection being relayed

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	active             atomic.Int64 // connections being relayed now
	relayed            atomic.Int64 // connections piped to the hub
	rejected, failures atomic.Int64 // refused (over the bound, not TLS); no stream
}

// startAPIRelay opens the relay's socket, after putting its address on
// the DNS interface when the agent manages one. It returns nil when the
// relay is off.
func (a *Agent) startAPIRelay() (*apiRelay, error) {
	addr := a.cfg.APIRelayAddr
	if !addr.IsValid() {
		return nil, nil
	}
	if a.cfg.DNSInterface != "" {
		if _, err := ensureDNSInterface(a.cfg.DNSInterface, addr.Addr()); err != nil {
			return nil, fmt.Errorf("set up the API relay address %s on %s: %w", addr.Addr(), a.cfg.DNSInterface, err)
		}
	}
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		return nil, fmt.Errorf("listen for the API relay on %s: %w", addr, err)
	}
	bound := netip.AddrPortFrom(addr.Addr(), uint16(ln.Addr().(*net.TCPAddr).Port))
	a.log.Info("API relay listening", "addr", bound)
	return &apiRelay{
		ln: ln, addr: bound, log: a.log.With("component", "api-relay"),
		slots: make(chan struct{}, a.cfg.APIRelayMaxConns),
		conns: map[net.Conn]struct{}{},
	}, nil
}

// serve accepts connections until ctx ends, then closes the socket and
// every relayed connection and returns once their goroutines are done.
func (r *apiRelay) serve(ctx context.Context) {
	stop := context.AfterFunc(ctx, r.close)
	defer stop()
	defer r.wg.Wait()
	defer r.close()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("accept", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case r.slots <- struct{}{}:
		default:
			r.rejected.Add(1)
			r.log.Debug("refuse connection: too many relayed", "from", c.RemoteAddr(), "max", cap(r.slots))
			abortConn(c)
			continue
		}
		if !r.track(c) {
			c.Close()
			<-r.slots
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.slots }()
			r.relay(ctx, c)
		}()
	}
}

// close stops accepting and closes every connection; it may be called
// more than once.
func (r *apiRelay) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
}

// track registers c for close; false means the relay is closed.
func (r *apiRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *apiRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// relay pipes one pod connection to a new tunnel stream.
func (r *apiRelay) relay(ctx context.Context, c net.Conn) {
	defer r.untrack(c)
	head := make([]byte, 6)
	c.SetReadDeadline(time.Now().Add(relayHelloTimeout))
	if _, err := io.ReadFull(c, head); err != nil || !isClientHello(head) {
		r.rejected.Add(1)
		r.log.Debug("refuse connection: no TLS ClientHello", "from", c.RemoteAddr(), "err", err)
		abortConn(c)
		return
	}
	c.SetReadDeadline(time.Time{})
	dctx, cancel := context.WithTimeout(ctx, relayDialTimeout)
	up, err := r.dial(dctx, "tcp", "hub")
	cancel()
	if err != nil {
		r.failures.Add(1)
		r.log.Debug("open tunnel stream", "from", c.RemoteAddr(), "err", err)
		abortConn(c)
		return
	}
	if !r.track(up) {
		up.Close()
		c.Close()
		return
	}
	defer r.untrack(up)
	r.relayed.Add(1)
	r.active.Add(1)
	defer r.active.Add(-1)
	if _, err := up.Write(head); err != nil {
		up.Close()
		abortConn(c)
		return
	}
	spliceHalfClose(c, up)
}

// spliceHalfClose copies both ways between a and b until both directions
// ended: an end of input is passed on as a half-close, an error closes both.
func spliceHalfClose(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(b, a)
	}()
	copyHalf(a, b)
	<-done
	a.Close()
	b.Close()
}

// copyHalf copies src to dst, then half-closes dst, or closes both on an
// error.
func copyHalf(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		abortConn(dst)
		abortConn(src)
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
}

// abortConn closes a TCP connection with a reset, so that the peer sees
// an error rather than an orderly end.
func abortConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// isClientHello tells whether head, the first six bytes of a connection,
// start a TLS handshake record holding a ClientHello.
func isClientHello(head []byte) bool {
	return len(head) >= 6 && head[0] == 0x16 && head[1] == 0x03 && head[5] == 0x01
}

// relaySink passes Service and EndpointSlice changes on to next, with the
// endpoints of the kubernetes Service replaced by the relay's address.
type relaySink struct {
	next serviceSink
	addr netip.AddrPort
	node string
}

func (s relaySink) UpsertService(svc *corev1.Service)    { s.next.UpsertService(svc) }
func (s relaySink) DeleteService(namespace, name string) { s.next.DeleteService(namespace, name) }
func (s relaySink) DeleteEndpointSlice(namespace, name string) {
	s.next.DeleteEndpointSlice(namespace, name)
}

func (s relaySink) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) {
	if isMasterSlice(es) {
		es = relaySlice(es, s.addr, s.node)
	}
	s.next.UpsertEndpointSlice(es)
}

// isMasterSlice tells whether es is a slice of default/kubernetes.
func isMasterSlice(es *discoveryv1.EndpointSlice) bool {
	return es.Namespace == metav1.NamespaceDefault && es.Labels[discoveryv1.LabelServiceName] == masterServiceName
}

// relaySlice returns a copy of es, a slice of the kubernetes Service, whose
// only endpoint is the relay on this node, serving its https port (or its
// only port) on the relay's port.
func relaySlice(es *discoveryv1.EndpointSlice, relay netip.AddrPort, node string) *discoveryv1.EndpointSlice {
	out := es.DeepCopy()
	out.AddressType = discoveryv1.AddressTypeIPv4
	if relay.Addr().Is6() && !relay.Addr().Is4In6() {
		out.AddressType = discoveryv1.AddressTypeIPv6
	}
	var port *discoveryv1.EndpointPort
	for i := range es.Ports {
		if p := es.Ports[i]; p.Name != nil && *p.Name == "https" {
			port = &out.Ports[i]
			break
		}
	}
	if port == nil && len(out.Ports) == 1 {
		port = &out.Ports[0]
	}
	out.Ports, out.Endpoints = nil, nil
	if port == nil {
		return out
	}
	num := int32(relay.Port())
	tcp := corev1.ProtocolTCP
	out.Ports = []discoveryv1.EndpointPort{{Name: port.Name, Protocol: &tcp, Port: &num}}
	yes, no := true, false
	out.Endpoints = []discoveryv1.Endpoint{{
		Addresses:  []string{relay.Addr().Unmap().String()},
		Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
		NodeName:   &node,
	}}
	return out
}

// serviceSinks are the receivers of Service and EndpointSlice changes:
// the dataplane, through relaySink when the API relay is on, and the DNS
// server, which keeps answering kubernetes.default.svc with the cluster IP.
func (a *Agent) serviceSinks(n *nodeNet) []serviceSink {
	var out []serviceSink
	if n.dp != nil {
		var s serviceSink = n.dp
		if a.relay != nil {
			s = relaySink{next: n.dp, addr: a.relay.addr, node: a.name}
		}
		out = append(out, s)
	}
	if n.dns != nil {
		out = append(out, n.dns)
	}
	return out
}
