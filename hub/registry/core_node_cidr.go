package registry

import (
	"context"
	"fmt"
	"math/big"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultClusterCIDR is the range node pod CIDRs come from unless the hub
// is told otherwise; with /24 per node it holds 256 nodes, as k3s's default.
const (
	DefaultClusterCIDR  = "10.42.0.0/16"
	DefaultNodeMaskSize = 24
)

// ClusterNetwork configures how nodes get their pod CIDR.
type ClusterNetwork struct {
	// CIDR is the range pod CIDRs are carved from; zero means 10.42.0.0/16.
	CIDR netip.Prefix
	// NodeMaskSize is the prefix length of each node's pod CIDR; zero
	// means 24.
	NodeMaskSize int
}

// withDefaults fills the zero fields of n and checks that its node ranges
// fit in it.
func (n ClusterNetwork) withDefaults() (ClusterNetwork, error) {
	if !n.CIDR.IsValid() {
		n.CIDR = netip.MustParsePrefix(DefaultClusterCIDR)
	}
	if n.NodeMaskSize == 0 {
		n.NodeMaskSize = DefaultNodeMaskSize
		if n.CIDR.Addr().Is6() {
			n.NodeMaskSize = 64
		}
	}
	n.CIDR = n.CIDR.Masked()
	if n.NodeMaskSize < n.CIDR.Bits() || n.NodeMaskSize > n.CIDR.Addr().BitLen()-2 {
		return n, fmt.Errorf("cluster network: node mask size /%d does not fit in %s", n.NodeMaskSize, n.CIDR)
	}
	if n.NodeMaskSize-n.CIDR.Bits() > 20 {
		return n, fmt.Errorf("cluster network: %s split in /%d gives more than 2^20 node ranges", n.CIDR, n.NodeMaskSize)
	}
	return n, nil
}

// podCIDRAllocator gives every node without one a pod CIDR when it is
// created, which upstream's node IPAM controller does just after. Doing it
// at admission means an agent sees its range in the object it registered.
// The taken ranges are read from the store once and then kept here.
type podCIDRAllocator struct {
	mu     sync.Mutex
	net    ClusterNetwork
	seeded bool
	owners map[netip.Prefix]string // range -> node name
	next   int64                   // where the search for a free range starts
}

func newPodCIDRAllocator(n ClusterNetwork) *podCIDRAllocator {
	return &podCIDRAllocator{net: n, owners: map[netip.Prefix]string{}}
}

func (a *podCIDRAllocator) seed(ctx context.Context, l Lister) error {
	if a.seeded || l == nil {
		return nil
	}
	objs, err := l.List(ctx, "nodes", "")
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, o := range objs {
		n, ok := o.(*corev1.Node)
		if !ok {
			continue
		}
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				a.owners[p.Masked()] = n.Name
			}
		}
	}
	a.seeded = true
	return nil
}

func (a *podCIDRAllocator) count() int64 {
	return int64(1) << (a.net.NodeMaskSize - a.net.CIDR.Bits())
}

func (a *podCIDRAllocator) nth(i int64) netip.Prefix {
	shift := uint(a.net.CIDR.Addr().BitLen() - a.net.NodeMaskSize)
	off := new(big.Int).Lsh(big.NewInt(i), shift)
	return netip.PrefixFrom(nthAddr(a.net.CIDR, off), a.net.NodeMaskSize)
}

