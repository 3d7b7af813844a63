package registry

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
