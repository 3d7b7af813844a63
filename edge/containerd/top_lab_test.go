package containerd

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/tether-edge/tether/testbench/images"
)

// labMetricsPeriod is how often the lab's agent reports usage to the hub.
const labMetricsPeriod = 5 * time.Second

const burnerPod = `
apiVersion: v1
kind: Pod
metadata: {name: burner, labels: {app: burner}}
spec:
  containers:
  - name: burn
    image: %s
    imagePullPolicy: Never
    env: [{name: BURN_MILLICORES, value: "300"}]
    resources: {requests: {cpu: 300m}}
`

// cgroupReading is one reading of a container's cgroup counters.
type cgroupReading struct {
	at  time.Time
	cpu time.Duration
	ws  uint64
}

// cgroupRecorder reads a container's cgroup every interval, apart from
// the agent, until stopped.
type cgroupRecorder struct {
	mu       sync.Mutex
	readings []cgroupReading
	err      error
	stop     chan struct{}
	done     chan struct{}
}

func recordCgroup(id string, interval time.Duration) *cgroupRecorder {
	r := &cgroupRecorder{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			before := time.Now()
			cpu, ws, err := readCgroup(id)
			after := time.Now()
			r.mu.Lock()
			if err != nil {
				r.err = err
			} else {
				// The middle of the read stands for when it was taken.
				r.readings = append(r.readings, cgroupReading{at: before.Add(after.Sub(before) / 2), cpu: cpu, ws: ws})
			}
			r.mu.Unlock()
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

func (r *cgroupRecorder) close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// covers reports whether a reading at or after t has been taken.
func (r *cgroupRecorder) covers(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.readings) > 0 && !r.readings[len(r.readings)-1].at.Before(t)
}

// startedBy reports whether a reading at or before t was taken.
func (r *cgroupRecorder) startedBy(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.readings) > 0 && !r.readings[0].at.After(t)
}

// cpuAt is the cgroup's CPU counter at t, interpolated between the
// readings bracketing t.
func (r *cgroupRecorder) cpuAt(t time.Time) (time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 1; i < len(r.readings); i++ {
		a, b := r.readings[i-1], r.readings[i]
		if a.at.After(t) || b.at.Before(t) {
			continue
		}
		f := float64(t.Sub(a.at)) / float64(b.at.Sub(a.at))
		return a.cpu + time.Duration(f*float64(b.cpu-a.cpu)), nil
	}
	return 0, fmt.Errorf("no cgroup readings bracket %s (%d readings, error %v)", t.Format(time.StampMilli), len(r.readings), r.err)
}

// wsNear is the working set of the reading nearest to t.
func (r *cgroupRecorder) wsNear(t time.Time) (ws uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := time.Duration(1<<63 - 1)
	for _, x := range r.readings {
		if d := x.at.Sub(t).Abs(); d < best {
			best, ws, at = d, x.ws, x.at
		}
	}
	return ws, at
}

