// Package ingress is tether's built-in ingress controller. It serves the
// Kubernetes Ingresses whose IngressClass names the controller
// tether.io/ingress on the node's ports 80 and 443, with
// net/http/httputil's reverse proxy (HTTP/1.1, HTTP/2 over TLS, and
// protocol upgrades such as WebSocket passed through).
//
// The controller keeps no watch of its own: the agent hands it the
// Services, EndpointSlices, Ingresses, IngressClasses and TLS Secrets it
// keeps in its local state, so that a node cut off from the hub keeps
// routing as it last knew. Every change rebuilds an immutable route table
// that is swapped in whole: requests in flight and open connections,
// keep-alive and upgraded alike, are untouched, and the next request on a
// connection takes the new routes.
//
// Routing follows the Ingress specification: a rule's host is matched
// exactly, or by a wildcard "*.example.com" that stands for exactly one
// label; Exact paths match the request path exactly, Prefix paths element
// by element ("/foo" matches "/foo" and "/foo/bar", not "/foobar"), and
// ImplementationSpecific paths are Prefix paths. The longest matching path
// wins, Exact before Prefix of the same length. The request's host rules
// are tried first, then its wildcard rules, then the rules without a
// host, then the oldest Ingress's defaultBackend; a request nothing
// matches gets 404, one whose Service is missing, has no such port or no
// ready endpoint gets 503. Backends are reached at the Service's cluster
// IP and port, which the node's Service load balancing spreads over the
// endpoints.
package ingress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ControllerName is the spec.controller of the IngressClasses this
// controller serves.
const ControllerName = "tether.io/ingress"

// NodeLabel marks the Nodes that run the controller; the hub's node
// authorizer lets those read Ingresses, IngressClasses and the Secrets
// their TLS entries name, and write Ingresses' status.
const NodeLabel = "ingress.tether.io/controller"

// rebuildDelay gathers the changes of a burst into one rebuild.
const rebuildDelay = 20 * time.Millisecond

// Config configures a Controller.
type Config struct {
	// HTTPAddr and HTTPSAddr are where Run listens. Empty means ":80" and
	// ":443".
	HTTPAddr, HTTPSAddr string
	// Dial connects to a backend, a Service's ClusterIP:port. Nil means
	// a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Controller is the spec.controller served; empty means
	// ControllerName.
	Controller string
	// Addresses are the node's addresses, written to the status of the
	// Ingresses served (see Status).
	Addresses []string
	// Status writes Ingresses' status; nil writes none.
	Status StatusWriter
	// OnSecrets is called after a rebuild that changed the set of TLS
	// Secrets the served Ingresses name, with the new set: the agent
	// watches those.
	OnSecrets func([]types.NamespacedName)
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Controller routes HTTP and HTTPS requests by the Ingresses it is given.
// Its methods are safe for concurrent use.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	errorLog *log.Logger
	proxies  sync.Map // backend address: *httputil.ReverseProxy (proxy.go)
	buffers  bufferPool
	tr       *http.Transport  // requests with a body, upgrades
	up       *upstream        // the proxies' RoundTripper (upstream.go)
	self     *tls.Certificate // for TLS names no Secret covers

	table atomic.Pointer[table]
	dirty chan struct{}

	mu        sync.Mutex
	ingresses map[types.NamespacedName]*networkingv1.Ingress
	classes   map[string]*networkingv1.IngressClass
	services  map[types.NamespacedName]*corev1.Service
	slices    map[types.NamespacedName]*discoveryv1.EndpointSlice
	secrets   map[types.NamespacedName]*corev1.Secret
	certs     map[types.NamespacedName]parsedCert
	wanted    map[types.NamespacedName]bool // TLS Secrets of the last table

	status *statusWriter
}

// New returns a controller with an empty route table.
func New(cfg Config) (*Controller, error) {
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = ":80"
	}
	if cfg.HTTPSAddr == "" {
		cfg.HTTPSAddr = ":443"
	}
	if cfg.Controller == "" {
		cfg.Controller = ControllerName
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	self, err := selfSigned()
	if err != nil {
		return nil, fmt.Errorf("create ingress controller: %w", err)
	}
	c := &Controller{
		cfg: cfg, log: cfg.Logger.With("component", "ingress"), self: self,
		dirty:     make(chan struct{}, 1),
		ingresses: map[types.NamespacedName]*networkingv1.Ingress{},
		classes:   map[string]*networkingv1.IngressClass{},
		services:  map[types.NamespacedName]*corev1.Service{},
		slices:    map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		secrets:   map[types.NamespacedName]*corev1.Secret{},
		certs:     map[types.NamespacedName]parsedCert{},
	}
	c.tr = &http.Transport{
		DialContext:         cfg.Dial,
		MaxIdleConnsPerHost: maxIdlePerBackend,
		// Pass Accept-Encoding through as the client sent it rather
		// than asking for gzip and decompressing in the proxy.
		DisableCompression:    true,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0,
		ExpectContinueTimeout: time.Second,
	}
	c.up = newUpstream(c.tr, cfg.Dial)
	c.errorLog = slog.NewLogLogger(c.log.Handler(), slog.LevelDebug)
	if cfg.Status != nil {
		c.status = newStatusWriter(cfg.Status, cfg.Addresses, c.log)
	}
	c.table.Store(build(&state{controller: cfg.Controller, cert: func(types.NamespacedName) *tls.Certificate { return nil }}))
	return c, nil
}

