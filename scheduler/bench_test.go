package scheduler

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/benchfmt"
)

var benchFull = flag.Bool("schedbench.full", false, "run the end-to-end scheduler benchmark at full size (10,000 pods on 100, 1,000 and 5,000 nodes; memory at 5,000 nodes and 50,000 pods)")

func benchNode(i int) *corev1.Node {
	n := testNode(fmt.Sprintf("node-%05d", i), "32", "128Gi", map[string]string{"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%10)})
	n.Status.Allocatable[corev1.ResourcePods] = resource.MustParse("250")
	n.Status.Capacity = n.Status.Allocatable
	return n
}

// benchPod is a plain pod, or with constrained, a member of one of groups
// that spread over zones (maxSkew 1) and keep one pod per node (required
// anti-affinity).
func benchPod(i int, constrained bool, groupSize int) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%06d", i), Namespace: "default", Labels: map[string]string{"app": "bench"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}}},
	}
	if constrained {
		g := fmt.Sprintf("g%d", i/groupSize)
		p.Labels["group"] = g
		sel := &metav1.LabelSelector{MatchLabels: map[string]string{"group": g}}
		p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone",
			WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel}}
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
			{LabelSelector: sel, TopologyKey: corev1.LabelHostname}}}}
	}
	return p
}

func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

type e2eResult struct {
	nodes, pods int
	constrained bool
	elapsed     time.Duration
	heapMB      float64
	hubRSSMB    float64
}

