package hollow_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/testbench/hollow"
)

// The size of TestHubScale. CI runs 1,000 nodes and 10,000 pods;
// TETHER_SCALE_FULL=1 runs 5,000 nodes and 150,000 pods, Kubernetes'
// envelope, and TETHER_SCALE_NODES, _PODS, _CHURN and _IDLE (durations)
// override either.
type scaleSize struct {
	full          bool
	nodes, pods   int
	perReplicaSet int
	churn, idle   time.Duration
}

func scaleBench(t *testing.T) scaleSize {
	s := scaleSize{nodes: 1000, pods: 10000, perReplicaSet: 100, churn: 20 * time.Second, idle: 10 * time.Second}
	if os.Getenv("TETHER_SCALE_FULL") != "" {
		s = scaleSize{full: true, nodes: 5000, pods: 150000, perReplicaSet: 500, churn: 2 * time.Minute, idle: time.Minute}
	}
	for env, p := range map[string]*int{"TETHER_SCALE_NODES": &s.nodes, "TETHER_SCALE_PODS": &s.pods} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				t.Fatalf("%s=%q: want a positive number", env, v)
			}
			*p = n
		}
	}
	for env, p := range map[string]*time.Duration{"TETHER_SCALE_CHURN": &s.churn, "TETHER_SCALE_IDLE": &s.idle} {
		if v := os.Getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a positive duration", env, v)
			}
			*p = d
		}
	}
	if s.pods < s.nodes {
		t.Fatalf("%d pods for %d nodes: the DaemonSet alone runs one per node", s.pods, s.nodes)
	}
	return s
}

// scaleNamespace holds the workloads of TestHubScale.
const scaleNamespace = "scale"

