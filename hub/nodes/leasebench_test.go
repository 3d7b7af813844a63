package nodes

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/store/sqlite"
)

var leaseBenchFull = flag.Bool("lease-bench-full", false, "run the node Lease write benchmark with 1000 nodes for two minutes of hub time")

// TestLeaseStoreWritesBenchmark measures the store writes node Leases
// cost: N nodes heartbeat through the Lease keeper (as the tunnel server
// feeds it) with the default renewal period, on a clock that runs ten
// times faster than the wall clock, while one watch of kube-node-lease
// receives the renewals. Before Leases were kept in memory, every renewal
// was a store write: that is the peer figure.
func TestLeaseStoreWritesBenchmark(t *testing.T) {
	n, window := 50, 3*time.Second
	if *leaseBenchFull {
		n, window = 1000, 12*time.Second
	}
	const speed = 10
	start := time.Now()
	now := func() time.Time { return start.Add(time.Since(start) * speed) }

	sq, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	st := &countingStore{Store: sq}
	stg := newStorageOn(t, st, storage.Config{})
	l := NewLeases(Config{Storage: stg, Logger: quiet, Now: now})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.Run(ctx)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("hollow-%04d", i)
		if _, err := stg.Create(ctx, nodesKind, "", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i]}}, storage.Options{}); err != nil {
			t.Fatal(err)
		}
		l.Connected(names[i])
	}
	go func() {
		// Agents heartbeat every 15s of hub time.
		tick := time.NewTicker(15 * time.Second / speed)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				for _, name := range names {
					l.Heartbeat(name)
				}
			}
		}
	}()
	waitUntil(t, "every Lease created", func() bool { return l.Stats().Store >= int64(n) })

	w, err := l.Serve(stg).Watch(ctx, leasesKind, corev1.NamespaceNodeLease, storage.WatchOptions{SendInitialEvents: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var events atomic.Int64
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				events.Add(1)
			}
		}
	}()

	writes0, stats0, t0 := st.leaseWrites.Load(), l.Stats(), now()
	time.Sleep(window)
	writes, stats, minutes := st.leaseWrites.Load()-writes0, l.Stats(), now().Sub(t0).Minutes()
	renewals := stats.Memory + stats.Store - stats0.Memory - stats0.Store
	perMin := func(v int64) float64 { return float64(v) / minutes }
	t.Logf("%d nodes, %.1f min of hub time: %d renewals, %d Lease writes to the store, %d watch events",
		n, minutes, renewals, writes, events.Load())
	if renewals < int64(n) {
		t.Fatalf("%d renewals of %d nodes in %.1f min of hub time", renewals, n, minutes)
	}
	if writes != 0 {
		t.Errorf("%d Lease writes reached the store while nodes only heartbeat", writes)
	}
	if events.Load() < int64(n) {
		t.Errorf("the watch got %d renewals of %d nodes", events.Load(), n)
	}
	extra := []string{fmt.Sprintf("nodes=%d", n), "lease_renew_s=7",
		fmt.Sprintf("watch_events_per_minute=%s", benchfmt.FormatValue(perMin(events.Load())))}
	benchfmt.Report(t, benchfmt.Figure{Name: "lease_store_writes_per_minute", Value: perMin(writes), Unit: "writes/min",
		Target: "ratio<=0.01", Peer: "store_per_renewal", PeerValue: perMin(renewals), Mode: benchfmt.Mode(*leaseBenchFull), Extra: extra})
}
