package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A pod's host ports (a container port's hostPort) are frontends like a
// NodePort's with a single local backend, the pod: the tc programs
// translate what arrives on an uplink for the node address (DNAT only,
// the pod sees the client), the socket programs what the node's processes
// and pods dial, and 127.0.0.1 or ::1 dialled in the node's namespace. As
// with NodePorts, a host process cannot bind a port that a pod publishes
// on every node address.

// HostPort is one port a pod publishes on the node: connections to
// HostIP:Port, or to any node address when HostIP is unset or
// unspecified, reach PodIP:PodPort.
type HostPort struct {
	HostIP   netip.Addr
	Port     uint16
	Protocol corev1.Protocol // "" means TCP
	PodIP    netip.Addr
	PodPort  uint16
}

func (p HostPort) String() string {
	host := "*"
	if p.HostIP.IsValid() && !p.HostIP.IsUnspecified() {
		host = p.HostIP.Unmap().String()
	}
	proto := p.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	return fmt.Sprintf("%s:%d/%s -> %s:%d", host, p.Port, proto, p.PodIP.Unmap(), p.PodPort)
}

// check says why the dataplane cannot serve p, if it cannot.
func (p HostPort) check() error {
	switch {
	case p.Port == 0 || p.PodPort == 0:
		return fmt.Errorf("host port %s: port 0", p)
	case !p.PodIP.IsValid():
		return fmt.Errorf("host port %s: no pod address", p)
	case p.Protocol != "" && p.Protocol != corev1.ProtocolTCP && p.Protocol != corev1.ProtocolUDP:
		return fmt.Errorf("host port %s: protocol %s is not supported (TCP and UDP are)", p, p.Protocol)
	case p.HostIP.IsValid() && !p.HostIP.IsUnspecified() && p.HostIP.Unmap().Is6() != p.PodIP.Unmap().Is6():
		return fmt.Errorf("host port %s: host and pod addresses of different families", p)
	}
	return nil
}

// ownerKey names what programs a frontend: a Service, or the host ports
// of a pod (by UID: a pod created again under the same name is another
// pod, and the old one's removal must not take the new one's ports).
type ownerKey struct {
	pod types.UID
	svc types.NamespacedName
}

func serviceOwner(k types.NamespacedName) ownerKey { return ownerKey{svc: k} }

func (o ownerKey) String() string {
	if o.pod != "" {
		return "pod " + string(o.pod)
	}
	return "Service " + o.svc.String()
}

// SetHostPorts records the host ports of pod uid, replacing those recorded
// before; none forgets them. Like the Service calls it only records before
// the first Sync, which writes them with the Services, and is in the kernel
// when it returns afterwards: an agent that restarts gives the pods' host
// ports before its first Sync, or Sync removes them as unwanted. Ports the
// dataplane cannot serve (SCTP, a port 0, no pod address) are left out
// and named in the error; the others are programmed.
func (d *Dataplane) SetHostPorts(uid types.UID, ports []HostPort) error {
	var errs []error
	var keep []HostPort
	for _, p := range ports {
		if err := p.check(); err != nil {
			errs = append(errs, err)
			continue
		}
		keep = append(keep, p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("set host ports: closed")
	}
	if len(keep) == 0 {
		delete(d.hostPorts, uid)
	} else {
		d.hostPorts[uid] = keep
	}
	d.applyLocked(ownerKey{pod: uid})
	return errors.Join(errs...)
}

// desiredHostPorts computes the frontends of one pod's host ports. Both
// scopes are Local with the pod as their only backend; a host port on
// every node address is the NodePort key for the uplinks and one key per
// address of nodeIPs (the node's and loopback, sockAddrs) of the pod
// address's family for the node's sockets.
func desiredHostPorts(ports []HostPort, nodeIPs []netip.Addr) []desiredFE {
	var out []desiredFE
	add := func(ip netip.Addr, p HostPort, proto uint8, scope uint8) {
		k := feKey{IP: as16(ip), Port: p.Port, Proto: proto, Scope: scope}
		if slices.ContainsFunc(out, func(d desiredFE) bool { return d.Key == k }) {
			return // the same port listed twice: the first one counts
		}
		be := beSpec{beKey{IP: as16(p.PodIP.Unmap()), Port: p.PodPort}, beLocal}
		out = append(out, desiredFE{Key: k, Flags: feLocalOnly, Backends: []beSpec{be}})
	}
	for _, p := range ports {
		proto, ok := protoOf(p.Protocol)
		if !ok || p.check() != nil {
			continue
		}
		v6 := p.PodIP.Unmap().Is6()
		if h := p.HostIP.Unmap(); h.IsValid() && !h.IsUnspecified() {
			add(h, p, proto, scopeExternal)
			add(h, p, proto, scopeInternal)
			continue
		}
		add(anyAddr(v6), p, proto, scopeExternal)
		for _, ip := range nodeIPs {
			if ip.Is6() == v6 {
				add(ip, p, proto, scopeInternal)
			}
		}
	}
	return out
}
