package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/controllers"

	"github.com/tether-edge/tether/hub/admission"
	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/discovery"
	"github.com/tether-edge/tether/hub/nodes"
	"github.com/tether-edge/tether/hub/openapi"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/scheduler"
	"github.com/tether-edge/tether/store/sqlite"
	"github.com/tether-edge/tether/tunnel"
)

// KubernetesVersion is the Kubernetes API version the hub serves and reports
// at /version; kubectl warns when its own minor version is more than one away.
const KubernetesVersion = "v1.37.2"

// Config configures a Hub. Only DataDir is required.
type Config struct {
	// DataDir holds the store (state.db), the PKI (pki/), an optional
	// static token file (tokens.csv) and admin.kubeconfig. Created if
	// missing.
	DataDir string
	// Listen is the TCP address of the HTTPS API; "" means 0.0.0.0:6443.
	// Port 0 picks a free port (see Addr).
	Listen string
	// AdvertiseAddress is the IP the kubernetes Service's endpoints and the
	// serving certificate name; "" means the listen IP, or when listening
	// on all addresses or on loopback the first non-loopback IPv4 address
	// of the host.
	AdvertiseAddress string
	// SANs are extra DNS names or IPs for the serving certificate.
	SANs []string
	// ServiceCIDR is the range of Service cluster IPs; "" means
	// 10.0.0.0/16. Its first address is the kubernetes Service's.
	ServiceCIDR string
	// ChangeLogRetain is how many revisions the store's change log keeps
	// (watches may resume from within them); zero means the store's
	// default, 100,000.
	ChangeLogRetain int64
	// CompactInterval is how often the change log is compacted; zero means
	// the store's default, 30 seconds.
	CompactInterval time.Duration
	// TunnelListen is the UDP address of the edge tunnel (QUIC); "" means
	// the API's address and port. Edges that cannot use UDP fall back to
	// TCP+TLS on the API port itself.
	TunnelListen string
	// ClusterCIDR is the range node pod CIDRs come from; "" means
	// 10.42.0.0/16.
	ClusterCIDR string
	// NodeCIDRMaskSize is the prefix length of each node's pod CIDR; zero
	// means 24.
	NodeCIDRMaskSize int
	// NodeCertTTL is the lifetime of node certificates; zero means one
	// year. Agents renew them over the tunnel at two thirds of it.
	NodeCertTTL time.Duration
	// TunnelHandshakeRate and TunnelHandshakeBurst bound how fast the hub
	// admits new edge connections (a token bucket); zero means 500/s with
	// a burst of 100. Edges refused back off with jitter and come later.
	TunnelHandshakeRate  float64
	TunnelHandshakeBurst int
	// DrainWindow is the reconnect window the hub announces to edges when
	// it shuts down; they spread their reconnects over it. Zero means 10s.
	DrainWindow time.Duration
	// Controllers selects the built-in controllers to run, as
	// kube-controller-manager's --controllers ("*", "name", "-name"); nil
	// runs them all.
	Controllers []string
	// LocalPathRoot is the directory of nodes under which the local-path
	// provisioner makes volumes; empty means /var/lib/tether/storage. Agents
	// must use the same (tether edge --local-path-root).
	LocalPathRoot string
	// DisableScheduler leaves pods unscheduled by the hub, for another
	// scheduler or for tests that run their own.
	DisableScheduler bool
	// Profiling serves /debug/pprof/ (see apiserver.Config.Profiling).
	Profiling bool
	// Version is tether's own version, reported as gitCommit at /version.
	Version string
	// Logger receives the hub's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Hub is a running control plane.
type Hub struct {
	cfg   Config
	log   *slog.Logger
	addr  chan net.Addr // receives the bound address once serving
	ready chan struct{}
}

// New checks cfg and returns a Hub; nothing is opened until Run.
func New(cfg Config) (*Hub, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("create hub: no data directory")
	}
	if cfg.Listen == "" {
		cfg.Listen = "0.0.0.0:6443"
	}
	if cfg.ServiceCIDR == "" {
		cfg.ServiceCIDR = registry.DefaultServiceCIDR
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("create hub: listen address %q: %w", cfg.Listen, err)
	}
	if _, err := netip.ParsePrefix(cfg.ServiceCIDR); err != nil {
		return nil, fmt.Errorf("create hub: service CIDR: %w", err)
	}
	if cfg.ClusterCIDR == "" {
		cfg.ClusterCIDR = registry.DefaultClusterCIDR
	}
	if _, err := netip.ParsePrefix(cfg.ClusterCIDR); err != nil {
		return nil, fmt.Errorf("create hub: cluster CIDR: %w", err)
	}
	if cfg.DrainWindow <= 0 {
		cfg.DrainWindow = 10 * time.Second
	}
	if err := controllers.CheckNames(cfg.Controllers); err != nil {
		return nil, fmt.Errorf("create hub: %w", err)
	}
	if cfg.AdvertiseAddress != "" && net.ParseIP(cfg.AdvertiseAddress) == nil {
		return nil, fmt.Errorf("create hub: advertise address %q is not an IP", cfg.AdvertiseAddress)
	}
	return &Hub{cfg: cfg, log: cfg.Logger.With("component", "hub"), addr: make(chan net.Addr, 1), ready: make(chan struct{})}, nil
}

