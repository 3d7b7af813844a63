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
//
// With claims (every write but a dry run) the store decides: each range
// handed out is claimed there, so that two hubs never give out the same
// one. owners is what this hub knows of the taken ranges: read from the
// store once (the claims, and the stored nodes' ranges, claimed where no
// claim holds them yet), then kept up to date with what this hub hands
// out and frees, and with the claims of other hubs it runs into. The
// claims alone are read again when every range seems taken, since other
// hubs free ranges this one never hears of. So a create claims one
// range, usually the first it tries, and reads no other node: reading
// them all at every create made registering a fleet quadratic in its
// size, and still would once the cluster CIDR is used up.
//
// Without claims (dry runs, and tests) the ranges are kept here only.
type podCIDRAllocator struct {
	mu     sync.Mutex
	net    ClusterNetwork
	seeded bool                    // owners holds the stored nodes' ranges
	synced bool                    // owners holds the store's claims as well
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
		for _, p := range podCIDRs(n) {
			a.owners[p] = n.Name
		}
	}
	a.seeded = true
	return nil
}

// syncLocked reads the taken ranges from the store into owners, unless
// it holds them already: the ranges of stored nodes, each claimed for its
// node where no claim holds it (nodes stored before the hub claimed
// ranges, or that brought their own), and the claims, but for stale ones
// (see staleClaim), which an allocation may then take over.
func (a *podCIDRAllocator) syncLocked(ctx context.Context, l Lister, claims Claims) error {
	if a.synced {
		return nil
	}
	held, err := claimedRanges(ctx, claims)
	if err != nil {
		return err
	}
	objs, err := l.List(ctx, "nodes", "")
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	owners := make(map[netip.Prefix]string, max(len(held), len(objs)))
	for _, o := range objs {
		n, ok := o.(*corev1.Node)
		if !ok {
			continue
		}
		for _, p := range podCIDRs(n) {
			if _, ok := held[p]; !ok && a.allocatable(p) {
				if _, _, err := claims.Claim(ctx, podCIDRPool, p.String(), claimOf(n), nil); err != nil {
					return err
				}
			}
			owners[p] = n.Name
		}
	}
	for p, h := range held {
		if _, ok := owners[p]; !ok && time.Since(h.Time) < staleClaimAge {
			owners[p] = h.Object
		}
	}
	a.owners, a.seeded, a.synced = owners, true, true
	return nil
}

// rereadLocked replaces owners with the store's claims, stale ones too:
// after the first read every node's range has a claim.
func (a *podCIDRAllocator) rereadLocked(ctx context.Context, claims Claims) error {
	held, err := claimedRanges(ctx, claims)
	if err != nil {
		return err
	}
	a.owners = make(map[netip.Prefix]string, len(held))
	for p, h := range held {
		a.owners[p] = h.Object
	}
	return nil
}

// claimedRanges returns the store's claims on pod CIDRs by range.
func claimedRanges(ctx context.Context, claims Claims) (map[netip.Prefix]Claim, error) {
	held, err := claims.ListClaims(ctx, podCIDRPool)
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Prefix]Claim, len(held))
	for c, h := range held {
		if p, err := netip.ParsePrefix(c); err == nil {
			out[p.Masked()] = h
		}
	}
	return out, nil
}

// claimOf is the claim n makes on a range.
func claimOf(n *corev1.Node) Claim { return Claim{Owner: string(n.UID), Object: n.Name} }

