package edge

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/edge/ingress"
)

// KubernetesVersion is the Kubernetes version the agent reports as its
// kubelet version (see KubeletVersion).
const KubernetesVersion = "v1.37.2"

// Dataplane choices (Config.Dataplane).
const (
	DataplaneEBPF = "ebpf"
	DataplaneNone = "none"
)

// UplinkAuto in Config.Uplinks stands for the interface that holds the
// node's address.
const UplinkAuto = "auto"

// DefaultDNSAddr is the node-local address of the DNS server that `tether
// edge` uses by default: link-local, so that it is never routed off the node,
// and the one NodeLocal DNSCache uses. DefaultDNSInterface holds it.
const (
	DefaultDNSAddr      = "169.254.20.10"
	DefaultDNSInterface = "tether-dns"
)

// DefaultAPIRelayPort is the port of the API relay that `tether edge`
// opens on DefaultDNSAddr by default, the port of the kubernetes Service.
// DefaultAPIRelayMaxConns bounds its connections when
// Config.APIRelayMaxConns is zero.
const (
	DefaultAPIRelayPort     = 443
	DefaultAPIRelayMaxConns = 256
)

// Config configures an Agent. HubURL, DataDir and Runtime are required;
// Token is required the first time only.
type Config struct {
	// HubURL is the hub's API address, https://HOST:PORT. The agent joins
	// and re-attests there; the tunnel goes to the same host and port
	// over UDP unless TunnelAddr says otherwise.
	HubURL string
	// Token is the join token (tether:<id>.<secret>:sha256:<hash>). It is
	// used only when DataDir holds no certificate yet; later starts ignore
	// it.
	Token string
	// DataDir keeps the node's key (node.key, mode 0600), certificate
	// (node.crt) and the hub's CA (ca.crt). Created if missing.
	DataDir string
	// NodeName is the Node's name. Empty means the name in the saved
	// certificate, or else the host name (lower-cased).
	NodeName string
	// Runtime runs the pods. Required.
	Runtime Runtime
	// Zone is the node's site, reported as the topology.kubernetes.io/zone
	// label. Empty means no zone label.
	Zone string
	// SiteView is the site's gossip membership as this node sees it. The
	// Service load balancing and DNS answers leave out the endpoints of
	// the site's members it says are Dead, and take them back when they
	// are Alive again. Nil: the node's own site gossip (GossipPort) when
	// it has a Zone, else every endpoint counts, as the hub says.
	SiteView SiteView
	// Labels are added to the Node's labels at registration.
	Labels map[string]string
	// NodeObserver, when set, is given the node's Node as the hub returns
	// it at registration and after each status write: how the program
	// around the agent learns of what the hub set on the Node (such as
	// the release its agent is to run) without a watch. It is called in
	// the status loop, so it must not block.
	NodeObserver func(*corev1.Node)
	// Capacity overrides entries of the capacity the runtime reports
	// (allocatable follows).
	Capacity corev1.ResourceList
	// NodeIP is the node's InternalIP. Invalid (zero) means the address
	// the host would use to reach the hub, or its first non-loopback
	// address.
	NodeIP netip.Addr
	// TunnelAddr is the tunnel's host:port. Empty means the host and port
	// of HubURL.
	TunnelAddr string
	// HeartbeatInterval is the tunnel's heartbeat period, which the hub
	// turns into Lease renewals. Zero means the tunnel's default (15s).
	HeartbeatInterval time.Duration
	// StatusInterval is the longest time between two Node status reports
	// when nothing changes. Zero means 5m, as upstream.
	StatusInterval time.Duration
	// StatusCheckInterval is how often the node status is computed to
	// detect changes. Zero means 10s.
	StatusCheckInterval time.Duration
	// WatchServices starts informers on Services and EndpointSlices for
	// the data plane. Hollow nodes turn it off. Dataplane and DNSAddr need
	// it.
	WatchServices bool
	// Dataplane chooses how the node load-balances Services:
	// DataplaneEBPF loads the eBPF dataplane (kernel features are probed
	// first, and Run fails naming any that are missing) and programs it
	// from the Service and EndpointSlice watches; DataplaneNone or ""
	// leaves Services alone. No iptables or nftables rule is ever written.
	Dataplane string
	// DataplaneCgroup is the cgroup v2 directory whose sockets are
	// load-balanced. Empty: the cgroup v2 root (every process).
	DataplaneCgroup string
	// DataplaneBPFFS is the bpffs directory of the dataplane's pins.
	// Empty: /sys/fs/bpf/tether.
	DataplaneBPFFS string
	// Uplinks are the interfaces that carry NodePort and externalIP
	// traffic; UplinkAuto stands for the interface that holds the node's
	// address. Empty: NodePorts are not served.
	Uplinks []string
	// ClusterDomain is the cluster's DNS domain. Empty: cluster.local.
	ClusterDomain string
	// DNSAddr is where the node's DNS server listens, over UDP and TCP. It
	// answers the cluster domain from the agent's Service and
	// EndpointSlice stores (so it keeps answering while the hub is out of
	// reach) and forwards every other name to DNSUpstreams. A zero port
	// lets the kernel pick one (see Agent.DNSAddr). Invalid (zero): no DNS
	// server.
	DNSAddr netip.AddrPort
	// DNSInterface, when set, is the interface the agent puts DNSAddr's
	// address on, creating it (a dummy interface) if missing: pods reach
	// the server through their default route to the node, NodeLocal
	// DNSCache style. Empty: the address must already be on the node.
	DNSInterface string
	// DNSUpstreams are the resolvers (host:port) of names outside the
	// cluster domain. Empty: the nameservers of the node's
	// /etc/resolv.conf, DNSAddr's address excepted.
	DNSUpstreams []string
	// APIRelayAddr is where the agent relays pods' connections to the
	// hub's API: the dataplane sends connections to the kubernetes
	// Service there, and the agent pipes each, unread beyond its TLS
	// ClientHello, to a tunnel stream the hub serves with its HTTPS
	// server; the pod's own credentials authenticate it. The address must
	// be on the node: with DNSInterface set the agent puts it there.
	// Invalid (zero): no relay, and the kubernetes Service keeps the
	// endpoints the hub writes.
	APIRelayAddr netip.AddrPort
	// APIRelayMaxConns bounds the connections relayed at once; further
	// ones are refused. Zero means DefaultAPIRelayMaxConns.
	APIRelayMaxConns int
	// Ingress, when set, runs the built-in ingress controller
	// (edge/ingress) for the IngressClasses of ingress.ControllerName,
	// listening on Ingress.HTTPAddr and HTTPSAddr (default :80 and :443),
	// and labels the Node ingress.NodeLabel=true so that the hub lets it
	// read Ingresses and their TLS Secrets. It needs WatchServices. The
	// agent sets OnSecrets, and fills Addresses (the node's address),
	// Status and Logger when they are unset.
	Ingress *ingress.Config
	// PodManifestPath is the directory of static pod manifests (or one
	// manifest file), as the kubelet's staticPodPath: the pods there run
	// without the hub, and the agent keeps a mirror pod of each on the
	// hub. It is created if missing. Empty: no static pods.
	PodManifestPath string
	// LocalVolumeCheckInterval is how often the agent asks the hub
	// whether the local-path volumes its pods used and no longer use still
	// exist, to remove the data of deleted ones. Zero means 1m.
	LocalVolumeCheckInterval time.Duration
	// GossipPort is the port (UDP and TCP) of the site gossip that a
	// node with a Zone runs with the other nodes of its site (see
	// edge/site); the agent publishes it in its Node's
	// AnnotationGossipPort. Zero means DefaultGossipPort; negative turns
	// the gossip off.
	GossipPort int
	// ImageSharePort is the TCP port on which a node with site gossip
	// serves its image content to its site's members, and fetches theirs
	// before the registry (edge/imageshare); the agent publishes it in
	// its Node's AnnotationImageSharePort. Zero or negative: no sharing.
	ImageSharePort int
	// ImageStagingInterval is how often the agent checks that it holds
	// the images of the ImageStagings that select its node, besides
	// whenever they change. Zero means 1m.
	ImageStagingInterval time.Duration
	// GossipBind is the address the site gossip listens on. Empty: every
	// address. The other members reach it at NodeIP.
	GossipBind string
	// MetricsPeriod is how often the agent reports the usage of its node
	// and containers to the hub (when the runtime is a StatsProvider).
	// Zero turns the reports off; `tether edge` defaults to 15s.
	MetricsPeriod time.Duration
	// CertRenewFraction is the fraction of the certificate's lifetime
	// after which it is renewed. Zero means 2/3.
	CertRenewFraction float64
	// Version is tether's version, sent to the hub in the tunnel's hello.
	// Empty means "devel".
	Version string
	// TunnelBackoffBase and TunnelBackoffCap shape the tunnel's reconnect
	// backoff. Zero means the tunnel's defaults (1s and 60s).
	TunnelBackoffBase, TunnelBackoffCap time.Duration
	// Logger receives the agent's logs. Nil means slog.Default().
	Logger *slog.Logger

	// afterPersist, when set, is called after a kept informer wrote an
	// event to the local state and before the agent acts on it. Only
	// tests set it (export_test.go).
	afterPersist func(kind string, ev watch.EventType, obj metav1.Object)
}

