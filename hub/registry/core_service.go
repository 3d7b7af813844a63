package registry

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Default service network settings: node ports as upstream's; cluster IPs
// from 10.0.0.0/16, the range the Kubernetes documentation's examples use,
// so they work here as written.
const (
	DefaultServiceCIDR   = "10.0.0.0/16"
	DefaultNodePortRange = "30000-32767"
)

// ServiceNetwork configures how Service cluster IPs and node ports are
// allocated.
type ServiceNetwork struct {
	// CIDR is the range cluster IPs come from; zero means 10.0.0.0/16.
	// Its first host address belongs to the "kubernetes" Service in
	// "default" and its tenth to cluster DNS; both are given only when
	// asked for explicitly.
	CIDR netip.Prefix
	// NodePortFirst and NodePortLast bound the node port range,
	// inclusive; zero means 30000-32767.
	NodePortFirst, NodePortLast int32
}

// withDefaults fills the zero fields of n and checks the result: it fails
// on a range that cannot hold addresses or ports.
func (n ServiceNetwork) withDefaults() (ServiceNetwork, error) {
	if !n.CIDR.IsValid() {
		n.CIDR = netip.MustParsePrefix(DefaultServiceCIDR)
	}
	if n.NodePortFirst == 0 && n.NodePortLast == 0 {
		n.NodePortFirst, n.NodePortLast = 30000, 32767
	}
	n.CIDR = n.CIDR.Masked()
	bits := n.CIDR.Addr().BitLen() - n.CIDR.Bits()
	if bits < 2 {
		return n, fmt.Errorf("service network: CIDR %s is too small", n.CIDR)
	}
	if n.NodePortFirst < 1 || n.NodePortLast > 65535 || n.NodePortFirst > n.NodePortLast {
		return n, fmt.Errorf("service network: invalid node port range %d-%d", n.NodePortFirst, n.NodePortLast)
	}
	return n, nil
}

// serviceAllocator hands out cluster IPs and node ports. Reservations made
// by Admit are held until Release, so concurrent creates that cannot yet
// see each other's committed objects never get the same address.
type serviceAllocator struct {
	mu    sync.Mutex
	net   ServiceNetwork
	ips   map[netip.Addr]string // address -> owner "namespace/name"
	ports map[int32]string      // node port -> owner
}

func newServiceAllocator(n ServiceNetwork) *serviceAllocator {
	return &serviceAllocator{net: n, ips: map[netip.Addr]string{}, ports: map[int32]string{}}
}

func serviceOwner(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }

// nthAddr returns the address n positions after the prefix's first address.
func nthAddr(p netip.Prefix, n *big.Int) netip.Addr {
	b := new(big.Int).SetBytes(p.Addr().AsSlice())
	b.Add(b, n)
	buf := make([]byte, p.Addr().BitLen()/8)
	b.FillBytes(buf)
	a, _ := netip.AddrFromSlice(buf)
	return a
}

// rangeSize returns the number of addresses in the prefix.
func rangeSize(p netip.Prefix) *big.Int {
	return new(big.Int).Lsh(big.NewInt(1), uint(p.Addr().BitLen()-p.Bits()))
}

func needsClusterIP(svc *corev1.Service) bool {
	return svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != corev1.ClusterIPNone
}

func needsNodePorts(svc *corev1.Service) bool {
	if svc.Spec.Type == corev1.ServiceTypeNodePort {
		return true
	}
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer &&
		(svc.Spec.AllocateLoadBalancerNodePorts == nil || *svc.Spec.AllocateLoadBalancerNodePorts)
}