// podCIDRs returns n's pod CIDRs, masked; unparsable ones are left out.
func podCIDRs(n *corev1.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// allocatable reports whether p is one of the ranges the allocator hands
// out.
func (a *podCIDRAllocator) allocatable(p netip.Prefix) bool {
	return p.Bits() == a.net.NodeMaskSize && a.net.CIDR.Contains(p.Addr())
}

func (a *podCIDRAllocator) count() int64 {
	return int64(1) << (a.net.NodeMaskSize - a.net.CIDR.Bits())
}

func (a *podCIDRAllocator) nth(i int64) netip.Prefix {
	shift := uint(a.net.CIDR.Addr().BitLen() - a.net.NodeMaskSize)
	off := new(big.Int).Lsh(big.NewInt(i), shift)
	return netip.PrefixFrom(nthAddr(a.net.CIDR, off), a.net.NodeMaskSize)
}

// reserveLocked records the next range owners does not hold as node's
// and returns it; false when owners holds them all.
func (a *podCIDRAllocator) reserveLocked(node string) (netip.Prefix, bool) {
	total := a.count()
	for i := int64(0); i < total; i++ {
		p := a.nth((a.next + i) % total)
		if _, used := a.owners[p]; used {
			continue
		}
		a.owners[p] = node
		a.next = (a.next + i + 1) % total
		return p, true
	}
	return netip.Prefix{}, false
}

// admitNode gives a new node without a pod CIDR the next free range, and
// records the range of a node that brings its own.
func (a *podCIDRAllocator) admitNode(ctx context.Context, l Lister, obj, old runtime.Object) error {
	n := obj.(*corev1.Node)
	if n.Spec.PodCIDR != "" || len(n.Spec.PodCIDRs) > 0 {
		if old == nil || len(old.(*corev1.Node).Spec.PodCIDRs) == 0 {
			return a.take(ctx, l, n)
		}
		return nil
	}
	if old != nil {
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
	if p, ok := a.reserveLocked(n.Name); ok {
		n.Spec.PodCIDR = p.String()
		n.Spec.PodCIDRs = []string{p.String()}
	}
	// Upstream leaves a node for which no range is left without one and
	// reports an event; a node without pod CIDR cannot run pods with
	// their own IPs, but it may still register.
	return nil
}

// admitClaimed gives n the next range that no claim in the store holds,
// and claims it (see podCIDRAllocator).
func (a *podCIDRAllocator) admitClaimed(ctx context.Context, l Lister, claims Claims, n *corev1.Node) error {
	// Twice at most: when every range seems taken, the claims are read
	// again.
	for pass := range 2 {
		a.mu.Lock()
		var err error
		if pass == 0 {
			err = a.syncLocked(ctx, l, claims)
		} else {
			err = a.rereadLocked(ctx, claims)
		}
		a.mu.Unlock()
		if err != nil {
			return fmt.Errorf("allocate a pod CIDR: %w", err)
		}
		for {
			a.mu.Lock()
			p, ok := a.reserveLocked(n.Name)
			a.mu.Unlock()
			if !ok {
				break
			}
			// Another hub may hand the range out at the same time: the
			// claim in the store decides.
			held, ok, err := claims.Claim(ctx, podCIDRPool, p.String(), claimOf(n), a.staleClaim(ctx, l, p))
			a.mu.Lock()
			switch {
			case err != nil && a.owners[p] == n.Name:
				delete(a.owners, p)
			case err == nil && !ok:
				a.owners[p] = held.Object
			}
			a.mu.Unlock()
			if err != nil {
				return fmt.Errorf("allocate a pod CIDR: %w", err)
			}
			if ok {
				n.Spec.PodCIDR = p.String()
				n.Spec.PodCIDRs = []string{p.String()}
				return nil
			}
		}
	}
	return nil
}

// take records the ranges a node brought itself and, with claims, claims
// those the allocator could hand out, so that no other node gets them. A
// range another node holds already stays the new node's too, as upstream
// lets it.
func (a *podCIDRAllocator) take(ctx context.Context, l Lister, n *corev1.Node) error {
	a.mu.Lock()
	for _, p := range podCIDRs(n) {
		a.owners[p] = n.Name
	}
	a.mu.Unlock()
	claims, ok := l.(Claims)
	if !ok {
		return nil
	}
	for _, p := range podCIDRs(n) {
		if !a.allocatable(p) {
			continue
		}
		if _, _, err := claims.Claim(ctx, podCIDRPool, p.String(), claimOf(n), nil); err != nil {
			return fmt.Errorf("claim pod CIDR %s: %w", p, err)
		}
	}
	return nil
}

// releaseNode frees the range of a deleted node, here and, when l records
// claims, in the store.
func (a *podCIDRAllocator) releaseNode(ctx context.Context, l Lister, obj runtime.Object) {
	n := obj.(*corev1.Node)
	a.mu.Lock()
	for _, p := range podCIDRs(n) {
		if a.owners[p] == n.Name {
			delete(a.owners, p)
		}
	}
	a.mu.Unlock()
	// The claims name their owner's UID: only this node's go.
	if claims, ok := l.(Claims); ok {
		for _, p := range podCIDRs(n) {
			_ = claims.Unclaim(ctx, podCIDRPool, p.String(), string(n.UID))
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
