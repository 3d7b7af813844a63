package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Dir is a direction of traffic relative to a local pod.
type Dir uint8

// Directions, as the programs number them.
const (
	Ingress Dir = 0
	Egress  Dir = 1
)

func (d Dir) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Reserved peer identities (bpf/policy.h).
const (
	// IDWorld is every address that is no known pod nor the node: only
	// ipBlock peers select it.
	IDWorld uint32 = 0
	// IDHost is the node's own addresses; its traffic into pods is
	// always allowed.
	IDHost uint32 = 1
	// IDAny stands for every peer (a rule without from or to).
	IDAny uint32 = 0xffffffff
)

// MaxRanges is the most port ranges one allow entry holds.
const MaxRanges = 16

// Protocol numbers of the protocols a NetworkPolicyPort names.
const (
	protoAny  = 0
	protoTCP  = 6
	protoUDP  = 17
	protoSCTP = 132
)

// Pod is what the compiler needs of a pod: where it lives, its labels and
// addresses, and its named container ports.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	IPs             []netip.Addr
	NamedPorts      []NamedPort
	// Local pods run on this node: policies selecting them are enforced
	// here. Other pods are peers only.
	Local bool
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name  string
	Proto uint8
	Port  uint16
}

// PodFromAPI reduces a pod to what the compiler needs. Pods on the host
// network have no address of their own (their traffic is the node's), and
// pods that ended hold theirs no more: both get none.
func PodFromAPI(p *corev1.Pod, local bool) Pod {
	out := Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Local: local}
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return out
	}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.IPs = append(out.IPs, a.Unmap())
		}
	}
	if len(out.IPs) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out.IPs = append(out.IPs, a.Unmap())
		}
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == "" || cp.ContainerPort <= 0 || cp.ContainerPort > 65535 {
				continue
			}
			out.NamedPorts = append(out.NamedPorts, NamedPort{Name: cp.Name, Proto: protoNumber(&cp.Protocol), Port: uint16(cp.ContainerPort)})
		}
	}
	return out
}

// protoNumber maps a Kubernetes protocol to its number; empty is TCP.
func protoNumber(p *corev1.Protocol) uint8 {
	if p == nil {
		return protoTCP
	}
	switch *p {
	case corev1.ProtocolUDP:
		return protoUDP
	case corev1.ProtocolSCTP:
		return protoSCTP
	}
	return protoTCP
}

// Input is everything a node's policy rules follow from.
type Input struct {
	Pods []Pod
	// Namespaces maps each namespace to its labels.
	Namespaces map[string]map[string]string
	Policies   []*networkingv1.NetworkPolicy
	// NodeIPs are the node's own addresses (IDHost).
	NodeIPs []netip.Addr
}

// PortRange is a range of ports of one protocol (0: every protocol).
type PortRange struct {
	Proto  uint8
	Lo, Hi uint16
}

// PortSet is what one allow entry allows: N ranges, sorted and merged. A
// zero PortSet allows nothing (an ipBlock except).
type PortSet struct {
	N int
	R [MaxRanges]PortRange
}

// Ranges returns the set's ranges.
func (s PortSet) Ranges() []PortRange { return s.R[:s.N] }

func (s PortSet) String() string {
	var b strings.Builder
	for i, r := range s.Ranges() {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d:%d-%d", r.Proto, r.Lo, r.Hi)
	}
	return b.String()
}

// allPorts is every port of every protocol.
var allPorts = PortRange{Proto: protoAny, Lo: 0, Hi: 65535}

// Endpoint is a local pod's address in one direction.
type Endpoint struct {
	IP  netip.Addr
	Dir Dir
}

// IDKey keys what a local pod may exchange with a peer identity.
type IDKey struct {
	Local netip.Addr
	Peer  uint32
	Dir   Dir
}

// CIDRKey keys what a local pod may exchange with an address block.
type CIDRKey struct {
	Local netip.Addr
	Dir   Dir
	Peer  netip.Prefix
}

// Rules are the contents of the policy maps for one node.
type Rules struct {
	// IDs maps the address of every known pod, and the node's, to its
	// peer identity.
	IDs map[netip.Addr]uint32
	// Isolated holds the local endpoints some policy isolates, with the
	// pod ("namespace/name") they belong to.
	Isolated  map[Endpoint]string
	AllowID   map[IDKey]PortSet
	AllowCIDR map[CIDRKey]PortSet
	// Warnings say what could not be enforced as written (a policy with
	// a bad selector, too many port ranges for one entry).
	Warnings []string
}

// normalize sorts and merges ranges (in place) into a PortSet. Sets of
// more than MaxRanges ranges keep the first MaxRanges (allowing less,
// never more) and report false.
func normalize(rs []PortRange) (PortSet, bool) {
	var s PortSet
	if len(rs) == 1 {
		s.R[0], s.N = rs[0], 1
		return s, true
	}
	if slices.Contains(rs, allPorts) {
		s.R[0], s.N = allPorts, 1
		return s, true
	}
	slices.SortFunc(rs, func(a, b PortRange) int {
		if a.Proto != b.Proto {
			return int(a.Proto) - int(b.Proto)
		}
		return int(a.Lo) - int(b.Lo)
	})
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].Proto == r.Proto && int(r.Lo) <= int(out[n-1].Hi)+1 {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	ok := len(out) <= MaxRanges
	s.N = copy(s.R[:], out)
	return s, ok
}
