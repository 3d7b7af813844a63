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
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/controllers"
	"github.com/tether-edge/tether/hub/admission"
	"github.com/tether-edge/tether/hub/admissionregistration"
	"github.com/tether-edge/tether/hub/aggregator"
	"github.com/tether-edge/tether/hub/apiextensions"
	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/audit"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/certificates"
	"github.com/tether-edge/tether/hub/discovery"
	"github.com/tether-edge/tether/hub/fleet"
	"github.com/tether-edge/tether/hub/metrics"
	"github.com/tether-edge/tether/hub/nodes"
	"github.com/tether-edge/tether/hub/openapi"
	"github.com/tether-edge/tether/hub/peers"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/rbac"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/releases"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/dirlock"
	"github.com/tether-edge/tether/tunnel"
)

// Run serves until ctx ends, then shuts down cleanly. It opens the store,
// builds the API server, serves it on the API port and to the edges'
// tunnels, starts the controllers and the scheduler as in-process clients,
// and, when ctx ends, drains the edges and closes everything in the
// reverse order.
func (h *Hub) Run(ctx context.Context) (err error) {
	r := &run{h: h, cfg: h.cfg}
	defer func() {
		t := time.Now()
		err = errors.Join(err, r.close())
		r.h.log.Info("closed", "took", time.Since(t).Round(time.Millisecond))
	}()
	if err := r.open(ctx); err != nil {
		return err
	}
	if err := r.buildAPI(); err != nil {
		return err
	}
	if err := r.serve(ctx); err != nil {
		return err
	}
	if err := r.startClients(ctx); err != nil {
		return err
	}
	select {
	case err := <-r.serveErr:
		return fmt.Errorf("serve the API: %w", err)
	case <-ctx.Done():
	}
	r.shutdown()
	return nil
}

// run is what one Run of a hub opened, step by step. Each step adds how to
// undo it to closers; close undoes them in the reverse order.
type run struct {
	h       *Hub
	cfg     Config
	closers []func() error

	// open
	ln        net.Listener
	advertise string
	serviceIP netip.Addr
	authority *pki.Authority
	kinds     []*registry.Kind
	reg       *registry.Registry
	crds      *apiextensions.Controller
	adm       *admission.Admission
	csrAdm    *certificates.Admission
	relAdm    *releases.Admission
	rbac      *rbac.Authorizer
	objs      *storage.Storage
	bootCfg   storage.BootstrapConfig

	// buildAPI
	authz  *nodes.Authorizer
	leases *nodes.Leases
	beats  *nodes.Heartbeats
	zones  *nodes.Zones
	sites  *nodes.Sites
	nudges *nodes.Nudges
	edges  *tunnel.Server
	relay  *streamDemux
	api    *apiserver.Server
	agg    *aggregator.Aggregator
	usage  *metrics.Store   // the resource metrics API's samples
	peers  *peers.Directory // the hubs sharing the store; nil on SQLite

	// serve
	srv, tunnelHTTP *http.Server
	cancelRequests  context.CancelFunc // ends the requests in flight
	stopBackground  context.CancelFunc // ends background work, the tunnel's QUIC listener among it
	serveErr        chan error
	url             string

	// startClients
	stopCtrl, stopSched func()
	leaders             leaderStatus
}

// onClose adds an undo step.
func (r *run) onClose(f func() error) { r.closers = append(r.closers, f) }

func (r *run) close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i]())
	}
	return errors.Join(errs...)
}