// admit allocates what the service needs. The used sets hold what the
// other stored services hold.
func (a *serviceAllocator) admit(svc, old *corev1.Service, usedIPs map[netip.Addr]string, usedPorts map[int32]string) (serviceAllocation, field.ErrorList) {
	a.mu.Lock()
	defer a.mu.Unlock()
	owner := serviceOwner(svc)
	taken := func(ip netip.Addr) bool {
		if o, ok := a.ips[ip]; ok && o != owner {
			return true
		}
		o, ok := usedIPs[ip]
		return ok && o != owner
	}
	portTaken := func(p int32) bool {
		if o, ok := a.ports[p]; ok && o != owner {
			return true
		}
		o, ok := usedPorts[p]
		return ok && o != owner
	}
	var errs field.ErrorList
	var newIPs []netip.Addr
	var newPorts []int32
	specPath := field.NewPath("spec")

	headlessNoSelector := svc.Spec.ClusterIP == corev1.ClusterIPNone && len(svc.Spec.Selector) == 0
	if svc.Spec.Type != corev1.ServiceTypeExternalName && !headlessNoSelector {
		family := corev1.IPv4Protocol
		if a.net.CIDR.Addr().Is6() {
			family = corev1.IPv6Protocol
		}
		if pol := svc.Spec.IPFamilyPolicy; pol != nil && *pol == corev1.IPFamilyPolicyRequireDualStack {
			errs = append(errs, field.Invalid(specPath.Child("ipFamilyPolicy"), *pol, "this cluster is not configured for dual-stack services"))
		}
		for i, f := range svc.Spec.IPFamilies {
			if f != family {
				errs = append(errs, field.Invalid(specPath.Child("ipFamilies").Index(i), f, "not configured on this cluster"))
			}
		}
		if len(errs) > 0 {
			return serviceAllocation{}, errs
		}
	}
	if needsClusterIP(svc) {
		cidr := a.net.CIDR
		var keep string
		if old != nil && needsClusterIP(old) && old.Spec.ClusterIP != "" {
			keep = old.Spec.ClusterIP
		}
		switch {
		case svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP == keep:
			// Unchanged on update.
		case svc.Spec.ClusterIP != "":
			ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
			p := specPath.Child("clusterIPs")
			requested := svc.Spec.ClusterIPs
			if len(requested) == 0 {
				requested = []string{svc.Spec.ClusterIP}
			}
			switch {
			case err != nil:
				errs = append(errs, field.Invalid(p.Index(0), svc.Spec.ClusterIP, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"))
			case !cidr.Contains(ip) || ip == cidr.Addr() || (ip.Is4() && ip == nthAddr(cidr, new(big.Int).Sub(rangeSize(cidr), big.NewInt(1)))):
				errs = append(errs, field.Invalid(p, requested, fmt.Sprintf("failed to allocate IP %s: the provided IP (%s) is not in the valid range. The range of valid IPs is %s", svc.Spec.ClusterIP, svc.Spec.ClusterIP, cidr)))
			case taken(ip):
				errs = append(errs, field.Invalid(p, requested, fmt.Sprintf("failed to allocate IP %s: provided IP is already allocated", svc.Spec.ClusterIP)))
			default:
				newIPs = append(newIPs, ip)
			}
		default:
			ip, ok := a.pickIP(taken)
			if !ok {
				errs = append(errs, field.Invalid(specPath.Child("clusterIPs"), svc.Spec.ClusterIPs, "failed to allocate IP: range is full"))
			} else {
				newIPs = append(newIPs, ip)
				svc.Spec.ClusterIP = ip.String()
			}
		}
		if svc.Spec.ClusterIP != "" && len(errs) == 0 {
			svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
		}
	}

	if needsNodePorts(svc) {
		oldPorts := map[int32]bool{}
		if old != nil && needsNodePorts(old) {
			for _, p := range old.Spec.Ports {
				if p.NodePort != 0 {
					oldPorts[p.NodePort] = true
				}
			}
		}
		inThis := map[int32]bool{}
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			path := specPath.Child("ports").Index(i).Child("nodePort")
			switch {
			case sp.NodePort != 0 && oldPorts[sp.NodePort]:
				inThis[sp.NodePort] = true
			case sp.NodePort != 0:
				switch {
				case sp.NodePort < a.net.NodePortFirst || sp.NodePort > a.net.NodePortLast:
					errs = append(errs, field.Invalid(path, sp.NodePort, fmt.Sprintf("provided port is not in the valid range. The range of valid ports is %d-%d", a.net.NodePortFirst, a.net.NodePortLast)))
				case portTaken(sp.NodePort):
					errs = append(errs, field.Invalid(path, sp.NodePort, "provided port is already allocated"))
				case inThis[sp.NodePort]:
					// The same port on two protocols is allowed.
				default:
					inThis[sp.NodePort] = true
					newPorts = append(newPorts, sp.NodePort)
				}
			}
		}
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			if sp.NodePort != 0 {
				continue
			}
			p, ok := a.pickPort(func(p int32) bool { return inThis[p] || portTaken(p) })
			if !ok {
				errs = append(errs, field.Invalid(specPath.Child("ports").Index(i).Child("nodePort"), sp.NodePort, "failed to allocate a nodePort: range is full"))
				break
			}
			sp.NodePort = p
			inThis[p] = true
			newPorts = append(newPorts, p)
		}
	}
	if len(errs) > 0 {
		return serviceAllocation{}, errs
	}
	for _, ip := range newIPs {
		a.ips[ip] = owner
	}
	for _, p := range newPorts {
		a.ports[p] = owner
	}
	return serviceAllocation{ips: newIPs, ports: newPorts}, nil
}

