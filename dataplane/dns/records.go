package dns

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// local answers q from cluster state, or returns nil when the name is not
// ours (not in the zone, or a reverse name of an address we do not know).
func (s *Server) local(req *dns.Msg, q dns.Question, name string) *dns.Msg {
	if strings.HasSuffix(name, ".in-addr.arpa.") || strings.HasSuffix(name, ".ip6.arpa.") {
		return s.reverse(req, q, name)
	}
	if name != s.zone && !strings.HasSuffix(name, "."+s.zone) {
		return nil
	}
	if !s.ready.Load() {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		m.RecursionAvailable = true
		return m
	}
	s.mu.RLock()
	defer s.mu.RUnlock()

	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = true
	s.answerZone(m, q, name, 0)
	return m
}

// maxChase bounds ExternalName → ExternalName chains inside the zone.
const maxChase = 4

// answerZone fills m for a name inside the zone. The read lock is held.
func (s *Server) answerZone(m *dns.Msg, q dns.Question, name string, depth int) {
	rest := strings.TrimSuffix(strings.TrimSuffix(name, s.zone), ".")
	var labels []string
	if rest != "" {
		labels = strings.Split(rest, ".")
	}
	found := false // the name exists (possibly without records of this type)
	switch {
	case len(labels) == 0:
		found = true
		if q.Qtype == dns.TypeSOA {
			m.Answer = append(m.Answer, s.soa())
		} else if q.Qtype == dns.TypeNS {
			m.Answer = append(m.Answer, &dns.NS{Hdr: s.hdr(s.zone, dns.TypeNS), Ns: "ns.dns." + s.zone})
		}
	case labels[len(labels)-1] == "svc":
		found = s.answerSvc(m, q, labels[:len(labels)-1], depth)
	case labels[len(labels)-1] == "pod":
		found = s.answerPod(m, q, labels[:len(labels)-1])
	}
	if !found {
		m.Rcode = dns.RcodeNameError
	}
	if len(m.Answer) == 0 {
		// NXDOMAIN and NODATA both carry the SOA, whose minimum bounds
		// how long resolvers cache the negative answer (RFC 2308).
		m.Ns = append(m.Ns, s.soa())
	}
}

func (s *Server) hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: s.cfg.TTL}
}

func (s *Server) soa() dns.RR {
	return &dns.SOA{
		Hdr:     s.hdr(s.zone, dns.TypeSOA),
		Ns:      "ns.dns." + s.zone,
		Mbox:    "hostmaster." + s.zone,
		Serial:  1,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  s.cfg.TTL,
	}
}

// svcName is <svc>.<ns>.svc.<zone>.
func (s *Server) svcName(ns, name string) string {
	return name + "." + ns + ".svc." + s.zone
}

// answerSvc handles names under svc.<zone>; labels are the ones before
// "svc". It reports whether the name exists.
func (s *Server) answerSvc(m *dns.Msg, q dns.Question, labels []string, depth int) bool {
	switch len(labels) {
	case 0: // svc.<zone>
		return true
	case 1: // <ns>.svc.<zone>
		return s.nsCount[labels[0]] > 0
	case 2: // <svc>.<ns>.svc.<zone>
		svc := s.services[types.NamespacedName{Namespace: labels[1], Name: labels[0]}]
		if svc == nil {
			return false
		}
		s.serviceRecords(m, q, svc, depth)
		return true
	case 3: // <hostname>.<svc>.<ns>.svc.<zone>
		svc := s.services[types.NamespacedName{Namespace: labels[2], Name: labels[1]}]
		if svc == nil || !headless(svc) {
			return false
		}
		var addrs []netip.Addr
		for _, ep := range s.endpoints(svc) {
			if ep.label == labels[0] {
				addrs = append(addrs, ep.addr)
			}
		}
		if len(addrs) == 0 {
			return false
		}
		m.Answer = append(m.Answer, s.addrRRs(q.Name, q.Qtype, addrs)...)
		return true
	case 4: // _<port>._<proto>.<svc>.<ns>.svc.<zone>
		if !strings.HasPrefix(labels[0], "_") || !strings.HasPrefix(labels[1], "_") {
			return false
		}
		svc := s.services[types.NamespacedName{Namespace: labels[3], Name: labels[2]}]
		if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
			return false
		}
		return s.srvRecords(m, q, svc, labels[0][1:], labels[1][1:])
	}
	return false
}

func headless(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP == corev1.ClusterIPNone && svc.Spec.Type != corev1.ServiceTypeExternalName
}