// KubeconfigPath returns where the admin kubeconfig is written.
func (h *Hub) KubeconfigPath() string { return filepath.Join(h.cfg.DataDir, "admin.kubeconfig") }

// Ready is closed once the hub serves and the admin kubeconfig is written.
func (h *Hub) Ready() <-chan struct{} { return h.ready }

// Run serves until ctx ends, then shuts down cleanly.
func (h *Hub) Run(ctx context.Context) (err error) {
	cfg := h.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	cidr := netip.MustParsePrefix(cfg.ServiceCIDR).Masked()
	serviceIP := cidr.Addr().Next()
	reg, err := registry.New(registry.Config{
		Services: registry.ServiceNetwork{CIDR: cidr},
		Cluster:  registry.ClusterNetwork{CIDR: netip.MustParsePrefix(cfg.ClusterCIDR), NodeMaskSize: cfg.NodeCIDRMaskSize},
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen for the API: %w", err)
	}
	defer ln.Close()
	host, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)
	advertise := cfg.AdvertiseAddress
	if advertise == "" {
		advertise = pickAdvertise(host)
	}

	authority, err := pki.LoadOrCreate(pki.Config{
		Dir:       cfg.DataDir,
		Hosts:     append([]string{advertise}, cfg.SANs...),
		ServiceIP: net.IP(serviceIP.AsSlice()),
	})
	if err != nil {
		return err
	}

	st, err := sqlite.Open(sqlite.Config{
		Path:            filepath.Join(cfg.DataDir, "state.db"),
		Retain:          cfg.ChangeLogRetain,
		CompactInterval: cfg.CompactInterval,
		Logger:          cfg.Logger.With("component", "store"),
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, st.Close()) }()

	kinds := reg.Kinds()
	adm := admission.New(cfg.Logger.With("component", "admission"))
	objs, err := storage.New(storage.Config{Store: st, Kinds: kinds, Logger: cfg.Logger.With("component", "storage"),
		Admission: adm.Admitters()})
	if err != nil {
		return err
	}
	adm.SetStorage(objs)
	bootCfg := storage.BootstrapConfig{AdvertiseAddress: advertise, Port: int32(port), ServiceIP: serviceIP.String()}
	if err := objs.Bootstrap(ctx, bootCfg); err != nil {
		return fmt.Errorf("bootstrap objects: %w", err)
	}

	saKey, err := authority.ServiceAccountKey()
	if err != nil {
		return err
	}
	saTokens := auth.NewServiceAccountTokens(saKey, tokenObjectsExist(objs))
	authn := auth.Union{auth.NewCertAuthenticator(authority.CAPool()), saTokens}
	if tf := filepath.Join(cfg.DataDir, "tokens.csv"); fileExists(tf) {
		tokens, err := auth.NewTokenFile(tf)
		if err != nil {
			return err
		}
		authn = append(authn, tokens)
	}
	oapi, err := openapi.New(kinds, scheme.Scheme)
	if err != nil {
		return err
	}
	nodeCfg := nodes.Config{Storage: objs, Authority: authority, CertTTL: cfg.NodeCertTTL,
		Logger: cfg.Logger.With("component", "nodes")}
	authz := nodes.NewAuthorizer(nodeCfg)
	leases := nodes.NewLeases(nodeCfg)
	edges, err := newTunnelServer(cfg, authority, leases, cfg.Logger.With("component", "tunnel"))
	if err != nil {
		return err
	}
	defer edges.Close()
	relay := newStreamDemux(edges.Listener())
	api, err := apiserver.New(apiserver.Config{
		Storage:              objs,
		Kinds:                kinds,
		Authorizer:           authz,
		DialNode:             dialNode(edges),
		DialPod:              dialPod(edges),
		ServiceAccountTokens: saTokens,
		ExtraMetrics:         tunnelMetrics(edges, relay),
		Profiling:            cfg.Profiling,
		Extensions:           nodes.NewJoiner(nodeCfg).Handlers(),
		Authenticator:        authn,
		Discovery:            discovery.New(kinds, discovery.Config{Subresources: servedSubresources}),
		OpenAPI:              oapi,
		Version:              versionInfo(cfg.Version),
		Logger:               cfg.Logger.With("component", "apiserver"),
	})
	if err != nil {
		return err
	}

	baseCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	srv := &http.Server{
		Handler:           api.Handler(),
		TLSConfig:         authority.ServerTLSConfig(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    1 << 20,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(cfg.Logger.With("component", "http").Handler(), slog.LevelDebug),
	}
	// client-go shares one connection among all informers of a process:
	// allow as many concurrent streams as upstream servers do.
	if err := http2.ConfigureServer(srv, &http2.Server{MaxConcurrentStreams: 1000}); err != nil {
		return fmt.Errorf("configure HTTP/2: %w", err)
	}

	// Edges whose UDP is blocked reach the tunnel over TLS on this same
	// port, told apart from API clients by ALPN.
	srv.TLSConfig.NextProtos = append(srv.TLSConfig.NextProtos, tunnel.ALPN)
	srv.TLSNextProto[tunnel.ALPN] = func(_ *http.Server, c *tls.Conn, _ http.Handler) { edges.ServeConn(c) }

	tunnelAddr := cfg.TunnelListen
	if tunnelAddr == "" {
		tunnelAddr = ln.Addr().String()
	}
	pc, err := net.ListenPacket("udp", tunnelAddr)
	if err != nil {
		return fmt.Errorf("listen for the tunnel: %w", err)
	}
	defer pc.Close()
	// API requests of edges arrive as HTTP/1.1 on tunnel streams,
	// authenticated by the node certificate the tunnel verified; their
	// pods' connections to the API arrive relayed on streams of their own
	// (see streamDemux).
	tunnelHTTP := &http.Server{
		Handler:           api.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       10 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if p, ok := streamPeer(c); ok {
				return auth.WithPeerCertificates(ctx, p.Certificates)
			}
			return ctx
		},
		ErrorLog: srv.ErrorLog,
	}
	// Background work, the tunnel's QUIC listener among it, outlives the
	// signal that stops the hub: shutdown below drains the edges over it
	// and closes their sessions with a close frame before it ends.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	go authz.Run(bgCtx)
	go leases.Run(bgCtx)
	go adm.Run(bgCtx)
	go objs.KeepBootstrapped(bgCtx, bootCfg, 0)

	serveErr := make(chan error, 3)
	go func() { serveErr <- srv.Serve(tls.NewListener(ln, srv.TLSConfig)) }()
	go func() {
		if err := edges.ServeQUIC(bgCtx, pc); err != nil && bgCtx.Err() == nil {
			serveErr <- fmt.Errorf("tunnel: %w", err)
		}
	}()
	go func() { _ = relay.Run(srv) }()
	go func() {
		if err := tunnelHTTP.Serve(relay.Plain()); err != nil && !errors.Is(err, http.ErrServerClosed) && bgCtx.Err() == nil {
			serveErr <- fmt.Errorf("tunnel API: %w", err)
		}
	}()

	serverHost := advertise
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		serverHost = host
	} else if ip != nil && ip.IsUnspecified() {
		serverHost = "127.0.0.1"
	}
	url := "https://" + net.JoinHostPort(serverHost, portStr)
	if err := authority.WriteKubeconfig(h.KubeconfigPath(), url, pki.AdminUser, []string{pki.AdminGroup}); err != nil {
		_ = srv.Close()
		return err
	}
	h.addr <- ln.Addr()
	close(h.ready)
	h.log.Info("serving the Kubernetes API", "addr", ln.Addr().String(), "advertise", advertise, "kubeconfig", h.KubeconfigPath())

	// The built-in controllers are clients of the hub's own API like any
	// other client, served in-process (see apiserver.LocalTransport).
	ctrl, err := controllers.New(controllers.Config{
		RestConfig:    localConfig(api, url, "system:kube-controller-manager"),
		Logger:        cfg.Logger.With("component", "controllers"),
		Controllers:   cfg.Controllers,
		RootCA:        authority.CAPEM(),
		LocalPathRoot: cfg.LocalPathRoot,
	})
	if err != nil {
		_ = srv.Close()
		return err
	}
	ctrlCtx, cancelCtrl := context.WithCancel(ctx)
	ctrlDone := make(chan error, 1)
	go func() {
		err := ctrl.Run(ctrlCtx)
		if err != nil && ctrlCtx.Err() == nil {
			h.log.Error("controllers stopped", "err", err)
		}
		ctrlDone <- err
	}()
	stopCtrl := sync.OnceFunc(func() { cancelCtrl(); <-ctrlDone })
	defer stopCtrl()

	stopSched := func() {}
	if !cfg.DisableScheduler {
		if stopSched, err = h.startScheduler(ctx, api, url); err != nil {
			_ = srv.Close()
			return err
		}
	}
	defer stopSched()

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve the API: %w", err)
	case <-ctx.Done():
	}
	h.log.Info("shutting down")
	// Tell edges to come back spread over the drain window rather than
	// all at once when the hub is back, then let them go.
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), 2*time.Second)
	_ = edges.Drain(drainCtx, cfg.DrainWindow)
	cancelDrain()
	// Close what is left explicitly, so every edge gets a close frame now
	// instead of finding out by its idle timeout after the socket is gone.
	_ = edges.Close()
	stopSched()
	stopCtrl() // before requests end, so the controllers see no broken watches

	// Close the door before ending the watches in flight. Shutdown closes
	// the listener and tells HTTP/2 clients (GOAWAY) to open no new
	// streams; a client whose watch then ends finds the port closed, which
	// client-go retries from its resourceVersion. Were the door still open,
	// its new watch would end at once, and client-go answers a watch that
	// ends within a second with a full re-list.
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shutDone := make(chan error, 1)
	go func() { shutDone <- srv.Shutdown(shutCtx) }()
	tunnelShutDone := make(chan error, 1)
	go func() { tunnelShutDone <- tunnelHTTP.Shutdown(shutCtx) }()
	time.Sleep(200 * time.Millisecond) // the GOAWAYs go out from goroutines of their own
	cancelRequests()                   // ends watches and streams so Shutdown need not wait for them
	if err := <-shutDone; err != nil {
		_ = srv.Close()
	}
	if err := <-tunnelShutDone; err != nil {
		_ = tunnelHTTP.Close()
	}
	stopBackground()
	return nil
}