func (c *Config) setDefaults() error {
	if c.Runtime == nil {
		return errors.New("no runtime")
	}
	if c.DataDir == "" {
		return errors.New("no data directory")
	}
	u, err := url.Parse(c.HubURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Port() == "" {
		return fmt.Errorf("hub address %q must be https://HOST:PORT", c.HubURL)
	}
	if c.TunnelAddr == "" {
		c.TunnelAddr = u.Host
	}
	if _, _, err := net.SplitHostPort(c.TunnelAddr); err != nil {
		return fmt.Errorf("tunnel address %q: %w", c.TunnelAddr, err)
	}
	if c.NodeName != "" {
		if errs := validation.IsDNS1123Subdomain(c.NodeName); len(errs) > 0 {
			return fmt.Errorf("node name %q: %s", c.NodeName, strings.Join(errs, "; "))
		}
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = 5 * time.Minute
	}
	if c.StatusCheckInterval <= 0 {
		c.StatusCheckInterval = 10 * time.Second
	}
	if c.LocalVolumeCheckInterval <= 0 {
		c.LocalVolumeCheckInterval = time.Minute
	}
	if c.CertRenewFraction <= 0 || c.CertRenewFraction >= 1 {
		c.CertRenewFraction = 2.0 / 3
	}
	switch c.Dataplane {
	case "", DataplaneNone:
		c.Dataplane = DataplaneNone
	case DataplaneEBPF:
		if !c.WatchServices {
			return errors.New("the eBPF dataplane needs WatchServices")
		}
	default:
		return fmt.Errorf("unknown dataplane %q: want %s or %s", c.Dataplane, DataplaneEBPF, DataplaneNone)
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = "cluster.local"
	}
	c.ClusterDomain = strings.TrimSuffix(c.ClusterDomain, ".")
	if errs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(errs) > 0 {
		return fmt.Errorf("cluster domain %q: %s", c.ClusterDomain, strings.Join(errs, "; "))
	}
	if c.DNSAddr.IsValid() {
		if !c.WatchServices {
			return errors.New("the DNS server needs WatchServices")
		}
		if c.DNSAddr.Addr().IsUnspecified() {
			return fmt.Errorf("DNS address %s: pods need a specific address", c.DNSAddr)
		}
	}
	if c.DNSInterface != "" && len(c.DNSInterface) > 15 {
		return fmt.Errorf("DNS interface name %q is longer than 15 characters", c.DNSInterface)
	}
	if c.APIRelayAddr.IsValid() {
		if c.APIRelayAddr.Addr().IsUnspecified() || c.APIRelayAddr.Port() == 0 {
			return fmt.Errorf("API relay address %s: pods need a specific address and port", c.APIRelayAddr)
		}
	}
	if c.APIRelayMaxConns <= 0 {
		c.APIRelayMaxConns = DefaultAPIRelayMaxConns
	}
	if c.GossipPort == 0 {
		c.GossipPort = DefaultGossipPort
	}
	if c.GossipPort > 65535 {
		return fmt.Errorf("gossip port %d out of range", c.GossipPort)
	}
	if c.ImageSharePort > 65535 {
		return fmt.Errorf("image share port %d out of range", c.ImageSharePort)
	}
	if c.ImageStagingInterval <= 0 {
		c.ImageStagingInterval = time.Minute
	}
	if c.GossipBind != "" {
		if _, err := netip.ParseAddr(c.GossipBind); err != nil {
			return fmt.Errorf("gossip bind address %q: %w", c.GossipBind, err)
		}
	}
	if c.MetricsPeriod < 0 {
		return fmt.Errorf("metrics period %v is negative", c.MetricsPeriod)
	}
	if err := c.validateIngress(); err != nil {
		return err
	}
	if c.Version == "" {
		c.Version = "devel"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// hubHost returns the host part of the hub URL.
func hubHost(hubURL string) string {
	u, _ := url.Parse(hubURL)
	return u.Hostname()
}
