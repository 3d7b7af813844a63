package endpoints

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tether-edge/tether/controllers/internal/kit"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels and annotations the controller writes, as upstream's.
const (
	LabelManagedBy        = discoveryv1.LabelManagedBy // endpointslice.kubernetes.io/managed-by
	ManagedByValue        = "endpointslice-controller.k8s.io"
	LabelServiceName      = discoveryv1.LabelServiceName // kubernetes.io/service-name
	LabelHeadless         = corev1.IsHeadlessService     // service.kubernetes.io/headless
	LabelZone             = corev1.LabelTopologyZone     // topology.kubernetes.io/zone
	AnnotationTriggerTime = corev1.EndpointsLastChangeTriggerTime
	AnnotationOverCap     = corev1.EndpointsOverCapacity
)

// group is the endpoints that share an address type and resolved ports:
// they may go in the same slice.
type group struct {
	addressType discoveryv1.AddressType
	ports       []discoveryv1.EndpointPort
	endpoints   map[string]discoveryv1.Endpoint // by endpointKey
}

// groupKey names an address type and a port list. Ports are kept in the
// Service's order, which is how the controller writes them, so the key of
// a slice it wrote matches the key of the group it came from.
func groupKey(t discoveryv1.AddressType, ports []discoveryv1.EndpointPort) string {
	var b strings.Builder
	b.WriteString(string(t))
	for _, p := range ports {
		fmt.Fprintf(&b, "|%s/%s/%d/%s", deref(p.Name), derefProto(p.Protocol), deref32(p.Port), deref(p.AppProtocol))
	}
	return b.String()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefProto(p *corev1.Protocol) corev1.Protocol {
	if p == nil {
		return ""
	}
	return *p
}

func deref32(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

// endpointKey identifies one endpoint across syncs: the pod it stands for
// and its first address, so a pod given a new address is a new endpoint.
func endpointKey(ep *discoveryv1.Endpoint) string {
	uid := ""
	if ep.TargetRef != nil {
		uid = string(ep.TargetRef.UID)
	}
	addr := ""
	if len(ep.Addresses) > 0 {
		addr = ep.Addresses[0]
	}
	return uid + "|" + addr
}

// addressTypes returns the address types a Service's slices carry: its IP
// families, else the family of its cluster IP; a headless Service with
// neither gets both, as its pods may have either.
func addressTypes(svc *corev1.Service) []discoveryv1.AddressType {
	var out []discoveryv1.AddressType
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			out = append(out, discoveryv1.AddressTypeIPv4)
		case corev1.IPv6Protocol:
			out = append(out, discoveryv1.AddressTypeIPv6)
		}
	}
	if len(out) > 0 {
		return out
	}
	if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil {
		if ip.Is4() {
			return []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4}
		}
		return []discoveryv1.AddressType{discoveryv1.AddressTypeIPv6}
	}
	return []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}
}

// podAddresses returns a pod's IPs of one address type.
func podAddresses(pod *corev1.Pod, t discoveryv1.AddressType) []string {
	ips := make([]string, 0, 2)
	for _, p := range pod.Status.PodIPs {
		ips = append(ips, p.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = append(ips, pod.Status.PodIP)
	}
	var out []string
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if (t == discoveryv1.AddressTypeIPv4) == ip.Unmap().Is4() {
			out = append(out, ip.Unmap().String())
		}
	}
	return out
}

// podIsTerminal says whether a pod has ended for good: its IP may already
// belong to another pod.
func podIsTerminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// podInEndpoints says whether a pod may be an endpoint at all: it has an
// address and has not ended. Terminating pods are kept when
// includeTerminating is set.
func podInEndpoints(pod *corev1.Pod, includeTerminating bool) bool {
	if pod.Status.PodIP == "" && len(pod.Status.PodIPs) == 0 {
		return false
	}
	if podIsTerminal(pod) {
		return false
	}
	if !includeTerminating && pod.DeletionTimestamp != nil {
		return false
	}
	return true
}

// resolvePort finds the number a Service port's targetPort means for a
// pod: a number as is (zero means the Service port), a name through the
// pod's container ports of the same protocol.
func resolvePort(sp *corev1.ServicePort, pod *corev1.Pod) (int32, bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int {
		if tp.IntVal == 0 {
			return sp.Port, true
		}
		return tp.IntVal, true
	}
	if tp.StrVal == "" {
		return sp.Port, true
	}
	proto := sp.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			pp := p.Protocol
			if pp == "" {
				pp = corev1.ProtocolTCP
			}
			if p.Name == tp.StrVal && pp == proto {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// endpointPorts resolves every Service port for a pod. A named port the
// pod does not define is left out for that pod, as upstream does.
func endpointPorts(svc *corev1.Service, pod *corev1.Pod) []discoveryv1.EndpointPort {
	out := make([]discoveryv1.EndpointPort, 0, len(svc.Spec.Ports))
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
		name := sp.Name
		out = append(out, discoveryv1.EndpointPort{
			Name: &name, Protocol: &proto, Port: &num, AppProtocol: sp.AppProtocol,
		})
	}
	return out
}

// podHostname is the hostname a pod has in the Service's DNS records: its
// spec.hostname, when its subdomain names the Service.
func podHostname(svc *corev1.Service, pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" && pod.Spec.Subdomain == svc.Name && pod.Namespace == svc.Namespace {
		return pod.Spec.Hostname
	}
	return ""
}

// desiredGroups turns the pods a Service selects into endpoint groups.
// zoneOf returns a node's zone ("" when unknown).
func desiredGroups(svc *corev1.Service, pods []*corev1.Pod, zoneOf func(node string) string) map[string]*group {
	groups := map[string]*group{}
	types := addressTypes(svc)
	publish := svc.Spec.PublishNotReadyAddresses
	for _, pod := range pods {
		if !podInEndpoints(pod, true) {
			continue
		}
		ports := endpointPorts(svc, pod)
		serving := publish || kit.IsPodReady(pod)
		terminating := pod.DeletionTimestamp != nil
		// Ready is never true for a terminating pod unless the Service
		// asks for unready addresses to be published.
		ready := publish || (serving && !terminating)
		for _, t := range types {
			addrs := podAddresses(pod, t)
			if len(addrs) == 0 {
				continue
			}
			ep := discoveryv1.Endpoint{
				Addresses: addrs,
				Conditions: discoveryv1.EndpointConditions{
					Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating),
				},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			}
			if pod.Spec.NodeName != "" {
				ep.NodeName = ptr(pod.Spec.NodeName)
				if z := zoneOf(pod.Spec.NodeName); z != "" {
					ep.Zone = ptr(z)
				}
			}
			if h := podHostname(svc, pod); h != "" {
				ep.Hostname = ptr(h)
			}
			k := groupKey(t, ports)
			g := groups[k]
			if g == nil {
				g = &group{addressType: t, ports: ports, endpoints: map[string]discoveryv1.Endpoint{}}
				groups[k] = g
			}
			g.endpoints[endpointKey(&ep)] = ep
		}
	}
	return groups
}

func ptr[T any](v T) *T { return &v }

// sortedKeys returns a map's keys in order, so plans are deterministic.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
