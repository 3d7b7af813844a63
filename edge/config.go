package edge

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// KubernetesVersion is the Kubernetes version the agent reports as its
// kubelet version, with a "-tether" suffix.
const KubernetesVersion = "v1.37.2"

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
	// Labels are added to the Node's labels at registration.
	Labels map[string]string
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
	// the data plane. Hollow nodes turn it off.
	WatchServices bool
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
	if c.CertRenewFraction <= 0 || c.CertRenewFraction >= 1 {
		c.CertRenewFraction = 2.0 / 3
	}
	if c.Version == "" {
		c.Version = "devel"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// hostName returns the host's name as a node name.
func hostName() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("read host name: %w", err)
	}
	return strings.ToLower(h), nil
}

// hubHost returns the host part of the hub URL.
func hubHost(hubURL string) string {
	u, _ := url.Parse(hubURL)
	return u.Hostname()
}
