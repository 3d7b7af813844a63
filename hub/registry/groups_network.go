package registry

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var supportedSliceProtocols = []string{string(corev1.ProtocolSCTP), string(corev1.ProtocolTCP), string(corev1.ProtocolUDP)}

// ---- EndpointSlice ----

var endpointSliceKind = &Kind{
	GVK:        discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
	Resource:   "endpointslices",
	Singular:   "endpointslice",
	Namespaced: true,
	Default: func(obj runtime.Object) {
		s := obj.(*discoveryv1.EndpointSlice)
		for i := range s.Ports {
			if s.Ports[i].Name == nil {
				s.Ports[i].Name = ptrTo("")
			}
			if s.Ports[i].Protocol == nil {
				s.Ports[i].Protocol = ptrTo(corev1.ProtocolTCP)
			}
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateEndpointSlice(obj.(*discoveryv1.EndpointSlice))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		s, o := obj.(*discoveryv1.EndpointSlice), old.(*discoveryv1.EndpointSlice)
		errs := validateEndpointSlice(s)
		return append(errs, apivalidation.ValidateImmutableField(s.AddressType, o.AddressType, field.NewPath("addressType"))...)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("AddressType", "string", 0, "The type of address held in this EndpointSlice."),
		column("Ports", "string", 0, "The network ports exposed by this EndpointSlice."),
		column("Endpoints", "string", 0, "The addresses of the endpoints in this EndpointSlice."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		s := obj.(*discoveryv1.EndpointSlice)
		var ports, addrs []string
		for _, p := range s.Ports {
			v := "*"
			if p.Port != nil {
				v = strconv.Itoa(int(*p.Port))
			} else if p.Name != nil {
				v = *p.Name
			}
			ports = append(ports, v)
		}
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		return []any{s.Name, string(s.AddressType), firstThree(ports), firstThree(addrs), age(s.CreationTimestamp, now)}
	},
}

// firstThree joins up to three items and counts the rest, as the
// endpoints and endpoint slice tables do.
func firstThree(items []string) string {
	if len(items) == 0 {
		return "<unset>"
	}
	if len(items) <= 3 {
		return strings.Join(items, ",")
	}
	return fmt.Sprintf("%s + %d more...", strings.Join(items[:3], ","), len(items)-3)
}

func validateEndpointSlice(s *discoveryv1.EndpointSlice) field.ErrorList {
	var errs field.ErrorList
	ap := field.NewPath("addressType")
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
	case "":
		errs = append(errs, field.Required(ap, ""))
	default:
		errs = append(errs, field.NotSupported(ap, s.AddressType, []string{string(discoveryv1.AddressTypeFQDN), string(discoveryv1.AddressTypeIPv4), string(discoveryv1.AddressTypeIPv6)}))
	}
	ep := field.NewPath("endpoints")
	if len(s.Endpoints) > 1000 {
		errs = append(errs, field.TooMany(ep, len(s.Endpoints), 1000))
	}
	for i, e := range s.Endpoints {
		p := ep.Index(i)
		aps := p.Child("addresses")
		if len(e.Addresses) == 0 {
			errs = append(errs, field.Required(aps, "must contain at least 1 address"))
		} else if len(e.Addresses) > 100 {
			errs = append(errs, field.TooMany(aps, len(e.Addresses), 100))
		}
		for k, a := range e.Addresses {
			var msgs []string
			switch s.AddressType {
			case discoveryv1.AddressTypeIPv4:
				if ip, err := netip.ParseAddr(a); err != nil || !ip.Is4() {
					msgs = []string{"must be a valid IPv4 address"}
				}
			case discoveryv1.AddressTypeIPv6:
				if ip, err := netip.ParseAddr(a); err != nil || !ip.Is6() || ip.Is4In6() {
					msgs = []string{"must be a valid IPv6 address"}
				}
			case discoveryv1.AddressTypeFQDN:
				for _, err := range validation.IsFullyQualifiedDomainName(aps.Index(k), a) {
					msgs = append(msgs, err.Detail)
				}
			}
			for _, m := range msgs {
				errs = append(errs, field.Invalid(aps.Index(k), a, m))
			}
		}
		if e.Hostname != nil {
			for _, m := range validation.IsDNS1123Label(*e.Hostname) {
				errs = append(errs, field.Invalid(p.Child("hostname"), *e.Hostname, m))
			}
		}
		if e.NodeName != nil {
			for _, m := range apivalidation.NameIsDNSSubdomain(*e.NodeName, false) {
				errs = append(errs, field.Invalid(p.Child("nodeName"), *e.NodeName, m))
			}
		}
	}
	pp := field.NewPath("ports")
	if len(s.Ports) > 20000 {
		errs = append(errs, field.TooMany(pp, len(s.Ports), 20000))
	}
	names := map[string]bool{}
	for i, port := range s.Ports {
		p := pp.Index(i)
		if port.Name != nil && *port.Name != "" {
			for _, m := range validation.IsDNS1123Label(*port.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), *port.Name, m))
			}
		}
		name := ""
		if port.Name != nil {
			name = *port.Name
		}
		if names[name] {
			errs = append(errs, field.Duplicate(p.Child("name"), name))
		}
		names[name] = true
		if port.Protocol == nil {
			errs = append(errs, field.Required(p.Child("protocol"), ""))
		} else if !strings.Contains(","+strings.Join(supportedSliceProtocols, ",")+",", ","+string(*port.Protocol)+",") {
			errs = append(errs, field.NotSupported(p.Child("protocol"), *port.Protocol, supportedSliceProtocols))
		}
		if port.Port != nil {
			for _, m := range validation.IsValidPortNum(int(*port.Port)) {
				errs = append(errs, field.Invalid(p.Child("port"), *port.Port, m))
			}
		}
		if port.AppProtocol != nil {
			for _, m := range validation.IsQualifiedName(*port.AppProtocol) {
				errs = append(errs, field.Invalid(p.Child("appProtocol"), *port.AppProtocol, m))
			}
		}
	}
	return errs
}

