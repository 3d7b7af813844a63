package hollow_test

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/hollow"
)

var (
	hollowN      = flag.Int("hollow.n", 2000, "hollow nodes in TestHollowFleet")
	hollowWindow = flag.Duration("hollow.window", 0, "window over which hollow nodes start (0: 10ms per node, at least 2s)")
	hollowPods   = flag.Int("hollow.pods", 20, "pods created on the first hollow nodes")
	hollowIdle   = flag.Duration("hollow.idle", 15*time.Second, "how long the connected fleet idles while the hub's CPU is measured")
)

// TestHollowFleet joins a fleet of hollow nodes to a real hub, runs pods on
// them, restarts the hub, and checks that every node reconnects within 30s
// and that no reflector re-lists.
func TestHollowFleet(t *testing.T) {
	n := *hollowN
	// A handshake budget that makes the fleet's return take a few seconds
	// whatever its size, so that the test shows admission control at work.
	rate := max(10, n/5)
	burst := rate / 2
	hubArgs := []string{fmt.Sprintf("--tunnel-handshake-rate=%d", rate), fmt.Sprintf("--tunnel-handshake-burst=%d", burst)}
	h := hubtest.Start(t, hubArgs...)
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v\n%s", err, h.Logs())
	}
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
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

	f, err := hollow.New(hollow.Config{
		HubURL: "https://" + h.Addr, Token: strings.TrimSpace(string(out)), N: n, DataDir: t.TempDir(),
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

	wait := func(what string, timeout time.Duration, ok func(hollow.Stats) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			s := f.Stats()
			if ok(s) {
				return time.Since(start)
			}
			if s.Failed > 0 {
				t.Fatalf("%s: %d agents failed: %s", what, s.Failed, s)
			}
			if time.Since(start) > timeout {
				// Where the agents still waiting are stuck: the fleet's
				// goroutines grouped by stack, largest groups first.
				var b strings.Builder
				pprof.Lookup("goroutine").WriteTo(&b, 1)
				dump := b.String()
				if len(dump) > 200_000 {
					dump = dump[:200_000] + "\n[truncated]"
				}
				t.Fatalf("%s: not within %v: %s\ngoroutines:\n%s", what, timeout, s, dump)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	took := wait("all registered", window+2*time.Minute, func(s hollow.Stats) bool { return s.Registered == n })
	t.Logf("%d hollow nodes registered in %v (start window %v)", n, took, window)

	nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != n {
		t.Fatalf("hub lists %d nodes, want %d", len(nodes.Items), n)
	}

	pods := min(*hollowPods, n)
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
	waitRunning := func(what string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			list, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
			running := 0
			if err == nil {
				for _, p := range list.Items {
					if p.Status.Phase == corev1.PodRunning {
						running++
					}
				}
			}
			if running == pods {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d pods running (%v)", what, running, pods, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	waitRunning("pods start")

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	perAgent := (int64(after.HeapInuse) - int64(before.HeapInuse)) / int64(n)
	t.Logf("memory: %d KiB heap in use per hollow node, %d goroutines per node",
		perAgent>>10, (runtime.NumGoroutine()-goroutinesBefore)/n)

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

	h.Stop()
	// The hub sends every edge a goaway, then closes its session with a
	// close frame before it exits, so the fleet knows at once; only an edge
	// whose close frame was lost would wait for its idle timeout (45 s).
	took = wait("all disconnected", 20*time.Second, func(s hollow.Stats) bool { return s.Connected == 0 })
	t.Logf("all %d nodes disconnected %v after the hub exited", n, took.Round(time.Millisecond))
	h.Restart(hubArgs...)
	// Sample the hub's handshake counter while the fleet comes back, to
	// see how the reconnects spread over time.
	samples := make(chan []handshakeSample, 1)
	stopSampling := make(chan struct{})
	go func() { samples <- sampleHandshakes(client, stopSampling) }()
	took = wait("all reconnected", 30*time.Second, func(s hollow.Stats) bool { return s.Connected == n })
	close(stopSampling)
	t.Logf("all %d nodes reconnected %v after the hub served again", n, took)
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
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods not finalised by their nodes after the restart: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
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