// open creates the data directory, the registry with the hub's networks,
// the API listener, the store with the cluster's keys, the PKI and the
// storage over the store, and writes the objects every cluster has
// (bootstrap).
func (r *run) open(ctx context.Context) error {
	cfg := r.cfg
	// One hub per data directory: a second one would serve from its own
	// watch cache and keys, run its own controllers on the same objects
	// and, on SQLite, write the same file.
	lock, err := dirlock.Acquire(cfg.DataDir, "")
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("a hub runs on %s (%s): stop it first", cfg.DataDir, held.Holder())
	}
	if err != nil {
		return err
	}
	r.onClose(lock.Release)
	cidr := netip.MustParsePrefix(cfg.ServiceCIDR).Masked()
	r.serviceIP = cidr.Addr().Next()
	reg, err := registry.New(registry.Config{
		Services: registry.ServiceNetwork{CIDR: cidr},
		Cluster:  registry.ClusterNetwork{CIDR: netip.MustParsePrefix(cfg.ClusterCIDR), NodeMaskSize: cfg.NodeCIDRMaskSize},
		Extra:    slices.Concat(admissionregistration.Kinds(), apiextensions.Kinds(), aggregator.Kinds(), metricsKinds(cfg)),
	})
	if err != nil {
		return err
	}
	r.kinds, r.reg = reg.Kinds(), reg

	if r.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen for the API: %w", err)
	}
	r.onClose(func() error { _ = r.ln.Close(); return nil })
	host, _, _ := net.SplitHostPort(r.ln.Addr().String())
	r.advertise = cfg.AdvertiseAddress
	if r.advertise == "" {
		r.advertise = pickAdvertise(host)
	}

	// The store first: on PostgreSQL it holds the cluster's keys, and a
	// hub that cannot open them must write nothing.
	st, keys, err := openStoreAndKeys(ctx, cfg)
	if err != nil {
		return err
	}
	r.onClose(st.Close)
	r.authority, err = pki.LoadOrCreate(pki.Config{
		Dir:       cfg.DataDir,
		Hosts:     append([]string{r.advertise}, cfg.SANs...),
		ServiceIP: net.IP(r.serviceIP.AsSlice()),
		Keys:      keys,
	})
	if err != nil {
		return err
	}

	r.adm = admission.New(cfg.Logger.With("component", "admission"))
	r.csrAdm = certificates.NewAdmission()
	r.relAdm = releases.NewAdmission(reg)
	r.rbac = rbac.New(rbac.Config{Logger: cfg.Logger.With("component", "rbac")})
	r.objs, err = storage.New(storage.Config{Store: st, Registry: reg, Logger: cfg.Logger.With("component", "storage"),
		Admission: append(r.adm.Admitters(), r.csrAdm, r.rbac.Admitter(), r.relAdm)})
	if err != nil {
		return err
	}
	r.rbac.SetStorage(r.objs)
	r.crds = apiextensions.New(apiextensions.Config{Storage: r.objs, Registry: r.reg, Logger: cfg.Logger.With("component", "apiextensions")})
	r.adm.SetStorage(r.objs)
	r.relAdm.SetStorage(r.objs)
	port := r.ln.Addr().(*net.TCPAddr).Port
	r.bootCfg = storage.BootstrapConfig{AdvertiseAddress: r.advertise, Port: int32(port), ServiceIP: r.serviceIP.String()}
	if err := r.objs.Bootstrap(ctx, r.bootCfg); err != nil {
		return fmt.Errorf("bootstrap objects: %w", err)
	}
	return r.installFleetDefinitions(ctx)
}

