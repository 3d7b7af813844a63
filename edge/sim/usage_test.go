package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge/metrics"
)

func stats(t *testing.T, r *Runtime) metrics.Snapshot {
	t.Helper()
	s, err := r.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func findContainer(s metrics.Snapshot, pod, name string) (metrics.Container, bool) {
	for _, p := range s.Pods {
		for _, c := range p.Containers {
			if p.Name == pod && c.Name == name {
				return c, true
			}
		}
	}
	return metrics.Container{}, false
}

func TestAnnotatedUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{StartDelay: time.Second})
		p := testPod("web", corev1.RestartPolicyAlways, map[string]string{
			CPUUsage: "250m", MemoryUsage: "64Mi", CPUUsage + ".side": "1", MemoryUsage + ".side": "bogus",
		}, "app", "side")
		syncPod(t, r, p)
		// Not started yet: no containers, the node uses its base.
		s := stats(t, r)
		if len(s.Pods) != 0 || s.Node.WorkingSet != baseMemoryBytes {
			t.Fatalf("before the start: %+v", s)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		var sampler metrics.Sampler
		rates := func(s metrics.Snapshot) map[string]uint64 {
			out := map[string]uint64{}
			if r, ok := sampler.Rate("node", s.Time, s.Node.CPU, time.Time{}); ok {
				out["node"] = r
			}
			for _, p := range s.Pods {
				for _, c := range p.Containers {
					if r, ok := sampler.Rate(c.ID, s.Time, c.Stats.CPU, c.StartTime); ok {
						out[c.Name] = r
					}
				}
			}
			sampler.Done()
			return out
		}
		rates(stats(t, r))
		time.Sleep(10 * time.Second)
		s = stats(t, r)
		got := rates(s)
		if got["app"] != 250_000_000 || got["side"] != 1_000_000_000 || got["node"] != 1_300_000_000 {
			t.Errorf("rates %v, want app 250m, side 1, node 1300m", got)
		}
		app, _ := findContainer(s, "web", "app")
		side, _ := findContainer(s, "web", "side")
		if app.Stats.WorkingSet != 64<<20 || side.Stats.WorkingSet != 0 {
			t.Errorf("working sets app %d side %d, want 64Mi and 0", app.Stats.WorkingSet, side.Stats.WorkingSet)
		}
		if app.Stats.CPU != 2500*time.Millisecond { // 10s at 250m
			t.Errorf("app cpu %v, want 2.5s", app.Stats.CPU)
		}
		if want := uint64(baseMemoryBytes + 64<<20); s.Node.WorkingSet != want {
			t.Errorf("node working set %d, want %d", s.Node.WorkingSet, want)
		}

		// kubectl annotate on the running pod: the agent syncs it again.
		p = p.DeepCopy()
		p.Annotations[CPUUsage] = "500m"
		p.Annotations[MemoryUsage] = "1Gi"
		time.Sleep(5 * time.Second)
		syncPod(t, r, p)
		time.Sleep(5 * time.Second)
		s = stats(t, r)
		got = rates(s)
		// 5s at 250m then 5s at 500m.
		if got["app"] != 375_000_000 {
			t.Errorf("app rate across the change %d, want 375m", got["app"])
		}
		time.Sleep(10 * time.Second)
		s = stats(t, r)
		if got = rates(s); got["app"] != 500_000_000 || got["node"] != 1_550_000_000 {
			t.Errorf("rates after the change %v, want app 500m, node 1550m", got)
		}
		if app, _ = findContainer(s, "web", "app"); app.Stats.WorkingSet != 1<<30 {
			t.Errorf("app working set %d, want 1Gi", app.Stats.WorkingSet)
		}

		// A killed pod reports nothing; the node's counter never goes back.
		before := s.Node.CPU
		if err := r.KillPod(context.Background(), p.UID, 0); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		time.Sleep(time.Second)
		s = stats(t, r)
		if len(s.Pods) != 0 || s.Node.CPU < before || s.Node.WorkingSet != baseMemoryBytes {
			t.Errorf("after kill: pods %d, node cpu %v (before %v), working set %d", len(s.Pods), s.Node.CPU, before, s.Node.WorkingSet)
		}
	})
}

// TestUsageJitter: with UsageJitter each reading's CPU rate and working
// set move within their bounds around the annotated usage, the counter
// never goes back, and two runtimes draw the same sequence.
func TestUsageJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		readings := func() []metrics.Container {
			r := New(Config{UsageJitter: 0.3})
			syncPod(t, r, testPod("web", corev1.RestartPolicyAlways, map[string]string{CPUUsage: "200m", MemoryUsage: "60Mi"}, "app"))
			time.Sleep(time.Second)
			synctest.Wait()
			var out []metrics.Container
			for range 20 {
				time.Sleep(5 * time.Second)
				c, ok := findContainer(stats(t, r), "web", "app")
				if !ok {
					t.Fatal("no container app")
				}
				out = append(out, c)
			}
			return out
		}
		a, b := readings(), readings()
		rates := map[time.Duration]bool{}
		for i := 1; i < len(a); i++ {
			d := a[i].Stats.CPU - a[i-1].Stats.CPU
			if d < 700*time.Millisecond || d > 1300*time.Millisecond { // 5s at 200m ± 30%
				t.Errorf("reading %d: %v of CPU in 5s, want within 200m ± 30%%", i, d)
			}
			rates[d] = true
			if ws := a[i].Stats.WorkingSet; ws < 58<<20 || ws > 62<<20 {
				t.Errorf("reading %d: working set %d, want within 60Mi ± 2%%", i, ws)
			}
			if a[i].Stats != b[i].Stats {
				t.Errorf("reading %d differs between runtimes: %+v and %+v", i, a[i].Stats, b[i].Stats)
			}
		}
		if len(rates) < 10 {
			t.Errorf("only %d distinct rates in 19 readings", len(rates))
		}
	})
}