// pickIP chooses a free address at random, skipping the network and
// broadcast addresses and the first and tenth host addresses, which are
// kept for the kubernetes and DNS Services.
func (a *serviceAllocator) pickIP(taken func(netip.Addr) bool) (netip.Addr, bool) {
	cidr := a.net.CIDR
	size := rangeSize(cidr)
	if size.Cmp(big.NewInt(1<<20)) > 0 {
		size = big.NewInt(1 << 20)
	}
	n := size.Int64()
	start := rand.Int64N(n)
	for i := int64(0); i < n; i++ {
		off := (start + i) % n
		if off == 0 || off == 1 || off == 10 || (cidr.Addr().Is4() && off == n-1 && n == rangeSize(cidr).Int64()) {
			continue
		}
		ip := nthAddr(cidr, big.NewInt(off))
		if !taken(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

func (a *serviceAllocator) pickPort(taken func(int32) bool) (int32, bool) {
	n := int64(a.net.NodePortLast - a.net.NodePortFirst + 1)
	start := rand.Int64N(n)
	for i := int64(0); i < n; i++ {
		p := a.net.NodePortFirst + int32((start+i)%n)
		if !taken(p) {
			return p, true
		}
	}
	return 0, false
}

// release frees the reservations the service holds.
func (a *serviceAllocator) release(svc *corev1.Service) {
	a.mu.Lock()
	defer a.mu.Unlock()
	owner := serviceOwner(svc)
	for _, s := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		if ip, err := netip.ParseAddr(s); err == nil && a.ips[ip] == owner {
			delete(a.ips, ip)
		}
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 && a.ports[p.NodePort] == owner {
			delete(a.ports, p.NodePort)
		}
	}
}

// admitService allocates the cluster IPs and node ports a created or
// updated Service needs, seeing what the stored Services hold.
func (a *serviceAllocator) admitService(ctx context.Context, l Lister, obj, old runtime.Object) error {
	svc := obj.(*corev1.Service)
	var oldSvc *corev1.Service
	if old != nil {
		oldSvc = old.(*corev1.Service)
	}
	usedIPs := map[netip.Addr]string{}
	usedPorts := map[int32]string{}
	if l != nil && (needsClusterIP(svc) || needsNodePorts(svc)) {
		objs, err := l.List(ctx, "services", "")
		if err != nil {
			return fmt.Errorf("list services: %w", err)
		}
		for _, o := range objs {
			s, ok := o.(*corev1.Service)
			if !ok {
				continue
			}
			owner := serviceOwner(s)
			for _, c := range append([]string{s.Spec.ClusterIP}, s.Spec.ClusterIPs...) {
				if ip, err := netip.ParseAddr(c); err == nil {
					usedIPs[ip] = owner
				}
			}
			for _, p := range s.Spec.Ports {
				if p.NodePort != 0 {
					usedPorts[p.NodePort] = owner
				}
			}
		}
	}
	claims, _ := l.(Claims)
	if claims == nil {
		if _, errs := a.admit(svc, oldSvc, usedIPs, usedPorts); len(errs) > 0 {
			return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, errs)
		}
		return nil
	}
	return a.admitClaimed(ctx, l, claims, svc, oldSvc, usedIPs, usedPorts)
}

func defaultService(svc *corev1.Service) {
	s := &svc.Spec
	if s.SessionAffinity == "" {
		s.SessionAffinity = corev1.ServiceAffinityNone
	}
	if s.SessionAffinity == corev1.ServiceAffinityNone {
		s.SessionAffinityConfig = nil
	}
	if s.SessionAffinity == corev1.ServiceAffinityClientIP &&
		(s.SessionAffinityConfig == nil || s.SessionAffinityConfig.ClientIP == nil || s.SessionAffinityConfig.ClientIP.TimeoutSeconds == nil) {
		t := int32(corev1.DefaultClientIPServiceAffinitySeconds)
		s.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &t}}
	}
	if s.Type == "" {
		s.Type = corev1.ServiceTypeClusterIP
	}
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		if p.TargetPort == intstr.FromInt32(0) || p.TargetPort == intstr.FromString("") {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
	}
	if (s.Type == corev1.ServiceTypeNodePort || s.Type == corev1.ServiceTypeLoadBalancer) && s.ExternalTrafficPolicy == "" {
		s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if s.Type != corev1.ServiceTypeExternalName && s.InternalTrafficPolicy == nil {
		p := corev1.ServiceInternalTrafficPolicyCluster
		s.InternalTrafficPolicy = &p
	}
	if s.Type == corev1.ServiceTypeLoadBalancer && s.AllocateLoadBalancerNodePorts == nil {
		t := true
		s.AllocateLoadBalancerNodePorts = &t
	}
	if s.Type == corev1.ServiceTypeExternalName {
		return
	}
	if s.ClusterIP == "" && len(s.ClusterIPs) > 0 {
		s.ClusterIP = s.ClusterIPs[0]
	}
	if s.ClusterIP != "" && len(s.ClusterIPs) == 0 {
		s.ClusterIPs = []string{s.ClusterIP}
	}
	if s.IPFamilyPolicy == nil {
		p := corev1.IPFamilyPolicySingleStack
		if s.ClusterIP == corev1.ClusterIPNone && len(s.Selector) == 0 {
			p = corev1.IPFamilyPolicyRequireDualStack
		}
		s.IPFamilyPolicy = &p
	}
	if len(s.IPFamilies) == 0 {
		fam := corev1.IPv4Protocol
		if ip, err := netip.ParseAddr(s.ClusterIP); err == nil && ip.Is6() {
			fam = corev1.IPv6Protocol
		}
		s.IPFamilies = []corev1.IPFamily{fam}
	}
}

