package nodes

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// TestNodeStatusHeartbeatsFromMemory patches a Node's status the way an
// agent reports it (a strategic merge patch of its conditions) through an
// API server whose storage Heartbeats serves: a report that only moves the
// heartbeats is not stored, reads show it, watches are not told of it; a
// report that changes anything else is stored as ever.
func TestNodeStatusHeartbeatsFromMemory(t *testing.T) {
	ctx := context.Background()
	sq, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "hub.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sq.Close() })
	st := &countingStore{Store: sq}
	stg := newStorageOn(t, st, storage.Config{})
	beats := NewHeartbeats()
	api, err := apiserver.New(apiserver.Config{Storage: beats.Serve(stg), Kinds: registry.All(), Authenticator: admin{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(api.Handler())
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	client := kubernetes.NewForConfigOrDie(cfg)
	protoCfg := rest.CopyConfig(cfg)
	protoCfg.ContentType = "application/vnd.kubernetes.protobuf"
	protoClient := kubernetes.NewForConfigOrDie(protoCfg)

	t0 := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	conds := func(beat metav1.Time, readyReason string) []corev1.NodeCondition {
		return []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: readyReason, LastHeartbeatTime: beat, LastTransitionTime: t0},
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "Enough", LastHeartbeatTime: beat, LastTransitionTime: t0},
		}
	}
	report := func(beat metav1.Time, readyReason string) *corev1.Node {
		t.Helper()
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": conds(beat, readyReason)}})
		if err != nil {
			t.Fatal(err)
		}
		n, err := client.CoreV1().Nodes().Patch(ctx, "shop-1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		if err != nil {
			t.Fatalf("status patch: %v", err)
		}
		return n
	}
	readyBeat := func(n *corev1.Node) time.Time {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.LastHeartbeatTime.Time
			}
		}
		return time.Time{}
	}

	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "shop-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stored := report(t0, "Running")
	w, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: stored.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	writes := st.nodeWrites.Load()

	// A heartbeat: nothing stored, the reply and every read show it.
	t1 := metav1.NewTime(t0.Add(5 * time.Minute))
	got := report(t1, "Running")
	if n := st.nodeWrites.Load() - writes; n != 0 {
		t.Errorf("a heartbeat-only report wrote the Node %d times, want 0", n)
	}
	if got.ResourceVersion != stored.ResourceVersion || !readyBeat(got).Equal(t1.Time) {
		t.Errorf("reply: resourceVersion %s heartbeat %v, want %s and %v", got.ResourceVersion, readyBeat(got), stored.ResourceVersion, t1)
	}
	for name, c := range map[string]*kubernetes.Clientset{"json": client, "protobuf": protoClient} {
		n, err := c.CoreV1().Nodes().Get(ctx, "shop-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !readyBeat(n).Equal(t1.Time) || n.ResourceVersion != stored.ResourceVersion {
			t.Errorf("%s GET: heartbeat %v resourceVersion %s, want %v and %s", name, readyBeat(n), n.ResourceVersion, t1, stored.ResourceVersion)
		}
		l, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 || !readyBeat(&l.Items[0]).Equal(t1.Time) {
			t.Errorf("%s LIST: %d nodes, heartbeat %v, want 1 with %v", name, len(l.Items), readyBeat(&l.Items[0]), t1)
		}
	}
	select {
	case ev := <-w.ResultChan():
		t.Errorf("a watch was told of a heartbeat-only report: %s", ev.Type)
	case <-time.After(300 * time.Millisecond):
	}
	if v := beats.held.Load(); v != 1 {
		t.Errorf("heartbeats held counter %v, want 1", v)
	}

	// A heartbeat older than the stored one is not a heartbeat: it is
	// stored as the client wrote it, and reads go on showing the later one
	// held.
	writes = st.nodeWrites.Load()
	report(metav1.NewTime(t0.Add(-time.Minute)), "Running")
	if n := st.nodeWrites.Load() - writes; n != 1 {
		t.Errorf("a report moving heartbeats back wrote the Node %d times, want 1", n)
	}
	if n, err := client.CoreV1().Nodes().Get(ctx, "shop-1", metav1.GetOptions{}); err != nil || !readyBeat(n).Equal(t1.Time) {
		t.Errorf("GET after an older stored heartbeat: %v %v, want the held %v", readyBeat(n), err, t1)
	}
	drain(t, w, 1)

	// A report that changes something else is stored, heartbeats
	// included, and watches see it.
	t2 := metav1.NewTime(t1.Add(time.Minute))
	writes = st.nodeWrites.Load()
	got = report(t2, "KubeletReady")
	if n := st.nodeWrites.Load() - writes; n != 1 {
		t.Errorf("a report with a new reason wrote the Node %d times, want 1", n)
	}
	if !readyBeat(got).Equal(t2.Time) || got.ResourceVersion == stored.ResourceVersion {
		t.Errorf("reply: heartbeat %v resourceVersion %s, want %v and a new revision", readyBeat(got), got.ResourceVersion, t2)
	}
	if ev := drain(t, w, 1); !readyBeat(ev.Object.(*corev1.Node)).Equal(t2.Time) {
		t.Errorf("the watch saw heartbeat %v, want %v", readyBeat(ev.Object.(*corev1.Node)), t2)
	}
	if left := heldNodes(beats); left != 0 {
		t.Errorf("%d nodes' heartbeats still held after a stored report caught up", left)
	}

	// Deleting the Node drops what is held for it.
	report(metav1.NewTime(t2.Add(time.Minute)), "KubeletReady")
	if err := client.CoreV1().Nodes().Delete(ctx, "shop-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if left := heldNodes(beats); left != 0 {
		t.Errorf("%d nodes' heartbeats still held after the Node was deleted", left)
	}

	// So does deleting a collection of them.
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "shop-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	report(t0, "Running")
	report(t1, "Running")
	if err := client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if left := heldNodes(beats); left != 0 {
		t.Errorf("%d nodes' heartbeats still held after their collection was deleted", left)
	}
}

// drain returns the last of n events from w.
func drain(t *testing.T, w watch.Interface, n int) watch.Event {
	t.Helper()
	var ev watch.Event
	for i := 0; i < n; i++ {
		select {
		case ev = <-w.ResultChan():
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d of %d did not come", i+1, n)
		}
	}
	return ev
}

// heldNodes returns how many Nodes have heartbeats held.
func heldNodes(h *Heartbeats) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.beats)
}
