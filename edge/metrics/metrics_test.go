package metrics

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadCgroupV2(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "cgroup.controllers"), "cpu memory\n")
	dir := filepath.Join(root, "tether", "c1")
	write(t, filepath.Join(dir, "cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
	write(t, filepath.Join(dir, "memory.current"), "104857600\n")
	write(t, filepath.Join(dir, "memory.stat"), "anon 52428800\nfile 41943040\ninactive_file 20971520\nactive_file 1\n")
	h := OpenHierarchy(root)
	if !h.V2() {
		t.Fatal("hierarchy with cgroup.controllers not seen as v2")
	}
	c, err := h.Read("/tether/c1")
	if err != nil {
		t.Fatal(err)
	}
	want := Cgroup{CPU: 2500 * time.Millisecond, Memory: Memory{Usage: 100 << 20, WorkingSet: 80 << 20, RSS: 50 << 20, Cache: 40 << 20}}
	if c != want {
		t.Errorf("read %+v, want %+v", c, want)
	}
	// PSI present.
	write(t, filepath.Join(dir, "cpu.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=1500\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=700\n")
	write(t, filepath.Join(dir, "memory.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=9\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=3\n")
	c, err = h.Read("/tether/c1")
	if err != nil {
		t.Fatal(err)
	}
	if c.CPUPressure == nil || *c.CPUPressure != (Pressure{Some: 1500 * time.Microsecond, Full: 700 * time.Microsecond}) {
		t.Errorf("cpu pressure %+v", c.CPUPressure)
	}
	if c.MemoryPressure == nil || *c.MemoryPressure != (Pressure{Some: 9 * time.Microsecond, Full: 3 * time.Microsecond}) {
		t.Errorf("memory pressure %+v", c.MemoryPressure)
	}
	// Inactive file above usage: the working set is floored at zero.
	write(t, filepath.Join(dir, "memory.stat"), "anon 1\nfile 2\ninactive_file 209715200\n")
	if c, err = h.Read("/tether/c1"); err != nil || c.WorkingSet != 0 {
		t.Errorf("working set %d (%v), want 0", c.WorkingSet, err)
	}
	// A cgroup that is gone is an error.
	if _, err := h.Read("/tether/gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read of a missing cgroup: %v", err)
	}
}

func TestReadCgroupV1(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "cpu,cpuacct", "tether", "c1", "cpuacct.usage"), "3000000000\n")
	mem := filepath.Join(root, "memory", "tether", "c1")
	write(t, filepath.Join(mem, "memory.usage_in_bytes"), "1000\n")
	write(t, filepath.Join(mem, "memory.stat"), "cache 9\nrss 9\ntotal_cache 600\ntotal_rss 300\ntotal_inactive_file 250\n")
	h := OpenHierarchy(root)
	if h.V2() {
		t.Fatal("v1 hierarchy seen as v2")
	}
	c, err := h.Read("/tether/c1")
	if err != nil {
		t.Fatal(err)
	}
	want := Cgroup{CPU: 3 * time.Second, Memory: Memory{Usage: 1000, WorkingSet: 750, RSS: 300, Cache: 600}}
	if c != want {
		t.Errorf("read %+v, want %+v", c, want)
	}
}

const meminfo = `MemTotal:        4000000 kB
MemFree:         1000000 kB
MemAvailable:    2500000 kB
Cached:          1200000 kB
AnonPages:        900000 kB
Inactive(file):   700000 kB
`