var (
	supportedServiceTypes    = sets.New[string](string(corev1.ServiceTypeClusterIP), string(corev1.ServiceTypeNodePort), string(corev1.ServiceTypeLoadBalancer), string(corev1.ServiceTypeExternalName))
	supportedSessionAffinity = sets.New[string](string(corev1.ServiceAffinityClientIP), string(corev1.ServiceAffinityNone))
	supportedTrafficPolicies = sets.New[string](string(corev1.ServiceExternalTrafficPolicyCluster), string(corev1.ServiceExternalTrafficPolicyLocal))
	supportedIPFamilyPolicy  = sets.New[string](string(corev1.IPFamilyPolicySingleStack), string(corev1.IPFamilyPolicyPreferDualStack), string(corev1.IPFamilyPolicyRequireDualStack))
)

func validateService(svc *corev1.Service) field.ErrorList {
	var errs field.ErrorList
	s := &svc.Spec
	sp := field.NewPath("spec")
	headless := s.ClusterIP == corev1.ClusterIPNone

	if !supportedServiceTypes.Has(string(s.Type)) {
		errs = append(errs, field.NotSupported(sp.Child("type"), s.Type, sets.List(supportedServiceTypes)))
	}
	if s.Type == corev1.ServiceTypeExternalName {
		if s.ClusterIP != "" {
			errs = append(errs, field.Forbidden(sp.Child("clusterIP"), "may not be set for ExternalName services"))
		}
		if s.ExternalName == "" {
			errs = append(errs, field.Required(sp.Child("externalName"), ""))
		} else {
			for _, msg := range validation.IsDNS1123Subdomain(strings.TrimSuffix(s.ExternalName, ".")) {
				errs = append(errs, field.Invalid(sp.Child("externalName"), s.ExternalName, msg))
			}
		}
	} else if len(s.Ports) == 0 && !headless {
		errs = append(errs, field.Required(sp.Child("ports"), ""))
	}
	if headless && (s.Type == corev1.ServiceTypeNodePort || s.Type == corev1.ServiceTypeLoadBalancer) {
		errs = append(errs, field.Invalid(sp.Child("clusterIPs").Index(0), s.ClusterIP, fmt.Sprintf("may not be set to 'None' for %s services", s.Type)))
	}
	if s.ClusterIP != "" && !headless {
		if _, err := netip.ParseAddr(s.ClusterIP); err != nil {
			errs = append(errs, field.Invalid(sp.Child("clusterIPs").Index(0), s.ClusterIP, "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"))
		}
	}
	if len(s.ClusterIPs) > 0 && s.ClusterIP != "" && s.ClusterIPs[0] != s.ClusterIP {
		errs = append(errs, field.Invalid(sp.Child("clusterIPs"), s.ClusterIPs, "first value must match `clusterIP`"))
	}
	if len(s.ClusterIPs) > 2 {
		errs = append(errs, field.Invalid(sp.Child("clusterIPs"), s.ClusterIPs, "may only hold up to 2 values"))
	}

	portPath := sp.Child("ports")
	names := sets.New[string]()
	keys := sets.New[string]()
	for i, p := range s.Ports {
		pp := portPath.Index(i)
		if len(s.Ports) > 1 && p.Name == "" {
			errs = append(errs, field.Required(pp.Child("name"), ""))
		} else if p.Name != "" {
			for _, msg := range validation.IsDNS1123Label(p.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), p.Name, msg))
			}
			if names.Has(p.Name) {
				errs = append(errs, field.Duplicate(pp.Child("name"), p.Name))
			}
			names.Insert(p.Name)
		}
		for _, msg := range validation.IsValidPortNum(int(p.Port)) {
			errs = append(errs, field.Invalid(pp.Child("port"), p.Port, msg))
		}
		errs = append(errs, validateProtocol(p.Protocol, pp.Child("protocol"))...)
		if p.TargetPort.Type == intstr.Int {
			for _, msg := range validation.IsValidPortNum(int(p.TargetPort.IntVal)) {
				errs = append(errs, field.Invalid(pp.Child("targetPort"), p.TargetPort.IntVal, msg))
			}
		} else {
			for _, msg := range validation.IsValidPortName(p.TargetPort.StrVal) {
				errs = append(errs, field.Invalid(pp.Child("targetPort"), p.TargetPort.StrVal, msg))
			}
		}
		if p.NodePort != 0 {
			if s.Type == corev1.ServiceTypeClusterIP {
				errs = append(errs, field.Forbidden(pp.Child("nodePort"), "may not be used when `type` is 'ClusterIP'"))
			} else {
				for _, msg := range validation.IsValidPortNum(int(p.NodePort)) {
					errs = append(errs, field.Invalid(pp.Child("nodePort"), p.NodePort, msg))
				}
			}
		}
		key := fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		if keys.Has(key) {
			errs = append(errs, field.Duplicate(pp, key))
		}
		keys.Insert(key)
	}
	if !supportedSessionAffinity.Has(string(s.SessionAffinity)) {
		errs = append(errs, field.NotSupported(sp.Child("sessionAffinity"), s.SessionAffinity, sets.List(supportedSessionAffinity)))
	}
	if s.SessionAffinity == corev1.ServiceAffinityClientIP && s.SessionAffinityConfig != nil && s.SessionAffinityConfig.ClientIP != nil && s.SessionAffinityConfig.ClientIP.TimeoutSeconds != nil {
		if t := *s.SessionAffinityConfig.ClientIP.TimeoutSeconds; t <= 0 || t > maxClientIPAffinitySeconds {
			errs = append(errs, field.Invalid(sp.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds"), t, fmt.Sprintf("must be greater than 0 and less than %d", maxClientIPAffinitySeconds)))
		}
	}
	if s.SessionAffinity == corev1.ServiceAffinityNone && s.SessionAffinityConfig != nil {
		errs = append(errs, field.Invalid(sp.Child("sessionAffinityConfig"), s.SessionAffinityConfig, fmt.Sprintf("must not be set when session affinity is %s", corev1.ServiceAffinityNone)))
	}
	if s.Type != corev1.ServiceTypeExternalName {
		errs = append(errs, metav1validation.ValidateLabels(s.Selector, sp.Child("selector"))...)
	}
	if s.ExternalTrafficPolicy != "" {
		if s.Type == corev1.ServiceTypeClusterIP || s.Type == corev1.ServiceTypeExternalName {
			errs = append(errs, field.Invalid(sp.Child("externalTrafficPolicy"), s.ExternalTrafficPolicy, fmt.Sprintf("may only be set when `type` is '%s' or '%s'", corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer)))
		} else if !supportedTrafficPolicies.Has(string(s.ExternalTrafficPolicy)) {
			errs = append(errs, field.NotSupported(sp.Child("externalTrafficPolicy"), s.ExternalTrafficPolicy, sets.List(supportedTrafficPolicies)))
		}
	} else if s.Type == corev1.ServiceTypeNodePort || s.Type == corev1.ServiceTypeLoadBalancer {
		errs = append(errs, field.Required(sp.Child("externalTrafficPolicy"), ""))
	}
	if s.IPFamilyPolicy != nil && !supportedIPFamilyPolicy.Has(string(*s.IPFamilyPolicy)) {
		errs = append(errs, field.NotSupported(sp.Child("ipFamilyPolicy"), *s.IPFamilyPolicy, sets.List(supportedIPFamilyPolicy)))
	}
	for i, f := range s.IPFamilies {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
			errs = append(errs, field.NotSupported(sp.Child("ipFamilies").Index(i), f, []string{string(corev1.IPv4Protocol), string(corev1.IPv6Protocol)}))
		}
	}
	for i, ip := range s.ExternalIPs {
		errs = append(errs, validation.IsValidIP(sp.Child("externalIPs").Index(i), ip)...)
	}
	return errs
}