// ---- NetworkPolicy ----

var networkPolicyKind = &Kind{
	GVK:        networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy"),
	Resource:   "networkpolicies",
	Singular:   "networkpolicy",
	Namespaced: true,
	ShortNames: []string{"netpol"},
	HasSpec:    true,
	Default: func(obj runtime.Object) {
		n := obj.(*networkingv1.NetworkPolicy)
		for _, r := range n.Spec.Ingress {
			defaultPolicyPorts(r.Ports)
		}
		for _, r := range n.Spec.Egress {
			defaultPolicyPorts(r.Ports)
		}
		if len(n.Spec.PolicyTypes) == 0 {
			types := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if len(n.Spec.Egress) != 0 {
				types = append(types, networkingv1.PolicyTypeEgress)
			}
			n.Spec.PolicyTypes = types
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateNetworkPolicy(&obj.(*networkingv1.NetworkPolicy).Spec)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Pod-Selector", "string", 0, "Selects the pods to which this NetworkPolicy object applies."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		n := obj.(*networkingv1.NetworkPolicy)
		return []any{n.Name, metav1.FormatLabelSelector(&n.Spec.PodSelector), age(n.CreationTimestamp, now)}
	},
}

func defaultPolicyPorts(ports []networkingv1.NetworkPolicyPort) {
	for i := range ports {
		if ports[i].Protocol == nil {
			ports[i].Protocol = ptrTo(corev1.ProtocolTCP)
		}
	}
}

func validateNetworkPolicy(s *networkingv1.NetworkPolicySpec) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, metav1validation.ValidateLabelSelector(&s.PodSelector, metav1validation.LabelSelectorValidationOptions{}, gSpec.Child("podSelector"))...)
	for i, r := range s.Ingress {
		p := gSpec.Child("ingress").Index(i)
		errs = append(errs, validatePolicyPorts(r.Ports, p.Child("ports"))...)
		errs = append(errs, validatePolicyPeers(r.From, p.Child("from"))...)
	}
	for i, r := range s.Egress {
		p := gSpec.Child("egress").Index(i)
		errs = append(errs, validatePolicyPorts(r.Ports, p.Child("ports"))...)
		errs = append(errs, validatePolicyPeers(r.To, p.Child("to"))...)
	}
	allowed := []string{string(networkingv1.PolicyTypeIngress), string(networkingv1.PolicyTypeEgress)}
	tp := gSpec.Child("policyTypes")
	if len(s.PolicyTypes) > len(allowed) {
		errs = append(errs, field.Invalid(tp, s.PolicyTypes, "may not specify more than two policyTypes"))
		return errs
	}
	for i, t := range s.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			errs = append(errs, field.NotSupported(tp.Index(i), t, allowed))
		}
	}
	return errs
}