func TestReadNode(t *testing.T) {
	proc := t.TempDir()
	write(t, filepath.Join(proc, "stat"), "cpu  100 20 30 5000 40 5 6 7 50 60\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n")
	write(t, filepath.Join(proc, "meminfo"), meminfo)
	root := t.TempDir()
	write(t, filepath.Join(root, "cgroup.controllers"), "cpu memory\n")
	n, err := ReadNode(proc, OpenHierarchy(root))
	if err != nil {
		t.Fatal(err)
	}
	// user+nice+system+irq+softirq+steal = 168 ticks of 10ms.
	if n.CPU != 1680*time.Millisecond {
		t.Errorf("node cpu %v, want 1.68s", n.CPU)
	}
	// No root memory.stat: Inactive(file) of meminfo.
	if want := (Memory{Usage: 3000000 << 10, WorkingSet: 2300000 << 10, RSS: 900000 << 10, Cache: 1200000 << 10}); n.Memory != want {
		t.Errorf("node memory %+v, want %+v", n.Memory, want)
	}
	if n.CPUPressure != nil || n.MemoryPressure != nil {
		t.Errorf("pressure without PSI files: %v %v", n.CPUPressure, n.MemoryPressure)
	}
	// The root's memory.stat wins, and PSI is read.
	write(t, filepath.Join(root, "memory.stat"), "anon 100\nfile 200\ninactive_file 1024000000\n")
	write(t, filepath.Join(proc, "pressure", "cpu"), "some avg10=1.00 avg60=0.00 avg300=0.00 total=42\n")
	if n, err = ReadNode(proc, OpenHierarchy(root)); err != nil {
		t.Fatal(err)
	}
	if want := (Memory{Usage: 3000000 << 10, WorkingSet: 3000000<<10 - 1024000000, RSS: 100, Cache: 200}); n.Memory != want {
		t.Errorf("node memory %+v, want %+v", n.Memory, want)
	}
	if n.CPUPressure == nil || n.CPUPressure.Some != 42*time.Microsecond {
		t.Errorf("node cpu pressure %+v", n.CPUPressure)
	}
	// cgroup v1: the root cgroup's usage and total_inactive_file.
	v1 := t.TempDir()
	write(t, filepath.Join(v1, "cpuacct", "cpuacct.usage"), "5\n")
	write(t, filepath.Join(v1, "memory", "memory.usage_in_bytes"), "5000\n")
	write(t, filepath.Join(v1, "memory", "memory.stat"), "total_inactive_file 1000\ntotal_rss 10\ntotal_cache 20\n")
	if n, err = ReadNode(proc, OpenHierarchy(v1)); err != nil {
		t.Fatal(err)
	}
	if want := (Memory{Usage: 5000, WorkingSet: 4000, RSS: 10, Cache: 20}); n.Memory != want {
		t.Errorf("node memory on v1 %+v, want %+v", n.Memory, want)
	}
}