// buildAPI assembles the API server: authentication (client certificates,
// ServiceAccount tokens, the optional static token file), the node
// authorizer and Lease keeper, the tunnel server the edges dial, and the
// OpenAPI and discovery documents of the served kinds.
func (r *run) buildAPI() error {
	cfg := r.cfg
	saKey, err := r.authority.ServiceAccountKey()
	if err != nil {
		return err
	}
	saTokens := auth.NewServiceAccountTokens(saKey, tokenObjectsExist(r.objs))
	authn := auth.Union{auth.NewCertAuthenticator(r.authority.CAPool()), saTokens}
	if tf := filepath.Join(cfg.DataDir, "tokens.csv"); fileExists(tf) {
		tokens, err := auth.NewTokenFile(tf)
		if err != nil {
			return err
		}
		authn = append(authn, tokens)
	}
	oapi, err := openapi.NewHandler(openapi.Config{Registry: r.reg})
	if err != nil {
		return err
	}
	nodeCfg := nodes.Config{Storage: r.objs, Authority: r.authority, CertTTL: cfg.NodeCertTTL,
		Logger: cfg.Logger.With("component", "nodes")}
	r.authz = nodes.NewAuthorizer(nodeCfg)
	r.authz.Next = r.rbac // nodes are the node authorizer's, everyone else RBAC's
	r.csrAdm.SetAuthorizer(r.authz)
	r.leases = nodes.NewLeases(nodeCfg)
	r.beats = nodes.NewHeartbeats()
	r.zones = nodes.NewZones(nodeCfg)
	r.authz.Zones = r.zones // a node reads its site's gossip keys
	r.sites = nodes.NewSites(nodes.SitesConfig{
		Zones: r.zones, Live: r.leases.Alive, LastHeartbeat: r.leases.LastHeartbeat,
		// A node its site says is dead is asked over its tunnel first.
		Probe:  func(ctx context.Context, node string) error { return r.edges.Probe(ctx, node) },
		Logger: cfg.Logger.With("component", "sites"),
	})
	if !cfg.DisableMetricsAPI {
		r.usage = metrics.NewStore(metrics.Config{Logger: cfg.Logger.With("component", "metrics")})
	}
	if r.edges, err = newTunnelServer(cfg, r.authority, r.leases, r.sites, r.usage, cfg.Logger.With("component", "tunnel")); err != nil {
		return err
	}
	r.onClose(func() error { _ = r.edges.Close(); return nil })
	r.nudges = nodes.NewNudges(nodes.NudgeConfig{
		Storage:   r.objs,
		Connected: func(node string) bool { return r.edges.Session(node) != nil },
		Send:      nudgeNode(r.edges),
		Logger:    cfg.Logger.With("component", "nodes"),
	})
	r.relay = newStreamDemux(r.edges.Listener())
	if err := r.openPeers(); err != nil {
		return err
	}
	if err := r.newAggregator(r.reg); err != nil {
		return err
	}
	auditLog, err := openAudit(cfg)
	if err != nil {
		return err
	}
	if auditLog != nil {
		r.onClose(auditLog.Close)
	}
	// The fleet page reads the hub's own API as the controllers do, from
	// its first request until the hub stops.
	fleetCtx, stopFleet := context.WithCancel(context.Background())
	r.onClose(func() error { stopFleet(); return nil })
	fleetPage := fleet.New(fleetCtx, func() (*rest.Config, error) {
		return localConfig(r.api, r.url, bootstrap.ControllerManagerUser, "system:authenticated"), nil
	})
	reg, err := r.metricsRegistry()
	if err != nil {
		return err
	}
	releaseStore, err := r.openReleases()
	if err != nil {
		return err
	}
	r.api, err = apiserver.New(apiserver.Config{
		Fleet:                fleetPage,
		Releases:             releaseStore,
		Audit:                auditLog,
		Storage:              r.serveMetrics(r.beats.Serve(r.leases.Serve(r.objs))),
		Registry:             r.reg,
		Authorizer:           r.authz,
		DialNode:             r.dialNode,
		DialPod:              r.dialPod,
		ServiceAccountTokens: saTokens,
		Metrics:              reg,
		Profiling:            cfg.Profiling,
		Extensions:           r.extensions(nodeCfg),
		Authenticator:        authn,
		Discovery:            r.agg.Discovery(discovery.New(nil, discovery.Config{Registry: r.reg, Subresources: servedSubresources})),
		Aggregated:           r.agg,
		OpenAPI:              oapi,
		Version:              versionInfo(cfg.Version),
		Logger:               cfg.Logger.With("component", "apiserver"),
	})
	return err
}

