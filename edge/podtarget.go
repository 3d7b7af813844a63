package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// errNotPodAddress refuses a tunnel stream to an address that is not one
// of the node's pods.
var errNotPodAddress = errors.New("not the address of a pod on this node")

// dialPod connects a stream the hub opened for pods/proxy or
// services/proxy to addr, an IP:port of one of the node's pods, from the
// host (pod addresses are routed to the pods' network). Only the
// addresses of the node's own pods are served, and not those of
// host-network pods, which are the node's: the tunnel reaches nothing
// else of the node's network.
func (a *Agent) dialPod(ctx context.Context, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial pod %q: %w", addr, errNotPodAddress)
	}
	if !podAddrAllowed(ctx, a.pods.pods(), a.cfg.Runtime.PodStatus, ap.Addr()) {
		return nil, fmt.Errorf("dial pod %s: %w", ap, errNotPodAddress)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", ap.String())
}

// podAddrAllowed reports whether ip is the address the runtime gave one of
// pods, host-network pods excepted.
func podAddrAllowed(ctx context.Context, pods []*corev1.Pod, status func(context.Context, types.UID) (*PodStatus, error), ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsLoopback() {
		return false
	}
	for _, p := range pods {
		if p.Spec.HostNetwork {
			continue
		}
		st, err := status(ctx, p.UID)
		if err != nil {
			continue
		}
		for _, pip := range st.IPs {
			if pip.Unmap() == ip {
				return true
			}
		}
	}
	return false
}
