package policy

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// decide answers as the programs do (bpf/policy.c allowed()).
func decide(r *Rules, local, peer netip.Addr, dir Dir, proto uint8, port uint16) bool {
	if _, iso := r.Isolated[Endpoint{local, dir}]; !iso || local == peer {
		return true
	}
	in := func(s PortSet, ok bool) bool {
		for _, x := range s.Ranges() {
			if ok && (x.Proto == 0 || x.Proto == proto) && port >= x.Lo && port <= x.Hi {
				return true
			}
		}
		return false
	}
	id := r.IDs[peer]
	if id == IDHost && dir == Ingress {
		return true
	}
	if id != IDWorld {
		if s, ok := r.AllowID[IDKey{local, id, dir}]; in(s, ok) {
			return true
		}
	}
	if s, ok := r.AllowID[IDKey{local, IDAny, dir}]; in(s, ok) {
		return true
	}
	best := -1
	var bs PortSet
	for k, s := range r.AllowCIDR {
		if k.Local == local && k.Dir == dir && k.Peer.Contains(peer) && k.Peer.Bits() > best {
			best, bs = k.Peer.Bits(), s
		}
	}
	return in(bs, best >= 0)
}

var (
	aIP    = netip.MustParseAddr("10.1.0.10") // local, prod, app=web
	bIP    = netip.MustParseAddr("10.1.0.11") // prod, app=client
	cIP    = netip.MustParseAddr("10.2.0.12") // dev, app=client
	dIP    = netip.MustParseAddr("10.2.0.13") // dev, app=other
	nodeIP = netip.MustParseAddr("10.1.0.1")
	extIP  = netip.MustParseAddr("192.0.2.7")
)

func compilePods() []Pod {
	return []Pod{
		{Namespace: "prod", Name: "a", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{aIP}, Local: true,
			NamedPorts: []NamedPort{{"http", protoTCP, 8080}}},
		{Namespace: "prod", Name: "b", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{bIP}, Local: true},
		{Namespace: "dev", Name: "c", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{cIP},
			NamedPorts: []NamedPort{{"dns", protoUDP, 5353}}},
		{Namespace: "dev", Name: "d", Labels: map[string]string{"app": "other"}, IPs: []netip.Addr{dIP}},
	}
}

func np(name string, sel map[string]string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	spec.PodSelector = metav1.LabelSelector{MatchLabels: sel}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: name}, Spec: spec}
}

func from(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers}}
}

func podSel(l map[string]string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: l} }

type probe struct {
	local, peer netip.Addr
	dir         Dir
	proto       uint8
	port        uint16
	want        bool
}