// runE2E pre-creates nodes and pending pods with no scheduler running,
// then starts the scheduler and measures the time until a watch has seen
// every pod bound. The clock includes the scheduler's informers' first
// LIST of every pod and node. With inHub the scheduler is the hub's own:
// the hub is restarted with it on, and the clock starts when its scheduler
// did (see schedulerStart).
func runE2E(t *testing.T, numNodes, numPods int, constrained, inHub bool) e2eResult {
	th := startHub(t)
	ctx := context.Background()
	if err := parallel(numNodes, 32, func(i int) error {
		_, err := th.cs.CoreV1().Nodes().Create(ctx, benchNode(i), metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatalf("create nodes: %v", err)
	}
	groupSize := min(numNodes/2, 50)
	if err := parallel(numPods, 32, func(i int) error {
		_, err := th.cs.CoreV1().Pods("default").Create(ctx, benchPod(i, constrained, groupSize), metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatalf("create pods: %v", err)
	}
	list, err := th.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The watch that stops the clock reads protobuf, as the scheduler's
	// informers do: the hub encodes each change once for both, and the
	// observer takes little of the CPU the measured parties share.
	prc := rest.CopyConfig(th.rc)
	prc.ContentType = "application/vnd.kubernetes.protobuf"
	prc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	pcs, err := kubernetes.NewForConfig(prc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pcs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { w.Stop() }()

	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	var s *Scheduler
	hubCPU0, _ := th.h.CPU()
	var stats func() string
	if inHub {
		w.Stop()
		th.h.Stop()
		args := hubArgsWithScheduler
		if *benchProfile != "" {
			args = append(slices.Clip(args), "--profiling")
		}
		th.h.Restart(args...)
		deadline := time.Now().Add(30 * time.Second)
		var synced time.Duration
		for start, synced, err = schedulerStart(th.h.Logs()); err != nil; start, synced, err = schedulerStart(th.h.Logs()) {
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The hub's CPU counts from its restart: the scheduler started
		// before the test could read it, and loading the store is little.
		hubCPU0 = 0
		stats = func() string { return fmt.Sprintf("hub scheduler, informers synced in %v", synced) }
		if *benchProfile != "" {
			done := profileHub(t, th, *benchProfile)
			defer func() { <-done }()
		}
		if w, err = pcs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion}); err != nil {
			t.Fatal(err)
		}
	} else {
		s = th.runScheduler(t)
		stats = func() string { return fmt.Sprintf("%+v", s.Stats()) }
	}
	bound := map[types.UID]bool{}
	timeout := time.After(time.Duration(numPods/50+60) * time.Second)
	lastRV := list.ResourceVersion
	for len(bound) < numPods {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The hub ends a watch that falls too far behind, as
				// kube-apiserver does; resume from the last event seen.
				if w, err = pcs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{ResourceVersion: lastRV}); err != nil {
					t.Fatalf("resume the watch: %v", err)
				}
				continue
			}
			if ev.Type != watch.Modified {
				continue
			}
			p := ev.Object.(*corev1.Pod)
			lastRV = p.ResourceVersion
			if p.Spec.NodeName != "" {
				bound[p.UID] = true
			}
		case <-timeout:
			t.Fatalf("only %d of %d pods bound (stats %s)", len(bound), numPods, stats())
		}
	}
	res := e2eResult{nodes: numNodes, pods: numPods, constrained: constrained, elapsed: time.Since(start)}
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	hubCPU1, _ := th.h.CPU()
	hubCPU := hubCPU1 - hubCPU0
	where := fmt.Sprintf("scheduler process CPU %.1fs, hub", cpu.Seconds())
	if inHub {
		where = "hub with its scheduler, since its restart,"
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.heapMB = float64(ms.HeapAlloc) / (1 << 20)
	if rss, err := th.h.RSS(); err == nil {
		res.hubRSSMB = float64(rss) / (1 << 20)
	}
	kind := "plain"
	if constrained {
		kind = "spread+anti-affinity"
	}
	if inHub {
		kind += ", in the hub"
	}
	t.Logf("%-33s %5d nodes %6d pods: %6.2fs  %7.0f pods/s  (%s CPU %.1fs, heap %.0f MB, hub RSS %.0f MB, stats %s)",
		kind, numNodes, numPods, res.elapsed.Seconds(), float64(numPods)/res.elapsed.Seconds(), where, hubCPU.Seconds(), res.heapMB, res.hubRSSMB, stats())
	name, target := "plain", ""
	switch {
	case constrained:
		name = "constrained"
		if numNodes >= 5000 {
			target = ">=500"
		}
	case numNodes >= 5000:
		target = ">=2000"
	}
	if inHub {
		name += "_hub"
	}
	name = fmt.Sprintf("sched_%s_%dn_%dp", name, numNodes, numPods)
	mode := benchfmt.Mode(*benchFull)
	benchfmt.Report(t, benchfmt.Figure{Name: name, Value: float64(numPods) / res.elapsed.Seconds(), Unit: "pods/s", Target: target, Mode: mode,
		Extra: []string{fmt.Sprintf("hub_cpu_s=%.1f", hubCPU.Seconds())}})
	if !inHub {
		// The test process's heap is the scheduler's only when it runs
		// here.
		benchfmt.Report(t, benchfmt.Figure{Name: name + "_heap", Value: res.heapMB, Unit: "MiB", Mode: mode,
			Extra: []string{fmt.Sprintf("hub_rss_mib=%.0f", res.hubRSSMB)}})
	}
	return res
}

// TestEndToEndThroughput measures pods bound per second through a real
// hub. Pods are created first, with no scheduler running; the clock starts
// when the scheduler starts and stops when a watch has seen every pod
// bound. Short by default (1,000 pods on 100 and 1,000 nodes); with
// -schedbench.full 10,000 pods on 100, 1,000 and 5,000 nodes.
func TestEndToEndThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hub processes; skipped in -short")
	}
	pods, sizes := 1000, []int{100, 1000}
	if *benchFull {
		pods, sizes = 10000, []int{100, 1000, 5000}
	}
	for _, constrained := range []bool{false, true} {
		for _, n := range sizes {
			t.Run(fmt.Sprintf("nodes=%d/constrained=%v", n, constrained), func(t *testing.T) {
				runE2E(t, n, pods, constrained, false)
			})
		}
	}
	// The hub's own scheduler, which reaches the API in-process.
	for _, n := range sizes {
		t.Run(fmt.Sprintf("nodes=%d/constrained=false/scheduler=hub", n), func(t *testing.T) {
			runE2E(t, n, pods, false, true)
		})
	}
}