// serve starts serving: HTTPS on the API port (with the tunnel's TCP+TLS
// fallback on the same port), QUIC for the tunnels, the edges' API
// requests and their pods' relayed connections on tunnel streams, and the
// background work; then it writes the admin kubeconfig and marks the hub
// ready.
func (r *run) serve(ctx context.Context) error {
	cfg := r.cfg
	baseCtx, cancelRequests := context.WithCancel(context.Background())
	r.cancelRequests = cancelRequests
	r.onClose(func() error { cancelRequests(); return nil })
	r.srv = &http.Server{
		Handler:           r.api.Handler(),
		TLSConfig:         r.authority.ServerTLSConfig(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    1 << 20,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(cfg.Logger.With("component", "http").Handler(), slog.LevelDebug),
	}
	// client-go shares one connection among all informers of a process:
	// allow as many concurrent streams as upstream servers do.
	if err := http2.ConfigureServer(r.srv, &http2.Server{MaxConcurrentStreams: 1000}); err != nil {
		return fmt.Errorf("configure HTTP/2: %w", err)
	}
	// Edges whose UDP is blocked reach the tunnel over TLS on this same
	// port, told apart from API clients by ALPN.
	r.srv.TLSConfig.NextProtos = append(r.srv.TLSConfig.NextProtos, tunnel.ALPN)
	r.srv.TLSNextProto[tunnel.ALPN] = func(_ *http.Server, c *tls.Conn, _ http.Handler) { r.edges.ServeConn(c) }

	tunnelAddr := cfg.TunnelListen
	if tunnelAddr == "" {
		tunnelAddr = r.ln.Addr().String()
	}
	pc, err := net.ListenPacket("udp", tunnelAddr)
	if err != nil {
		return fmt.Errorf("listen for the tunnel: %w", err)
	}
	r.onClose(func() error { _ = pc.Close(); return nil })
	// API requests of edges arrive as HTTP/2 (HTTP/1.1 from older edges)
	// on tunnel streams, authenticated by the node certificate the tunnel
	// verified; their pods' connections to the API arrive relayed on
	// streams of their own (see streamDemux).
	var tunnelProtocols http.Protocols
	tunnelProtocols.SetHTTP1(true)
	tunnelProtocols.SetUnencryptedHTTP2(true)
	r.tunnelHTTP = &http.Server{
		Protocols:         &tunnelProtocols,
		Handler:           r.api.Handler(),
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
		ErrorLog: r.srv.ErrorLog,
	}
	// Background work, the tunnel's QUIC listener among it, outlives the
	// signal that stops the hub: shutdown drains the edges over it and
	// closes their sessions with a close frame before it ends.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	r.stopBackground = stopBackground
	r.onClose(func() error { stopBackground(); return nil })
	go r.authz.Run(bgCtx)
	go r.rbac.Run(bgCtx)
	go r.leases.Run(bgCtx)
	if r.peers != nil {
		go r.peers.Run(bgCtx)
	}
	go r.zones.Run(bgCtx)
	go r.nudges.Run(bgCtx)
	go r.adm.Run(bgCtx)
	go r.crds.Run(bgCtx)
	go r.objs.KeepBootstrapped(bgCtx, r.bootCfg, 0)

	// The default RBAC policy is written before anyone but the hub is
	// served, so the roles of its controllers and scheduler exist when
	// they start.
	if err := r.reconcilePolicy(ctx); err != nil {
		return err
	}
	if !r.rbac.WaitSynced(ctx) {
		return fmt.Errorf("load RBAC objects: %w", ctx.Err())
	}
	if err := r.startWebhooks(ctx, bgCtx); err != nil {
		return err
	}
	// The custom resources of definitions stored before a restart are
	// served before the hub says it is ready.
	if !r.crds.WaitSynced(ctx) {
		return fmt.Errorf("serve stored CustomResourceDefinitions: %w", ctx.Err())
	}

	r.serveErr = make(chan error, 3)
	go func() { r.serveErr <- r.srv.Serve(tls.NewListener(r.ln, r.srv.TLSConfig)) }()
	go func() {
		if err := r.edges.ServeQUIC(bgCtx, pc); err != nil && bgCtx.Err() == nil {
			r.serveErr <- fmt.Errorf("tunnel: %w", err)
		}
	}()
	go func() { _ = r.relay.Run(r.srv) }()
	go func() {
		if err := r.tunnelHTTP.Serve(r.relay.Plain()); err != nil && !errors.Is(err, http.ErrServerClosed) && bgCtx.Err() == nil {
			r.serveErr <- fmt.Errorf("tunnel API: %w", err)
		}
	}()
	// Until shutdown takes over, a failed step closes both servers.
	r.onClose(func() error { _ = r.srv.Close(); _ = r.tunnelHTTP.Close(); return nil })

	host, portStr, _ := net.SplitHostPort(r.ln.Addr().String())
	serverHost := r.advertise
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		serverHost = host
	} else if ip != nil && ip.IsUnspecified() {
		serverHost = "127.0.0.1"
	}
	r.url = "https://" + net.JoinHostPort(serverHost, portStr)
	if err := r.authority.WriteKubeconfig(r.h.KubeconfigPath(), r.url, pki.AdminUser, []string{pki.AdminGroup}); err != nil {
		return err
	}
	r.h.addr <- r.ln.Addr()
	close(r.h.ready)
	r.h.log.Info("serving the Kubernetes API", "addr", r.ln.Addr().String(), "advertise", r.advertise, "kubeconfig", r.h.KubeconfigPath())
	return nil
}