func TestCompileSemantics(t *testing.T) {
	web := map[string]string{"app": "web"}
	client := map[string]string{"app": "client"}
	dev := map[string]string{"env": "dev"}
	tcp := func(p int32) networkingv1.NetworkPolicyPort { return networkingv1.NetworkPolicyPort{Port: ptrInt(p)} }
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		probes   []probe
	}{
		{"no policy allows all", nil, []probe{
			{aIP, cIP, Ingress, protoTCP, 80, true}, {aIP, extIP, Egress, protoUDP, 53, true}}},
		{"deny-all ingress isolates ingress only", []*networkingv1.NetworkPolicy{np("deny", nil, networkingv1.NetworkPolicySpec{})}, []probe{
			{aIP, bIP, Ingress, protoTCP, 80, false}, {aIP, cIP, Egress, protoTCP, 80, true},
			{aIP, nodeIP, Ingress, protoTCP, 80, true}, // the node's probes
			{aIP, aIP, Ingress, protoTCP, 80, true}}},  // itself
		{"egress rules default policyTypes to both", []*networkingv1.NetworkPolicy{np("e", web, networkingv1.NetworkPolicySpec{
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptrProto("UDP"), Port: ptrInt(53)}}}}})}, []probe{
			{aIP, bIP, Ingress, protoTCP, 80, false}, {aIP, extIP, Egress, protoUDP, 53, true},
			{aIP, extIP, Egress, protoTCP, 53, false}, {aIP, nodeIP, Egress, protoTCP, 80, false},
			{bIP, aIP, Ingress, protoTCP, 80, true}}}, // b is not selected
		{"union of policies", []*networkingv1.NetworkPolicy{
			np("p1", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(client)})}),
			np("p2", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: podSel(dev)}}, Ports: []networkingv1.NetworkPolicyPort{tcp(443)}}}})}, []probe{
			{aIP, bIP, Ingress, protoTCP, 1, true}, {aIP, dIP, Ingress, protoTCP, 443, true}, {aIP, dIP, Ingress, protoTCP, 80, false},
			{aIP, cIP, Ingress, protoTCP, 80, false}}}, // a podSelector alone is the policy's namespace
		{"namespace and pod selector in one peer is AND", []*networkingv1.NetworkPolicy{
			np("and", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(dev), PodSelector: podSel(client)})})}, []probe{
			{aIP, cIP, Ingress, protoTCP, 80, true}, {aIP, dIP, Ingress, protoTCP, 80, false}, {aIP, bIP, Ingress, protoTCP, 80, false}}},
		{"separate peers are OR", []*networkingv1.NetworkPolicy{
			np("or", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(dev)}, networkingv1.NetworkPolicyPeer{PodSelector: podSel(client)})})}, []probe{
			{aIP, cIP, Ingress, protoTCP, 80, true}, {aIP, dIP, Ingress, protoTCP, 80, true}, {aIP, bIP, Ingress, protoTCP, 80, true},
			{aIP, extIP, Ingress, protoTCP, 80, false}}},
		{"empty namespaceSelector is every namespace", []*networkingv1.NetworkPolicy{
			np("all-ns", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}})})}, []probe{
			{aIP, dIP, Ingress, protoTCP, 80, true}, {aIP, bIP, Ingress, protoTCP, 80, true}, {aIP, extIP, Ingress, protoTCP, 80, false}}},
		{"namespace name label", []*networkingv1.NetworkPolicy{
			np("by-name", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{NamespaceSelector: podSel(map[string]string{"kubernetes.io/metadata.name": "dev"})})})}, []probe{
			{aIP, dIP, Ingress, protoTCP, 80, true}, {aIP, bIP, Ingress, protoTCP, 80, false}}},
		{"named port resolves on the receiving pod", []*networkingv1.NetworkPolicy{
			np("named", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntStr("http")}}}}}),
			np("named-egress", client, networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Egress"},
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptrProto("UDP"), Port: ptrIntStr("dns")}}}}})}, []probe{
			{aIP, cIP, Ingress, protoTCP, 8080, true}, {aIP, cIP, Ingress, protoTCP, 80, false},
			{bIP, cIP, Egress, protoUDP, 5353, true}, {bIP, dIP, Egress, protoUDP, 5353, false}, {bIP, extIP, Egress, protoUDP, 5353, false}}},
		{"endPort range", []*networkingv1.NetworkPolicy{
			np("range", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptrInt(32000), EndPort: ptrInt32(32768)}}}}})}, []probe{
			{aIP, cIP, Ingress, protoTCP, 32000, true}, {aIP, cIP, Ingress, protoTCP, 32768, true}, {aIP, cIP, Ingress, protoTCP, 32769, false},
			{aIP, cIP, Ingress, protoUDP, 32000, false}}},
		{"ipBlock with except", []*networkingv1.NetworkPolicy{
			np("block", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.2.0.0/16"}}})}),
			np("inner", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.2.0.13/32"}})})}, []probe{
			{aIP, bIP, Ingress, protoTCP, 80, true}, {aIP, cIP, Ingress, protoTCP, 80, false}, {aIP, dIP, Ingress, protoTCP, 80, true},
			{aIP, extIP, Ingress, protoTCP, 80, false}}},
		{"an overlapping block is not cut by another's except", []*networkingv1.NetworkPolicy{
			np("block", web, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.2.0.0/16"}}})}),
			np("world", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}, Ports: []networkingv1.NetworkPolicyPort{tcp(443)}}}})}, []probe{
			{aIP, cIP, Ingress, protoTCP, 443, true}, {aIP, cIP, Ingress, protoTCP, 80, false}, {aIP, extIP, Ingress, protoTCP, 443, true}}},
		{"a policy selecting nothing has no effect", []*networkingv1.NetworkPolicy{
			np("none", map[string]string{"app": "nothing"}, networkingv1.NetworkPolicySpec{})}, []probe{
			{aIP, cIP, Ingress, protoTCP, 80, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Compile(Input{Pods: compilePods(), Policies: tc.policies, NodeIPs: []netip.Addr{nodeIP},
				Namespaces: map[string]map[string]string{"prod": {"env": "prod"}, "dev": {"env": "dev"}}})
			if len(r.Warnings) > 0 {
				t.Fatalf("warnings: %v", r.Warnings)
			}
			for _, p := range tc.probes {
				if got := decide(r, p.local, p.peer, p.dir, p.proto, p.port); got != p.want {
					t.Errorf("%s %s %s proto %d port %d: allowed %v, want %v", p.local, p.dir, p.peer, p.proto, p.port, got, p.want)
				}
			}
		})
	}
}

// TestCompileBothEnds: b's egress must allow what a's ingress allows.
func TestCompileBothEnds(t *testing.T) {
	pols := []*networkingv1.NetworkPolicy{
		np("web-in", map[string]string{"app": "web"}, networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{PodSelector: podSel(map[string]string{"app": "client"})})}),
		np("client-out", map[string]string{"app": "client"}, networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Egress"}}),
	}
	r := Compile(Input{Pods: compilePods(), Policies: pols})
	if !decide(r, aIP, bIP, Ingress, protoTCP, 80) {
		t.Fatal("a's ingress should allow b")
	}
	if decide(r, bIP, aIP, Egress, protoTCP, 80) {
		t.Fatal("b's egress should deny a")
	}
}

// TestCompileStable: identities do not depend on input order, so a
// restarted agent computes what the maps hold.
func TestCompileStable(t *testing.T) {
	pods := compilePods()
	r1 := Compile(Input{Pods: pods})
	rev := make([]Pod, len(pods))
	for i := range pods {
		rev[len(pods)-1-i] = pods[i]
	}
	r2 := Compile(Input{Pods: rev})
	for ip, id := range r1.IDs {
		if r2.IDs[ip] != id {
			t.Fatalf("%s: identity %d, then %d", ip, id, r2.IDs[ip])
		}
	}
}

func TestNormalize(t *testing.T) {
	s, ok := normalize([]PortRange{{6, 80, 80}, {6, 81, 90}, {17, 53, 53}, {6, 85, 100}})
	if !ok || s.String() != "6:80-100,17:53-53" {
		t.Fatalf("got %s %v", s, ok)
	}
	var many []PortRange
	for i := range 20 {
		many = append(many, PortRange{6, uint16(i * 10), uint16(i * 10)})
	}
	if s, ok := normalize(many); ok || s.N != MaxRanges {
		t.Fatalf("20 ranges: %d, %v", s.N, ok)
	}
}
