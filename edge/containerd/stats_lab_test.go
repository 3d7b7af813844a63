package containerd

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/metrics"
	"github.com/tether-edge/tether/testbench/images"
)

// rawCgroup reads a container's CPU time and working set straight from
// its cgroup files, apart from edge/metrics, on cgroup v2 or v1.
func rawCgroup(t *testing.T, id string) (cpu time.Duration, ws uint64) {
	t.Helper()
	cpu, ws, err := readCgroup(id)
	if err != nil {
		t.Fatal(err)
	}
	return cpu, ws
}

// readCgroup is rawCgroup for any goroutine: it returns what fails.
func readCgroup(id string) (cpu time.Duration, ws uint64, err error) {
	num := func(path, key string) uint64 {
		if err != nil {
			return 0
		}
		b, rerr := os.ReadFile(path)
		if rerr != nil {
			err = rerr
			return 0
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if key == "" && len(f) == 1 || len(f) == 2 && f[0] == key {
				n, perr := strconv.ParseUint(f[len(f)-1], 10, 64)
				if perr != nil {
					err = fmt.Errorf("parse %s: %w", path, perr)
				}
				return n
			}
		}
		err = fmt.Errorf("read %s: no %q", path, key)
		return 0
	}
	if _, serr := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); serr == nil {
		dir := filepath.Join(cgroupRoot, Namespace, id)
		cpu = time.Duration(num(filepath.Join(dir, "cpu.stat"), "usage_usec")) * time.Microsecond
		usage, inactive := num(filepath.Join(dir, "memory.current"), ""), num(filepath.Join(dir, "memory.stat"), "inactive_file")
		return cpu, usage - min(usage, inactive), err
	}
	cpu = time.Duration(num(filepath.Join(cgroupRoot, "cpuacct", Namespace, id, "cpuacct.usage"), ""))
	mem := filepath.Join(cgroupRoot, "memory", Namespace, id)
	usage, inactive := num(filepath.Join(mem, "memory.usage_in_bytes"), ""), num(filepath.Join(mem, "memory.stat"), "total_inactive_file")
	return cpu, usage - min(usage, inactive), err
}

// TestRuntimeStats runs a pod with a container burning half a core and
// one holding 32 MiB: the runtime's Stats, the rates a Sampler makes of
// them and /metrics/resource agree with the containers' cgroups, read
// apart, over the same window.
func TestRuntimeStats(t *testing.T) {
	e := newTestRuntime(t, "10.231.7.0/24")
	pod := testPod("usage",
		corev1.Container{Name: "burn", Image: images.Burner, Env: []corev1.EnvVar{{Name: "BURN_MILLICORES", Value: "500"}}},
		corev1.Container{Name: "hog", Image: images.MemHog, Args: []string{"memhog", "32"}},
	)
	e.syncUntil(t, pod, 30*time.Second, "burn and hog running", func(st *edge.PodStatus) bool {
		return running("burn")(st) && running("hog")(st)
	})
	ids := map[string]string{"burn": containerID(pod.UID, "burn", 0), "hog": containerID(pod.UID, "hog", 0)}
	ctx := context.Background()
	read := func() (metrics.Snapshot, map[string]time.Duration, map[string]uint64, time.Time) {
		s, err := e.rt.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cpu, ws := map[string]time.Duration{}, map[string]uint64{}
		for name, id := range ids {
			cpu[name], ws[name] = rawCgroup(t, id)
		}
		return s, cpu, ws, time.Now()
	}
	// Let the hog allocate and the burner settle.
	time.Sleep(time.Second)

	var sampler metrics.Sampler
	rates := func(s metrics.Snapshot) map[string]uint64 {
		out := map[string]uint64{}
		for _, p := range s.Pods {
			for _, c := range p.Containers {
				if r, ok := sampler.Rate(c.ID, s.Time, c.Stats.CPU, c.StartTime); ok && p.Name == "usage" {
					out[c.Name] = r
				}
			}
		}
		if r, ok := sampler.Rate("node", s.Time, s.Node.CPU, time.Time{}); ok {
			out["node"] = r
		}
		sampler.Done()
		return out
	}
	scrape := func() float64 {
		regs := metrics.NewRegistries(e.rt.Stats, 5*time.Second)
		srv := httptest.NewServer(metrics.Handler(regs.Resource, nil))
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fams["container_cpu_usage_seconds_total"].GetMetric() {
			if labelsOf(m)["container"] == "burn" && labelsOf(m)["pod"] == "usage" {
				return m.GetCounter().GetValue()
			}
		}
		t.Fatal("no container_cpu_usage_seconds_total of burn")
		return 0
	}

	s1, cpu1, _, t1 := read()
	rates(s1)
	prom1, pt1 := scrape(), time.Now()
	pcpu1, _ := rawCgroup(t, ids["burn"])
	time.Sleep(3 * time.Second)
	s2, cpu2, ws2, t2 := read()
	got := rates(s2)
	prom2, pt2 := scrape(), time.Now()
	pcpu2, _ := rawCgroup(t, ids["burn"])

	for _, name := range []string{"burn", "hog"} {
		raw := float64(cpu2[name]-cpu1[name]) / t2.Sub(t1).Seconds()
		t.Logf("%s: reported %d nanocores, cgroup %.0f over the same window", name, got[name], raw)
		if name == "burn" && (float64(got[name]) < 0.9*raw || float64(got[name]) > 1.1*raw) {
			t.Errorf("%s: reported %d nanocores, the cgroup says %.0f", name, got[name], raw)
		}
	}
	// The burner gets its half core only when the node has one to spare:
	// what it gets is what the cgroup counts.
	promRate := (prom2 - prom1) / pt2.Sub(pt1).Seconds()
	rawRate := (pcpu2 - pcpu1).Seconds() / pt2.Sub(pt1).Seconds()
	t.Logf("burn: container_cpu_usage_seconds_total rose at %.3f cores, the cgroup at %.3f; node %d nanocores", promRate, rawRate, got["node"])
	if promRate < 0.9*rawRate || promRate > 1.1*rawRate || promRate < 0.05 || promRate > 0.6 {
		t.Errorf("container_cpu_usage_seconds_total of a 500m burner rose at %.3f cores, its cgroup at %.3f", promRate, rawRate)
	}
	if got["node"] < got["burn"] {
		t.Errorf("node uses %d nanocores, less than its burner's %d", got["node"], got["burn"])
	}
	for _, p := range s2.Pods {
		for _, c := range p.Containers {
			if p.Name != "usage" {
				continue
			}
			raw := ws2[c.Name]
			t.Logf("%s: working set %d, cgroup %d", c.Name, c.Stats.WorkingSet, raw)
			if d := float64(c.Stats.WorkingSet) - float64(raw); d > 0.1*float64(raw) || -d > 0.1*float64(raw) {
				t.Errorf("%s: working set %d, the cgroup says %d", c.Name, c.Stats.WorkingSet, raw)
			}
			if c.Name == "hog" && c.Stats.WorkingSet < 32<<20 {
				t.Errorf("hog: working set %d, below the 32 MiB it holds", c.Stats.WorkingSet)
			}
		}
	}
	if s2.Node.WorkingSet == 0 || s2.Node.WorkingSet > s2.Node.Usage || len(s2.Node.Filesystems) != 2 {
		t.Errorf("node: %+v", s2.Node)
	}
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