// TestHubScale measures what a fleet costs the hub: a hub alone, then
// with a fleet of hollow nodes idle, then running pods made by a DaemonSet
// (one per node) and Deployments (the rest), through a churn of rollouts,
// scaling and single-object writes, and at rest again. It reports hub
// memory per node and per pod beyond the hub's own, hub CPU and store
// writes at rest, API latency percentiles per verb and resource from the
// hub's /metrics, pod startup latency as a watch sees it, and the WAN
// bytes of an idle node; it fails on the bounds that catch a regression
// (see the checks at the end).
func TestHubScale(t *testing.T) {
	size := scaleBench(t)
	n := size.nodes
	rate := max(10, n/5)
	hubArgs := []string{fmt.Sprintf("--tunnel-handshake-rate=%d", rate), fmt.Sprintf("--tunnel-handshake-burst=%d", rate/2),
		"--cluster-cidr=" + clusterCIDRFor(n),
		// The heap after a collection, read from the heap profile, is the
		// steadier figure beside RSS.
		"--profiling"}
	h := hubtest.Start(t, hubArgs...)
	token, rc := joinToken(t, h)
	rc.QPS, rc.Burst = 500, 1000
	client := kubernetes.NewForConfigOrDie(rc)
	// The pod clock decodes every pod event: protobuf keeps the test's
	// own share of the machine small.
	prc := *rc
	prc.ContentType = "application/vnd.kubernetes.protobuf"
	protoClient := kubernetes.NewForConfigOrDie(&prc)
	ctx := context.Background()
	t.Logf("scale: %d nodes, %d pods, churn %v, idle %v, load average %s", n, size.pods, size.churn, size.idle, loadAverage())

	// The hub alone: what every figure per node and per pod is beyond.
	time.Sleep(3 * time.Second)
	base := measureHubMemory(t, h, client)
	t.Logf("hub alone: RSS %.1f MiB, heap %.1f MiB (%.1f MiB live)", mib(base.rss), mib(base.heap), mib(base.live))

	f, err := hollow.New(hollow.Config{
		HubURL: "https://" + h.Addr, Token: token, N: n, DataDir: t.TempDir(),
		StartWindow: max(2*time.Second, time.Duration(n)*10*time.Millisecond),
		Sim:         sim.Config{StartDelay: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	fleetCtx, stopFleet := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fleetCtx) }()
	defer func() {
		stopFleet()
		if err := <-done; err != nil {
			t.Errorf("fleet: %v", err)
		}
	}()
	w := &waiter{t: t, start: time.Now()}
	took := w.progress("all registered", "every node registered", 5*time.Minute, time.Minute,
		fleetCount(t, f, "all registered", func(s hollow.Stats) int { return s.Registered }))
	t.Logf("%d nodes registered in %v", n, took.Round(time.Millisecond))
	w.progress("all ready", "every node Ready", 2*time.Minute, time.Minute, func() (int, int, string) {
		r := readyNodes(client)
		return r, n, fmt.Sprintf("%d of %d nodes Ready", r, n)
	})

	// The fleet idle: no pods yet. Every agent writes its whole Node
	// status at its first status check after its tunnel connects (10s):
	// the window opens after those.
	time.Sleep(15 * time.Second)
	idleNodes := atRest(t, h, client, f, size.idle)
	nodesMem := measureHubMemory(t, h, client)
	t.Logf("hub with %d idle nodes: RSS %.1f MiB, heap %.1f MiB (%.1f MiB live); %s", n, mib(nodesMem.rss), mib(nodesMem.heap), mib(nodesMem.live), idleNodes)

	// Pods: a DaemonSet, and Deployments for the rest.
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clockCtx, stopClock := context.WithCancel(ctx)
	defer stopClock()
	clock, err := watchPods(clockCtx, protoClient, scaleNamespace)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	cpuProfile := profileCPU(t, client, "hub-cpu.pb.gz", 30*time.Second)
	deployments := createWorkloads(t, client, size)
	t.Logf("%d workloads created in %v", len(deployments)+1, time.Since(created).Round(time.Millisecond))
	w.progress("pods running", "every pod Running", 5*time.Minute, time.Minute, func() (int, int, string) {
		d, seen := clock.startups()
		return len(d), size.pods, fmt.Sprintf("%d pods seen, %d running", seen, len(d))
	})
	startedAll := time.Since(created)
	startups, _ := clock.startups()
	t.Logf("%d pods running %v after the first create (%.0f pods/s); startup p50 %v, p99 %v, max %v", size.pods,
		startedAll.Round(time.Millisecond), float64(size.pods)/startedAll.Seconds(),
		percentile(startups, 0.5).Round(time.Millisecond), percentile(startups, 0.99).Round(time.Millisecond),
		percentile(startups, 1).Round(time.Millisecond))
	toScheduled, toRunning := clock.stages()
	t.Logf("startup stages in the burst: seen → bound p50 %v p99 %v; bound → Running p50 %v p99 %v",
		percentile(toScheduled, 0.5).Round(time.Millisecond), percentile(toScheduled, 0.99).Round(time.Millisecond),
		percentile(toRunning, 0.5).Round(time.Millisecond), percentile(toRunning, 0.99).Round(time.Millisecond))

	// Startup latency as upstream's SLO measures it: pods created one
	// by one at a steady rate into the loaded cluster, from the create
	// call to Running seen by a watch (the burst above measures the
	// scheduler's and the nodes' throughput, its latencies its queues).
	latency := latencyPods(t, client, clock, size)
	t.Logf("%d latency pods at %d/s: startup p50 %v, p99 %v, max %v", len(latency), latencyPodRate,
		percentile(latency, 0.5).Round(time.Millisecond), percentile(latency, 0.99).Round(time.Millisecond), percentile(latency, 1).Round(time.Millisecond))

	// Churn: rollouts, scaling, single-object writes and whole lists.
	before, err := readLatencies(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	<-cpuProfile
	churnProfile := profileCPU(t, client, "hub-cpu-churn.pb.gz", size.churn)
	churn := runChurn(t, client, deployments, size)
	<-churnProfile
	after, err := readLatencies(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	single := worstP99(before, after, []string{"get", "create", "update", "patch", "delete"}, 20)
	lists := worstP99(before, after, []string{"list"}, 5)
	for i, q := range single {
		if i < 5 {
			t.Logf("churn, single-object: %s", q)
		}
	}
	for _, q := range lists {
		t.Logf("churn, list: %s", q)
	}
	t.Logf("churn: %s", churn)
	if len(churn.errors) > 0 {
		t.Errorf("%d API calls failed during the churn, the first: %s", len(churn.errors), churn.errors[0])
	}

	// At rest again, every rollout done.
	w.progress("rollouts done", "every Deployment rolled out and every pod Running", 5*time.Minute, time.Minute, func() (int, int, string) {
		return settled(ctx, client, deployments, size.pods+len(latency))
	})
	time.Sleep(5 * time.Second)
	rest := atRest(t, h, client, f, size.idle)
	podsMem := measureHubMemory(t, h, client)
	saveProfiles(t, client)
	t.Logf("hub with %d nodes and %d pods at rest: RSS %.1f MiB, heap %.1f MiB (%.1f MiB live); %s", n, size.pods, mib(podsMem.rss), mib(podsMem.heap), mib(podsMem.live), rest)

	perNode := func(a, b int64) float64 { return float64(b-a) / float64(n) / 1e3 }
	perPod := func(a, b int64) float64 { return float64(b-a) / float64(size.pods+len(latency)) / 1e3 }
	mode := benchfmt.Mode(size.full)
	sizes := []string{fmt.Sprintf("nodes=%d", n), fmt.Sprintf("pods=%d", size.pods)}
	report := func(f benchfmt.Figure) {
		f.Mode, f.Extra = mode, append(f.Extra, sizes...)
		benchfmt.Report(t, f)
	}
	report(benchfmt.Figure{Name: "scale_hub_rss_per_node", Value: perNode(base.rss, nodesMem.rss), Unit: "KB", Target: "<=150",
		Extra: []string{fmt.Sprintf("heap_kb=%.1f", perNode(base.heap, nodesMem.heap)), fmt.Sprintf("live_kb=%.1f", perNode(base.live, nodesMem.live)),
			fmt.Sprintf("base_rss_mib=%.1f", mib(base.rss))}})
	report(benchfmt.Figure{Name: "scale_hub_rss_per_pod", Value: perPod(nodesMem.rss, podsMem.rss), Unit: "KB", Target: "<=6",
		Extra: []string{fmt.Sprintf("heap_kb=%.2f", perPod(nodesMem.heap, podsMem.heap)), fmt.Sprintf("live_kb=%.2f", perPod(nodesMem.live, podsMem.live)),
			fmt.Sprintf("rss_mib=%.1f", mib(podsMem.rss))}})
	report(benchfmt.Figure{Name: "scale_store_writes_idle", Value: rest.writesPerSec, Unit: "writes/s",
		Extra: []string{fmt.Sprintf("heartbeats_per_s=%.0f", float64(n)/15), fmt.Sprintf("election_writes_per_s=%.2f", rest.electionWritesPerSec)}})
	report(benchfmt.Figure{Name: "scale_hub_cpu_idle", Value: 100 * rest.cpuShare, Unit: "% of a core",
		Extra: []string{fmt.Sprintf("without_pods=%.1f", 100*idleNodes.cpuShare)}})
	report(benchfmt.Figure{Name: "scale_wan_bytes_per_node_idle", Value: rest.wanBytesPerNodeMin, Unit: "B/min"})
	if len(single) > 0 {
		report(benchfmt.Figure{Name: "scale_api_p99_single", Value: single[0].p99.Seconds(), Unit: "s", Target: "<=1",
			Extra: []string{"worst=" + single[0].key.verb + "_" + single[0].key.resource, fmt.Sprintf("client_p99_s=%.3f", churn.singleP99.Seconds())}})
	}
	report(benchfmt.Figure{Name: "scale_list_pods_p99", Value: churn.listP99.Seconds() * 1e3, Unit: "ms", Target: "<=150",
		Extra: []string{fmt.Sprintf("lists=%d", churn.lists), "client_side", "protobuf"}})
	report(benchfmt.Figure{Name: "scale_pod_startup_p99", Value: percentile(latency, 0.99).Seconds(), Unit: "s", Target: "<=5",
		Extra: []string{fmt.Sprintf("p50_s=%.2f", percentile(latency, 0.5).Seconds()), fmt.Sprintf("latency_pods=%d", len(latency))}})
	report(benchfmt.Figure{Name: "scale_pods_per_s", Value: float64(size.pods) / startedAll.Seconds(), Unit: "pods/s",
		Extra: []string{fmt.Sprintf("burst_startup_p50_s=%.2f", percentile(startups, 0.5).Seconds()), fmt.Sprintf("burst_startup_p99_s=%.2f", percentile(startups, 0.99).Seconds())}})

	// The bounds that catch a regression. The targets above are reported,
	// not asserted: see docs/benchmarks.md for where they stand.
	if len(single) > 0 && single[0].p99 > time.Second {
		t.Errorf("single-object API p99 under churn is %v (%s), over upstream's 1s SLO", single[0].p99, single[0])
	}
	if p99 := percentile(latency, 0.99); p99 > 5*time.Second {
		t.Errorf("pod startup p99 is %v, over upstream's 5s SLO", p99)
	}
	// Memory, within about 1.5 times what it measured when these bounds
	// were set: the live heap after a collection, the steadiest figure
	// (105 KB per node, 26 KB per pod), the heap in use, which adds the
	// room freed objects leave in the allocator's spans (203–209 KB per
	// node, 53–56 KB per pod), and RSS, which moves with the collector's
	// timing (350–354 KB per node, 90–108 KB per pod). The targets, 150
	// and 6 KB of RSS, are reported, not met.
	for _, b := range []struct {
		what  string
		kb    float64
		bound float64
	}{
		{"live heap per idle node", perNode(base.live, nodesMem.live), 160},
		{"live heap per pod", perPod(nodesMem.live, podsMem.live), 40},
		{"heap per idle node", perNode(base.heap, nodesMem.heap), 310},
		{"heap per pod", perPod(nodesMem.heap, podsMem.heap), 85},
		{"RSS per idle node", perNode(base.rss, nodesMem.rss), 530},
		{"RSS per pod", perPod(nodesMem.rss, podsMem.rss), 165},
	} {
		if b.kb > b.bound {
			t.Errorf("hub %s %.0f KB, over the regression bound of %.0f KB", b.what, b.kb, b.bound)
		}
	}
	// A node writes its status every 5 minutes at rest, as the kubelet
	// does; one write per heartbeat would be n/15 per second.
	if limit := float64(n) / 60; rest.writesPerSec > limit {
		t.Errorf("%.1f store writes/s at rest with %d nodes, over %.1f (one per node per minute)", rest.writesPerSec, n, limit)
	}
}

// hubMemory is the hub's resident set, and its heap in use and live heap
// after a collection (see hubHeap).
type hubMemory struct{ rss, heap, live int64 }

func measureHubMemory(t *testing.T, h *hubtest.Hub, client kubernetes.Interface) hubMemory {
	t.Helper()
	heap, live, err := hubHeap(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	rss, err := h.RSS()
	if err != nil {
		t.Fatal(err)
	}
	return hubMemory{rss: rss, heap: heap, live: live}
}

// saveProfiles writes the hub's heap and goroutine profiles into the
// directory $TETHER_SCALE_PROFILES when it is set, for whoever looks into
// where the hub's memory goes (go tool pprof -sample_index=inuse_space).
func saveProfiles(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	dir := os.Getenv("TETHER_SCALE_PROFILES")
	if dir == "" {
		return
	}
	for _, p := range []string{"heap", "goroutine"} {
		raw, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/" + p).DoRaw(context.Background())
		if err != nil {
			t.Errorf("read hub %s profile: %v", p, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "hub-"+p+".pb.gz"), raw, 0o644); err != nil {
			t.Error(err)
		}
	}
}

// profileCPU records the hub's CPU profile for d into the file name in
// $TETHER_SCALE_PROFILES when that is set; the returned channel is closed
// when it is written (or at once when it is not set).
func profileCPU(t *testing.T, client kubernetes.Interface, name string, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("TETHER_SCALE_PROFILES")
	if dir == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
		defer cancel()
		raw, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + 30*time.Second).DoRaw(ctx)
		if err != nil {
			t.Errorf("read hub CPU profile: %v", err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o644); err != nil {
			t.Error(err)
		}
	}()
	return done
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// scaleRest is what the hub and the fleet do over a window at rest.
type scaleRest struct {
	// writesPerSec counts every store write; electionWritesPerSec those
	// of them that renewed the hub's leader-election Leases.
	writesPerSec, electionWritesPerSec float64
	cpuShare, wanBytesPerNodeMin       float64
}

func (r scaleRest) String() string {
	return fmt.Sprintf("at rest: %.2f store writes/s (%.2f/s of leader elections), hub CPU %.1f%% of a core, WAN %.0f B/min per node",
		r.writesPerSec, r.electionWritesPerSec, 100*r.cpuShare, r.wanBytesPerNodeMin)
}

func atRest(t *testing.T, h *hubtest.Hub, client kubernetes.Interface, f *hollow.Fleet, d time.Duration) scaleRest {
	t.Helper()
	s0, rev0, cpu0 := f.Stats(), storeRevision(t, client), hubCPU(t, h)
	elections := watchElections(t, client, rev0)
	time.Sleep(d)
	s1, rev1, cpu1 := f.Stats(), storeRevision(t, client), hubCPU(t, h)
	electionWrites := elections(rev1)
	wan := float64(s1.BytesSent-s0.BytesSent+s1.BytesReceived-s0.BytesReceived) / float64(s1.Agents)
	return scaleRest{
		// The readings themselves are lists, no writes.
		writesPerSec:         float64(rev1-rev0) / d.Seconds(),
		electionWritesPerSec: float64(electionWrites) / d.Seconds(),
		cpuShare:             float64(cpu1-cpu0) / float64(d),
		wanBytesPerNodeMin:   wan / d.Minutes(),
	}
}

// latencyPodRate is how many latency pods a second latencyPods creates.
const latencyPodRate = 10

// latencyPods creates latency pods one by one, latencyPodRate a second
// (100 of them, 500 at full size), waits until they all run and returns
// their startup latencies, sorted: from the create call to Running seen
// by the clock's watch.
func latencyPods(t *testing.T, client kubernetes.Interface, clock *podClock, size scaleSize) []time.Duration {
	t.Helper()
	ctx := context.Background()
	n := 100
	if size.full {
		n = 500
	}
	created := map[types.UID]time.Time{}
	tick := time.NewTicker(time.Second / latencyPodRate)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("latency-%04d", i), Labels: map[string]string{"app": "latency"}},
			Spec: podTemplate(nil).Spec}
		at := time.Now()
		p, err := client.CoreV1().Pods(scaleNamespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create latency pod: %v", err)
		}
		created[p.UID] = at
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sorted, missing := clock.runningSince(created)
		if missing == 0 {
			return sorted
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d latency pods not Running 2m after the last create", missing, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// createWorkloads creates a DaemonSet and as many Deployments of
// size.perReplicaSet replicas as the pods beyond it need; it returns the
// Deployments' names and replicas.
func createWorkloads(t *testing.T, client kubernetes.Interface, size scaleSize) map[string]int32 {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{"app": "agent"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: scaleNamespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate(labels),
		},
	}
	if _, err := client.AppsV1().DaemonSets(scaleNamespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for left, i := size.pods-size.nodes, 0; left > 0; i++ {
		replicas := int32(min(left, size.perReplicaSet))
		left -= int(replicas)
		name := fmt.Sprintf("web-%03d", i)
		labels := map[string]string{"app": name}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: scaleNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: podTemplate(labels),
			},
		}
		start := time.Now()
		if _, err := client.AppsV1().Deployments(scaleNamespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > time.Second {
			t.Logf("creating Deployment %s took %v", name, took.Round(time.Millisecond))
		}
		out[name] = replicas
	}
	return out
}

func podTemplate(labels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
}

// churnFigures are what the churn did and what the test's own lists of
// every pod took.
type churnFigures struct {
	rollouts, writes, lists int
	listP99                 time.Duration
	singleP99               time.Duration // the ConfigMap calls, timed by the client
	errors                  []string
}

func (c churnFigures) String() string {
	s := fmt.Sprintf("%d rollouts, %d single-object writes (client p99 %v), %d lists of every pod (p99 %v)", c.rollouts, c.writes,
		c.singleP99.Round(time.Millisecond), c.lists, c.listP99.Round(time.Millisecond))
	if len(c.errors) > 0 {
		s += fmt.Sprintf("; %d errors, the first: %s", len(c.errors), c.errors[0])
	}
	return s
}

// runChurn, for size.churn: rolls out one Deployment after another (a new
// pod template: every pod replaced), writes a ConfigMap ten times a
// second (create, update, get, delete), and lists every pod of the
// namespace every two seconds, timing each list.
func runChurn(t *testing.T, client kubernetes.Interface, deployments map[string]int32, size scaleSize) churnFigures {
	t.Helper()
	// The churn's end stops the loops, never a call: each call has its
	// own deadline, and a call the end would cut short is not an error.
	stop, cancel := context.WithTimeout(context.Background(), size.churn)
	defer cancel()
	ctx, cancelCalls := context.WithTimeout(context.Background(), size.churn+time.Minute)
	defer cancelCalls()
	var (
		mu  sync.Mutex
		fig churnFigures
		wg  sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		fig.errors = append(fig.errors, err.Error())
		mu.Unlock()
	}
	every := func(d time.Duration, do func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(d)
			defer tick.Stop()
			for i := 0; ; i++ {
				do(i)
				select {
				case <-stop.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	var names []string
	for name := range deployments {
		names = append(names, name)
	}
	// Rollouts: one every three seconds, each replacing a whole Deployment.
	every(3*time.Second, func(i int) {
		if len(names) == 0 {
			return
		}
		patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"scale/rollout":"%d"}}}}}`, i)
		if _, err := client.AppsV1().Deployments(scaleNamespace).Patch(ctx, names[i%len(names)], types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			fail(fmt.Errorf("roll out %s: %w", names[i%len(names)], err))
			return
		}
		mu.Lock()
		fig.rollouts++
		mu.Unlock()
	})
	// Single-object writes, each call timed by the client as well.
	var single []time.Duration
	timed := func(call func() error) error {
		start := time.Now()
		err := call()
		mu.Lock()
		single = append(single, time.Since(start))
		mu.Unlock()
		return err
	}
	every(100*time.Millisecond, func(i int) {
		cms := client.CoreV1().ConfigMaps(scaleNamespace)
		name := fmt.Sprintf("churn-%d", i%20)
		var cm *corev1.ConfigMap
		if err := timed(func() (err error) {
			cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": strconv.Itoa(i)}}, metav1.CreateOptions{})
			return err
		}); err != nil {
			fail(fmt.Errorf("create configmap: %w", err))
			return
		}
		cm.Data["i"] = "updated"
		if err := timed(func() error { _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); return err }); err != nil {
			fail(fmt.Errorf("update configmap: %w", err))
		}
		if err := timed(func() error { _, err := cms.Get(ctx, name, metav1.GetOptions{}); return err }); err != nil {
			fail(fmt.Errorf("get configmap: %w", err))
		}
		if err := timed(func() error { return cms.Delete(ctx, name, metav1.DeleteOptions{}) }); err != nil {
			fail(fmt.Errorf("delete configmap: %w", err))
		}
		mu.Lock()
		fig.writes += 3
		mu.Unlock()
	})
	// Whole lists, as an informer's relist makes them: client-go's typed
	// clients ask for protobuf, which the hub encodes from each stored
	// pod decoded (kubectl's JSON lists are spliced from the stored bytes).
	var took []time.Duration
	every(2*time.Second, func(int) {
		start := time.Now()
		_, err := client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			fail(fmt.Errorf("list pods: %w", err))
			return
		}
		d := time.Since(start)
		mu.Lock()
		took = append(took, d)
		fig.lists++
		mu.Unlock()
	})
	wg.Wait()
	slices.Sort(took)
	fig.listP99 = percentile(took, 0.99)
	slices.Sort(single)
	fig.singleP99 = percentile(single, 0.99)
	return fig
}

// settled counts the Deployments rolled out (every replica updated and
// available) and tells whether the namespace runs exactly want pods.
func settled(ctx context.Context, client kubernetes.Interface, deployments map[string]int32, want int) (int, int, string) {
	list, err := client.AppsV1().Deployments(scaleNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, len(deployments) + 1, fmt.Sprintf("list deployments: %v", err)
	}
	done := 0
	for _, d := range list.Items {
		s := d.Status
		if s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == deployments[d.Name] &&
			s.AvailableReplicas == deployments[d.Name] && s.Replicas == deployments[d.Name] {
			done++
		}
	}
	pods, err := client.CoreV1().Pods(scaleNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return done, len(deployments) + 1, fmt.Sprintf("list pods: %v", err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running++
		}
	}
	state := fmt.Sprintf("%d of %d Deployments rolled out; %d pods, %d running (want %d)", done, len(deployments), len(pods.Items), running, want)
	if len(pods.Items) == want && running == want {
		done++
	}
	return done, len(deployments) + 1, state
}
