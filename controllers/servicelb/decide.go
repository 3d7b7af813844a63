package servicelb

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// LabelLoadBalancer on a node with value "true" makes the node serve
// LoadBalancer Services; once any node carries it, only such nodes do.
const LabelLoadBalancer = "node.tether.io/loadbalancer"

// ReasonPortConflict is the reason of the Warning event a Service gets
// when an older LoadBalancer Service holds one of its ports.
const ReasonPortConflict = "PortConflict"

// Eligible returns the nodes that serve LoadBalancer Services: Ready and
// schedulable, not excluded from external load balancers and, when any
// node carries LabelLoadBalancer=true, carrying it.
func Eligible(nodes []*corev1.Node) []*corev1.Node {
	labelled := slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Labels[LabelLoadBalancer] == "true" })
	var out []*corev1.Node
	for _, n := range nodes {
		if labelled && n.Labels[LabelLoadBalancer] != "true" {
			continue
		}
		if n.DeletionTimestamp != nil || n.Spec.Unschedulable || !ready(n) {
			continue
		}
		if _, ok := n.Labels[corev1.LabelNodeExcludeBalancers]; ok {
			continue
		}
		out = append(out, n)
	}
	return out
}

// ready reports whether n's Ready condition is True.
func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Addresses returns the addresses the eligible nodes serve Services on:
// each node's ExternalIPs, or its InternalIPs if it has none; sorted and
// without repeats.
func Addresses(nodes []*corev1.Node) []string {
	set := sets.New[netip.Addr]()
	for _, n := range nodes {
		for _, typ := range []corev1.NodeAddressType{corev1.NodeExternalIP, corev1.NodeInternalIP} {
			found := false
			for _, a := range n.Status.Addresses {
				if a.Type != typ {
					continue
				}
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					set.Insert(ip.Unmap())
					found = true
				}
			}
			if found {
				break
			}
		}
	}
	addrs := set.UnsortedList()
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}

// allAddresses returns every IP address of nodes, of any type: what
// ingress this controller may have written.
func allAddresses(nodes []*corev1.Node) sets.Set[string] {
	set := sets.New[string]()
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				set.Insert(ip.Unmap().String())
			}
		}
	}
	return set
}

// Served reports whether the controller serves svc: a LoadBalancer
// Service without a loadBalancerClass, not being deleted.
func Served(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass == nil && svc.DeletionTimestamp == nil
}

// portKey is one port and protocol of the node addresses.
type portKey struct {
	port  int32
	proto corev1.Protocol
}

func (k portKey) String() string { return fmt.Sprintf("%d/%s", k.port, k.proto) }

// Conflicts admits the served Services among svcs oldest first
// (creationTimestamp, then namespace and name) and returns, by
// namespace/name, why each one not admitted is not: the first of its
// ports an admitted Service holds. An admitted Service holds all its
// ports; one not admitted holds none.
func Conflicts(svcs []*corev1.Service) map[string]string {
	served := make([]*corev1.Service, 0, len(svcs))
	for _, s := range svcs {
		if Served(s) {
			served = append(served, s)
		}
	}
	slices.SortFunc(served, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	held := map[portKey]*corev1.Service{}
	out := map[string]string{}
	for _, s := range served {
		var conflict string
		for _, p := range s.Spec.Ports {
			k := portKey{p.Port, cmp.Or(p.Protocol, corev1.ProtocolTCP)}
			if h, ok := held[k]; ok {
				conflict = fmt.Sprintf("port %s is already used on the node addresses by LoadBalancer Service %s/%s", k, h.Namespace, h.Name)
				break
			}
		}
		if conflict != "" {
			out[s.Namespace+"/"+s.Name] = conflict
			continue
		}
		for _, p := range s.Spec.Ports {
			held[portKey{p.Port, cmp.Or(p.Protocol, corev1.ProtocolTCP)}] = s
		}
	}
	return out
}

// Desired returns the ingress svc should have, and whether the controller
// is to write it at all. A served Service gets addrs, or nothing while in
// conflict. A Service of another type has its ingress cleared if owned
// says the controller could have written every entry: a bare IP that is
// an address of a Node. A LoadBalancer Service of another class is left
// alone unless ours says this controller wrote its ingress (it was served
// before its class was set) and owned agrees.
func Desired(svc *corev1.Service, addrs []string, conflict bool, owned sets.Set[string], ours bool) ([]corev1.LoadBalancerIngress, bool) {
	if !Served(svc) {
		cur := svc.Status.LoadBalancer.Ingress
		if len(cur) == 0 || svc.DeletionTimestamp != nil {
			return nil, false
		}
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer && !ours {
			return nil, false
		}
		for _, in := range cur {
			if in.Hostname != "" || len(in.Ports) > 0 || !owned.Has(in.IP) {
				return nil, false
			}
		}
		return nil, true
	}
	if conflict {
		return nil, true
	}
	vip := corev1.LoadBalancerIPModeVIP
	out := make([]corev1.LoadBalancerIngress, len(addrs))
	for i, a := range addrs {
		out[i] = corev1.LoadBalancerIngress{IP: a, IPMode: &vip}
	}
	return out, true
}

// Equal reports whether two ingress lists say the same, an unset ipMode
// being VIP (as the API server defaults it).
func Equal(a, b []corev1.LoadBalancerIngress) bool {
	return slices.EqualFunc(a, b, func(x, y corev1.LoadBalancerIngress) bool {
		mode := func(m *corev1.LoadBalancerIPMode) corev1.LoadBalancerIPMode {
			if m == nil {
				return corev1.LoadBalancerIPModeVIP
			}
			return *m
		}
		return x.IP == y.IP && x.Hostname == y.Hostname && mode(x.IPMode) == mode(y.IPMode) &&
			len(x.Ports) == 0 && len(y.Ports) == 0
	})
}