func validateServiceUpdate(svc, old *corev1.Service) field.ErrorList {
	errs := validateService(svc)
	sp := field.NewPath("spec")
	if old.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.Type != corev1.ServiceTypeExternalName &&
		old.Spec.ClusterIP != "" && svc.Spec.ClusterIP != old.Spec.ClusterIP {
		errs = append(errs, field.Invalid(sp.Child("clusterIPs").Index(0), svc.Spec.ClusterIP, "may not change once set"))
	}
	return errs
}

// prepareServiceUpdate keeps allocations the update left out and drops
// fields the new type no longer uses.
func prepareServiceUpdate(svc, old *corev1.Service) {
	if needsClusterIP(svc) && needsClusterIP(old) && svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0 {
		svc.Spec.ClusterIP = old.Spec.ClusterIP
		svc.Spec.ClusterIPs = append([]string(nil), old.Spec.ClusterIPs...)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName && old.Spec.Type != corev1.ServiceTypeExternalName {
		if svc.Spec.ClusterIP == old.Spec.ClusterIP {
			svc.Spec.ClusterIP = ""
			svc.Spec.ClusterIPs = nil
		}
		svc.Spec.IPFamilies = nil
		svc.Spec.IPFamilyPolicy = nil
		svc.Spec.InternalTrafficPolicy = nil
	}
	oldPorts := map[string]int32{}
	for _, p := range old.Spec.Ports {
		oldPorts[fmt.Sprintf("%d/%s", p.Port, p.Protocol)] = p.NodePort
	}
	if needsNodePorts(svc) && needsNodePorts(old) {
		for i := range svc.Spec.Ports {
			p := &svc.Spec.Ports[i]
			if p.NodePort == 0 {
				proto := p.Protocol
				if proto == "" {
					proto = corev1.ProtocolTCP
				}
				p.NodePort = oldPorts[fmt.Sprintf("%d/%s", p.Port, proto)]
			}
		}
	}
	if !needsNodePorts(svc) && needsNodePorts(old) {
		for i := range svc.Spec.Ports {
			p := &svc.Spec.Ports[i]
			for _, op := range old.Spec.Ports {
				if op.NodePort == p.NodePort {
					p.NodePort = 0
					break
				}
			}
		}
	}
	if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer &&
		svc.Spec.ExternalTrafficPolicy == old.Spec.ExternalTrafficPolicy {
		svc.Spec.ExternalTrafficPolicy = ""
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer && old.Spec.Type == corev1.ServiceTypeLoadBalancer {
		svc.Spec.AllocateLoadBalancerNodePorts = nil
	}
}

// newServiceKind returns the Service kind, allocating from a.
func newServiceKind(a *serviceAllocator) *Kind {
	return &Kind{
		GVK:        corev1.SchemeGroupVersion.WithKind("Service"),
		Resource:   "services",
		Singular:   "service",
		Namespaced: true,
		ShortNames: []string{"svc"},
		Categories: []string{"all"},
		HasStatus:  true,
		Default:    func(obj runtime.Object) { defaultService(obj.(*corev1.Service)) },
		PrepareForUpdate: func(obj, old runtime.Object) {
			prepareServiceUpdate(obj.(*corev1.Service), old.(*corev1.Service))
		},
		Validate: func(obj runtime.Object) field.ErrorList { return validateService(obj.(*corev1.Service)) },
		ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
			return validateServiceUpdate(obj.(*corev1.Service), old.(*corev1.Service))
		},
		ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
			var errs field.ErrorList
			p := field.NewPath("status", "loadBalancer", "ingress")
			for i, in := range obj.(*corev1.Service).Status.LoadBalancer.Ingress {
				if in.IP != "" {
					errs = append(errs, validation.IsValidIP(p.Index(i).Child("ip"), in.IP)...)
				}
				if in.Hostname != "" {
					for _, msg := range validation.IsDNS1123Subdomain(in.Hostname) {
						errs = append(errs, field.Invalid(p.Index(i).Child("hostname"), in.Hostname, msg))
					}
				}
			}
			return errs
		},
		NameRule: func(name string, prefix bool) []string {
			if prefix {
				name = maskTrailingDash(name)
			}
			return validation.IsDNS1035Label(name)
		},
		Admit: a.admitService,
		Release: func(ctx context.Context, l Lister, obj runtime.Object) {
			a.releaseService(ctx, l, obj.(*corev1.Service))
		},
		Columns: []metav1.TableColumnDefinition{
			nameColumn,
			column("Type", "string", 0, "The way the service is exposed: ClusterIP, NodePort, LoadBalancer or ExternalName."),
			column("Cluster-IP", "string", 0, "The virtual IP address the service is reachable at inside the cluster."),
			column("External-IP", "string", 0, "The addresses the service is reachable at from outside the cluster."),
			column("Port(s)", "string", 0, "The ports the service exposes."),
			ageColumn,
			column("Selector", "string", 1, "Route service traffic to pods with label keys and values matching this selector."),
		},
		Cells: func(obj runtime.Object, now time.Time) []any { return serviceCells(obj.(*corev1.Service), now) },
	}
}

// maskTrailingDash lets a generateName prefix end with "-".
func maskTrailingDash(name string) string {
	if len(name) > 1 && strings.HasSuffix(name, "-") {
		return name[:len(name)-2] + "a"
	}
	return name
}

// maxClientIPAffinitySeconds is the longest ClientIP session affinity
// timeout allowed (one day).
const maxClientIPAffinitySeconds = 86400