// reconcilePolicy writes the default RBAC policy as an admin (see
// bootstrap.Reconcile), retrying for a while: storage may still be
// settling right after it opened.
func (r *run) reconcilePolicy(ctx context.Context) error {
	rc := localConfig(r.api, "https://localhost", "system:apiserver", pki.AdminGroup, "system:authenticated")
	rc.QPS = -1 // in-process: no client-side throttling
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("create policy client: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := bootstrap.Reconcile(ctx, kube)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("reconcile the default RBAC policy: %w", err)
			}
			return nil
		}
		r.h.log.Warn("reconcile the default RBAC policy", "err", err)
		time.Sleep(500 * time.Millisecond)
	}
}

// startClients runs the built-in controllers and the scheduler, clients of
// the hub's own API like any other, served in-process (see
// apiserver.LocalTransport), each while this hub holds its Lease (see
// startElected).
func (r *run) startClients(ctx context.Context) error {
	r.startAggregator(ctx)
	return r.startElected(ctx)
}

// startControllerManager runs the built-in controllers and the
// kubernetes.io/kube-apiserver-client signer, what upstream's
// kube-controller-manager runs; the returned function stops them and
// waits.
func (r *run) startControllerManager(ctx context.Context) (func(), error) {
	ctrl, err := controllers.New(controllers.Config{
		RestConfig:    localConfig(r.api, r.url, bootstrap.ControllerManagerUser, "system:authenticated"),
		ClientConfig:  controllerConfig(r.api, r.url),
		Logger:        r.cfg.Logger.With("component", "controllers"),
		Controllers:   r.cfg.Controllers,
		RootCA:        r.authority.CAPEM(),
		LocalPathRoot: r.cfg.LocalPathRoot,
		SitePeers:     r.sites.Peers,
		SiteHeard:     func(zone string) bool { return r.zones.AnyMember(zone, r.leases.Alive) },
		// Sites probes a node before saying it is dead.
		SiteDeadGrace: -1,
		// Custom resources are watched (garbage collection, namespace
		// deletion) as soon as they are served.
		ResourcesChanged: r.reg.Changed,
		SiteKeyRotation:  r.cfg.SiteKeyRotation,
		// HorizontalPodAutoscalers: upstream's
		// --horizontal-pod-autoscaler-sync-period.
		HorizontalPodAutoscalerSyncPeriod: r.cfg.HorizontalPodAutoscalerSyncPeriod,
		NodeMonitorGracePeriod:            r.cfg.NodeMonitorGracePeriod,
	})
	if err != nil {
		return nil, err
	}
	stopSigner, err := r.startSigner(ctx)
	if err != nil {
		return nil, err
	}
	ctrlCtx, cancelCtrl := context.WithCancel(ctx)
	ctrlDone := make(chan error, 1)
	go func() {
		err := ctrl.Run(ctrlCtx)
		if err != nil && ctrlCtx.Err() == nil {
			r.h.log.Error("controllers stopped", "err", err)
		}
		ctrlDone <- err
	}()
	return sync.OnceFunc(func() { cancelCtrl(); <-ctrlDone; stopSigner() }), nil
}

