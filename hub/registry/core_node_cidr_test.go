package registry

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func TestNodePodCIDRAllocation(t *testing.T) {
	net, err := ClusterNetwork{CIDR: netip.MustParsePrefix("10.9.0.0/22")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	a := newPodCIDRAllocator(net)
	ctx := context.Background()
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	seen := map[string]bool{}
	var nodes []*corev1.Node
	for _, name := range []string{"a", "b", "c", "d"} {
		n := node(name)
		if err := a.admitNode(ctx, nil, n, nil); err != nil {
			t.Fatal(err)
		}
		if n.Spec.PodCIDR == "" || len(n.Spec.PodCIDRs) != 1 || n.Spec.PodCIDRs[0] != n.Spec.PodCIDR || seen[n.Spec.PodCIDR] {
			t.Fatalf("node %s got %q %v", name, n.Spec.PodCIDR, n.Spec.PodCIDRs)
		}
		if p := netip.MustParsePrefix(n.Spec.PodCIDR); p.Bits() != 24 || !netip.MustParsePrefix("10.9.0.0/22").Contains(p.Addr()) {
			t.Fatalf("node %s got %s outside 10.9.0.0/22 or not /24", name, p)
		}
		seen[n.Spec.PodCIDR] = true
		nodes = append(nodes, n)
	}
	full := node("e")
	if err := a.admitNode(ctx, nil, full, nil); err != nil || full.Spec.PodCIDR != "" {
		t.Fatalf("fifth node in a range of four: %q, %v", full.Spec.PodCIDR, err)
	}
	a.releaseNode(ctx, nil, nodes[2])
	if err := a.admitNode(ctx, nil, full, nil); err != nil || full.Spec.PodCIDR != nodes[2].Spec.PodCIDR {
		t.Fatalf("after a release: got %q, want %q", full.Spec.PodCIDR, nodes[2].Spec.PodCIDR)
	}
	// A node that brings its own range keeps it and holds it.
	own := node("own")
	own.Spec.PodCIDR, own.Spec.PodCIDRs = "10.99.0.0/24", []string{"10.99.0.0/24"}
	if err := a.admitNode(ctx, nil, own, nil); err != nil || own.Spec.PodCIDR != "10.99.0.0/24" {
		t.Fatalf("own range: %q %v", own.Spec.PodCIDR, err)
	}
}

func TestClusterNetworkRejects(t *testing.T) {
	for _, n := range []ClusterNetwork{
		{CIDR: netip.MustParsePrefix("10.0.0.0/24"), NodeMaskSize: 16},
		{CIDR: netip.MustParsePrefix("10.0.0.0/8"), NodeMaskSize: 31},
		{CIDR: netip.MustParsePrefix("10.0.0.0/2"), NodeMaskSize: 24},
	} {
		if _, err := n.withDefaults(); err == nil {
			t.Errorf("cluster network %v accepted", n)
		}
	}
}

// claimStore is a Lister and Claims over a map, as the store's claims
// behave for one hub, and counts the lists of nodes.
type claimStore struct {
	mu        sync.Mutex
	nodes     []*corev1.Node
	claims    map[string]Claim
	nodeLists int
}

func (s *claimStore) List(_ context.Context, resource, _ string) ([]runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if resource != "nodes" {
		return nil, nil
	}
	s.nodeLists++
	out := make([]runtime.Object, len(s.nodes))
	for i, n := range s.nodes {
		out[i] = n.DeepCopy()
	}
	return out, nil
}

func (s *claimStore) Claim(_ context.Context, _, name string, c Claim, reclaim func(Claim) bool) (Claim, bool, error) {
	s.mu.Lock()
	held, ok := s.claims[name]
	s.mu.Unlock()
	// reclaim lists nodes: it runs without the lock, as with the store,
	// and the takeover is at the claim read.
	if ok && held.Owner != c.Owner && (reclaim == nil || !reclaim(held)) {
		return held, false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if now, still := s.claims[name]; still != ok || now != held {
		return now, false, nil
	}
	if c.Time.IsZero() {
		c.Time = time.Now()
	}
	s.claims[name] = c
	return c, true, nil
}

func (s *claimStore) Unclaim(_ context.Context, _, name, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claims[name].Owner == owner {
		delete(s.claims, name)
	}
	return nil
}

func (s *claimStore) ListClaims(context.Context, string) (map[string]Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.claims), nil
}

func (s *claimStore) counts() (claims, nodeLists int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.claims), s.nodeLists
}

