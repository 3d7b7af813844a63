package policy

import (
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// identity is a set of pods that no policy can tell apart: one namespace,
// one set of labels, one set of named ports.
type identity struct {
	id         uint32
	namespace  string
	labels     labels.Set
	namedPorts []NamedPort
}

// compiledPolicy is a NetworkPolicy with its selectors parsed.
type compiledPolicy struct {
	np      *networkingv1.NetworkPolicy
	pods    labels.Selector
	ingress bool
	egress  bool
}

// compiler holds what Compile derives from its Input once.
type compiler struct {
	in       Input
	ids      []*identity
	podIDs   []uint32 // per Input.Pods index, 0 for pods without address
	policies map[string][]compiledPolicy
	nsLabel  map[string]labels.Set
	// selected caches the identities each selector peer selects: a
	// policy's peers are the same for every local pod it selects.
	selected map[*networkingv1.NetworkPolicyPeer][]*identity
	out      *Rules
	// idEntries collects AllowID's entries, which go into a map of the
	// right size at the end (growing a map of tens of thousands of
	// entries costs more than the compilation).
	idEntries []idEntry
}

type idEntry struct {
	k IDKey
	v PortSet
}

// Compile turns a node's view of the cluster into the contents of its
// policy maps, following NetworkPolicy's semantics:
//
//   - A local pod is isolated in a direction when a policy of its
//     namespace selects it and lists that direction in policyTypes
//     (defaulted as the API server does: Ingress, and Egress when the
//     policy has egress rules). Traffic of a direction in which it is not
//     isolated is allowed.
//   - What an isolated pod may do is the union of the rules of all
//     policies selecting it; both ends judge, each by its own policies.
//   - A peer with namespaceSelector and podSelector selects the pods that
//     match both; separate peers add up. A missing namespaceSelector means
//     the policy's namespace; an empty one, every namespace.
//   - Named ports are resolved against the pod that receives: the local
//     pod for ingress, each peer for egress.
//   - An ipBlock allows its CIDR but its excepts (IPv4).
//
// The result depends on the input only, never on map order, so that a
// restarted agent computes the same identities as the one before it.
func Compile(in Input) *Rules {
	c := &compiler{in: in, nsLabel: map[string]labels.Set{}, selected: map[*networkingv1.NetworkPolicyPeer][]*identity{}, out: &Rules{
		IDs:       map[netip.Addr]uint32{},
		Isolated:  map[Endpoint]string{},
		AllowID:   map[IDKey]PortSet{},
		AllowCIDR: map[CIDRKey]PortSet{},
	}}
	c.identities()
	c.parsePolicies()
	for i, p := range in.Pods {
		if p.Local {
			c.localPod(i)
		}
	}
	c.out.AllowID = make(map[IDKey]PortSet, len(c.idEntries))
	for _, e := range c.idEntries {
		c.out.AllowID[e.k] = e.v
	}
	slices.Sort(c.out.Warnings)
	return c.out
}

func (c *compiler) warn(format string, args ...any) {
	c.out.Warnings = append(c.out.Warnings, fmt.Sprintf(format, args...))
}

// identities numbers the pods' identities (a hash of what defines them,
// probed past reserved and taken numbers in a fixed order) and fills IDs.
func (c *compiler) identities() {
	keys := map[string]*identity{}
	podKeys := make([]string, len(c.in.Pods))
	for i, p := range c.in.Pods {
		if len(p.IPs) == 0 {
			continue
		}
		np := slices.Clone(p.NamedPorts)
		slices.SortFunc(np, func(a, b NamedPort) int { return strings.Compare(a.Name, b.Name) })
		var b strings.Builder
		b.WriteString(p.Namespace)
		b.WriteByte(0)
		b.WriteString(labels.Set(p.Labels).String())
		for _, n := range np {
			fmt.Fprintf(&b, "\x00%s/%d/%d", n.Name, n.Proto, n.Port)
		}
		k := b.String()
		podKeys[i] = k
		if keys[k] == nil {
			keys[k] = &identity{namespace: p.Namespace, labels: labels.Set(p.Labels), namedPorts: np}
		}
	}
	sorted := slices.Sorted(maps.Keys(keys))
	taken := map[uint32]bool{}
	for _, k := range sorted {
		h := fnv.New32a()
		h.Write([]byte(k))
		id := h.Sum32()
		for id == IDWorld || id == IDHost || id == IDAny || taken[id] {
			id++
		}
		taken[id] = true
		keys[k].id = id
		c.ids = append(c.ids, keys[k])
	}
	for _, ip := range c.in.NodeIPs {
		c.out.IDs[ip.Unmap()] = IDHost
	}
	c.podIDs = make([]uint32, len(c.in.Pods))
	for i, p := range c.in.Pods {
		if podKeys[i] == "" {
			continue
		}
		c.podIDs[i] = keys[podKeys[i]].id
		for _, ip := range p.IPs {
			c.out.IDs[ip] = keys[podKeys[i]].id
		}
	}
}

// parsePolicies parses the policies' pod selectors and defaults their
// types; a policy whose selector does not parse selects nothing.
func (c *compiler) parsePolicies() {
	c.policies = map[string][]compiledPolicy{}
	for _, np := range c.in.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			c.warn("NetworkPolicy %s/%s: podSelector: %v", np.Namespace, np.Name, err)
			continue
		}
		cp := compiledPolicy{np: np, pods: sel}
		types := np.Spec.PolicyTypes
		if len(types) == 0 {
			types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			if len(np.Spec.Egress) > 0 {
				types = append(types, networkingv1.PolicyTypeEgress)
			}
		}
		cp.ingress = slices.Contains(types, networkingv1.PolicyTypeIngress)
		cp.egress = slices.Contains(types, networkingv1.PolicyTypeEgress)
		c.policies[np.Namespace] = append(c.policies[np.Namespace], cp)
	}
}