// labTop runs a pod burning 300 millicores: kubectl top pod shows it
// within 30 s of it running, and the metrics.k8s.io PodMetrics agree with
// the container's cgroup, read apart from the agent, over the same window.
func labTop(t *testing.T, l *lab) {
	l.apply(t, fmt.Sprintf(burnerPod, images.Burner))
	t.Cleanup(func() { _, _ = l.hub.Run("delete", "pod", "burner", "--wait=true", "--timeout=60s") })
	l.waitPodPhase(t, "burner", "{.status.phase}", "Running")
	running := time.Now()
	uid := l.kubectl(t, "get", "pod", "burner", "-o", "jsonpath={.metadata.uid}")
	rec := recordCgroup(containerID(types.UID(uid), "burn", 0), 250*time.Millisecond)
	defer rec.close()

	// kubectl top pod --containers shows the container with millicores.
	var top string
	var appeared time.Duration
	for {
		out, err := l.hub.Run("top", "pod", "burner", "--containers")
		if err == nil && topShowsBurn(out) {
			top, appeared = out, time.Since(running)
			break
		}
		if time.Since(running) > 60*time.Second {
			t.Fatalf("kubectl top pod burner --containers shows no burn container 60s after the pod ran: %v\n%s", err, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("kubectl top pod showed the container %v after the pod was seen Running:\n%s", appeared.Round(time.Millisecond), top)
	if appeared > 30*time.Second {
		t.Errorf("kubectl top pod showed the container %v after the pod ran, want within 30s", appeared)
	}

	// The first rate of a new container covers the time since it started
	// rather than the sample's window: compare a later sample, one whose
	// window the recorder, started once the pod ran, saw begin.
	first := podMetrics(t, l, "burner")
	var pm metricsv1beta1.PodMetrics
	var start, end time.Time
	l.waitFor(t, 5*labMetricsPeriod+5*time.Second, "a later PodMetrics sample within the cgroup readings", func() (bool, string) {
		pm = podMetrics(t, l, "burner")
		// The timestamp is whole seconds on the wire: the sample was
		// taken within the second after it; take its middle.
		end = pm.Timestamp.Add(500 * time.Millisecond)
		start = end.Add(-pm.Window.Duration)
		return pm.Timestamp.After(first.Timestamp.Time) && rec.startedBy(start), fmt.Sprintf("sample at %s, window %v", pm.Timestamp, pm.Window.Duration)
	})
	l.waitFor(t, 10*time.Second, "cgroup readings past the sample", func() (bool, string) {
		return rec.covers(end.Add(750 * time.Millisecond)), ""
	})
	rec.close()
	c0, err := rec.cpuAt(start)
	if err != nil {
		t.Fatal(err)
	}
	c1, err := rec.cpuAt(end)
	if err != nil {
		t.Fatal(err)
	}
	var usage corev1.ResourceList
	for _, c := range pm.Containers {
		if c.Name == "burn" {
			usage = c.Usage
		}
	}
	if usage == nil {
		t.Fatalf("PodMetrics has no burn container: %+v", pm)
	}
	apiCPU := float64(usage.Cpu().ScaledValue(-9))
	cgCPU := float64(c1-c0) / end.Sub(start).Seconds()
	t.Logf("cpu: PodMetrics %.0f nanocores over %v ending %s, the cgroup %.0f (%+.1f%%)",
		apiCPU, pm.Window.Duration, pm.Timestamp.Format(time.TimeOnly), cgCPU, 100*(apiCPU-cgCPU)/cgCPU)
	// The node is shared: the burner gets what it can, and what it gets
	// is what its cgroup counts.
	if cgCPU < 1e7 {
		t.Fatalf("the burner's cgroup counted %.0f nanocores: it did not burn", cgCPU)
	}
	if d := apiCPU - cgCPU; d > 0.1*cgCPU || d < -0.1*cgCPU {
		t.Errorf("PodMetrics say %.0f nanocores, the cgroup %.0f over the same window", apiCPU, cgCPU)
	}

	apiWS := float64(usage.Memory().Value())
	ws, at := rec.wsNear(end)
	cgWS := float64(ws)
	// The memory cgroup's usage counter is charged in per-CPU batches of
	// 32 pages, so it may be off by 32 pages per CPU at each of the two
	// reads: allow that, or 10 %, whichever is more.
	slack := max(0.1*cgWS, float64(2*runtime.NumCPU()*32*4096))
	t.Logf("memory: PodMetrics working set %.0f bytes, the cgroup %.0f at %s (%+.0f bytes, allowed %.0f)",
		apiWS, cgWS, at.Format(time.TimeOnly), apiWS-cgWS, slack)
	if d := apiWS - cgWS; d > slack || d < -slack {
		t.Errorf("PodMetrics say a working set of %.0f bytes, the cgroup %.0f", apiWS, cgWS)
	}
}

// topShowsBurn reports whether kubectl top pod --containers output has a
// line for the burn container with millicores and bytes.
func topShowsBurn(out string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "burner" && f[1] == "burn" && strings.HasSuffix(f[2], "m") && strings.HasSuffix(f[3], "Mi") {
			return true
		}
	}
	return false
}

func podMetrics(t *testing.T, l *lab, name string) metricsv1beta1.PodMetrics {
	t.Helper()
	out := l.kubectl(t, "get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/"+name)
	var pm metricsv1beta1.PodMetrics
	if err := json.Unmarshal([]byte(out), &pm); err != nil {
		t.Fatalf("decode PodMetrics: %v\n%s", err, out)
	}
	return pm
}
