package hub_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
)

var apiBenchFull = flag.Bool("apibench.full", false, "run the API benchmark at full size (10,000 pods, 1,000 watchers) and check its targets")

func benchPod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i), Labels: map[string]string{"app": "bench", "shard": fmt.Sprint(i % 16)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.example/app:1.0", Command: []string{"/app", "--serve"},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
		}}},
	}
}

func pct(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// TestAPIBenchmark measures the hub process through client-go: create
// latency at 1, 16 and 64 concurrent clients, LIST of all pods, watch
// fan-out, and the hub's RSS idle and loaded. Short by default; with
// -apibench.full it stores 10,000 pods, runs 1,000 watchers and checks
// LIST p99 ≤ 150 ms and idle RSS ≤ 40 MB.
func TestAPIBenchmark(t *testing.T) {
	pods, watchers := 1000, 100
	if *apiBenchFull {
		pods, watchers = 10000, 1000
	}
	h := hubtest.Start(t, apiOnly...)
	createDefaultAccounts(t, h, "default")
	cs := clientFor(t, h)
	ctx := t.Context()
	time.Sleep(2 * time.Second)
	idle, err := h.RSS()
	if err != nil {
		t.Fatal(err)
	}

	created := 0
	for _, clients := range []int{1, 16, 64} {
		n := pods / 3
		if clients == 64 {
			n = pods - created
		}
		var (
			mu   sync.Mutex
			lat  []time.Duration
			wg   sync.WaitGroup
			next atomic.Int64
		)
		base := created
		start := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1))
					if i > n {
						return
					}
					t0 := time.Now()
					if _, err := cs.CoreV1().Pods("default").Create(ctx, benchPod(base+i), metav1.CreateOptions{}); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					lat = append(lat, time.Since(t0))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		created += n
		t.Logf("create, %2d clients: %5d pods, %6.0f/s, p50 %v, p99 %v", clients, len(lat), float64(len(lat))/el.Seconds(), pct(lat, 0.5), pct(lat, 0.99))
		benchfmt.Report(t, benchfmt.Figure{Name: fmt.Sprintf("api_creates_%dc", clients), Value: float64(len(lat)) / el.Seconds(), Unit: "pods/s",
			Mode: benchfmt.Mode(*apiBenchFull), Extra: []string{fmt.Sprintf("p99_ms=%.1f", float64(pct(lat, 0.99))/1e6)}})
	}

	var lists []time.Duration
	for range 20 {
		t0 := time.Now()
		l, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lists = append(lists, time.Since(t0))
		if len(l.Items) < pods {
			t.Fatalf("listed %d pods, want %d", len(l.Items), pods)
		}
	}
	t.Logf("list of %d pods, decoded by client-go: p50 %v, p99 %v", pods, pct(lists, 0.5), pct(lists, 0.99))
	// The server's share: the same list read as bytes, not decoded.
	var raw []time.Duration
	for range 20 {
		t0 := time.Now()
		b, err := cs.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, time.Since(t0))
		if len(b) < pods*500 {
			t.Fatalf("list body of %d bytes for %d pods", len(b), pods)
		}
	}
	listP99 := pct(raw, 0.99)
	t.Logf("list of %d pods, raw JSON: p50 %v, p99 %v", pods, pct(raw, 0.5), listP99)

	// Watch fan-out: every watcher must see one change.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ws []watch.Interface
	for range watchers {
		w, err := cs.CoreV1().ConfigMaps("default").Watch(wctx, metav1.ListOptions{ResourceVersion: "0", FieldSelector: "metadata.name=fanout"})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	t0 := time.Now()
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fanout"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen []time.Duration
	)
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-w.ResultChan():
				mu.Lock()
				seen = append(seen, time.Since(t0))
				mu.Unlock()
			case <-time.After(30 * time.Second):
			}
		}()
	}
	wg.Wait()
	if len(seen) != watchers {
		t.Fatalf("%d of %d watchers saw the change", len(seen), watchers)
	}
	t.Logf("watch fan-out to %d watchers: p50 %v, p99 %v, last %v", watchers, pct(seen, 0.5), pct(seen, 0.99), pct(seen, 1))
	loaded, err := h.RSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hub RSS: idle %.1f MB, with %d pods and %d watchers %.1f MB", float64(idle)/1e6, pods, watchers, float64(loaded)/1e6)
	mode, msf := benchfmt.Mode(*apiBenchFull), func(d time.Duration) float64 { return float64(d) / 1e6 }
	listTarget := ""
	if *apiBenchFull {
		listTarget = "<=150" // for 10,000 pods
	}
	benchfmt.Report(t, benchfmt.Figure{Name: "api_list_raw_p99", Value: msf(listP99), Unit: "ms", Target: listTarget, Mode: mode,
		Extra: []string{fmt.Sprintf("pods=%d", pods), fmt.Sprintf("p50_ms=%.1f", msf(pct(raw, 0.5)))}})
	benchfmt.Report(t, benchfmt.Figure{Name: "api_list_decoded_p99", Value: msf(pct(lists, 0.99)), Unit: "ms", Mode: mode,
		Extra: []string{fmt.Sprintf("pods=%d", pods)}})
	benchfmt.Report(t, benchfmt.Figure{Name: "api_watch_fanout_p99", Value: msf(pct(seen, 0.99)), Unit: "ms", Mode: mode,
		Extra: []string{fmt.Sprintf("watchers=%d", watchers)}})
	benchfmt.Report(t, benchfmt.Figure{Name: "api_hub_rss_idle", Value: float64(idle) / 1e6, Unit: "MB", Target: "<=40", Mode: mode})
	benchfmt.Report(t, benchfmt.Figure{Name: "api_hub_rss_loaded", Value: float64(loaded) / 1e6, Unit: "MB", Mode: mode,
		Extra: []string{fmt.Sprintf("pods=%d", pods), fmt.Sprintf("watchers=%d", watchers)}})
	if *apiBenchFull {
		if listP99 > 150*time.Millisecond {
			t.Errorf("LIST of %d pods p99 %v, target ≤ 150ms", pods, listP99)
		}
		if idle > 40e6 {
			t.Errorf("idle RSS %.1f MB, target ≤ 40 MB", float64(idle)/1e6)
		}
	}
}
