package endpoints

//lint:file-ignore SA1019 Kubernetes still serves v1 Endpoints, deprecated for EndpointSlices, and the endpoints controller keeps them as upstream does

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tether-edge/tether/controllers/internal/kit"
	corev1 "k8s.io/api/core/v1"
)

// MaxEndpointsPerObject caps the addresses of one Endpoints object, as
// upstream does; the rest are left out and the object is annotated as over
// capacity. EndpointSlices have no such cap.
const MaxEndpointsPerObject = 1000

// legacyAddress is one pod's address in an Endpoints object.
type legacyAddress struct {
	addr  corev1.EndpointAddress
	ready bool
	ports []corev1.EndpointPort
}

// primaryFamilyIP returns the pod IP of the Service's first family.
func primaryFamilyIP(svc *corev1.Service, pod *corev1.Pod) string {
	want4 := true
	switch {
	case len(svc.Spec.IPFamilies) > 0:
		want4 = svc.Spec.IPFamilies[0] == corev1.IPv4Protocol
	default:
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil {
			want4 = ip.Is4()
		} else if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			// Headless with no family: the pod's primary IP.
			want4 = ip.Is4()
		}
	}
	ips := []string{pod.Status.PodIP}
	for _, p := range pod.Status.PodIPs {
		ips = append(ips, p.IP)
	}
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil && ip.Unmap().Is4() == want4 {
			return ip.Unmap().String()
		}
	}
	return ""
}

// desiredSubsets returns the subsets of a Service's Endpoints object and
// whether it had to be truncated to MaxEndpointsPerObject addresses.
// Addresses with the same ports share a subset; in each, ready pods are in
// addresses and the others in notReadyAddresses. Terminating pods are left
// out unless the Service publishes unready addresses, which also makes
// every address ready.
func desiredSubsets(svc *corev1.Service, pods []*corev1.Pod, maxAddrs int) ([]corev1.EndpointSubset, bool) {
	publish := svc.Spec.PublishNotReadyAddresses
	headlessNoPorts := svc.Spec.ClusterIP == corev1.ClusterIPNone && len(svc.Spec.Ports) == 0
	var addrs []legacyAddress
	for _, pod := range pods {
		if !podInEndpoints(pod, publish) {
			continue
		}
		ip := primaryFamilyIP(svc, pod)
		if ip == "" {
			continue
		}
		a := legacyAddress{
			addr: corev1.EndpointAddress{
				IP:        ip,
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			},
			ready: publish || kit.IsPodReady(pod),
		}
		if pod.Spec.NodeName != "" {
			a.addr.NodeName = ptr(pod.Spec.NodeName)
		}
		a.addr.Hostname = podHostname(svc, pod)
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			num, ok := resolvePort(sp, pod)
			if !ok {
				continue
			}
			proto := sp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			a.ports = append(a.ports, corev1.EndpointPort{Name: sp.Name, Port: num, Protocol: proto, AppProtocol: sp.AppProtocol})
		}
		if len(a.ports) == 0 && !headlessNoPorts {
			continue
		}
		addrs = append(addrs, a)
	}

	// Group by port set.
	bySig := map[string]*corev1.EndpointSubset{}
	for _, a := range addrs {
		slices.SortFunc(a.ports, func(x, y corev1.EndpointPort) int {
			return cmp.Or(cmp.Compare(x.Name, y.Name), cmp.Compare(x.Port, y.Port), cmp.Compare(x.Protocol, y.Protocol))
		})
		sig := portsSignature(a.ports)
		ss := bySig[sig]
		if ss == nil {
			ss = &corev1.EndpointSubset{Ports: a.ports}
			bySig[sig] = ss
		}
		if a.ready {
			ss.Addresses = append(ss.Addresses, a.addr)
		} else {
			ss.NotReadyAddresses = append(ss.NotReadyAddresses, a.addr)
		}
	}
	subsets := make([]corev1.EndpointSubset, 0, len(bySig))
	total := 0
	for _, sig := range slices.Sorted(maps.Keys(bySig)) {
		ss := bySig[sig]
		byIP := func(x, y corev1.EndpointAddress) int {
			return cmp.Or(cmp.Compare(x.IP, y.IP), cmp.Compare(x.TargetRef.UID, y.TargetRef.UID))
		}
		slices.SortFunc(ss.Addresses, byIP)
		slices.SortFunc(ss.NotReadyAddresses, byIP)
		total += len(ss.Addresses) + len(ss.NotReadyAddresses)
		subsets = append(subsets, *ss)
	}
	if total <= maxAddrs {
		return subsets, false
	}
	return truncateSubsets(subsets, total, maxAddrs), true
}

// truncateSubsets keeps maxAddrs addresses, sharing them among subsets in
// proportion to their sizes and keeping ready addresses before unready
// ones in each.
func truncateSubsets(subsets []corev1.EndpointSubset, total, maxAddrs int) []corev1.EndpointSubset {
	left := maxAddrs
	for i := range subsets {
		ss := &subsets[i]
		n := len(ss.Addresses) + len(ss.NotReadyAddresses)
		quota := n * maxAddrs / total
		if i == len(subsets)-1 {
			quota = left
		}
		quota = min(quota, left, n)
		left -= quota
		if len(ss.Addresses) >= quota {
			ss.Addresses = ss.Addresses[:quota]
			ss.NotReadyAddresses = nil
			continue
		}
		ss.NotReadyAddresses = ss.NotReadyAddresses[:quota-len(ss.Addresses)]
	}
	out := subsets[:0]
	for _, ss := range subsets {
		if len(ss.Addresses)+len(ss.NotReadyAddresses) > 0 {
			out = append(out, ss)
		}
	}
	return out
}

func portsSignature(ports []corev1.EndpointPort) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, "%s/%d/%s/%s;", p.Name, p.Port, p.Protocol, deref(p.AppProtocol))
	}
	return b.String()
}

// legacyLabels returns the labels of a Service's Endpoints object.
func legacyLabels(svc *corev1.Service) map[string]string {
	l := maps.Clone(svc.Labels)
	if l == nil {
		l = map[string]string{}
	}
	delete(l, LabelHeadless)
	// The controller's own Endpoints are not to be mirrored, as
	// upstream marks them.
	l[LabelSkipMirror] = "true"
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		l[LabelHeadless] = ""
	}
	return l
}