// nsLabels returns a namespace's labels with the name label the API
// server sets on every namespace.
func (c *compiler) nsLabels(ns string) labels.Set {
	if l, ok := c.nsLabel[ns]; ok {
		return l
	}
	l := labels.Set{corev1.LabelMetadataName: ns}
	for k, v := range c.in.Namespaces[ns] {
		l[k] = v
	}
	c.nsLabel[ns] = l
	return l
}

// block is one ipBlock of a rule, with the ports it allows.
type block struct {
	cidr    netip.Prefix
	excepts []netip.Prefix
	ports   []PortRange
}

// localPod writes the isolation and allow entries of one local pod.
func (c *compiler) localPod(i int) {
	pod := c.in.Pods[i]
	var locals []netip.Addr
	for _, ip := range pod.IPs {
		if ip.Is4() {
			locals = append(locals, ip)
		}
	}
	if len(locals) == 0 {
		return
	}
	for _, dir := range []Dir{Ingress, Egress} {
		var selecting []compiledPolicy
		for _, p := range c.policies[pod.Namespace] {
			if (dir == Ingress && p.ingress || dir == Egress && p.egress) && p.pods.Matches(labels.Set(pod.Labels)) {
				selecting = append(selecting, p)
			}
		}
		if len(selecting) == 0 {
			continue
		}
		byID := map[uint32][]PortRange{}
		var blocks []block
		for _, p := range selecting {
			if dir == Ingress {
				for _, r := range p.np.Spec.Ingress {
					blocks = c.rule(p.np, pod, dir, r.From, r.Ports, byID, blocks)
				}
			} else {
				for _, r := range p.np.Spec.Egress {
					blocks = c.rule(p.np, pod, dir, r.To, r.Ports, byID, blocks)
				}
			}
		}
		name := pod.Namespace + "/" + pod.Name
		for _, local := range locals {
			c.out.Isolated[Endpoint{local, dir}] = name
			for id, rs := range byID {
				s, ok := normalize(rs)
				if !ok {
					c.warn("pod %s: more than %d port ranges for one %s peer: some are not allowed", name, MaxRanges, dir)
				}
				if s.N > 0 {
					c.idEntries = append(c.idEntries, idEntry{IDKey{local, id, dir}, s})
				}
			}
			for p, s := range cidrEntries(blocks) {
				c.out.AllowCIDR[CIDRKey{local, dir, p}] = s
			}
		}
	}
}

// rule adds what one ingress or egress rule of np allows the local pod.
func (c *compiler) rule(np *networkingv1.NetworkPolicy, pod Pod, dir Dir, peers []networkingv1.NetworkPolicyPeer,
	ports []networkingv1.NetworkPolicyPort, byID map[uint32][]PortRange, blocks []block) []block {
	// The receiving pod resolves named ports: once for ingress, per peer
	// for egress rules that name any.
	local := resolvePorts(ports, pod.NamedPorts)
	localPorts := func() []PortRange { return local }
	named := hasNamed(ports)
	plain := local
	if dir == Egress {
		plain = resolvePorts(ports, nil)
	}
	peerPorts := func(id *identity) []PortRange {
		if dir == Ingress || !named {
			return plain
		}
		return resolvePorts(ports, id.namedPorts)
	}
	if len(peers) == 0 {
		if dir == Ingress || !named {
			byID[IDAny] = append(byID[IDAny], localPorts()...)
			return blocks
		}
		// Egress to every peer on a named port: each pod resolves it.
		byID[IDAny] = append(byID[IDAny], resolvePorts(ports, nil)...)
		for _, id := range c.ids {
			byID[id.id] = append(byID[id.id], peerPorts(id)...)
		}
		return blocks
	}
	for i := range peers {
		peer := &peers[i]
		if peer.IPBlock != nil {
			b, err := parseBlock(peer.IPBlock)
			if err != nil {
				c.warn("NetworkPolicy %s/%s: %v", np.Namespace, np.Name, err)
				continue
			}
			if !b.cidr.Addr().Is4() {
				continue
			}
			// An address block has no named ports.
			b.ports = resolvePorts(ports, nil)
			if dir == Ingress {
				b.ports = localPorts()
			}
			blocks = append(blocks, b)
			continue
		}
		ids, err := c.selectedBy(np, peer)
		if err != nil {
			c.warn("NetworkPolicy %s/%s: %v", np.Namespace, np.Name, err)
			continue
		}
		for _, id := range ids {
			byID[id.id] = append(byID[id.id], peerPorts(id)...)
		}
	}
	return blocks
}