func TestReadFilesystem(t *testing.T) {
	f, err := ReadFilesystem("agent", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if f.Capacity == 0 || f.Used > f.Capacity || f.Available > f.Capacity {
		t.Errorf("filesystem %+v", f)
	}
}

func TestSamplerRates(t *testing.T) {
	var s Sampler
	t0 := time.Unix(1000, 0)
	start := t0.Add(-10 * time.Second)
	// First reading with a start time: the average since the start.
	if r, ok := s.Rate("c", t0, 5*time.Second, start); !ok || r != 500_000_000 {
		t.Errorf("first rate %d %v, want 500000000", r, ok)
	}
	// First reading without a start time: no rate.
	if _, ok := s.Rate("node", t0, time.Hour, time.Time{}); ok {
		t.Error("rate of a counter read once")
	}
	s.Done()
	t1 := t0.Add(15 * time.Second)
	if r, ok := s.Rate("c", t1, 8*time.Second, start); !ok || r != 200_000_000 {
		t.Errorf("rate %d %v, want 200000000 (3s over 15s)", r, ok)
	}
	if r, ok := s.Rate("node", t1, time.Hour+30*time.Second, time.Time{}); !ok || r != 2_000_000_000 {
		t.Errorf("node rate %d %v, want 2 cores", r, ok)
	}
	s.Done()
	// The container restarted: a new start, the counter starts over.
	t2 := t1.Add(15 * time.Second)
	restart := t1.Add(5 * time.Second)
	if r, ok := s.Rate("c", t2, 5*time.Second, restart); !ok || r != 500_000_000 {
		t.Errorf("rate after restart %d %v, want 500000000 (5s over 10s)", r, ok)
	}
	// The node's counter went backwards (reboot), no start: no rate.
	if _, ok := s.Rate("node", t2, time.Second, time.Time{}); ok {
		t.Error("rate of a counter that went backwards")
	}
	s.Done()
	// Counters not read in a round are forgotten.
	s.Rate("node", t2.Add(time.Second), 2*time.Second, time.Time{})
	s.Done()
	if _, ok := s.Rate("c", t2.Add(2*time.Second), 6*time.Second, time.Time{}); ok {
		t.Error("a forgotten counter still has a previous reading")
	}
}

func testSnapshot() Snapshot {
	at := time.Unix(1700000000, 0)
	return Snapshot{
		Time: at,
		Node: Node{CPU: 90 * time.Second, Memory: Memory{Usage: 2000, WorkingSet: 1500, RSS: 700, Cache: 800},
			CPUPressure: &Pressure{Some: time.Second},
			Filesystems: []Filesystem{{Name: "agent", Path: "/var/lib/tether", Capacity: 100, Used: 40, Available: 60, Inodes: 10, InodesFree: 5}}},
		Pods: []Pod{{Namespace: "default", Name: "web", Containers: []Container{
			{Name: "app", ID: "containerd://abc", Image: "docker.io/tether/burner:v1", Cgroup: "/tether/abc", StartTime: at.Add(-time.Minute),
				Stats: Cgroup{CPU: 3 * time.Second, Memory: Memory{Usage: 300, WorkingSet: 200}}},
			{Name: "side", ID: "containerd://def", StartTime: at.Add(-time.Minute),
				Stats: Cgroup{CPU: time.Second, Memory: Memory{WorkingSet: 50}}},
		}}},
	}
}

func scrape(t *testing.T, read ReadFunc, path string) map[string]*dto.MetricFamily {
	t.Helper()
	regs := NewRegistries(read, time.Second)
	reg := regs.Resource
	if path == "cadvisor" {
		reg = regs.Cadvisor
	}
	srv := httptest.NewServer(Handler(reg, nil))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func labels(m *dto.Metric) string {
	var b []string
	for _, l := range m.GetLabel() {
		b = append(b, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(b, ",")
}

// value returns the value of the sample of family name whose labels are
// lbls, checking its timestamp.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name, lbls string, ts time.Time) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no %s", name)
	}
	for _, m := range f.GetMetric() {
		if labels(m) != lbls {
			continue
		}
		if !ts.IsZero() && m.GetTimestampMs() != ts.UnixMilli() {
			t.Errorf("%s{%s} timestamp %d, want %d", name, lbls, m.GetTimestampMs(), ts.UnixMilli())
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		default:
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s{%s}", name, lbls)
	return 0
}

func TestResourceExposition(t *testing.T) {
	s := testSnapshot()
	fams := scrape(t, func(context.Context) (Snapshot, error) { return s, nil }, "resource")
	checks := []struct {
		name, labels string
		want         float64
	}{
		{"node_cpu_usage_seconds_total", "", 90},
		{"node_memory_working_set_bytes", "", 1500},
		{"container_cpu_usage_seconds_total", "container=app,namespace=default,pod=web", 3},
		{"container_memory_working_set_bytes", "container=side,namespace=default,pod=web", 50},
		{"pod_cpu_usage_seconds_total", "namespace=default,pod=web", 4},
		{"pod_memory_working_set_bytes", "namespace=default,pod=web", 250},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels, s.Time); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	start := s.Pods[0].Containers[0].StartTime
	if got := value(t, fams, "container_start_time_seconds", "container=app,namespace=default,pod=web", start); got != float64(start.Unix()) {
		t.Errorf("container_start_time_seconds = %v, want %v", got, start.Unix())
	}
	if got := value(t, fams, "scrape_error", "", time.Time{}); got != 0 {
		t.Errorf("scrape_error %v", got)
	}
	if fams["node_cpu_usage_seconds_total"].GetType() != dto.MetricType_COUNTER || fams["node_memory_working_set_bytes"].GetType() != dto.MetricType_GAUGE {
		t.Error("wrong metric types")
	}
	// A failed read: scrape_error 1 and nothing else.
	fams = scrape(t, func(context.Context) (Snapshot, error) { return Snapshot{}, errors.New("boom") }, "resource")
	if got := value(t, fams, "scrape_error", "", time.Time{}); got != 1 {
		t.Errorf("scrape_error after a failed read %v", got)
	}
	if _, ok := fams["node_cpu_usage_seconds_total"]; ok {
		t.Error("node metrics after a failed read")
	}
}

func TestCadvisorExposition(t *testing.T) {
	s := testSnapshot()
	fams := scrape(t, func(context.Context) (Snapshot, error) { return s, nil }, "cadvisor")
	root := "container=,id=/,image=,name=,namespace=,pod="
	app := "container=app,id=/tether/abc,image=docker.io/tether/burner:v1,name=abc,namespace=default,pod=web"
	checks := []struct {
		name, labels string
		want         float64
	}{
		{"container_cpu_usage_seconds_total", root, 90},
		{"container_memory_working_set_bytes", root, 1500},
		{"container_memory_usage_bytes", root, 2000},
		{"container_memory_rss", root, 700},
		{"container_memory_cache", root, 800},
		{"container_pressure_cpu_waiting_seconds_total", root, 1},
		{"container_fs_usage_bytes", "container=,device=/var/lib/tether,id=/,image=,name=,namespace=,pod=", 40},
		{"container_fs_limit_bytes", "container=,device=/var/lib/tether,id=/,image=,name=,namespace=,pod=", 100},
		{"container_cpu_usage_seconds_total", app, 3},
		{"container_memory_usage_bytes", app, 300},
		{"container_memory_working_set_bytes", app, 200},
		{"container_start_time_seconds", app, float64(s.Time.Unix() - 60)},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels, s.Time); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// No PSI for the containers, none for the node's memory: no series.
	for _, m := range fams["container_pressure_cpu_waiting_seconds_total"].GetMetric() {
		if labels(m) != root {
			t.Errorf("pressure series without PSI: %s", labels(m))
		}
	}
	if _, ok := fams["container_pressure_memory_waiting_seconds_total"]; ok {
		t.Error("memory pressure without PSI")
	}
}