// shutdown stops the hub in the order that spares its clients work: edges
// are told to come back spread out, the in-process clients stop before
// their watches break, and the port closes before the watches in flight
// end.
func (r *run) shutdown() {
	began := time.Now()
	r.h.log.Info("shutting down")
	// step runs one step of the shutdown and logs how long it took: a
	// restart is an outage for every client, and these say where it goes.
	step := func(name string, f func()) {
		t := time.Now()
		f()
		r.h.log.Info("shutdown step done", "step", name, "took", time.Since(t).Round(time.Millisecond))
	}
	// Tell edges to come back spread over the drain window rather than
	// all at once when the hub is back, then let them go.
	step("drain edges", func() {
		drainCtx, cancelDrain := context.WithTimeout(context.Background(), 2*time.Second)
		_ = r.edges.Drain(drainCtx, r.cfg.DrainWindow)
		cancelDrain()
	})
	// Close what is left explicitly, so every edge gets a close frame now
	// instead of finding out by its idle timeout after the socket is gone.
	step("close tunnels", func() { _ = r.edges.Close() })
	step("stop scheduler", r.stopSched)
	step("stop controllers", r.stopCtrl) // before requests end, so the controllers see no broken watches

	// Close the door before ending the watches in flight. Shutdown closes
	// the listener and tells HTTP/2 clients (GOAWAY) to open no new
	// streams; a client whose watch then ends finds the port closed, which
	// client-go retries from its resourceVersion. Were the door still open,
	// its new watch would end at once, and client-go answers a watch that
	// ends within a second with a full re-list.
	step("shut down HTTP", func() {
		shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shutDone := make(chan error, 1)
		go func() { shutDone <- r.srv.Shutdown(shutCtx) }()
		tunnelShutDone := make(chan error, 1)
		go func() { tunnelShutDone <- r.tunnelHTTP.Shutdown(shutCtx) }()
		time.Sleep(200 * time.Millisecond) // the GOAWAYs go out from goroutines of their own
		r.cancelRequests()                 // ends watches and streams so Shutdown need not wait for them
		if err := <-shutDone; err != nil {
			_ = r.srv.Close()
		}
		if err := <-tunnelShutDone; err != nil {
			_ = r.tunnelHTTP.Close()
		}
	})
	step("stop background work", r.stopBackground)
	r.h.log.Info("shut down; closing the stores", "took", time.Since(began).Round(time.Millisecond))
}

// startSigner runs the kubernetes.io/kube-apiserver-client signer, a
// client of the hub's API under the identity upstream's signing
// controller has; the returned function stops it and waits.
func (r *run) startSigner(ctx context.Context) (func(), error) {
	user, groups := bootstrap.ControllerUser(bootstrap.AccountFor("csrsigning"))
	client, err := kubernetes.NewForConfig(localConfig(r.api, r.url, user, groups...))
	if err != nil {
		return nil, fmt.Errorf("create signer client: %w", err)
	}
	signer, err := certificates.NewSigner(certificates.SignerConfig{Client: client, Authority: r.authority,
		MaxTTL: r.cfg.ClusterSigningDuration, Logger: r.cfg.Logger.With("component", "csrsigning")})
	if err != nil {
		return nil, err
	}
	sigCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = signer.Run(sigCtx) }()
	return sync.OnceFunc(func() { cancel(); <-done }), nil
}

// openAudit opens the audit log cfg asks for, or returns nil.
func openAudit(cfg Config) (*audit.Log, error) {
	if cfg.Audit.Path == "" {
		return nil, nil
	}
	o := cfg.Audit
	o.Logger = cfg.Logger.With("component", "audit")
	l, err := audit.New(o)
	if err != nil {
		return nil, err
	}
	policy := o.PolicyFile
	if policy == "" {
		policy = "(none: Metadata for every request)"
	}
	o.Logger.Info("audit log enabled", "path", o.Path, "policy", policy)
	return l, nil
}