// tokenObjectsExist checks that a service account token's objects are
// still there with the UIDs it names, so deleting a service account or the
// pod a token is bound to revokes the token.
func tokenObjectsExist(objs storage.API) func(ctx context.Context, c auth.Claims) error {
	kind := func(res string) *registry.Kind {
		return registry.Lookup(schema.GroupVersionResource{Version: "v1", Resource: res})
	}
	sas, pods, nodeKind := kind("serviceaccounts"), kind("pods"), kind("nodes")
	check := func(ctx context.Context, k *registry.Kind, ns, name, uid string) error {
		o, err := objs.Get(ctx, k, ns, name)
		if err != nil {
			return fmt.Errorf("%s %s/%s: %w", k.Resource, ns, name, err)
		}
		m, err := meta.Accessor(o)
		if err != nil || uid != "" && string(m.GetUID()) != uid {
			return fmt.Errorf("%s %s/%s was replaced", k.Resource, ns, name)
		}
		return nil
	}
	return func(ctx context.Context, c auth.Claims) error {
		if err := check(ctx, sas, c.Namespace, c.ServiceAccount, c.ServiceAccountUID); err != nil {
			return err
		}
		if c.PodName != "" {
			if err := check(ctx, pods, c.Namespace, c.PodName, c.PodUID); err != nil {
				return err
			}
		}
		if c.NodeName != "" {
			return check(ctx, nodeKind, "", c.NodeName, c.NodeUID)
		}
		return nil
	}
}

