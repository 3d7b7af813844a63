package edge

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNodeNetConfig checks how the dataplane and DNS settings are
// defaulted and refused.
func TestNodeNetConfig(t *testing.T) {
	base := func() Config {
		return Config{HubURL: "https://hub.example:6443", DataDir: t.TempDir(), Runtime: nopRuntime{}, WatchServices: true}
	}
	c := base()
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.Dataplane != DataplaneNone || c.ClusterDomain != "cluster.local" || c.DNSAddr.IsValid() {
		t.Errorf("defaults: dataplane %q, domain %q, DNS %v", c.Dataplane, c.ClusterDomain, c.DNSAddr)
	}
	c = base()
	c.ClusterDomain = "Edge.Internal."
	if err := c.setDefaults(); err == nil {
		t.Error("an upper-case cluster domain was accepted")
	}
	c = base()
	c.ClusterDomain = "edge.internal."
	if err := c.setDefaults(); err != nil || c.ClusterDomain != "edge.internal" {
		t.Errorf("cluster domain with a trailing dot: %q, %v", c.ClusterDomain, err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown dataplane", func(c *Config) { c.Dataplane = "iptables" }, "unknown dataplane"},
		{"dataplane without watches", func(c *Config) { c.Dataplane = DataplaneEBPF; c.WatchServices = false }, "needs WatchServices"},
		{"DNS without watches", func(c *Config) {
			c.DNSAddr = netip.MustParseAddrPort(DefaultDNSAddr + ":53")
			c.WatchServices = false
		}, "needs WatchServices"},
		{"DNS on the wildcard address", func(c *Config) { c.DNSAddr = netip.MustParseAddrPort("0.0.0.0:53") }, "specific address"},
		{"long interface name", func(c *Config) { c.DNSInterface = "tether-dns-interface" }, "longer than 15"},
	} {
		c := base()
		tc.edit(&c)
		if err := c.setDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestHostUpstreams checks that the DNS server never forwards to itself.
func TestHostUpstreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte("nameserver 169.254.20.10\nnameserver 192.0.2.53\nnameserver 2001:db8::53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := hostUpstreams(path, netip.MustParseAddr(DefaultDNSAddr))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.53:53", "[2001:db8::53]:53"}; !slices.Equal(got, want) {
		t.Errorf("upstreams %v, want %v", got, want)
	}
	got, err = hostUpstreams(filepath.Join(t.TempDir(), "missing"), netip.MustParseAddr(DefaultDNSAddr))
	if err != nil || got == nil || len(got) != 0 {
		t.Errorf("no resolv.conf: %#v, %v; want an empty, non-nil list", got, err)
	}
}

// nopRuntime satisfies Runtime for configuration checks; it runs nothing.
type nopRuntime struct{ Runtime }
