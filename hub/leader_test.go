package hub_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestAloneHubElections checks the elections of a hub on SQLite: it
// renews its Leases rarely (no other hub can stand by), takes them back
// at once after a crash under its kept identity, and takes over at once
// the Leases of a past run whose identity it no longer has (its data
// directory restored on another host), where waiting out the 90 s lease
// would leave the cluster without a scheduler meanwhile.
func TestAloneHubElections(t *testing.T) {
	h := hubtest.Start(t)
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	held := func(want string) (sched, ctrl string, ok bool) {
		sched, ctrl = leaseHolders(ctx, c)
		return sched, ctrl, sched != "" && sched == ctrl && (want == "" || strings.HasSuffix(sched, "_"+want))
	}
	waitHeld := func(what, want string, limit time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			sched, ctrl, ok := held(want)
			if ok {
				return time.Since(start)
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: Leases held by %q and %q after %v, want both by the id %q", what, sched, ctrl, limit, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitHeld("first start", "", 30*time.Second)
	idPath := filepath.Join(h.DataDir, "hub-id")
	id, err := os.ReadFile(idPath)
	if err != nil {
		t.Fatal(err)
	}

	// Renewals are rare: over 10 s the Leases' resourceVersions move at
	// most once each (a renewal every 30 s; 2 s would move them 5 times).
	rv := func() string {
		var out []string
		for _, name := range []string{"kube-scheduler", "kube-controller-manager"} {
			l, err := c.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l.ResourceVersion)
		}
		return strings.Join(out, ",")
	}
	before := rv()
	changes := 0
	for range 10 {
		time.Sleep(time.Second)
		if now := rv(); now != before {
			changes++
			before = now
		}
	}
	if changes > 2 {
		t.Errorf("the Leases changed %d times in 10 s; want at most one renewal each", changes)
	}

	// A crash: the same identity holds its Leases again at once.
	h.Kill()
	h.Restart()
	took := waitHeld("after a crash", strings.TrimSpace(string(id)), 15*time.Second)
	t.Logf("after a crash the hub held its Leases again %v after it was ready", took.Round(time.Millisecond))

	// The data directory on another host: a new identity, the past run's
	// Leases unexpired. It takes them at once.
	h.Kill()
	if err := os.WriteFile(idPath, []byte("0123456789ab\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.Restart()
	took = waitHeld("under a new identity", "0123456789ab", 15*time.Second)
	t.Logf("under a new identity the hub held the past run's Leases %v after it was ready", took.Round(time.Millisecond))
}