// servedSubresources are the subresources beyond those a Kind implies that
// the hub serves, listed in discovery as upstream lists them (kubectl drain,
// for one, uses evictions only where discovery shows pods/eviction).
var servedSubresources = []discovery.Subresource{
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "eviction",
		Kind: schema.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"}, Verbs: []string{"create"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, Name: "token",
		Kind: schema.GroupVersionKind{Group: "authentication.k8s.io", Version: "v1", Kind: "TokenRequest"}, Verbs: []string{"create"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "log",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Verbs: []string{"get"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "exec",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "PodExecOptions"}, Verbs: []string{"create", "get"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "attach",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "PodAttachOptions"}, Verbs: []string{"create", "get"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "portforward",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "PodPortForwardOptions"}, Verbs: []string{"create", "get"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, Name: "proxy",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "NodeProxyOptions"}, Verbs: []string{"create", "delete", "get", "patch", "update"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "proxy",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "PodProxyOptions"}, Verbs: []string{"create", "delete", "get", "patch", "update"}},
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "services"}, Name: "proxy",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "ServiceProxyOptions"}, Verbs: []string{"create", "delete", "get", "patch", "update"}},
}

// localConfig is the client configuration of a component running inside
// the hub: the API served in-process, as user (in the cluster-admin group).
func localConfig(api *apiserver.Server, url, user string) *rest.Config {
	return &rest.Config{
		Host:      url,
		Transport: api.LocalTransport(&auth.User{Name: user, Groups: []string{pki.AdminGroup, "system:authenticated"}}),
	}
}

