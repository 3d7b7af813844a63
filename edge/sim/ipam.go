package sim

import (
	"errors"
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"
)

// ipam hands out pod addresses from the node's pod ranges: one address per
// range (one per family on a dual-stack node), skipping the network
// address, the first host address (the bridge's, on a real node) and the
// IPv4 broadcast address.
type ipam struct {
	used map[string]types.UID // address → pod
}

// maxScan bounds the search in huge (IPv6) ranges.
const maxScan = 1 << 16

func (m *ipam) allocate(cidrs []netip.Prefix, uid types.UID) ([]string, error) {
	if len(cidrs) == 0 {
		return nil, errors.New("the node has no pod CIDR yet (spec.podCIDR)")
	}
	var out []string
	for _, cidr := range cidrs {
		ip, err := m.next(cidr.Masked(), uid)
		if err != nil {
			for _, a := range out {
				delete(m.used, a)
			}
			return nil, err
		}
		out = append(out, ip)
	}
	return out, nil
}

func (m *ipam) next(cidr netip.Prefix, uid types.UID) (string, error) {
	a := cidr.Addr().Next().Next()
	for i := 0; i < maxScan && a.IsValid() && cidr.Contains(a); i++ {
		n := a.Next()
		if a.Is4() && (!n.IsValid() || !cidr.Contains(n)) {
			break // broadcast
		}
		if _, taken := m.used[a.String()]; !taken {
			m.used[a.String()] = uid
			return a.String(), nil
		}
		a = n
	}
	return "", fmt.Errorf("no free address left in pod CIDR %s", cidr)
}

func (m *ipam) release(uid types.UID) {
	for a, owner := range m.used {
		if owner == uid {
			delete(m.used, a)
		}
	}
}

func mustAddr(s string) netip.Addr {
	a, _ := netip.ParseAddr(s)
	return a
}
