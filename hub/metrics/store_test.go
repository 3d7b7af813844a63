package metrics

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/usage"
)

// clock is a settable clock for tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// session stands for a tunnel session in tests.
type session struct {
	node string
	done chan struct{}
}

func newSession(node string) *session { return &session{node: node, done: make(chan struct{})} }

func (s *session) push(st *Store, payload []byte) { st.push(s, s.node, s.done, payload) }

func sampleOf(t time.Time, cpu uint64, pods ...usage.Pod) usage.Sample {
	return usage.Sample{Time: t, Window: 15 * time.Second, Node: usage.Resources{CPUNanoCores: cpu, MemoryWorkingSetBytes: 1 << 30}, Pods: pods}
}

func pod(ns, name string, cpu uint64) usage.Pod {
	return usage.Pod{Namespace: ns, Name: name, Containers: []usage.Container{{Name: "app", Usage: usage.Resources{CPUNanoCores: cpu, MemoryWorkingSetBytes: 64 << 20}}}}
}

func encode(t testing.TB, e *usage.Encoder, s usage.Sample) []byte {
	t.Helper()
	b, err := e.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStoreKeepsLatestSample: full samples and changes decode, the
// latest is served, pods are found by name whatever order the edge sent.
func TestStoreKeepsLatestSample(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	st := NewStore(Config{Now: c.now})
	s := newSession("n1")
	var e usage.Encoder
	s.push(st, encode(t, &e, sampleOf(c.now(), 1e9, pod("z", "b", 5e6), pod("a", "c", 7e6))))
	s.push(st, encode(t, &e, sampleOf(c.now().Add(15*time.Second), 2e9, pod("z", "b", 6e6), pod("a", "c", 8e6))))
	n, ok := st.Node("n1")
	if !ok || n.Usage.CPUNanoCores != 2e9 || !n.Time.Equal(c.now().Add(15*time.Second)) || n.Window != 15*time.Second {
		t.Fatalf("Node = %+v, %v", n, ok)
	}
	p, ok := st.Pod("n1", "z", "b")
	if !ok || len(p.Containers) != 1 || p.Containers[0].Usage.CPUNanoCores != 6e6 || p.Containers[0].Name != "app" {
		t.Fatalf("Pod = %+v, %v", p, ok)
	}
	if _, ok := st.Pod("n1", "a", "b"); ok {
		t.Fatal("unknown pod found")
	}
	if _, ok := st.Pod("n2", "z", "b"); ok {
		t.Fatal("pod found on a node without a sample")
	}
	if got := st.Stats(); got.Nodes != 1 || got.Decoded != 2 || got.Refused != 0 || got.Bytes == 0 {
		t.Fatalf("Stats = %+v", got)
	}
}

// TestStoreRefusesBadPayloads: undecodable payloads and changes without
// a full sample are dropped and counted, and keep the last good sample.
func TestStoreRefusesBadPayloads(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	st := NewStore(Config{Now: c.now})
	var e usage.Encoder
	full := encode(t, &e, sampleOf(c.now(), 1e9))
	changes := encode(t, &e, sampleOf(c.now(), 3e9))

	s := newSession("n1")
	s.push(st, changes) // a delta without its base, as after a hub restart race
	s.push(st, []byte{0xff, 0, 1})
	if _, ok := st.Node("n1"); ok {
		t.Fatal("refused payloads made a sample")
	}
	s.push(st, full)
	s.push(st, []byte{1})
	if n, ok := st.Node("n1"); !ok || n.Usage.CPUNanoCores != 1e9 {
		t.Fatalf("Node = %+v, %v", n, ok)
	}
	if got := st.Stats(); got.Decoded != 1 || got.Refused != 3 {
		t.Fatalf("Stats = %+v", got)
	}
}

// TestStoreForgetsEndedSessions: a node's sample goes when its session
// ends, but not when an older session of the node ends after a newer one
// took over.
func TestStoreForgetsEndedSessions(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	st := NewStore(Config{Now: c.now})
	old, cur := newSession("n1"), newSession("n1")
	var e1, e2 usage.Encoder
	old.push(st, encode(t, &e1, sampleOf(c.now(), 1e9)))
	cur.push(st, encode(t, &e2, sampleOf(c.now(), 2e9)))
	close(old.done)
	waitFor(t, func() bool { st.mu.RLock(); defer st.mu.RUnlock(); return len(st.streams) == 1 })
	if n, ok := st.Node("n1"); !ok || n.Usage.CPUNanoCores != 2e9 {
		t.Fatalf("Node after the old session ended = %+v, %v", n, ok)
	}
	close(cur.done)
	waitFor(t, func() bool { _, ok := st.Node("n1"); return !ok })
	cur.push(st, encode(t, &e2, sampleOf(c.now(), 2e9))) // after the end: ignored
	if _, ok := st.Node("n1"); ok {
		t.Fatal("a payload of an ended session made a sample")
	}
}

// TestStoreExpiresOldSamples: a sample is served for three windows, and
// at least a minute.
func TestStoreExpiresOldSamples(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	st := NewStore(Config{Now: c.now})
	s := newSession("n1")
	var e usage.Encoder
	short := sampleOf(c.now(), 1e9)
	short.Window = 5 * time.Second
	s.push(st, encode(t, &e, short))
	c.add(59 * time.Second)
	if _, ok := st.Node("n1"); !ok {
		t.Fatal("sample expired before a minute")
	}
	c.add(2 * time.Second)
	if _, ok := st.Node("n1"); ok {
		t.Fatal("sample served after a minute")
	}
	if st.Stats().Nodes != 0 {
		t.Fatal("expired sample counted")
	}
	long := sampleOf(c.now(), 1e9)
	long.Window = 40 * time.Second
	s.push(st, encode(t, &e, long))
	c.add(119 * time.Second)
	if _, ok := st.Node("n1"); !ok {
		t.Fatal("sample expired before three windows")
	}
	c.add(2 * time.Second)
	if _, ok := st.Node("n1"); ok {
		t.Fatal("sample served after three windows")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fillStore pushes nodes × pods (two containers each) through one
// session per node: a full sample, then one of changes, as edges do.
func fillStore(tb testing.TB, nodes, pods int) (*Store, []*session) {
	st := NewStore(Config{})
	sessions := make([]*session, nodes)
	now := time.Now()
	for n := range nodes {
		s := newSession(fmt.Sprintf("edge-%04d", n))
		sessions[n] = s
		smp := sampleOf(now, 1e9)
		for p := range pods {
			smp.Pods = append(smp.Pods, usage.Pod{Namespace: fmt.Sprintf("team-%d", p%5), Name: fmt.Sprintf("web-%04d-%02d-7d9f8b6c5-x2k4q", n, p),
				Containers: []usage.Container{
					{Name: "app", Usage: usage.Resources{CPUNanoCores: uint64(p) * 1e6, MemoryWorkingSetBytes: 100 << 20}},
					{Name: "sidecar", Usage: usage.Resources{CPUNanoCores: 1e6, MemoryWorkingSetBytes: 20 << 20}},
				}})
		}
		var e usage.Encoder
		s.push(st, encode(tb, &e, smp))
		smp.Time = smp.Time.Add(15 * time.Second)
		smp.Node.CPUNanoCores++
		s.push(st, encode(tb, &e, smp))
	}
	return st, sessions
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestStoreMemory: the samples of 2,000 nodes × 30 pods (two containers
// each), with their decoders, stay well below 150 MB of heap.
func TestStoreMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 60,000 pods")
	}
	before := heapInUse()
	st, sessions := fillStore(t, 2000, 30)
	after := heapInUse()
	if st.Stats().Nodes != 2000 {
		t.Fatalf("nodes with samples: %d", st.Stats().Nodes)
	}
	used := int64(after) - int64(before)
	t.Logf("heap for 2,000 nodes × 30 pods: %.1f MB (%d bytes per pod)", float64(used)/1e6, used/60000)
	benchfmt.Report(t, benchfmt.Figure{Name: "metrics_store_heap_2000_nodes_30_pods", Value: float64(used) / 1e6, Unit: "MB",
		Target: "<=150", Mode: benchfmt.Mode(false), Extra: []string{fmt.Sprintf("bytes_per_pod=%d", used/60000)}})
	if used > 150e6 {
		t.Fatalf("heap %d bytes, want at most 150 MB", used)
	}
	runtime.KeepAlive(st)
	runtime.KeepAlive(sessions)
}

// BenchmarkStoreMemory reports the heap of 2,000 nodes × 30 pods.
func BenchmarkStoreMemory(b *testing.B) {
	for b.Loop() {
		before := heapInUse()
		st, sessions := fillStore(b, 2000, 30)
		after := heapInUse()
		b.ReportMetric(float64(int64(after)-int64(before))/1e6, "heap-MB")
		runtime.KeepAlive(st)
		runtime.KeepAlive(sessions)
	}
}

// TestQuantities: usage is written as metrics-server writes it, CPU in
// nanocores and memory in bytes, both canonical quantities.
func TestQuantities(t *testing.T) {
	for _, c := range []struct {
		got  func() string
		want string
	}{
		{func() string { q := cpuQuantity(43629237); return q.String() }, "43629237n"},
		{func() string { q := cpuQuantity(123456000); return q.String() }, "123456u"},
		{func() string { q := cpuQuantity(250_000_000); return q.String() }, "250m"},
		{func() string { q := memoryQuantity(634824 << 10); return q.String() }, "634824Ki"},
		{func() string { q := memoryQuantity(64 << 20); return q.String() }, "64Mi"},
	} {
		if got := c.got(); got != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}
