package nodes

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/storage"
)

// TestNudges: a node whose Ready condition turns Unknown while this hub
// holds its tunnel is asked to report, once per turn; a node already
// Unknown when the hub started, or not connected here, is not; and no
// more than Concurrency asks are in flight at once.
func TestNudges(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodesKind := mustKindT(t, "nodes")
	withReady := func(name string, s corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}}}
	}
	names := []string{"n1", "n2", "n3", "n4", "n5", "away", "stale"}
	for _, name := range names {
		status := corev1.ConditionTrue
		if name == "stale" {
			status = corev1.ConditionUnknown
		}
		if _, err := st.Create(ctx, nodesKind, "", withReady(name, status), storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu             sync.Mutex
		asked          = map[string]int{}
		inFlight, most atomic.Int32
		release        = make(chan struct{})
		releaseOnce    sync.Once
	)
	openGate := func() { releaseOnce.Do(func() { close(release) }) }
	defer openGate()
	n := NewNudges(NudgeConfig{
		Storage:     st,
		Connected:   func(node string) bool { return node != "away" },
		Concurrency: 2,
		Logger:      quiet,
		Send: func(ctx context.Context, node string) error {
			cur := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				m := most.Load()
				if cur <= m || most.CompareAndSwap(m, cur) {
					break
				}
			}
			mu.Lock()
			asked[node]++
			mu.Unlock()
			select {
			case <-release:
			case <-ctx.Done():
			}
			if node == "n5" {
				return errors.New("unanswered")
			}
			return nil
		},
	})
	go n.Run(ctx)

	// Wait for the first list: the stale node was taken in as Unknown.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.mu.Lock()
		listed := n.unknown["stale"]
		n.mu.Unlock()
		if listed || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, name := range names {
		obj, err := st.Get(ctx, nodesKind, "", name)
		if err != nil {
			t.Fatal(err)
		}
		node := obj.(*corev1.Node)
		node.Status.Conditions[0].Status = corev1.ConditionUnknown
		node.Status.Conditions[0].Reason = "NodeStatusUnknown"
		if _, err := st.Update(ctx, nodesKind, "", name, node, storage.Options{Subresource: "status"}); err != nil {
			t.Fatal(err)
		}
	}
	// The asks are held: two start, and the others wait for them.
	deadline = time.Now().Add(10 * time.Second)
	for inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if got := inFlight.Load(); got != 2 {
		t.Errorf("%d asks in flight while they are held, want the bound, 2", got)
	}
	openGate()
	deadline = time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		total := len(asked)
		mu.Unlock()
		if total >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"n1", "n2", "n3", "n4", "n5"} {
		if asked[name] != 1 {
			t.Errorf("%s asked %d times, want once", name, asked[name])
		}
	}
	for _, name := range []string{"away", "stale"} {
		if asked[name] != 0 {
			t.Errorf("%s asked %d times, want never", name, asked[name])
		}
	}
	if m := most.Load(); m > 2 {
		t.Errorf("%d asks were in flight at once, want at most 2", m)
	}
	if s, f := n.sent.Load(), n.failed.Load(); s != 4 || f != 1 {
		t.Errorf("counted %d sent and %d failed, want 4 and 1", s, f)
	}
}
