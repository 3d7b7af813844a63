package edge

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPodAddrAllowed(t *testing.T) {
	pod := func(uid string, hostNet bool) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}, Spec: corev1.PodSpec{HostNetwork: hostNet}}
	}
	pods := []*corev1.Pod{pod("a", false), pod("h", true), pod("gone", false)}
	ips := map[types.UID][]netip.Addr{
		"a": {netip.MustParseAddr("10.42.0.5"), netip.MustParseAddr("fd00::5")},
		"h": {netip.MustParseAddr("192.0.2.10")},
	}
	status := func(_ context.Context, uid types.UID) (*PodStatus, error) {
		if ips[uid] == nil {
			return nil, fmt.Errorf("pod %s: %w", uid, ErrPodNotFound)
		}
		return &PodStatus{UID: uid, IPs: ips[uid]}, nil
	}
	for ip, want := range map[string]bool{
		"10.42.0.5":          true,
		"::ffff:10.42.0.5":   true,
		"fd00::5":            true,
		"10.42.0.6":          false, // no pod of this node
		"192.0.2.10":         false, // a host-network pod's address is the node's
		"127.0.0.1":          false,
		"0.0.0.0":            false,
		"169.254.169.254":    false,
		"fd00::6":            false,
		"::1":                false,
		"::ffff:192.0.2.10":  false,
		"::ffff:127.0.0.1":   false,
		"::ffff:10.42.0.250": false,
	} {
		if got := podAddrAllowed(context.Background(), pods, status, netip.MustParseAddr(ip)); got != want {
			t.Errorf("podAddrAllowed(%s) = %v, want %v", ip, got, want)
		}
	}
}