func validatePolicyPorts(ports []networkingv1.NetworkPolicyPort, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, port := range ports {
		p := path.Index(i)
		if port.Protocol != nil && *port.Protocol != corev1.ProtocolTCP && *port.Protocol != corev1.ProtocolUDP && *port.Protocol != corev1.ProtocolSCTP {
			errs = append(errs, field.NotSupported(p.Child("protocol"), *port.Protocol, supportedSliceProtocols))
		}
		if port.Port == nil {
			if port.EndPort != nil {
				errs = append(errs, field.Required(p.Child("port"), "must be specified when `endPort` is specified"))
			}
			continue
		}
		if port.Port.Type == intstr.Int {
			for _, m := range validation.IsValidPortNum(int(port.Port.IntVal)) {
				errs = append(errs, field.Invalid(p.Child("port"), port.Port.IntVal, m))
			}
			if port.EndPort != nil {
				if *port.EndPort < port.Port.IntVal {
					errs = append(errs, field.Invalid(p.Child("endPort"), *port.EndPort, "must be greater than or equal to `port`"))
				}
				for _, m := range validation.IsValidPortNum(int(*port.EndPort)) {
					errs = append(errs, field.Invalid(p.Child("endPort"), *port.EndPort, m))
				}
			}
			continue
		}
		if port.EndPort != nil {
			errs = append(errs, field.Invalid(p.Child("endPort"), *port.EndPort, "may not be specified when `port` is non-numeric"))
		}
		for _, m := range validation.IsValidPortName(port.Port.StrVal) {
			errs = append(errs, field.Invalid(p.Child("port"), port.Port.StrVal, m))
		}
	}
	return errs
}

func validatePolicyPeers(peers []networkingv1.NetworkPolicyPeer, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	opts := metav1validation.LabelSelectorValidationOptions{}
	for i, peer := range peers {
		p := path.Index(i)
		n := 0
		if peer.PodSelector != nil {
			n++
			errs = append(errs, metav1validation.ValidateLabelSelector(peer.PodSelector, opts, p.Child("podSelector"))...)
		}
		if peer.NamespaceSelector != nil {
			n++
			errs = append(errs, metav1validation.ValidateLabelSelector(peer.NamespaceSelector, opts, p.Child("namespaceSelector"))...)
		}
		if peer.IPBlock != nil {
			if n > 0 {
				errs = append(errs, field.Forbidden(p, "may not specify both ipBlock and another peer"))
			}
			n++
			errs = append(errs, validateIPBlock(peer.IPBlock, p.Child("ipBlock"))...)
		}
		if n == 0 {
			errs = append(errs, field.Required(p, "must specify a peer"))
		}
	}
	return errs
}

func validateIPBlock(b *networkingv1.IPBlock, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if b.CIDR == "" {
		return append(errs, field.Required(path.Child("cidr"), ""))
	}
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return append(errs, field.Invalid(path.Child("cidr"), b.CIDR, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
	}
	for i, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			errs = append(errs, field.Invalid(path.Child("except").Index(i), e, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
			continue
		}
		if ex.Addr().Is4() != cidr.Addr().Is4() || ex.Bits() < cidr.Bits() || !cidr.Contains(ex.Addr()) {
			errs = append(errs, field.Invalid(path.Child("except").Index(i), e, "must be a strict subset of `cidr`"))
		}
	}
	return errs
}
