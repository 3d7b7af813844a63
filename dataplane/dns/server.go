// Package dns is tether's node-local cluster DNS. It answers the Kubernetes
// DNS schema (<svc>.<ns>.svc.<zone>, headless Services, SRV for named ports,
// per-pod hostnames, ExternalName, pod A records, reverse lookups of Service
// and pod addresses) from the Services and EndpointSlices the agent feeds it,
// so it keeps answering while the node is cut off from the hub. Every other
// name goes to the node's upstream resolvers through a TTL-respecting cache
// with negative caching.
//
// A Server implements the same Upsert/Delete methods as the dataplane and is
// usually registered as one of its observers.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Config configures a Server. Zero values take the defaults in parentheses.
type Config struct {
	// ClusterDomain is the zone served from local state ("cluster.local").
	ClusterDomain string
	// Upstreams are the resolvers (host:port) for every other name. Nil:
	// the nameservers of ResolvConfPath; an empty, non-nil slice forwards
	// nothing (other names get SERVFAIL).
	Upstreams []string
	// ResolvConfPath is the node's resolver configuration
	// ("/etc/resolv.conf").
	ResolvConfPath string
	// TTL of cluster records, in seconds (5, as CoreDNS).
	TTL uint32
	// CacheSize bounds the forwarding cache (10000 answers).
	CacheSize int
	// MaxTTL caps how long a forwarded answer is cached (1 h);
	// MaxNegativeTTL caps NXDOMAIN and NODATA answers (30 min).
	MaxTTL, MaxNegativeTTL time.Duration
	// UpstreamTimeout bounds one upstream exchange (2 s).
	UpstreamTimeout time.Duration
	// Logger receives the server's logs (slog.Default()).
	Logger *slog.Logger
	// OnQuery, when set, is called for every question answered, with the
	// response code (for metrics and tests).
	OnQuery func(name string, qtype uint16, rcode int, forwarded bool)
	// WaitForState makes the server answer SERVFAIL for the cluster zone
	// until SetReady is called, so that clients retry instead of caching
	// NXDOMAIN for names whose Services it has not been given yet. Other
	// names are forwarded meanwhile.
	WaitForState bool
}

// Server answers DNS queries. Its methods are safe for concurrent use.
type Server struct {
	cfg  Config
	log  *slog.Logger
	zone string // "cluster.local." (lower case, fully qualified)
	fwd  *forwarder

	mu       sync.RWMutex
	services map[types.NamespacedName]*corev1.Service
	slices   map[types.NamespacedName]*discoveryv1.EndpointSlice
	bySvc    map[types.NamespacedName]map[string]bool
	nsCount  map[string]int // Services per namespace: a namespace name exists while it has one

	srvMu   sync.Mutex
	servers []*dns.Server

	ready atomic.Bool // the cluster state is complete (see Config.WaitForState)
}

// New creates a Server; it serves nothing until Serve or ListenAndServe.
func New(cfg Config) (*Server, error) {
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	if cfg.ResolvConfPath == "" {
		cfg.ResolvConfPath = "/etc/resolv.conf"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 5
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = 10000
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.MaxNegativeTTL <= 0 {
		cfg.MaxNegativeTTL = 30 * time.Minute
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Upstreams == nil {
		rc, err := dns.ClientConfigFromFile(cfg.ResolvConfPath)
		if err != nil {
			return nil, fmt.Errorf("read upstream resolvers: %w", err)
		}
		for _, s := range rc.Servers {
			cfg.Upstreams = append(cfg.Upstreams, net.JoinHostPort(s, rc.Port))
		}
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "dns"),
		zone:     dns.Fqdn(strings.ToLower(cfg.ClusterDomain)),
		services: map[types.NamespacedName]*corev1.Service{},
		slices:   map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		bySvc:    map[types.NamespacedName]map[string]bool{},
		nsCount:  map[string]int{},
	}
	s.fwd = newForwarder(cfg.Upstreams, cfg.UpstreamTimeout, newCache(cfg.CacheSize, cfg.MaxTTL, cfg.MaxNegativeTTL))
	s.ready.Store(!cfg.WaitForState)
	return s, nil
}

// SetReady tells the server that it has been given the complete cluster
// state: from now on it answers the cluster zone (see Config.WaitForState).
func (s *Server) SetReady() { s.ready.Store(true) }

// UpsertService records a Service.
func (s *Server) UpsertService(svc *corev1.Service) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.services[key]; !ok {
		s.nsCount[svc.Namespace]++
	}
	s.services[key] = svc
}