// ServeHTTP routes one request by the current table.
func (c *Controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b := c.table.Load().route(hostOnly(r.Host), r.URL.Path)
	switch {
	case b == nil:
		http.Error(w, "404 page not found", http.StatusNotFound)
	case b.target == "":
		http.Error(w, "503 service unavailable", b.status)
	default:
		c.proxyTo(b.target).ServeHTTP(w, r)
	}
}

// hostOnly is a Host header without its port. Most requests name no port,
// for which net.SplitHostPort would return (and allocate) an error.
func hostOnly(host string) string {
	if strings.IndexByte(host, ':') >= 0 && !strings.HasSuffix(host, "]") {
		if h, _, err := net.SplitHostPort(host); err == nil {
			return h
		}
	}
	return host
}

// getCertificate picks the certificate of the client's server name.
func (c *Controller) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cert := c.table.Load().certificate(hello.ServerName); cert != nil {
		return cert, nil
	}
	return c.self, nil
}

// Run listens on the HTTP and HTTPS addresses and serves until ctx ends;
// it returns an error when it cannot listen. Open connections are closed
// when it returns.
func (c *Controller) Run(ctx context.Context) error {
	httpLn, err := net.Listen("tcp", c.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen for HTTP on %s: %w", c.cfg.HTTPAddr, err)
	}
	httpsLn, err := net.Listen("tcp", c.cfg.HTTPSAddr)
	if err != nil {
		httpLn.Close()
		return fmt.Errorf("listen for HTTPS on %s: %w", c.cfg.HTTPSAddr, err)
	}
	return c.Serve(ctx, httpLn, httpsLn)
}

// Serve serves HTTP on httpLn and HTTPS on httpsLn (either may be nil)
// and keeps the route table current until ctx ends.
func (c *Controller) Serve(ctx context.Context, httpLn, httpsLn net.Listener) error {
	var wg sync.WaitGroup
	var servers []*http.Server
	serve := func(ln net.Listener, tlsOn bool) {
		srv := &http.Server{Handler: c, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute,
			ErrorLog: slog.NewLogLogger(c.log.Handler(), slog.LevelDebug)}
		if tlsOn {
			srv.TLSConfig = &tls.Config{GetCertificate: c.getCertificate, MinVersion: tls.VersionTLS12}
		}
		servers = append(servers, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if tlsOn {
				err = srv.ServeTLS(ln, "", "")
			} else {
				err = srv.Serve(ln)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				c.log.Error("ingress server stopped", "addr", ln.Addr(), "err", err)
			}
		}()
		c.log.Info("serving ingresses", "addr", ln.Addr(), "tls", tlsOn)
	}
	if httpLn != nil {
		serve(httpLn, false)
	}
	if httpsLn != nil {
		serve(httpsLn, true)
	}
	if c.status != nil {
		wg.Add(1)
		go func() { defer wg.Done(); c.status.run(ctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); c.up.reapEvery(ctx, upstreamIdleTimeout/3) }()
	c.rebuildLoop(ctx)
	for _, srv := range servers {
		srv.Close()
	}
	c.up.closeIdle()
	wg.Wait()
	return nil
}

// rebuildLoop rebuilds the table after changes until ctx ends.
func (c *Controller) rebuildLoop(ctx context.Context) {
	c.Rebuild()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.dirty:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(rebuildDelay):
		}
		c.Rebuild()
	}
}