var benchProfile = flag.String("schedbench.profile", "", "write a CPU profile of the hub, with its own scheduler, over the first 5 s of each run to this file")

// profileHub writes a 5 s CPU profile of the hub to path; the channel is
// closed when it is written.
func profileHub(t *testing.T, th *testHub, path string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		b, err := th.cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "5").DoRaw(context.Background())
		if err == nil {
			err = os.WriteFile(path, b, 0o644)
		}
		if err != nil {
			t.Errorf("profile the hub: %v", err)
		}
	}()
	return done
}

// hubArgsWithScheduler are hubArgs with the hub's own scheduler on.
var hubArgsWithScheduler = []string{"--controllers=*,-nodelifecycle"}

// schedulerStart returns when the hub's scheduler started: the time of
// its "scheduler started" line, which it logs once its informers have
// listed everything, less the time they took (synced), so that the clock
// includes their first LIST as it does for a scheduler in the test
// process.
func schedulerStart(logs string) (start time.Time, synced time.Duration, err error) {
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `msg="scheduler started"`) {
			continue
		}
		var at time.Time
		var errAt, errSynced error = errors.New("no time"), errors.New("no synced duration")
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "time="); ok {
				at, errAt = time.Parse(time.RFC3339Nano, v)
			}
			if v, ok := strings.CutPrefix(f, "synced="); ok {
				synced, errSynced = time.ParseDuration(v)
			}
		}
		if err := errors.Join(errAt, errSynced); err != nil {
			return time.Time{}, 0, fmt.Errorf("read the hub's scheduler started line %q: %w", line, err)
		}
		return at.Add(-synced), synced, nil
	}
	return time.Time{}, 0, errors.New("the hub did not log that its scheduler started")
}

// TestSchedulerMemory reports the test process's Go heap (scheduler
// snapshot plus informer caches) with 5,000 nodes and 50,000 bound pods
// (-schedbench.full); CI runs 500 nodes and 2,000 pods.
func TestSchedulerMemory(t *testing.T) {
	nodes, pods := 500, 2000
	if *benchFull {
		nodes, pods = 5000, 50000
	}
	runE2E(t, nodes, pods, false, false)
}

// benchSnapshot is an in-memory cluster of n nodes with pods already
// placed.
func benchSnapshot(b *testing.B, numNodes, numPods int, constrained bool) (*Snapshot, *Decider) {
	s := NewSnapshot()
	for i := range numNodes {
		s.SetNode(benchNode(i))
	}
	d := NewDecider(1)
	for i := range numPods {
		pod := benchPod(i, constrained, 50)
		pod.UID = types.UID(pod.Name)
		pi, err := NewPodInfo(pod, nil)
		if err != nil {
			b.Fatal(err)
		}
		dec := d.Decide(s, pi)
		if dec.Err != nil {
			b.Fatal(dec.Err)
		}
		s.AddPod(pi, dec.Node, false)
	}
	return s, d
}

// BenchmarkDecide measures one decision (filter and score, with the
// adaptive percentage of nodes) plus assuming the pod, in memory.
func BenchmarkDecide(b *testing.B) {
	for _, tc := range []struct {
		nodes, pods int
		constrained bool
	}{{100, 1000, false}, {5000, 10000, false}, {5000, 10000, true}} {
		b.Run(fmt.Sprintf("nodes=%d/pods=%d/constrained=%v", tc.nodes, tc.pods, tc.constrained), func(b *testing.B) {
			s, d := benchSnapshot(b, tc.nodes, tc.pods, tc.constrained)
			pis := make([]*PodInfo, b.N)
			for i := range pis {
				pod := benchPod(tc.pods+i, tc.constrained, 50)
				pod.UID = types.UID(pod.Name)
				pis[i], _ = NewPodInfo(pod, nil)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dec := d.Decide(s, pis[i])
				if dec.Err != nil {
					b.Fatal(dec.Err)
				}
				s.AddPod(pis[i], dec.Node, true)
			}
		})
	}
}
