package edge_test

import (
	"context"
	"testing"
	"time"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/metrics"
	"github.com/tether-edge/tether/internal/usage"
	"github.com/tether-edge/tether/tunnel"
)

// fakeTunnel records pushes, decoding them as the hub does: one decoder
// per connection.
type fakeTunnel struct {
	conn    uint64
	decoded map[uint64]*usage.Decoder
	samples []usage.Sample
	err     error
}

func (f *fakeTunnel) Conn() uint64 { return f.conn }

func (f *fakeTunnel) Push(conn uint64, payload []byte) error {
	if conn != f.conn || conn == 0 {
		return tunnel.ErrConnChanged
	}
	d := f.decoded[conn]
	if d == nil {
		d = &usage.Decoder{}
		f.decoded[conn] = d
	}
	s, err := d.Decode(payload)
	if err != nil {
		f.err = err
		return nil
	}
	f.samples = append(f.samples, s)
	return nil
}

// fakeStats is a node whose counters advance by a fixed amount per
// reading, 10s apart.
type fakeStats struct {
	now   time.Time
	cpu   time.Duration
	ctr   time.Duration
	start time.Time
	pods  int
}

func (f *fakeStats) Stats(context.Context) (metrics.Snapshot, error) {
	f.now = f.now.Add(10 * time.Second)
	f.cpu += 5 * time.Second // half a core
	f.ctr += 2 * time.Second // 200m
	s := metrics.Snapshot{Time: f.now, Node: metrics.Node{CPU: f.cpu, Memory: metrics.Memory{WorkingSet: 1 << 30}}}
	for i := range f.pods {
		name := string(rune('a' + i))
		s.Pods = append(s.Pods, metrics.Pod{Namespace: "default", Name: name, Containers: []metrics.Container{
			{Name: "app", ID: "sim://" + name, StartTime: f.start, Stats: metrics.Cgroup{CPU: f.ctr, Memory: metrics.Memory{WorkingSet: 64 << 20}}},
		}})
	}
	return s, nil
}

// TestUsagePusher: no sample while disconnected, rates over the window
// between readings, and a full sample to a new decoder on every new
// connection.
func TestUsagePusher(t *testing.T) {
	ft := &fakeTunnel{decoded: map[uint64]*usage.Decoder{}}
	st := &fakeStats{now: time.Unix(1_800_000_000, 0), start: time.Unix(1_799_999_000, 0), pods: 2}
	p := edge.NewUsagePusher(st, ft)
	p.Tick() // the first reading: nothing to push yet
	p.Tick() // disconnected
	if len(ft.samples) != 0 || p.Pushes() != 0 {
		t.Fatalf("pushed while disconnected: %d", len(ft.samples))
	}
	ft.conn = 1
	p.Tick()
	p.Tick()
	if len(ft.samples) != 2 || ft.err != nil {
		t.Fatalf("%d samples on connection 1 (%v), want 2", len(ft.samples), ft.err)
	}
	s := ft.samples[1]
	if s.Window != 10*time.Second || s.Node.CPUNanoCores != 500_000_000 || s.Node.MemoryWorkingSetBytes != 1<<30 {
		t.Errorf("sample %+v", s)
	}
	if len(s.Pods) != 2 || s.Pods[0].Name != "a" || s.Pods[1].Containers[0].Usage.CPUNanoCores != 200_000_000 {
		t.Errorf("pods %+v", s.Pods)
	}
	// A new connection, the same pods: its decoder has seen nothing,
	// and decodes what comes.
	ft.conn = 2
	p.Tick()
	if len(ft.samples) != 3 || ft.err != nil || len(ft.samples[2].Pods) != 2 {
		t.Fatalf("after a reconnection: %d samples, err %v", len(ft.samples), ft.err)
	}
	if p.Pushes() != 3 {
		t.Errorf("%d pushes counted, want 3", p.Pushes())
	}
}
