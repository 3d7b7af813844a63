package nodes

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestVouchedLeases renews, on a hub that does not hold a node's tunnel,
// the node's Lease in memory while another hub vouches for it, writes
// nothing to the store for it, and lets it age once the word expires.
func TestVouchedLeases(t *testing.T) {
	h := startLeaseHub(t, filepath.Join(t.TempDir(), "db"), Config{LeaseRenew: 100 * time.Millisecond})
	h.heartbeats(t, "n1")
	if got := h.leases.Held(); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("held %v, want [n1]", got)
	}
	// other is a second hub's keeper over the same storage: it hears no
	// heartbeat of n1.
	other := NewLeases(Config{Storage: h.stg, Logger: quiet, LeaseRenew: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go other.Run(ctx)
	served := other.Serve(h.stg)
	renewTime := func() time.Time {
		o, err := served.Get(ctx, leasesKind, corev1.NamespaceNodeLease, "n1")
		if err != nil {
			return time.Time{}
		}
		return o.(*coordinationv1.Lease).Spec.RenewTime.Time
	}
	waitUntil(t, "n1's lease", func() bool { return !renewTime().IsZero() })
	if len(other.Held()) != 0 {
		t.Fatalf("the other hub holds %v", other.Held())
	}
	stored := renewTime()
	writes := h.st.leaseWrites.Load()
	other.Vouch(map[string]time.Time{"n1": time.Now().Add(time.Hour)})
	if !other.Vouched("n1") {
		t.Fatal("n1 not vouched for")
	}
	waitUntil(t, "a vouched renewal", func() bool { return renewTime().After(stored.Add(300 * time.Millisecond)) })
	if other.Stats().Store != 0 || other.Stats().Memory == 0 {
		t.Fatalf("vouched renewals: %+v, want in memory only", other.Stats())
	}
	// The holding hub keeps its renewals in memory too.
	if w := h.st.leaseWrites.Load(); w != writes {
		t.Fatalf("%d lease writes to the store while vouched", w-writes)
	}

	other.Vouch(map[string]time.Time{"n1": time.Now().Add(-time.Second)})
	if other.Vouched("n1") {
		t.Fatal("an expired word still vouches")
	}
	time.Sleep(150 * time.Millisecond)
	last := renewTime()
	time.Sleep(400 * time.Millisecond)
	if got := renewTime(); !got.Equal(last) {
		t.Fatalf("lease renewed from %v to %v after the word expired", last, got)
	}
}