// selectedBy returns the identities a selector peer of np selects.
func (c *compiler) selectedBy(np *networkingv1.NetworkPolicy, peer *networkingv1.NetworkPolicyPeer) ([]*identity, error) {
	if ids, ok := c.selected[peer]; ok {
		return ids, nil
	}
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			return nil, fmt.Errorf("podSelector: %w", err)
		}
		podSel = s
	}
	var nsSel labels.Selector
	if peer.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			return nil, fmt.Errorf("namespaceSelector: %w", err)
		}
		nsSel = s
	}
	ids := []*identity{}
	for _, id := range c.ids {
		if nsSel == nil && id.namespace != np.Namespace || nsSel != nil && !nsSel.Matches(c.nsLabels(id.namespace)) {
			continue
		}
		if podSel.Matches(id.labels) {
			ids = append(ids, id)
		}
	}
	c.selected[peer] = ids
	return ids, nil
}

func hasNamed(ports []networkingv1.NetworkPolicyPort) bool {
	return slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool {
		return p.Port != nil && p.Port.Type == intstr.String
	})
}

// resolvePorts turns a rule's ports into ranges; named ports are looked up
// in named (and match nothing where they are not found). No ports is every
// port of every protocol.
func resolvePorts(ports []networkingv1.NetworkPolicyPort, named []NamedPort) []PortRange {
	if len(ports) == 0 {
		return []PortRange{allPorts}
	}
	var out []PortRange
	for _, p := range ports {
		proto := protoNumber(p.Protocol)
		switch {
		case p.Port == nil:
			out = append(out, PortRange{proto, 0, 65535})
		case p.Port.Type == intstr.String: // a name
			for _, n := range named {
				if n.Name == p.Port.StrVal && n.Proto == proto {
					out = append(out, PortRange{proto, n.Port, n.Port})
				}
			}
		default:
			lo := p.Port.IntVal
			hi := lo
			if p.EndPort != nil && *p.EndPort >= lo {
				hi = *p.EndPort
			}
			if lo < 0 || hi > 65535 {
				continue
			}
			out = append(out, PortRange{proto, uint16(lo), uint16(hi)})
		}
	}
	return out
}

func parseBlock(b *networkingv1.IPBlock) (block, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return block{}, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, err)
	}
	out := block{cidr: cidr.Masked()}
	for _, e := range b.Except {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return block{}, fmt.Errorf("ipBlock except %q: %w", e, err)
		}
		out.excepts = append(out.excepts, p.Masked())
	}
	return out, nil
}

// covers tells whether prefix a contains all of prefix b.
func covers(a, b netip.Prefix) bool {
	return a.Bits() <= b.Bits() && a.Contains(b.Addr())
}

// cidrEntries computes the trie entries of a pod's ipBlocks. The trie
// answers with the longest prefix that holds an address, so each prefix
// named by a block (a CIDR or an except) gets what every address whose
// longest named prefix it is may do: the union of the blocks whose CIDR
// covers it and none of whose excepts does. An except is thus an entry
// that allows less, or nothing, and another block's longer CIDR inside it
// still allows what that block allows.
func cidrEntries(blocks []block) map[netip.Prefix]PortSet {
	out := map[netip.Prefix]PortSet{}
	var bounds []netip.Prefix
	for _, b := range blocks {
		bounds = append(bounds, b.cidr)
		for _, e := range b.excepts {
			if e.Addr().Is4() {
				bounds = append(bounds, e)
			}
		}
	}
	for _, p := range bounds {
		if _, done := out[p]; done {
			continue
		}
		var rs []PortRange
		for _, b := range blocks {
			if !covers(b.cidr, p) || slices.ContainsFunc(b.excepts, func(e netip.Prefix) bool { return covers(e, p) }) {
				continue
			}
			rs = append(rs, b.ports...)
		}
		s, _ := normalize(rs)
		out[p] = s
	}
	return out
}