// startScheduler runs the scheduler in-process as a client of the hub's own
// API, like the controllers; the returned function stops it and waits.
func (h *Hub) startScheduler(ctx context.Context, api *apiserver.Server, url string) (func(), error) {
	sched, err := scheduler.New(scheduler.Config{
		RestConfig: localConfig(api, url, "system:kube-scheduler"),
		Logger:     h.cfg.Logger.With("component", "scheduler"),
	})
	if err != nil {
		return nil, err
	}
	schedCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sched.Run(schedCtx); err != nil && schedCtx.Err() == nil {
			h.log.Error("scheduler stopped", "err", err)
		}
	}()
	return sync.OnceFunc(func() { cancel(); <-done }), nil
}

// Addr returns the address the API listens on, blocking until it serves or
// ctx ends.
func (h *Hub) Addr(ctx context.Context) (net.Addr, error) {
	select {
	case a := <-h.addr:
		h.addr <- a
		return a, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func versionInfo(tether string) version.Info {
	parts := strings.SplitN(strings.TrimPrefix(KubernetesVersion, "v"), ".", 3)
	return version.Info{
		Major:        parts[0],
		Minor:        parts[1],
		GitVersion:   KubernetesVersion,
		GitCommit:    "tether-" + tether,
		GitTreeState: "clean",
		BuildDate:    "1970-01-01T00:00:00Z",
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// pickAdvertise chooses the address other parties use to reach the API.
func pickAdvertise(listenHost string) string {
	// Endpoints may not point at loopback addresses, so a hub listening on
	// loopback still advertises the host's own address.
	if ip := net.ParseIP(listenHost); ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
		return ip.String()
	}
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
