package dataplane

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Values mirrored from bpf/lb.h.
const (
	scopeInternal uint8 = 0
	scopeExternal uint8 = 1

	feAffinity  uint8 = 0x01
	feLocalOnly uint8 = 0x02
	feInline    uint8 = 0x04 // lb_fe_fast copies only

	beLocal       uint8 = 0x01
	beTerminating uint8 = 0x02

	protoTCP  uint8 = 6
	protoUDP  uint8 = 17
	protoSCTP uint8 = 132
)

// defaultAffinityTimeout is Kubernetes' default for
// sessionAffinityConfig.clientIP.timeoutSeconds (3 h).
const defaultAffinityTimeout = 10800

// labelProxyName marks Services that another proxy implementation owns.
const labelProxyName = "service.kubernetes.io/service-proxy-name"

// feKey identifies a frontend; it is the comparable Go form of fe_key.
// NodePorts use the unspecified address of their family.
type feKey struct {
	IP    netip.Addr // always the 16-byte form (IPv4 mapped)
	Port  uint16
	Proto uint8
	Scope uint8
}

// beKey identifies a backend within a frontend.
type beKey struct {
	IP   netip.Addr // 16-byte form
	Port uint16
}

type beSpec struct {
	beKey
	Flags uint8
}

// desiredFE is what one frontend should look like in the maps.
type desiredFE struct {
	Key             feKey
	Flags           uint8
	AffinityTimeout uint32
	Backends        []beSpec // sorted by address and port: slot order
}

// endpointInfo is one endpoint address of a slice, reduced to what the
// load balancer needs.
type endpointInfo struct {
	IP          netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	Local       bool
}

// protoOf maps a Kubernetes protocol to its IP protocol number; an unset
// protocol means TCP, like the API's default.
func protoOf(p corev1.Protocol) (uint8, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return protoTCP, true
	case corev1.ProtocolUDP:
		return protoUDP, true
	case corev1.ProtocolSCTP:
		return protoSCTP, true
	}
	return 0, false
}

// serviceHandled reports whether the load balancer programs anything for
// svc: headless and ExternalName Services are DNS-only, and Services that
// name another proxy are not ours.
func serviceHandled(svc *corev1.Service) bool {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return false
	}
	if _, ok := svc.Labels[labelProxyName]; ok {
		return false
	}
	return true
}

// endpointsFor returns the endpoints of the slices that serve the Service
// port named portName with protocol proto in address family v6. The port
// number comes from the slice: that is how a targetPort given by name is
// resolved per pod.
func endpointsFor(sl []*discoveryv1.EndpointSlice, portName string, proto corev1.Protocol, v6 bool, node string) []endpointInfo {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	var seen map[beKey]bool // built once a linear scan gets long
	var out []endpointInfo
	for _, s := range sl {
		switch s.AddressType {
		case discoveryv1.AddressTypeIPv4:
			if v6 {
				continue
			}
		case discoveryv1.AddressTypeIPv6:
			if !v6 {
				continue
			}
		default:
			continue // FQDN slices are not load-balanced
		}
		var port uint16
		for _, p := range s.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			pp := corev1.ProtocolTCP
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if name == portName && pp == proto && p.Port != nil && *p.Port > 0 && *p.Port < 65536 {
				port = uint16(*p.Port)
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			// Consumers use the first address only (the API contract).
			ip, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || ip.Unmap().Is6() != v6 {
				continue
			}
			ip = as16(ip.Unmap())
			k := beKey{IP: ip, Port: port}
			// The same endpoint may be in two slices during a move: the
			// first one counts.
			if seen == nil && len(out) >= 16 {
				seen = make(map[beKey]bool, 2*len(out))
				for _, e := range out {
					seen[beKey{e.IP, e.Port}] = true
				}
			}
			if seen != nil {
				if seen[k] {
					continue
				}
				seen[k] = true
			} else if slices.ContainsFunc(out, func(e endpointInfo) bool { return e.IP == ip && e.Port == port }) {
				continue
			}
			if out == nil {
				out = make([]endpointInfo, 0, len(s.Endpoints))
			}
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ready
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			term := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			out = append(out, endpointInfo{
				IP: ip, Port: port, Ready: ready && !term, Serving: serving, Terminating: term,
				Local: node != "" && ep.NodeName != nil && *ep.NodeName == node,
			})
		}
	}
	return out
}

