package hollow_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/testbench/hollow"
)

var (
	hollowN      = flag.Int("hollow.n", 2000, "hollow nodes in TestHollowFleet")
	hollowWindow = flag.Duration("hollow.window", 0, "window over which hollow nodes start (0: 10ms per node, at least 2s)")
	hollowPods   = flag.Int("hollow.pods", 20, "pods created on the first hollow nodes")
	hollowIdle   = flag.Duration("hollow.idle", 15*time.Second, "how long the connected fleet idles while the hub's CPU is measured")
)

// hubExitLimit is how long TestHollowFleet allows the hub to exit after
// SIGTERM with the whole fleet connected.
const hubExitLimit = 10 * time.Second

// TestHollowFleet joins a fleet of hollow nodes to a real hub, runs pods on
// them, restarts the hub, and checks that every node reconnects within 30s
// and that no reflector re-lists; the hub must exit within hubExitLimit
// of SIGTERM with the whole fleet connected.
func TestHollowFleet(t *testing.T) {
	n := *hollowN
	// A handshake budget that makes the fleet's return take a few seconds
	// whatever its size, so that the test shows admission control at work.
	rate := max(10, n/5)
	burst := rate / 2
	hubArgs := []string{fmt.Sprintf("--tunnel-handshake-rate=%d", rate), fmt.Sprintf("--tunnel-handshake-burst=%d", burst),
		// Room for a /24 per node: the default /16 holds 256 nodes,
		// and a node registered after those has no pod CIDR to run
		// pods in, as upstream's node IPAM would leave it.
		"--cluster-cidr=" + clusterCIDRFor(n)}
	started := time.Now()
	h := hubtest.Start(t, hubArgs...)
	t.Logf("hub built and ready in %v (load average %s)", time.Since(started).Round(time.Millisecond), loadAverage())
	token, rc := joinToken(t, h)
	rc.QPS, rc.Burst = 200, 400
	client := kubernetes.NewForConfigOrDie(rc)

	window := *hollowWindow
	if window == 0 {
		window = max(2*time.Second, time.Duration(n)*10*time.Millisecond)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	pods := min(*hollowPods, n)
	// The nodes that run pods keep their logs, to tell why a pod stalls.
	var podNodes []string
	for i := range pods {
		podNodes = append(podNodes, fmt.Sprintf("hollow-%05d", i))
	}
	logs := newNodeLogs(podNodes...)
	f, err := hollow.New(hollow.Config{
		Logger: logs.Logger(),
		HubURL: "https://" + h.Addr, Token: token, N: n, DataDir: t.TempDir(),
		StartWindow: window, Sim: sim.Config{StartDelay: 100 * time.Millisecond},
		StatusCheckInterval: 10 * time.Second,
		// The whole fleet reconnects within the 30s the test allows.
		TunnelBackoffCap: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fleet: %v", err)
		}
	}()

	// A failed run stops the hub before hubtest would, to show how its
	// shutdown went.
	t.Cleanup(func() {
		if t.Failed() {
			h.Stop()
			t.Logf("the hub's shutdown:\n%s", shutdownLog(h.Logs()))
		}
	})
	w := &waiter{t: t, start: time.Now()}
	// How fast a fleet registers is measured, not asserted: a loaded
	// machine may take longer, as long as registrations keep coming.
	took := w.progress("all registered", "every node registered", window+2*time.Minute, time.Minute,
		fleetCount(t, f, "all registered", func(s hollow.Stats) int { return s.Registered }))
	t.Logf("%d hollow nodes registered in %v (start window %v)", n, took, window)
	benchfmt.Report(t, benchfmt.Figure{Name: "fleet_all_registered", Value: took.Seconds(), Unit: "s",
		Extra: []string{fmt.Sprintf("nodes=%d", n), fmt.Sprintf("start_window_s=%.0f", window.Seconds())}})

	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != n {
		t.Fatalf("hub lists %d nodes, want %d", len(nodes.Items), n)
	}

	for i := range pods {
		node := f.Agents()[i].NodeName()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%s", node), Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
		}
		if _, err := client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running := func() (int, int, string) {
		list, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return 0, pods, fmt.Sprintf("list pods: %v", err)
		}
		r := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				r++
			}
		}
		return r, pods, fmt.Sprintf("%d of %d pods running", r, pods)
	}
	// stalled describes the first few pods not running, when the wait
	// for them fails.
	stalled := func() string {
		list, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return fmt.Sprintf("list pods: %v", err)
		}
		var out []string
		hubLogs := h.Logs()
		for i := range list.Items {
			if p := &list.Items[i]; p.Status.Phase != corev1.PodRunning && len(out) < 3 {
				out = append(out, describePod(p, logs, hubLogs))
			}
		}
		return strings.Join(out, "\n")
	}
	w.progress("pods start", "every pod running", time.Minute, 30*time.Second, running, stalled)

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	perAgent := (int64(after.HeapInuse) - int64(before.HeapInuse)) / int64(n)
	t.Logf("memory: %d KiB heap in use per hollow node, %d goroutines per node",
		perAgent>>10, (runtime.NumGoroutine()-goroutinesBefore)/n)
	benchfmt.Report(t, benchfmt.Figure{Name: "fleet_heap_per_agent", Value: float64(perAgent) / 1024, Unit: "KiB",
		Extra: []string{fmt.Sprintf("nodes=%d", n), fmt.Sprintf("goroutines=%d", (runtime.NumGoroutine()-goroutinesBefore)/n)}})

	steady := f.Stats()
	t.Logf("before the hub restart: %s", steady)

	// The hub with the whole fleet connected and idle.
	idle := *hollowIdle
	cpu0, err := h.CPU()
	if err != nil {
		t.Fatal(err)
	}
	sent0 := f.Stats().BytesSent
	time.Sleep(idle)
	cpu1, _ := h.CPU()
	rss, _ := h.RSS()
	sent1 := f.Stats().BytesSent
	t.Logf("hub with %d idle agents connected: RSS %d MiB, CPU %.1f%% of one core over %v; agents' uplink %.0f bit/s each",
		n, rss>>20, 100*float64(cpu1-cpu0)/float64(idle), idle, float64(sent1-sent0)*8/idle.Seconds()/float64(n))
	benchfmt.Report(t, benchfmt.Figure{Name: "fleet_hub_rss_idle", Value: float64(rss) / (1 << 20), Unit: "MiB",
		Extra: []string{fmt.Sprintf("nodes=%d", n), fmt.Sprintf("hub_cpu_pct=%.1f", 100*float64(cpu1-cpu0)/float64(idle))}})

	// hubtest allows the hub 30s to exit after SIGTERM (and reports it
	// when it took longer); how long it took is measured here.
	stopping := time.Now()
	h.Stop()
	exited := time.Since(stopping)
	t.Logf("the hub exited %v after SIGTERM at %s (load average %s); its shutdown:\n%s",
		exited.Round(time.Millisecond), stopping.UTC().Format(time.RFC3339Nano), loadAverage(), shutdownLog(h.Logs()))
	// A hub's stop is an outage for every client: its 2s drain and the
	// closing of sessions, servers and stores, a few seconds in all. The
	// bound is on the hub's own account, from its first shutdown line to
	// its last: this process, which runs every hollow agent, can be so
	// short of CPU that it notices the exit many seconds late.
	if hubTook, err := shutdownTook(h.Logs()); err != nil {
		t.Errorf("the hub's shutdown: %v", err)
	} else if hubTook > hubExitLimit {
		t.Errorf("deadline %v broken: the hub took %v from SIGTERM to its stores closed with %d edges connected (load average %s); its shutdown steps are logged above",
			hubExitLimit, hubTook.Round(time.Millisecond), n, loadAverage())
	}
	// The hub sends every edge a goaway, then closes its session with a
	// close frame before it exits, so the fleet knows at once; only an edge
	// whose close frame was lost would wait for its idle timeout (45 s).
	took = w.deadline("all disconnected", "every node to see the hub gone", 20*time.Second,
		fleetCount(t, f, "all disconnected", func(s hollow.Stats) int { return n - s.Connected }))
	t.Logf("all %d nodes disconnected %v after the hub exited", n, took.Round(time.Millisecond))
	benchfmt.Report(t, benchfmt.Figure{Name: "fleet_all_disconnected", Value: took.Seconds(), Unit: "s", Target: "<=20",
		Extra: []string{fmt.Sprintf("nodes=%d", n)}})
	// The claim: every node is back within 30s of the restarted hub
	// serving again, which is when its port completes a TLS handshake. The
	// test's readiness probe runs kubectl and, on a loaded machine, sees
	// the hub ready many seconds after the edges could: the clock starts
	// at the port instead.
	restarted := time.Now()
	served := make(chan time.Time, 1)
	go func() { served <- firstServe(h.Addr, 2*time.Minute) }()
	h.Restart(hubArgs...)
	servedAt := <-served
	if servedAt.IsZero() {
		t.Fatalf("the restarted hub at %s did not serve within 2m", h.Addr)
	}
	t.Logf("the restarted hub served %v after its start and was ready %v after it (load average %s)",
		servedAt.Sub(restarted).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond), loadAverage())
	// Sample the hub's handshake counter while the fleet comes back, to
	// see how the reconnects spread over time.
	samples := make(chan []handshakeSample, 1)
	stopSampling := make(chan struct{})
	go func() { samples <- sampleHandshakes(client, stopSampling) }()
	took = w.deadlineFrom(servedAt, "all reconnected", "every node connected to the restarted hub", 30*time.Second,
		fleetCount(t, f, "all reconnected", func(s hollow.Stats) int { return s.Connected }))
	close(stopSampling)
	t.Logf("all %d nodes reconnected %v after the restarted hub served", n, took)
	benchfmt.Report(t, benchfmt.Figure{Name: "fleet_all_reconnected", Value: took.Seconds(), Unit: "s", Target: "<=30",
		Extra: []string{fmt.Sprintf("nodes=%d", n)}})
	sampled, spread := peakHandshakes(<-samples)
	peak := hubGauge(t, client, "tether_tunnel_handshakes_peak_per_second")
	t.Logf("reconnect handshakes: peak %d admitted in one second (about %d seen by sampling), spread over %v",
		peak, sampled, spread.Round(100*time.Millisecond))
	// The hub admits at most rate handshakes a second plus a burst; the
	// rest back off (with jitter) and come later.
	if peak > rate+burst {
		t.Errorf("peak of %d handshakes in one second exceeds the hub's admission budget (%d/s + %d)", peak, rate, burst)
	}

	// Something new still reaches the nodes through the resumed watches.
	for i := range pods {
		node := f.Agents()[i].NodeName()
		if err := client.CoreV1().Pods("default").Delete(context.Background(), "p-"+node, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.progress("pods finalised", "every pod finalised by its node after the restart", time.Minute, 30*time.Second, func() (int, int, string) {
		list, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return 0, pods, fmt.Sprintf("list pods: %v", err)
		}
		return pods - len(list.Items), pods, fmt.Sprintf("%d of %d pods left", len(list.Items), pods)
	})
	final := f.Stats()
	t.Logf("after the hub restart: %s", final)
	if final.Lists != steady.Lists {
		t.Errorf("hollow nodes re-listed after the hub restart: %d LISTs before, %d after", steady.Lists, final.Lists)
	}
}