func (c *Controller) poke() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// Rebuild builds the route table from what the controller was given and
// swaps it in. Run calls it after every change; tests may call it to
// apply changes at once.
func (c *Controller) Rebuild() {
	c.mu.Lock()
	s := &state{
		classes: c.classes, controller: c.cfg.Controller,
		services: c.services,
		slices:   map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
		cert:     c.cert,
	}
	for _, ing := range c.ingresses {
		s.ingresses = append(s.ingresses, ing)
	}
	for _, es := range c.slices {
		if svc := es.Labels[discoveryv1.LabelServiceName]; svc != "" {
			k := types.NamespacedName{Namespace: es.Namespace, Name: svc}
			s.slices[k] = append(s.slices[k], es)
		}
	}
	t := build(s)
	c.forgetCerts()
	all := make([]*networkingv1.Ingress, 0, len(c.ingresses))
	for _, ing := range c.ingresses {
		all = append(all, ing)
	}
	secretsChanged := len(t.secrets) != len(c.wanted)
	for k := range t.secrets {
		if !c.wanted[k] {
			secretsChanged = true
		}
	}
	c.wanted = t.secrets
	c.mu.Unlock()

	c.table.Store(t)
	if secretsChanged && c.cfg.OnSecrets != nil {
		refs := make([]types.NamespacedName, 0, len(t.secrets))
		for k := range t.secrets {
			refs = append(refs, k)
		}
		slices.SortFunc(refs, func(a, b types.NamespacedName) int {
			if a.Namespace != b.Namespace {
				return compare(a.Namespace, b.Namespace)
			}
			return compare(a.Name, b.Name)
		})
		c.cfg.OnSecrets(refs)
	}
	if c.status != nil {
		c.status.update(all, t.served)
	}
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// referenced reports whether the last table used Service ns/name.
func (c *Controller) referenced(ns, name string) bool {
	return c.table.Load().services[types.NamespacedName{Namespace: ns, Name: name}]
}

// UpsertIngress adds or replaces an Ingress.
func (c *Controller) UpsertIngress(ing *networkingv1.Ingress) {
	c.mu.Lock()
	c.ingresses[types.NamespacedName{Namespace: ing.Namespace, Name: ing.Name}] = ing
	c.mu.Unlock()
	c.poke()
}

// DeleteIngress removes an Ingress.
func (c *Controller) DeleteIngress(namespace, name string) {
	c.mu.Lock()
	delete(c.ingresses, types.NamespacedName{Namespace: namespace, Name: name})
	c.mu.Unlock()
	c.poke()
}

// UpsertIngressClass adds or replaces an IngressClass.
func (c *Controller) UpsertIngressClass(ic *networkingv1.IngressClass) {
	c.mu.Lock()
	c.classes[ic.Name] = ic
	c.mu.Unlock()
	c.poke()
}

// DeleteIngressClass removes an IngressClass.
func (c *Controller) DeleteIngressClass(name string) {
	c.mu.Lock()
	delete(c.classes, name)
	c.mu.Unlock()
	c.poke()
}

// UpsertSecret adds or replaces a TLS Secret.
func (c *Controller) UpsertSecret(s *corev1.Secret) {
	c.mu.Lock()
	c.secrets[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	c.mu.Unlock()
	c.poke()
}

// DeleteSecret removes a TLS Secret.
func (c *Controller) DeleteSecret(namespace, name string) {
	c.mu.Lock()
	delete(c.secrets, types.NamespacedName{Namespace: namespace, Name: name})
	c.mu.Unlock()
	c.poke()
}

// UpsertService adds or replaces a Service; with the EndpointSlice
// methods it makes the controller a sink of the agent's Service watch.
// Changes of Services no served Ingress names rebuild nothing.
func (c *Controller) UpsertService(svc *corev1.Service) {
	c.mu.Lock()
	c.services[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = svc
	c.mu.Unlock()
	if c.referenced(svc.Namespace, svc.Name) {
		c.poke()
	}
}

// DeleteService removes a Service.
func (c *Controller) DeleteService(namespace, name string) {
	c.mu.Lock()
	delete(c.services, types.NamespacedName{Namespace: namespace, Name: name})
	c.mu.Unlock()
	if c.referenced(namespace, name) {
		c.poke()
	}
}

// UpsertEndpointSlice adds or replaces an EndpointSlice.
func (c *Controller) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) {
	c.mu.Lock()
	k := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
	old := c.slices[k]
	c.slices[k] = es
	c.mu.Unlock()
	if c.referenced(es.Namespace, es.Labels[discoveryv1.LabelServiceName]) ||
		old != nil && c.referenced(old.Namespace, old.Labels[discoveryv1.LabelServiceName]) {
		c.poke()
	}
}

// DeleteEndpointSlice removes an EndpointSlice.
func (c *Controller) DeleteEndpointSlice(namespace, name string) {
	c.mu.Lock()
	k := types.NamespacedName{Namespace: namespace, Name: name}
	old := c.slices[k]
	delete(c.slices, k)
	c.mu.Unlock()
	if old != nil && c.referenced(namespace, old.Labels[discoveryv1.LabelServiceName]) {
		c.poke()
	}
}