// serviceRecords answers for the Service's own name.
func (s *Server) serviceRecords(m *dns.Msg, q dns.Question, svc *corev1.Service, depth int) {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		target := dns.Fqdn(strings.ToLower(svc.Spec.ExternalName))
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: s.hdr(q.Name, dns.TypeCNAME), Target: target})
		if q.Qtype != dns.TypeCNAME {
			m.Answer = append(m.Answer, s.chase(target, q.Qtype, depth)...)
		}
		return
	}
	if q.Qtype == dns.TypeSRV {
		for _, p := range svc.Spec.Ports {
			if p.Name != "" {
				s.srvRecords(m, q, svc, p.Name, strings.ToLower(string(protoOr(p.Protocol))))
			}
		}
		return
	}
	var addrs []netip.Addr
	if headless(svc) {
		for _, ep := range s.endpoints(svc) {
			addrs = append(addrs, ep.addr)
		}
	} else {
		addrs = append(addrs, clusterIPs(svc)...)
	}
	m.Answer = append(m.Answer, s.addrRRs(q.Name, q.Qtype, addrs)...)
}

// chase resolves the target of an ExternalName CNAME so that stub
// resolvers get the addresses in one answer: locally when the target is in
// the cluster zone, through the forwarding cache otherwise. Failing that the
// CNAME alone is answered and the client follows it.
func (s *Server) chase(target string, qtype uint16, depth int) []dns.RR {
	if qtype != dns.TypeA && qtype != dns.TypeAAAA {
		return nil
	}
	req := new(dns.Msg)
	req.SetQuestion(target, qtype)
	if target == s.zone || strings.HasSuffix(target, "."+s.zone) {
		if depth >= maxChase {
			return nil
		}
		sub := new(dns.Msg)
		s.answerZone(sub, req.Question[0], target, depth+1)
		return sub.Answer
	}
	resp, err := s.fwd.resolve(req)
	if err != nil || resp.Rcode != dns.RcodeSuccess {
		return nil
	}
	return resp.Answer
}

func protoOr(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// addrRRs returns A or AAAA records for the addresses of the asked family;
// other types get none (NODATA).
func (s *Server) addrRRs(name string, qtype uint16, addrs []netip.Addr) []dns.RR {
	var out []dns.RR
	for _, a := range addrs {
		switch {
		case a.Is4() && (qtype == dns.TypeA || qtype == dns.TypeANY):
			out = append(out, &dns.A{Hdr: s.hdr(name, dns.TypeA), A: net.IP(a.AsSlice())})
		case a.Is6() && (qtype == dns.TypeAAAA || qtype == dns.TypeANY):
			out = append(out, &dns.AAAA{Hdr: s.hdr(name, dns.TypeAAAA), AAAA: net.IP(a.AsSlice())})
		}
	}
	return out
}

// srvRecords answers _port._proto for a Service: one record pointing at the
// Service name for a ClusterIP Service, one per endpoint for a headless one.
// It reports whether the Service has such a port.
func (s *Server) srvRecords(m *dns.Msg, q dns.Question, svc *corev1.Service, port, proto string) bool {
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if strings.EqualFold(p.Name, port) && strings.EqualFold(string(protoOr(p.Protocol)), proto) {
			sp = p
			break
		}
	}
	if sp == nil {
		return false
	}
	if q.Qtype != dns.TypeSRV && q.Qtype != dns.TypeANY {
		return true // the name exists; NODATA for other types
	}
	if !headless(svc) {
		target := s.svcName(svc.Namespace, svc.Name)
		m.Answer = append(m.Answer, &dns.SRV{Hdr: s.hdr(q.Name, dns.TypeSRV), Priority: 0, Weight: 100, Port: uint16(sp.Port), Target: target})
		m.Extra = append(m.Extra, s.addrRRs(target, dns.TypeANY, clusterIPs(svc))...)
		return true
	}
	eps := s.endpoints(svc)
	for _, ep := range eps {
		p, ok := ep.ports[portKey{sp.Name, protoOr(sp.Protocol)}]
		if !ok {
			continue
		}
		target := ep.label + "." + s.svcName(svc.Namespace, svc.Name)
		w := uint16(100 / max(1, len(eps)))
		m.Answer = append(m.Answer, &dns.SRV{Hdr: s.hdr(q.Name, dns.TypeSRV), Priority: 0, Weight: w, Port: p, Target: target})
		m.Extra = append(m.Extra, s.addrRRs(target, dns.TypeANY, []netip.Addr{ep.addr})...)
	}
	return true
}

// endpoint is one address of a headless Service as DNS shows it.
type endpoint struct {
	addr  netip.Addr
	label string // hostname, or the address with dashes
	ports map[portKey]uint16
}

type portKey struct {
	name  string
	proto corev1.Protocol
}