type handshakeSample struct {
	at    time.Time
	count int
}

// sampleHandshakes reads tether_tunnel_handshakes_total from the hub every
// 100ms until stop is closed.
func sampleHandshakes(client kubernetes.Interface, stop <-chan struct{}) []handshakeSample {
	var out []handshakeSample
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		cancel()
		if err == nil {
			for _, line := range strings.Split(string(raw), "\n") {
				var v int
				if _, err := fmt.Sscanf(line, "tether_tunnel_handshakes_total %d", &v); err == nil {
					out = append(out, handshakeSample{time.Now(), v})
				}
			}
		}
		select {
		case <-stop:
			return out
		case <-tick.C:
		}
	}
}

// peakHandshakes returns the most handshakes seen within any one second
// and the time from the first to the last one.
func peakHandshakes(s []handshakeSample) (peak int, spread time.Duration) {
	var first, last time.Time
	for i := range s {
		if i > 0 && s[i].count > s[i-1].count {
			if first.IsZero() {
				first = s[i-1].at
			}
			last = s[i].at
		}
		j := i
		for j > 0 && s[i].at.Sub(s[j-1].at) <= time.Second {
			j--
		}
		peak = max(peak, s[i].count-s[j].count)
	}
	if !first.IsZero() {
		spread = last.Sub(first)
	}
	return peak, spread
}

