package hollow_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// latencyHistograms are the hub's apiserver_request_duration_seconds
// histograms at one moment, by verb and resource: cumulative counts per
// upper bound.
type latencyHistograms map[latencyKey]map[float64]uint64

type latencyKey struct{ verb, resource string }

// readLatencies reads the hub's request latency histograms from /metrics.
func readLatencies(ctx context.Context, client kubernetes.Interface) (latencyHistograms, error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read hub metrics: %w", err)
	}
	return parseLatencies(string(raw))
}

// parseLatencies parses the bucket lines of
// apiserver_request_duration_seconds from a Prometheus text exposition.
func parseLatencies(text string) (latencyHistograms, error) {
	out := latencyHistograms{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	const prefix = "apiserver_request_duration_seconds_bucket{"
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			return nil, fmt.Errorf("bucket line %q: no value", sc.Text())
		}
		var k latencyKey
		le := math.NaN()
		for _, l := range strings.Split(labels, ",") {
			name, v, _ := strings.Cut(l, "=")
			v = strings.Trim(v, `"`)
			switch name {
			case "verb":
				k.verb = v
			case "resource":
				k.resource = v
			case "le":
				if v == "+Inf" {
					le = math.Inf(1)
				} else if f, err := strconv.ParseFloat(v, 64); err == nil {
					le = f
				}
			}
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil || math.IsNaN(le) {
			return nil, fmt.Errorf("bucket line %q: %v", sc.Text(), err)
		}
		if out[k] == nil {
			out[k] = map[float64]uint64{}
		}
		out[k][le] = n
	}
	return out, sc.Err()
}

// quantile is the q-quantile of the requests of k made between before and
// h, interpolated within its bucket as Prometheus' histogram_quantile
// does, and how many requests that is. A quantile in the +Inf bucket is
// the largest finite bound.
func (h latencyHistograms) quantile(before latencyHistograms, k latencyKey, q float64) (time.Duration, uint64) {
	bounds := make([]float64, 0, len(h[k]))
	for le := range h[k] {
		bounds = append(bounds, le)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 {
		return 0, 0
	}
	count := func(le float64) uint64 { return h[k][le] - before[k][le] }
	total := count(bounds[len(bounds)-1])
	if total == 0 {
		return 0, 0
	}
	rank := q * float64(total)
	lower, below := 0.0, uint64(0)
	for _, le := range bounds {
		c := count(le)
		if float64(c) >= rank {
			if math.IsInf(le, 1) {
				return time.Duration(lower * float64(time.Second)), total
			}
			frac := (rank - float64(below)) / float64(c-below)
			return time.Duration((lower + (le-lower)*frac) * float64(time.Second)), total
		}
		lower, below = le, c
	}
	return time.Duration(lower * float64(time.Second)), total
}

// apiQuantile is the p99 of one verb and resource's requests.
type apiQuantile struct {
	key   latencyKey
	p99   time.Duration
	count uint64
}

// worstP99 returns the p99s of the requests made between two readings,
// one per verb (of verbs) and resource with at least minRequests
// requests, the worst first.
func worstP99(before, after latencyHistograms, verbs []string, minRequests uint64) []apiQuantile {
	var out []apiQuantile
	for k := range after {
		if !slices.Contains(verbs, k.verb) {
			continue
		}
		p99, n := after.quantile(before, k, 0.99)
		if n >= minRequests {
			out = append(out, apiQuantile{k, p99, n})
		}
	}
	slices.SortFunc(out, func(a, b apiQuantile) int { return int(b.p99 - a.p99) })
	return out
}

func (q apiQuantile) String() string {
	return fmt.Sprintf("%s %s p99 %v (%d requests)", q.key.verb, q.key.resource, q.p99.Round(time.Millisecond), q.count)
}

// hubHeap returns the hub's heap after a garbage collection, read from
// its heap profile (/debug/pprof/heap?gc=1&debug=1 collects first and
// ends with the runtime's memory statistics): inuse, the bytes of the
// spans that hold objects, and live, the objects themselves. Their
// difference is the room left in those spans by objects freed since.
func hubHeap(ctx context.Context, client kubernetes.Interface) (inuse, live int64, err error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/heap").Param("gc", "1").Param("debug", "1").DoRaw(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read hub heap profile: %w", err)
	}
	inuse, live = -1, -1
	for _, line := range strings.Split(string(raw), "\n") {
		for prefix, v := range map[string]*int64{"# HeapInuse = ": &inuse, "# HeapAlloc = ": &live} {
			if f, ok := strings.CutPrefix(line, prefix); ok {
				if *v, err = strconv.ParseInt(strings.TrimSpace(f), 10, 64); err != nil {
					return 0, 0, fmt.Errorf("hub heap profile: %q: %w", line, err)
				}
			}
		}
	}
	if inuse < 0 || live < 0 {
		return 0, 0, fmt.Errorf("no HeapInuse or HeapAlloc in the hub's heap profile")
	}
	return inuse, live, nil
}

