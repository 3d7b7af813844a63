package edge

import (
	"net/netip"
	"testing"

	"github.com/tether-edge/tether/dataplane"
)

// The dataplane takes pod masquerading over from the CNI bridge only where
// it can do it: with an uplink, and for IPv4 pod ranges only.
func TestMasqueradeNeedsUplinkAndIPv4(t *testing.T) {
	v4 := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/24")}
	dual := append(v4, netip.MustParsePrefix("fd00:42::/64"))
	// A Dataplane that is never called: every case below must decline
	// before it writes to one.
	dp := &dataplane.Dataplane{}
	for _, c := range []struct {
		name  string
		net   *nodeNet
		cidrs []netip.Prefix
	}{
		{"no dataplane", &nodeNet{uplinks: []string{"eth0"}}, v4},
		{"no uplink", &nodeNet{dp: dp}, v4},
		{"no pod range yet", &nodeNet{dp: dp, uplinks: []string{"eth0"}}, nil},
		{"dual stack", &nodeNet{dp: dp, uplinks: []string{"eth0"}}, dual},
	} {
		a := &Agent{net: c.net}
		if a.masquerade(c.cidrs) {
			t.Errorf("%s: the dataplane masquerades, want the pod network to", c.name)
		}
	}
}