// hubGauge reads one unlabelled metric from the hub's /metrics.
func hubGauge(t *testing.T, client kubernetes.Interface, name string) int {
	t.Helper()
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("read hub metrics: %v", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		var v int
		if _, err := fmt.Sscanf(line, name+" %d", &v); err == nil {
			return v
		}
	}
	t.Fatalf("no %s in the hub's metrics", name)
	return 0
}

// clusterCIDRFor returns a cluster CIDR under 10.64.0.0/10 with a /24 for
// each of n nodes.
func clusterCIDRFor(n int) string {
	bits := 24
	for 1<<(24-bits) < n {
		bits--
	}
	return fmt.Sprintf("10.64.0.0/%d", min(bits, 16))
}

// shutdownTook returns how long the hub's last shutdown took by its own
// log: from its "shutting down" line to its "closed" line.
func shutdownTook(logs string) (time.Duration, error) {
	var began, ended time.Time
	for _, line := range strings.Split(logs, "\n") {
		at := func() time.Time {
			f := strings.Fields(line)
			if len(f) == 0 || !strings.HasPrefix(f[0], "time=") {
				return time.Time{}
			}
			ts, _ := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
			return ts
		}
		switch {
		case strings.Contains(line, `msg="shutting down"`):
			began, ended = at(), time.Time{}
		case strings.Contains(line, "msg=closed "):
			ended = at()
		}
	}
	if began.IsZero() || ended.IsZero() {
		return 0, fmt.Errorf("no timed \"shutting down\" and \"closed\" lines in the hub's log")
	}
	return ended.Sub(began), nil
}

// shutdownLog returns the lines of a hub's log that time its shutdown.
func shutdownLog(logs string) string {
	var b strings.Builder
	for _, line := range strings.Split(logs, "\n") {
		for _, m := range []string{"shutting down", "shutdown step", "shut down", "draining", "msg=closed", "sent goaways", "closed sessions"} {
			if strings.Contains(line, m) {
				b.WriteString("  " + line + "\n")
				break
			}
		}
	}
	return b.String()
}
