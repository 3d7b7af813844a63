package edge

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tether-edge/tether/edge/ingress"
)

// The ingress controller needs the Service watches, and labels the Node
// without touching the caller's labels.
func TestIngressConfig(t *testing.T) {
	base := func() Config {
		return Config{HubURL: "https://hub:6443", DataDir: t.TempDir(), Runtime: nopRuntime{}, Ingress: &ingress.Config{}}
	}
	cfg := base()
	if err := cfg.setDefaults(); err == nil || !strings.Contains(err.Error(), "WatchServices") {
		t.Errorf("ingress without WatchServices: %v", err)
	}
	cfg = base()
	cfg.WatchServices = true
	mine := map[string]string{"a": "b"}
	cfg.Labels = mine
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.Labels[ingress.NodeLabel] != "true" || cfg.Labels["a"] != "b" || len(mine) != 1 {
		t.Errorf("labels %v, caller's %v", cfg.Labels, mine)
	}
	cfg = base()
	cfg.Ingress = nil
	if err := cfg.setDefaults(); err != nil || cfg.Labels[ingress.NodeLabel] != "" {
		t.Errorf("without ingress: %v %v", err, cfg.Labels)
	}
}

// A wildcard ingress listener on the API relay's port moves to the node's
// address; anything else stays as asked.
func TestIngressListenAddr(t *testing.T) {
	relay := netip.MustParseAddrPort("169.254.20.10:443")
	node := netip.MustParseAddr("192.0.2.10")
	for _, c := range []struct {
		addr, def string
		relay     netip.AddrPort
		want      string
	}{
		{"", ":443", relay, "192.0.2.10:443"},
		{":443", ":443", relay, "192.0.2.10:443"},
		{"0.0.0.0:443", ":443", relay, "192.0.2.10:443"},
		{"", ":80", relay, ":80"},
		{"198.51.100.7:443", ":443", relay, "198.51.100.7:443"},
		{":8443", ":443", relay, ":8443"},
		{":443", ":443", netip.AddrPort{}, ":443"},
	} {
		if got := ingressListenAddr(c.addr, c.def, c.relay, node); got != c.want {
			t.Errorf("ingressListenAddr(%q, %q, %v) = %q, want %q", c.addr, c.def, c.relay, got, c.want)
		}
	}
}