// endpoints lists the addresses a headless Service resolves to: ready
// endpoints, or all of them with publishNotReadyAddresses.
func (s *Server) endpoints(svc *corev1.Service) []endpoint {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	names := make([]string, 0, len(s.bySvc[key]))
	for n := range s.bySvc[key] {
		names = append(names, n)
	}
	slices.Sort(names)
	seen := map[netip.Addr]bool{}
	var out []endpoint
	for _, n := range names {
		es := s.slices[types.NamespacedName{Namespace: svc.Namespace, Name: n}]
		if es == nil || es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		ports := map[portKey]uint16{}
		for _, p := range es.Ports {
			if p.Port == nil {
				continue
			}
			pk := portKey{proto: corev1.ProtocolTCP}
			if p.Name != nil {
				pk.name = *p.Name
			}
			if p.Protocol != nil {
				pk.proto = *p.Protocol
			}
			ports[pk] = uint16(*p.Port)
		}
		for _, ep := range es.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if !ready && !svc.Spec.PublishNotReadyAddresses {
				continue
			}
			if len(ep.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || seen[a.Unmap()] {
				continue
			}
			a = a.Unmap()
			seen[a] = true
			label := dashed(a)
			if ep.Hostname != nil && *ep.Hostname != "" {
				label = strings.ToLower(*ep.Hostname)
			}
			out = append(out, endpoint{addr: a, label: label, ports: ports})
		}
	}
	return out
}

// dashed writes an address as one DNS label: 10-1-2-3, fd00--1.
func dashed(a netip.Addr) string {
	if a.Is4() {
		return strings.ReplaceAll(a.String(), ".", "-")
	}
	return strings.ReplaceAll(a.String(), ":", "-")
}

func undash(label string) (netip.Addr, bool) {
	if strings.Count(label, "-") == 3 && !strings.Contains(label, "--") {
		a, err := netip.ParseAddr(strings.ReplaceAll(label, "-", "."))
		return a, err == nil && a.Is4()
	}
	a, err := netip.ParseAddr(strings.ReplaceAll(label, "-", ":"))
	return a, err == nil && a.Is6()
}

// answerPod handles <a-b-c-d>.<ns>.pod.<zone>: the address is in the name
// (what kube-dns and CoreDNS call "pods insecure").
func (s *Server) answerPod(m *dns.Msg, q dns.Question, labels []string) bool {
	switch len(labels) {
	case 0:
		return true
	case 1:
		return true // any namespace may have pods
	case 2:
		a, ok := undash(labels[0])
		if !ok {
			return false
		}
		m.Answer = append(m.Answer, s.addrRRs(q.Name, q.Qtype, []netip.Addr{a})...)
		return true
	}
	return false
}

// reverse answers PTR queries for ClusterIPs and for headless endpoints;
// other addresses are forwarded (nil).
func (s *Server) reverse(req *dns.Msg, q dns.Question, name string) *dns.Msg {
	a, ok := fromReverse(name)
	if !ok {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var targets []string
	for _, svc := range s.services {
		if headless(svc) {
			for _, ep := range s.endpoints(svc) {
				if ep.addr == a {
					targets = append(targets, ep.label+"."+s.svcName(svc.Namespace, svc.Name))
				}
			}
			continue
		}
		if slices.Contains(clusterIPs(svc), a) {
			targets = append(targets, s.svcName(svc.Namespace, svc.Name))
		}
	}
	if len(targets) == 0 {
		return nil
	}
	slices.Sort(targets)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = true
	if q.Qtype == dns.TypePTR || q.Qtype == dns.TypeANY {
		for _, t := range targets {
			m.Answer = append(m.Answer, &dns.PTR{Hdr: s.hdr(q.Name, dns.TypePTR), Ptr: t})
		}
	} else {
		m.Ns = append(m.Ns, s.soa())
	}
	return m
}

// fromReverse parses an in-addr.arpa or ip6.arpa name.
func fromReverse(name string) (netip.Addr, bool) {
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa."); ok {
		p := strings.Split(rest, ".")
		if len(p) != 4 {
			return netip.Addr{}, false
		}
		slices.Reverse(p)
		a, err := netip.ParseAddr(strings.Join(p, "."))
		return a, err == nil
	}
	if rest, ok := strings.CutSuffix(name, ".ip6.arpa."); ok {
		p := strings.Split(rest, ".")
		if len(p) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i := 0; i < 32; i++ {
			v, err := strconv.ParseUint(p[31-i], 16, 8)
			if err != nil || v > 15 {
				return netip.Addr{}, false
			}
			b[i/2] |= byte(v) << (4 * (1 - i%2))
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}