// usable applies Kubernetes' endpoint selection: ready endpoints; if there
// are none, endpoints that still serve while terminating.
func usable(eps []endpointInfo, localOnly bool) []beSpec {
	var ready, fallback []beSpec
	for _, e := range eps {
		if ready == nil && e.Ready {
			ready = make([]beSpec, 0, len(eps))
		}
		if localOnly && !e.Local {
			continue
		}
		var fl uint8
		if e.Local {
			fl |= beLocal
		}
		switch {
		case e.Ready:
			ready = append(ready, beSpec{beKey{e.IP, e.Port}, fl})
		case e.Serving && e.Terminating:
			fallback = append(fallback, beSpec{beKey{e.IP, e.Port}, fl | beTerminating})
		}
	}
	out := ready
	if len(out) == 0 {
		out = fallback
	}
	slices.SortFunc(out, func(a, b beSpec) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return cmp.Compare(a.Port, b.Port)
	})
	return out
}

// as16 returns the 16-byte form of an address (IPv4 mapped), the form the
// maps use for both families.
func as16(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.AddrFrom16(a.As16())
	}
	return a
}

// anyAddr is the NodePort key address of a family.
func anyAddr(v6 bool) netip.Addr {
	if v6 {
		return netip.IPv6Unspecified()
	}
	return as16(netip.IPv4Unspecified())
}

// desiredFrontends computes every frontend one Service needs. nodeIPs are
// the addresses (unmapped) on which its NodePorts also answer the sockets
// of the node and its pods: the node's, and loopback (sockAddrs).
func desiredFrontends(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node string, nodeIPs []netip.Addr) []desiredFE {
	if !serviceHandled(svc) {
		return nil
	}
	var clusterIPs []netip.Addr
	ipStrings := svc.Spec.ClusterIPs
	if len(ipStrings) == 0 && svc.Spec.ClusterIP != "" {
		ipStrings = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ipStrings {
		if a, err := netip.ParseAddr(s); err == nil {
			clusterIPs = append(clusterIPs, a.Unmap())
		}
	}
	if len(clusterIPs) == 0 {
		return nil
	}
	var extIPs []netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(s); err == nil {
			extIPs = append(extIPs, a.Unmap())
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			extIPs = append(extIPs, a.Unmap())
		}
	}

	var flags uint8
	var timeout uint32
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		flags |= feAffinity
		timeout = defaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			timeout = uint32(*c.ClientIP.TimeoutSeconds)
		}
	}
	intLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	extLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer

	var out []desiredFE
	for _, sp := range svc.Spec.Ports {
		proto, ok := protoOf(sp.Protocol)
		if !ok || sp.Port <= 0 || sp.Port > 65535 {
			continue
		}
		for _, fam := range []bool{false, true} {
			var famCluster []netip.Addr
			for _, a := range clusterIPs {
				if a.Is6() == fam {
					famCluster = append(famCluster, a)
				}
			}
			if len(famCluster) == 0 {
				continue
			}
			eps := endpointsFor(eps, sp.Name, sp.Protocol, fam, node)
			all := usable(eps, false)
			internal, intFlags := all, flags
			if intLocal {
				internal, intFlags = usable(eps, true), flags|feLocalOnly
			}
			external, extFlags := all, flags
			if extLocal {
				external, extFlags = usable(eps, true), flags|feLocalOnly
			}
			add := func(ip netip.Addr, port int32, scope uint8, fl uint8, bes []beSpec) {
				out = append(out, desiredFE{
					Key:   feKey{IP: as16(ip), Port: uint16(port), Proto: proto, Scope: scope},
					Flags: fl, AffinityTimeout: timeout, Backends: bes,
				})
			}
			for _, ip := range famCluster {
				add(ip, sp.Port, scopeInternal, intFlags, internal)
			}
			for _, ip := range extIPs {
				if ip.Is6() != fam {
					continue
				}
				// From inside the node an external address behaves
				// like the ClusterIP, as with kube-proxy.
				add(ip, sp.Port, scopeInternal, flags, all)
				add(ip, sp.Port, scopeExternal, extFlags, external)
			}
			if nodePorts && sp.NodePort > 0 && sp.NodePort < 65536 {
				add(anyAddr(fam), sp.NodePort, scopeExternal, extFlags, external)
				// A socket of the node or of one of its pods that
				// dials a node address never crosses the uplink: the
				// socket programs balance it, with the backends the
				// tc programs use (externalTrafficPolicy Local: this
				// node's only, refused when there is none). The same
				// for loopback, which the programs translate in the
				// node's namespace only.
				for _, ip := range nodeIPs {
					if ip.Is6() == fam {
						add(ip, sp.NodePort, scopeInternal, extFlags, external)
					}
				}
			}
		}
	}
	return out
}