// podClock times pods from the first watch event that shows them to the
// first that shows them Running: the pod startup latency a watching
// client sees, as upstream's SLO measures it (there from the creation
// timestamp, which has whole seconds only).
type podClock struct {
	mu        sync.Mutex
	seen      map[types.UID]time.Time
	scheduled map[types.UID]time.Duration // first seen bound to a node
	running   map[types.UID]time.Duration
	runningAt map[types.UID]time.Time
}

// watchPods starts a pod clock on the pods of namespace ns; it runs until
// ctx ends, watching again from the last resourceVersion when a watch
// ends.
func watchPods(ctx context.Context, client kubernetes.Interface, ns string) (*podClock, error) {
	c := &podClock{seen: map[types.UID]time.Time{}, scheduled: map[types.UID]time.Duration{}, running: map[types.UID]time.Duration{}, runningAt: map[types.UID]time.Time{}}
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods of %s: %w", ns, err)
	}
	if len(list.Items) > 0 {
		return nil, fmt.Errorf("namespace %s already has %d pods", ns, len(list.Items))
	}
	rv := list.ResourceVersion
	go func() {
		for ctx.Err() == nil {
			w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = p.ResourceVersion
				if ev.Type != watch.Bookmark {
					c.observe(p, time.Now())
				}
			}
			w.Stop()
		}
	}()
	return c, nil
}

func (c *podClock) observe(p *corev1.Pod, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first, ok := c.seen[p.UID]
	if !ok {
		first = now
		c.seen[p.UID] = now
	}
	if _, done := c.scheduled[p.UID]; !done && p.Spec.NodeName != "" {
		c.scheduled[p.UID] = now.Sub(first)
	}
	if _, done := c.running[p.UID]; !done && p.Status.Phase == corev1.PodRunning {
		c.running[p.UID] = now.Sub(first)
		c.runningAt[p.UID] = now
	}
}

// startups returns the startup latencies of the pods seen Running so far,
// sorted, and how many pods were seen.
func (c *podClock) startups() (sorted []time.Duration, seen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.running {
		sorted = append(sorted, d)
	}
	slices.Sort(sorted)
	return sorted, len(c.seen)
}

// runningSince returns, sorted, how long after its created time each pod
// of created was seen Running, and how many were not seen Running.
func (c *podClock) runningSince(created map[types.UID]time.Time) (sorted []time.Duration, missing int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, at := range created {
		r, ok := c.runningAt[uid]
		if !ok {
			missing++
			continue
		}
		sorted = append(sorted, r.Sub(at))
	}
	slices.Sort(sorted)
	return sorted, missing
}

// stages returns, sorted, how long the pods seen Running took to be seen
// bound to a node, and from then to Running: the scheduler's share and
// the node's (its agent, the status write and the watch).
func (c *podClock) stages() (toScheduled, toRunning []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, d := range c.running {
		s := c.scheduled[uid]
		toScheduled = append(toScheduled, s)
		toRunning = append(toRunning, d-s)
	}
	slices.Sort(toScheduled)
	slices.Sort(toRunning)
	return toScheduled, toRunning
}

// percentile is the p-th percentile (0 < p ≤ 1) of sorted values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
