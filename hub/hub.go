package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/controllers"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/audit"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/discovery"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/scheduler"
)

// KubernetesVersion is the Kubernetes API version the hub serves and reports
// at /version; kubectl warns when its own minor version is more than one away.
const KubernetesVersion = "v1.37.2"

// MinNodeMonitorGracePeriod is the shortest Config.NodeMonitorGracePeriod:
// about twice the interval (7s) at which the hub renews a connected
// node's Lease, so that one late renewal does not mark a healthy node.
const MinNodeMonitorGracePeriod = 15 * time.Second

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
	// Datastore is where the store lives: empty for SQLite in DataDir
	// (state.db), or a postgres:// URL for a PostgreSQL database (see
	// store/postgres), which records the cluster's CA key hash and refuses
	// to open another cluster's data.
	Datastore string
	// SecretKeyFile holds the secret (at least 32 bytes, blanks around it
	// ignored) the cluster's keys are encrypted with in a PostgreSQL
	// datastore, the same for every hub of the cluster. Required with
	// PostgreSQL, refused with SQLite, which keeps the keys in DataDir/pki.
	SecretKeyFile string
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
	// ClusterSigningDuration is the longest lifetime of the client
	// certificates the kubernetes.io/kube-apiserver-client signer issues
	// for CertificateSigningRequests (kube-controller-manager's
	// --cluster-signing-duration); zero means one year.
	ClusterSigningDuration time.Duration
	// TunnelHandshakeRate and TunnelHandshakeBurst bound how fast the hub
	// admits new edge connections (a token bucket); zero means 500/s with
	// a burst of 100. Edges refused back off with jitter and come later.
	TunnelHandshakeRate  float64
	TunnelHandshakeBurst int
	// TunnelIdleTimeout closes an edge tunnel without traffic, and so
	// bounds how long an edge takes to notice a hub that died without a
	// word (edges heartbeat at a third of it); zero means 45s. Fleets of
	// several hubs that want edges to move faster lower it, at the cost
	// of more frequent heartbeats.
	TunnelIdleTimeout time.Duration
	// DrainWindow is the reconnect window the hub announces to edges when
	// it shuts down; they spread their reconnects over it. Zero means 10s.
	DrainWindow time.Duration
	// Controllers selects the built-in controllers to run, as
	// kube-controller-manager's --controllers ("*", "name", "-name"); nil
	// runs them all.
	Controllers []string
	// HorizontalPodAutoscalerSyncPeriod is how often each
	// HorizontalPodAutoscaler is synced; zero means 15s.
	HorizontalPodAutoscalerSyncPeriod time.Duration
	// NodeMonitorGracePeriod is how long a node's Lease may go unrenewed
	// before the node is taken as unreachable (Ready=Unknown, the
	// unreachable taints), as kube-controller-manager's
	// --node-monitor-grace-period. Zero means 40s; less than
	// MinNodeMonitorGracePeriod is refused.
	NodeMonitorGracePeriod time.Duration
	// SiteKeyRotation is how often each site's gossip keys are rotated;
	// zero means a day.
	SiteKeyRotation time.Duration
	// LocalPathRoot is the directory of nodes under which the local-path
	// provisioner makes volumes; empty means /var/lib/tether/storage. Agents
	// must use the same (tether edge --local-path-root).
	LocalPathRoot string
	// DisableScheduler leaves pods unscheduled by the hub, for another
	// scheduler or for tests that run their own.
	DisableScheduler bool
	// DisableMetricsAPI leaves metrics.k8s.io unserved and the usage the
	// edges push unread, for clusters that run metrics-server instead.
	DisableMetricsAPI bool
	// Profiling serves /debug/pprof/ (see apiserver.Config.Profiling).
	Profiling bool
	// Version is tether's own version, reported as gitCommit at /version.
	Version string
	// Audit configures the audit log; an empty Path disables it.
	Audit audit.Options
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
	if cfg.Datastore != "" && !isPostgresDatastore(cfg.Datastore) {
		return nil, fmt.Errorf("create hub: datastore %q is neither empty (SQLite) nor a postgres:// URL", redactDSN(cfg.Datastore))
	}
	if cfg.Datastore == "" && cfg.SecretKeyFile != "" {
		return nil, errors.New("create hub: a secret key file (--secret-key-file) is for a PostgreSQL datastore; with SQLite the cluster's keys stay in the data directory (pki/)")
	}
	if cfg.Datastore != "" && cfg.SecretKeyFile == "" {
		return nil, errors.New("create hub: " + noSecretKey)
	}
	if g := cfg.NodeMonitorGracePeriod; g != 0 && g < MinNodeMonitorGracePeriod {
		return nil, fmt.Errorf("create hub: node monitor grace period %v is shorter than %v: the hub renews a connected node's Lease every 7s, so a healthy node would be taken as unreachable between renewals", g, MinNodeMonitorGracePeriod)
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
	{Parent: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Name: "ephemeralcontainers",
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Verbs: []string{"get", "patch", "update"}},
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
	{Parent: schema.GroupVersionResource{Group: "certificates.k8s.io", Version: "v1", Resource: "certificatesigningrequests"}, Name: "approval",
		Kind: schema.GroupVersionKind{Group: "certificates.k8s.io", Version: "v1", Kind: "CertificateSigningRequest"}, Verbs: []string{"get", "patch", "update"}},
}

// localConfig is the client configuration of a component running inside
// the hub: the API served in-process, as user in groups.
func localConfig(api *apiserver.Server, url, user string, groups ...string) *rest.Config {
	return &rest.Config{
		Host:      url,
		Transport: api.LocalTransport(&auth.User{Name: user, Groups: groups}),
	}
}

// controllerConfig returns, by controller name, the configuration under
// which that controller acts: its own ServiceAccount in kube-system, bound
// to its system:controller: ClusterRole, as kube-controller-manager's
// --use-service-account-credentials makes it.
func controllerConfig(api *apiserver.Server, url string) func(string) *rest.Config {
	return func(name string) *rest.Config {
		account := bootstrap.AccountFor(name)
		if account == "" {
			return nil
		}
		user, groups := bootstrap.ControllerUser(account)
		return localConfig(api, url, user, groups...)
	}
}

// startScheduler runs the scheduler in-process as a client of the hub's own
// API, like the controllers; the returned function stops it and waits.
func (h *Hub) startScheduler(ctx context.Context, api *apiserver.Server, url string) (func(), error) {
	sched, err := scheduler.New(scheduler.Config{
		RestConfig: localConfig(api, url, bootstrap.SchedulerUser, "system:authenticated"),
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