// admitNode gives a new node without a pod CIDR the next free range.
func (a *podCIDRAllocator) admitNode(ctx context.Context, l Lister, obj, old runtime.Object) error {
	n := obj.(*corev1.Node)
	if old != nil || n.Spec.PodCIDR != "" || len(n.Spec.PodCIDRs) > 0 {
		if old == nil {
			a.take(n)
		}
		return nil
	}
	if claims, ok := l.(Claims); ok {
		return a.admitClaimed(ctx, l, claims, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.seed(ctx, l); err != nil {
		return err
	}
	total := a.count()
	for i := int64(0); i < total; i++ {
		p := a.nth((a.next + i) % total)
		if _, used := a.owners[p]; used {
			continue
		}
		a.owners[p] = n.Name
		a.next = (a.next + i + 1) % total
		n.Spec.PodCIDR = p.String()
		n.Spec.PodCIDRs = []string{p.String()}
		return nil
	}
	// Upstream leaves the node without a range and reports an event; a
	// node without pod CIDR cannot run pods with their own IPs, but it
	// may still register.
	return nil
}

// admitClaimed gives n the next range that neither a stored node nor a
// claim in the store holds, and claims it. Both are read afresh: other
// hubs hand out and free ranges this one never hears of.
func (a *podCIDRAllocator) admitClaimed(ctx context.Context, l Lister, claims Claims, n *corev1.Node) error {
	held, err := claims.ListClaims(ctx, podCIDRPool)
	if err != nil {
		return fmt.Errorf("allocate a pod CIDR: %w", err)
	}
	used := map[netip.Prefix]bool{}
	for c := range held {
		if p, err := netip.ParsePrefix(c); err == nil {
			used[p.Masked()] = true
		}
	}
	objs, err := l.List(ctx, "nodes", "")
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, o := range objs {
		if on, ok := o.(*corev1.Node); ok {
			for _, c := range on.Spec.PodCIDRs {
				if p, err := netip.ParsePrefix(c); err == nil {
					used[p.Masked()] = true
				}
			}
		}
	}
	a.mu.Lock()
	start := a.next
	a.mu.Unlock()
	total := a.count()
	for i := int64(0); i < total; i++ {
		p := a.nth((start + i) % total)
		if used[p] {
			continue
		}
		// Another hub may hand the range out at the same time: the
		// claim in the store decides.
		_, ok, err := claims.Claim(ctx, podCIDRPool, p.String(), Claim{Owner: string(n.UID), Object: n.Name}, a.staleClaim(ctx, l, p))
		if err != nil {
			return fmt.Errorf("allocate a pod CIDR: %w", err)
		}
		if !ok {
			continue
		}
		a.mu.Lock()
		a.next = (start + i + 1) % total
		a.mu.Unlock()
		n.Spec.PodCIDR = p.String()
		n.Spec.PodCIDRs = []string{p.String()}
		return nil
	}
	return nil
}

// take records a range a node brought itself.
func (a *podCIDRAllocator) take(n *corev1.Node) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			a.owners[p.Masked()] = n.Name
		}
	}
}

// releaseNode frees the range of a deleted node, here and, when l records
// claims, in the store.
func (a *podCIDRAllocator) releaseNode(ctx context.Context, l Lister, obj runtime.Object) {
	n := obj.(*corev1.Node)
	a.mu.Lock()
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && a.owners[p.Masked()] == n.Name {
			delete(a.owners, p.Masked())
		}
	}
	a.mu.Unlock()
	// The claims name their owner's UID: only this node's go.
	if claims, ok := l.(Claims); ok {
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				_ = claims.Unclaim(ctx, podCIDRPool, p.Masked().String(), string(n.UID))
			}
		}
	}
}

// podCIDRPool is the claim pool of node pod CIDRs.
const podCIDRPool = "pod-cidrs"

// staleClaim says whether a claim on p may pass to another node: it is
// older than staleClaimAge and no stored node has p, so its node's
// create failed with its hub.
func (a *podCIDRAllocator) staleClaim(ctx context.Context, l Lister, p netip.Prefix) func(Claim) bool {
	return func(held Claim) bool {
		if time.Since(held.Time) < staleClaimAge {
			return false
		}
		objs, err := l.List(ctx, "nodes", "")
		if err != nil {
			return false
		}
		for _, o := range objs {
			if n, ok := o.(*corev1.Node); ok {
				for _, c := range n.Spec.PodCIDRs {
					if q, err := netip.ParsePrefix(c); err == nil && q.Masked() == p {
						return false
					}
				}
			}
		}
		return true
	}
}
