// Package hub is tether's control plane process: it opens the store, loads or
// creates the certificate authority, serves the Kubernetes API over HTTPS
// (HTTP/2 and HTTP/1.1) and writes an admin kubeconfig once it serves.
//
// A Hub is built with [New] from a [Config] and runs until its context ends;
// on SIGTERM the command cancels that context and Run drains requests, ends
// watches and closes the store, so every acknowledged write is on disk.
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
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/controllers"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/discovery"
	"github.com/tether-edge/tether/hub/openapi"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
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
	// 10.96.0.0/12. Its first address is the kubernetes Service's.
	ServiceCIDR string
	// ChangeLogRetain is how many revisions the store's change log keeps
	// (watches may resume from within them); zero means the store's
	// default, 100,000.
	ChangeLogRetain int64
	// CompactInterval is how often the change log is compacted; zero means
	// the store's default, 30 seconds.
	CompactInterval time.Duration
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
	if err := registry.SetServiceNetwork(registry.ServiceNetwork{CIDR: cidr}); err != nil {
		return err
	}
	serviceIP := cidr.Addr().Next()

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

	kinds := registry.All()
	objs, err := storage.New(storage.Config{Store: st, Kinds: kinds, Logger: cfg.Logger.With("component", "storage")})
	if err != nil {
		return err
	}
	if err := objs.Bootstrap(ctx, storage.BootstrapConfig{AdvertiseAddress: advertise, Port: int32(port), ServiceIP: serviceIP.String()}); err != nil {
		return fmt.Errorf("bootstrap objects: %w", err)
	}

	authn := auth.Union{auth.NewCertAuthenticator(authority.CAPool())}
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
	api, err := apiserver.New(apiserver.Config{
		Storage:       objs,
		Kinds:         kinds,
		Authenticator: authn,
		Discovery:     discovery.New(kinds, discovery.Config{}),
		OpenAPI:       oapi,
		Version:       versionInfo(cfg.Version),
		Logger:        cfg.Logger.With("component", "apiserver"),
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

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(tls.NewListener(ln, srv.TLSConfig)) }()

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

	// The built-in controllers are clients of the hub's own API over
	// loopback, like any other client.
	ctrlCert, ctrlKey, err := authority.IssueClientCert("system:kube-controller-manager", []string{pki.AdminGroup}, 10*365*24*time.Hour)
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("issue controllers certificate: %w", err)
	}
	ctrl, err := controllers.New(controllers.Config{
		RestConfig: &rest.Config{
			Host:            url,
			TLSClientConfig: rest.TLSClientConfig{CAData: authority.CAPEM(), CertData: ctrlCert, KeyData: ctrlKey},
		},
		Logger: cfg.Logger.With("component", "controllers"),
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

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve the API: %w", err)
	case <-ctx.Done():
	}
	h.log.Info("shutting down")
	stopCtrl()       // before requests end, so the controllers see no broken watches
	cancelRequests() // ends watches and streams so Shutdown need not wait for them
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		_ = srv.Close()
	}
	return nil
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