// TestNodePodCIDRClaims: with claims, the allocator reads the store once
// (claiming the ranges of stored nodes that no claim holds), then claims
// one range per node without reading other nodes, steps over ranges other
// hubs claimed, takes over a stale claim, and reads the claims again
// (not the nodes) only when every range seems taken.
func TestNodePodCIDRClaims(t *testing.T) {
	net, err := ClusterNetwork{CIDR: netip.MustParsePrefix("10.9.0.0/21")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	}
	// A node stored before ranges were claimed, and one that brought a
	// range the allocator does not hand out.
	old, own := node("old"), node("own")
	old.Spec.PodCIDR, old.Spec.PodCIDRs = "10.9.0.0/24", []string{"10.9.0.0/24"}
	own.Spec.PodCIDR, own.Spec.PodCIDRs = "10.99.0.0/24", []string{"10.99.0.0/24"}
	// And a claim whose hub died before it stored its node.
	st := &claimStore{nodes: []*corev1.Node{old, own}, claims: map[string]Claim{
		"10.9.4.0/24": {Owner: "uid-dead", Object: "dead", Time: time.Now().Add(-staleClaimAge - time.Second)},
	}}
	a := newPodCIDRAllocator(net)
	admit := func(name string) string {
		t.Helper()
		n := node(name)
		if err := a.admitNode(ctx, st, n, nil); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		st.nodes = append(st.nodes, n)
		st.mu.Unlock()
		return n.Spec.PodCIDR
	}

	if got := admit("a"); got != "10.9.1.0/24" {
		t.Fatalf("first node got %q, want 10.9.1.0/24 (10.9.0.0/24 is the stored node's)", got)
	}
	if c := st.claims["10.9.0.0/24"]; c.Owner != "uid-old" {
		t.Errorf("the stored node's range is claimed by %+v, want its UID", c)
	}
	if _, ok := st.claims["10.99.0.0/24"]; ok {
		t.Error("a range outside the cluster CIDR was claimed")
	}
	// Another hub claims the next range: it is stepped over.
	st.mu.Lock()
	st.claims["10.9.2.0/24"] = Claim{Owner: "uid-elsewhere", Object: "elsewhere", Time: time.Now()}
	st.mu.Unlock()
	if got := admit("b"); got != "10.9.3.0/24" {
		t.Fatalf("second node got %q, want 10.9.3.0/24 (another hub claimed 10.9.2.0/24)", got)
	}
	// A node that brings a range the allocator hands out claims it.
	brings := node("brings")
	brings.Spec.PodCIDR, brings.Spec.PodCIDRs = "10.9.7.0/24", []string{"10.9.7.0/24"}
	if err := a.admitNode(ctx, st, brings, nil); err != nil {
		t.Fatal(err)
	}
	if c := st.claims["10.9.7.0/24"]; c.Owner != "uid-brings" {
		t.Errorf("a brought range is claimed by %+v, want the node's UID", c)
	}
	st.nodes = append(st.nodes, brings)
	// The stale claim is taken over, after a second look at the nodes.
	if got := admit("c"); got != "10.9.4.0/24" || st.claims[got].Owner != "uid-c" {
		t.Fatalf("third node got %q (claim %+v), want the stale claim's 10.9.4.0/24", got, st.claims[got])
	}
	for _, name := range []string{"d", "e"} {
		admit(name)
	}
	if claims, lists := st.counts(); claims != 8 || lists != 2 {
		t.Fatalf("after filling the cluster CIDR: %d claims, %d lists of nodes; want 8 and 2", claims, lists)
	}
	if got := admit("full"); got != "" {
		t.Fatalf("a node beyond the eight ranges got %q", got)
	}
	// The other hub's node goes: the full allocator reads the store again.
	st.mu.Lock()
	delete(st.claims, "10.9.2.0/24")
	st.mu.Unlock()
	if got := admit("g"); got != "10.9.2.0/24" {
		t.Fatalf("after another hub freed 10.9.2.0/24: got %q", got)
	}
	if _, lists := st.counts(); lists != 2 {
		t.Errorf("reading the claims again when full read the nodes too (%d lists)", lists)
	}
	// A node deleted here frees its range, here and in the store, and
	// taking it again reads no nodes.
	b := st.nodes[3]
	if b.Name != "b" {
		t.Fatalf("stored nodes out of order: %s", b.Name)
	}
	a.releaseNode(ctx, st, b)
	if _, ok := st.claims[b.Spec.PodCIDR]; ok {
		t.Error("a deleted node's claim outlived it")
	}
	_, lists := st.counts()
	if got := admit("h"); got != b.Spec.PodCIDR {
		t.Fatalf("after b's release: got %q, want %s", got, b.Spec.PodCIDR)
	}
	if _, now := st.counts(); now != lists {
		t.Error("allocating a range this hub freed read the nodes again")
	}
}

// TestNodePodCIDRClaimsConcurrent: nodes admitted at once get distinct
// ranges, and the nodes are read once.
func TestNodePodCIDRClaimsConcurrent(t *testing.T) {
	net, err := ClusterNetwork{CIDR: netip.MustParsePrefix("10.8.0.0/16")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	st := &claimStore{claims: map[string]Claim{}}
	a := newPodCIDRAllocator(net)
	got := make([]string, 200)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}}
			if err := a.admitNode(context.Background(), st, n, nil); err != nil {
				t.Error(err)
			}
			got[i] = n.Spec.PodCIDR
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, c := range got {
		if c == "" || seen[c] {
			t.Fatalf("node %d got %q (given twice or none)", i, c)
		}
		seen[c] = true
	}
	if claims, lists := st.counts(); claims != len(got) || lists != 1 {
		t.Errorf("%d claims and %d lists of nodes, want %d and 1", claims, lists, len(got))
	}
}