// DeleteService forgets a Service.
func (s *Server) DeleteService(namespace, name string) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.services[key]; ok {
		delete(s.services, key)
		if s.nsCount[namespace]--; s.nsCount[namespace] <= 0 {
			delete(s.nsCount, namespace)
		}
	}
}

// UpsertEndpointSlice records an EndpointSlice.
func (s *Server) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) {
	key := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.slices[key]; old != nil {
		s.unlinkSlice(old)
	}
	s.slices[key] = es
	svc := types.NamespacedName{Namespace: es.Namespace, Name: es.Labels[discoveryv1.LabelServiceName]}
	if svc.Name != "" {
		if s.bySvc[svc] == nil {
			s.bySvc[svc] = map[string]bool{}
		}
		s.bySvc[svc][es.Name] = true
	}
}

// DeleteEndpointSlice forgets an EndpointSlice.
func (s *Server) DeleteEndpointSlice(namespace, name string) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.slices[key]; old != nil {
		s.unlinkSlice(old)
		delete(s.slices, key)
	}
}

func (s *Server) unlinkSlice(es *discoveryv1.EndpointSlice) {
	svc := types.NamespacedName{Namespace: es.Namespace, Name: es.Labels[discoveryv1.LabelServiceName]}
	if m := s.bySvc[svc]; m != nil {
		delete(m, es.Name)
		if len(m) == 0 {
			delete(s.bySvc, svc)
		}
	}
}

// ListenAndServe serves UDP and TCP on addr until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listen dns udp: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("listen dns tcp: %w", err)
	}
	return s.Serve(ctx, pc, ln)
}

// Serve answers queries on the given sockets (either may be nil) until ctx
// ends or Close is called. The sockets are closed on return.
func (s *Server) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener) error {
	var srvs []*dns.Server
	if pc != nil {
		srvs = append(srvs, &dns.Server{PacketConn: pc, Handler: s})
	}
	if ln != nil {
		srvs = append(srvs, &dns.Server{Listener: ln, Handler: s})
	}
	s.srvMu.Lock()
	s.servers = append(s.servers, srvs...)
	s.srvMu.Unlock()
	errc := make(chan error, len(srvs))
	for _, srv := range srvs {
		go func() { errc <- srv.ActivateAndServe() }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, srv := range srvs {
		srv.Shutdown()
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve dns: %w", err)
	}
	return nil
}

// Close stops every Serve loop.
func (s *Server) Close() error {
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	for _, srv := range s.servers {
		srv.Shutdown()
	}
	s.servers = nil
	return nil
}

// ServeDNS answers one query (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := s.Answer(req)
	if _, tcp := w.RemoteAddr().(*net.TCPAddr); !tcp {
		truncateForUDP(req, resp)
	} else if o := req.IsEdns0(); o != nil && resp.IsEdns0() == nil {
		resp.SetEdns0(o.UDPSize(), false)
	}
	w.WriteMsg(resp)
}

// Answer computes the response to req: from local state for the cluster
// zone and cluster reverse addresses, from the upstreams otherwise.
func (s *Server) Answer(req *dns.Msg) *dns.Msg {
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeNotImplemented)
		return m
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if q.Qclass == dns.ClassINET || q.Qclass == dns.ClassANY {
		if m := s.local(req, q, name); m != nil {
			s.observe(q, m.Rcode, false)
			return m
		}
	}
	m, err := s.fwd.resolve(req)
	if err != nil {
		s.log.Debug("forward query", "name", q.Name, "err", err)
		m = new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		m.RecursionAvailable = true
	}
	s.observe(q, m.Rcode, true)
	return m
}

func (s *Server) observe(q dns.Question, rcode int, fwd bool) {
	if s.cfg.OnQuery != nil {
		s.cfg.OnQuery(q.Name, q.Qtype, rcode, fwd)
	}
}

// truncateForUDP keeps a UDP response within the client's advertised size
// (512 bytes without EDNS), setting TC so that the client retries over TCP.
func truncateForUDP(req, m *dns.Msg) {
	size := dns.MinMsgSize
	if o := req.IsEdns0(); o != nil {
		size = max(int(o.UDPSize()), dns.MinMsgSize)
		if m.IsEdns0() == nil {
			m.SetEdns0(o.UDPSize(), false)
		}
	}
	m.Truncate(size)
}
