package containerd

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/edge/upgrade"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

var (
	footprintFull = flag.Bool("footprint.full", false, "TestAgentFootprintAndPodStartup: 20 pods one at a time, 50 at once, a 30-minute idle window, 5 minutes with the pods (default: 5, 20, 2 minutes, 30 seconds)")
	footprintIdle = flag.Duration("footprint.idle", 0, "TestAgentFootprintAndPodStartup: the idle window (default: 2m, 30m with -footprint.full)")
)

// TestAgentFootprintAndPodStartup runs `tether edge` as its own process,
// from the stripped edge build nodes install (tether-edge), with the
// containerd runtime and the eBPF dataplane (on a test cgroup)
// against a real hub, and measures what a node pays for the agent and what
// its users wait for:
//
//   - the agent's working set: the pages (anonymous and file) it referenced
//     over a window, from /proc/PID/smaps_rollup's Referenced after writing 1
//     to /proc/PID/clear_refs at the window's start; the window lasts until
//     a garbage collection ran in it (a collection reads the whole live
//     heap), in the short run for 10 s more at most. Idle over the idle
//     window, and with the pods running. Of it, the executable's pages,
//     and how much of the resident executable sits in large folios,
//     which the kernel keeps, and may count referenced, as a whole (the
//     executable is written as `tether install` and upgrades write it:
//     synced and dropped from the page cache, see upgrade.Uncache, so its
//     pages come back through the agent's page faults, as after a boot);
//   - its PSS, RSS and major page faults, and the PSS of containerd and the
//     shims, alongside;
//   - the kernel memory of the eBPF maps the agent holds: the sum of
//     memlock in /proc/PID/fdinfo over its map descriptors (each map once);
//   - the size of the full `tether` binary and of the edge-only build
//     (-tags edge), unstripped and stripped; the full run builds them as
//     scripts/build.sh does (-trimpath), the short one from the build
//     cache, without;
//   - pod start-up, create → Running as a watch sees it, local image: one
//     pod at a time right after the node is Ready, one at a time again after
//     the idle window, and many at once.
//
// Nothing trims the agent's memory. Each figure is printed as one line
//
//	BENCH name=NAME value=V unit=U [target=T met=yes|no] [key=value...]
//
// for scripts to tabulate. The targets (working set 20 MB idle and 30 MB
// with 50 pods, edge binary 45 MB stripped, p99 after idle within 1.2× of
// p99 right after start; in MiB 19.07, 28.61, 42.92) are reported, not
// asserted; the short run CI makes
// (20 pods, a 2-minute idle window) fails only past generous regression
// bounds. The idle figures are printed as soon as they are measured. The
// full run:
//
//	go test ./edge/containerd -run TestAgentFootprintAndPodStartup -v -count=1 -timeout 60m -args -footprint.full
func TestAgentFootprintAndPodStartup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containers and attach eBPF programs")
	}
	// As root (CI) it runs: what it needs is installed by scripts/test.sh.
	for _, bin := range []string{"containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("needs %s: %v", bin, err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		if _, err2 := os.Stat("/opt/cni/bin/bridge"); err2 != nil {
			t.Fatal("needs the CNI plugins (containernetworking-plugins)")
		}
	}
	seq, many := 5, 20
	// A window lasts until a garbage collection ran in it, for at most
	// gcGrace more; the short run, which CI makes within 4 minutes,
	// reports a window without one rather than wait for the runtime's
	// forced collection (every 2 minutes).
	idleWindow, podsWindow, gcGrace := 2*time.Minute, 20*time.Second, 10*time.Second
	if *footprintFull {
		seq, many = 20, 50
		idleWindow, podsWindow, gcGrace = 30*time.Minute, 5*time.Minute, 2*time.Minute+30*time.Second
	}
	if *footprintIdle > 0 {
		idleWindow = *footprintIdle
	}
	benchLine("loadavg_start", loadAvg(), "load", "")
	h, tok, cfg := startJoinableHub(t, "--cluster-cidr", "10.78.0.0/16")
	// Pods created at once go out at once: no client-side rate limit
	// (client-go's default, 5 per second, would count in their start-up).
	cfg.QPS, cfg.Burst = 1000, 1000
	client := kubernetes.NewForConfigOrDie(cfg)

	const bridge = "ttfoot"
	host := newAgentHost(t, "footprint", bridge)
	dir, cgroup, pins := host.dir, host.cgroup, host.pins

	// The agent runs the edge build, stripped, as nodes install it
	// (scripts/build.sh, tether-edge); it is built before the agent starts
	// and the other binaries are built while the agent starts. Its pages
	// are the agent's own: none is shared with the hub's process.
	buildDir := t.TempDir()
	buildCtx, stopBuild := context.WithCancel(context.Background())
	defer stopBuild()
	b, err := newBuilder(buildCtx, buildDir, *footprintFull)
	if err != nil {
		t.Fatal(err)
	}
	edgeBin, edgeStripped, err := b.build(buildCtx, "tether-edge-stripped", "edge", "-s -w")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "tether")
	if err := copyFile(edgeBin, bin); err != nil {
		t.Fatal(err)
	}
	var agentLog syncBuffer
	agent := exec.Command(bin, "edge", "--hub", "https://"+h.Addr, "--token", tok,
		"--data-dir", dir, "--name", "foot-0", "--runtime", "containerd", "--node-ip", "127.0.0.1",
		"--containerd-address", filepath.Join(dir, "containerd", "containerd.sock"),
		"--dataplane", "ebpf", "--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--uplinks", "none",
		"--dns-addr", "none", "--pod-bridge", bridge, "--log-level", "debug")
	agent.Stdout, agent.Stderr = &agentLog, &agentLog
	// The runtime's line per garbage collection (gctrace) tells the test
	// when one ran in a working-set window.
	agent.Env = append(os.Environ(), "GODEBUG="+strings.TrimPrefix(os.Getenv("GODEBUG")+",gctrace=1", ","))
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	pid := agent.Process.Pid
	agentDone := make(chan struct{})
	go func() { _ = agent.Wait(); close(agentDone) }()
	t.Cleanup(func() {
		_ = agent.Process.Signal(syscall.SIGTERM)
		select {
		case <-agentDone:
		case <-time.After(20 * time.Second):
			_ = agent.Process.Kill()
			<-agentDone
		}
	})
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nagent log:\n%s", append(args, agentLog.String())...)
	}
	// The other binaries' sizes, built while the agent starts and done
	// before any measurement. The short run links from the build cache
	// (the unstripped full binary is the hub's); the full one builds as
	// releases are built (-trimpath).
	type sizes struct {
		full, fullStripped, edge, edgeStripped int64
		err                                    error
	}
	built := make(chan sizes, 1)
	go func() {
		s := sizes{edgeStripped: edgeStripped}
		s.full, s.fullStripped, s.edge, s.err = buildSizes(buildCtx, b, h.Bin)
		built <- s
	}()

	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := client.CoreV1().Nodes().Get(context.Background(), "foot-0", metav1.GetOptions{})
		if err == nil && nodeReady(n) {
			break
		}
		if time.Now().After(deadline) {
			fail("node foot-0 not Ready within 2 minutes: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Running is seen on a watch of the namespace, as `kubectl get -w`
	// would show it.
	w, err := client.CoreV1().Pods("default").Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	running := map[string]time.Time{}
	changed := make(chan struct{}, 1)
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || p.Status.Phase != corev1.PodRunning {
				continue
			}
			mu.Lock()
			if _, seen := running[p.Name]; !seen {
				running[p.Name] = time.Now()
			}
			mu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}()
	create := func(name string) time.Time {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "footprint"}},
			Spec: corev1.PodSpec{NodeName: "foot-0", TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "c", Image: images.Echo, ImagePullPolicy: corev1.PullNever}}},
		}
		start := time.Now()
		if _, err := client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
			fail("create %s: %v", name, err)
		}
		return start
	}
	waitRunning := func(names []string, timeout time.Duration) {
		t.Helper()
		deadline := time.After(timeout)
		for {
			mu.Lock()
			n := 0
			for _, name := range names {
				if _, ok := running[name]; ok {
					n++
				}
			}
			mu.Unlock()
			if n == len(names) {
				return
			}
			select {
			case <-changed:
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				fail("%d of %d pods Running after %v", n, len(names), timeout)
			}
		}
	}
	took := func(name string, start time.Time) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return running[name].Sub(start)
	}
	// oneAtATime starts n pods one after the other, each deleted once
	// Running, and waits until the agent removed them all.
	oneAtATime := func(prefix string, n int) []time.Duration {
		t.Helper()
		var ds []time.Duration
		for i := range n {
			name := fmt.Sprintf("%s-%d", prefix, i)
			start := create(name)
			waitRunning([]string{name}, 2*time.Minute)
			ds = append(ds, took(name, start))
			if err := client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			l, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
			if err == nil && len(l.Items) == 0 {
				return ds
			}
			if time.Now().After(deadline) {
				fail("pods %s-* not removed within 2 minutes: %v", prefix, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// workingSet measures the pages the agent references over window,
	// and longer, by gcGrace at most, until a garbage collection ran in
	// it.
	workingSet := func(window time.Duration) usage {
		t.Helper()
		gcs := gcCount(agentLog.String())
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("1"), 0); err != nil {
			t.Fatalf("clear the agent's referenced bits: %v", err)
		}
		start := time.Now()
		time.Sleep(window)
		for deadline := time.Now().Add(gcGrace); gcCount(agentLog.String()) == gcs && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
		}
		u := footprint(pid, dir)
		u.window, u.gcs = time.Since(start).Round(time.Second), gcCount(agentLog.String())-gcs
		return u
	}

	var bins sizes
	select {
	case bins = <-built:
	case <-time.After(10 * time.Minute):
		t.Fatal("building the binaries took over 10 minutes")
	}
	if bins.err != nil {
		t.Fatal(bins.err)
	}

	fresh := oneAtATime("fresh", seq)
	idle := workingSet(idleWindow)
	idle.memlock, idle.maps = mapsMemlock(pid)
	// Printed at once: a later failure keeps them.
	mb := func(b int64) float64 { return float64(b) / (1 << 20) }
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	win := func(u usage) string {
		return fmt.Sprintf("executable=%.1f executable_large_folios=%s window=%v gcs=%d", mb(u.exeReferenced), u.largeFolios(""), u.window, u.gcs)
	}
	wsIdle := mb(idle.referenced)
	t.Logf("idle: %s", idle)
	benchLine("agent_working_set_idle", wsIdle, "MiB", "<=19.07", win(idle))
	benchLine("agent_pss_idle", mb(idle.pss), "MiB", "")
	benchLine("agent_rss_idle", mb(idle.rss), "MiB", "", fmt.Sprintf("anon=%.1f file=%.1f", mb(idle.anon), mb(idle.file)))
	benchLine("bpf_maps_memlock_idle", mb(idle.memlock), "MiB", "", fmt.Sprintf("maps=%d source=fdinfo", idle.maps))
	benchLine("loadavg_idle", loadAvg(), "load", "")
	_, faultsBefore := cpuAndFaults(pid)
	afterIdle := oneAtATime("again", seq)
	_, faultsAfter := cpuAndFaults(pid)

	var names []string
	for i := range many {
		names = append(names, fmt.Sprintf("load-%d", i))
	}
	starts := map[string]time.Time{}
	var wg sync.WaitGroup
	var smu sync.Mutex
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := create(name)
			smu.Lock()
			starts[name] = s
			smu.Unlock()
		}()
	}
	wg.Wait()
	waitRunning(names, 4*time.Minute)
	var loaded []time.Duration
	for _, name := range names {
		loaded = append(loaded, took(name, starts[name]))
	}
	withPods := workingSet(podsWindow)
	withPods.memlock, withPods.maps = mapsMemlock(pid)

	t.Logf("%d pods: %s", many, withPods)
	t.Logf("pod start-up, create → Running: %d one at a time right after start %v; %d one at a time after %v idle %v (%d major faults); %d at once %v",
		seq, fresh, seq, idle.window, afterIdle, faultsAfter-faultsBefore, many, loaded)

	wsPods := mb(withPods.referenced)
	if withPods.gcs > 0 {
		benchLine("agent_working_set_pods", wsPods, "MiB", "<=28.61", fmt.Sprintf("pods=%d target_pods=50 %s", many, win(withPods)))
	} else {
		// Without a collection the window misses the pages one reads:
		// a lower bound, not to be held against the target.
		benchLine("agent_working_set_pods", wsPods, "MiB", "", fmt.Sprintf("pods=%d target_pods=50 %s target=<=28.61 met=n/a lower_bound=no_gc", many, win(withPods)))
	}
	benchLine("agent_pss_pods", mb(withPods.pss), "MiB", "", fmt.Sprintf("pods=%d", many))
	benchLine("agent_rss_pods", mb(withPods.rss), "MiB", "", fmt.Sprintf("pods=%d anon=%.1f file=%.1f", many, mb(withPods.anon), mb(withPods.file)))
	benchLine("bpf_maps_memlock_pods", mb(withPods.memlock), "MiB", "", fmt.Sprintf("maps=%d source=fdinfo pods=%d", withPods.maps, many))
	benchLine("containerd_pss_pods", mb(withPods.containerdPSS), "MiB", "", fmt.Sprintf("pods=%d", many))
	benchLine("shims_pss_pods", mb(withPods.shimPSS), "MiB", "", fmt.Sprintf("shims=%d", withPods.shims))
	trim := fmt.Sprintf("trimpath=%v", *footprintFull)
	benchLine("binary_size_full", mb(bins.full), "MiB", "", trim)
	benchLine("binary_size_full_stripped", mb(bins.fullStripped), "MiB", "", trim)
	benchLine("binary_size_edge", mb(bins.edge), "MiB", "", trim)
	benchLine("binary_size_edge_stripped", mb(bins.edgeStripped), "MiB", "<=42.92", trim)
	freshP99, idleP99 := pctile(fresh, 0.99), pctile(afterIdle, 0.99)
	benchLine("pod_start_p50_fresh", ms(pctile(fresh, 0.5)), "ms", "", fmt.Sprintf("pods=%d", seq))
	benchLine("pod_start_p99_fresh", ms(freshP99), "ms", "", fmt.Sprintf("pods=%d first=%.0f", seq, ms(fresh[0])))
	benchLine("pod_start_p50_after_idle", ms(pctile(afterIdle, 0.5)), "ms", "", fmt.Sprintf("pods=%d idle=%v", seq, idle.window))
	benchLine("pod_start_p99_after_idle", ms(idleP99), "ms", "", fmt.Sprintf("pods=%d first=%.0f idle=%v major_faults=%d", seq, ms(afterIdle[0]), idle.window, faultsAfter-faultsBefore))
	benchLine("pod_start_p99_after_idle_ratio", float64(idleP99)/float64(freshP99), "x", "<=1.2")
	benchLine("pod_start_p50_load", ms(pctile(loaded, 0.5)), "ms", "", fmt.Sprintf("pods=%d", many))
	benchLine("pod_start_p99_load", ms(pctile(loaded, 0.99)), "ms", "", fmt.Sprintf("pods=%d", many))
	benchLine("loadavg_end", loadAvg(), "load", "")

	if *footprintFull {
		return
	}
	// The short run guards against regressions, with room for a machine
	// shared with other work: bounds well above what it measures, and
	// the targets are the full run's to report.
	check := func(what string, got, limit float64) {
		t.Helper()
		if got > limit {
			t.Errorf("%s: %.1f, want at most %.1f", what, got, limit)
		}
	}
	check("agent working set idle, MiB", wsIdle, 48)
	check(fmt.Sprintf("agent working set with %d pods, MiB", many), wsPods, 56)
	check("edge binary stripped, MiB", mb(bins.edgeStripped), 64)
	check("pod start p99 after idle, ms", ms(idleP99), 3*ms(freshP99)+2000)
}

// benchLine prints one figure as a line scripts can read: name, value,
// unit, the target (with whether the value meets it) and extra key=value
// fields.
func benchLine(name string, value float64, unit, target string, extra ...string) {
	line := fmt.Sprintf("BENCH name=%s value=%.3f unit=%s", name, value, unit)
	if target != "" {
		met := "no"
		if limit, err := strconv.ParseFloat(strings.TrimPrefix(target, "<="), 64); err == nil && value <= limit {
			met = "yes"
		}
		line += " target=" + target + " met=" + met
	}
	if *footprintFull {
		line += " mode=full"
	} else {
		line += " mode=short"
	}
	for _, e := range extra {
		line += " " + e
	}
	fmt.Println(line)
}

// loadAvg is the host's load average over the last minute.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// builder builds cmd/tether into dir. With trimpath set it builds as
// scripts/build.sh does (-trimpath), which compiles every package again
// (and SQLite's C); without, it links the packages the hub's build left in
// the cache, and the sizes differ from the release builds' only by the
// longer file paths they record.
type builder struct {
	root, dir string
	trimpath  bool
}

func newBuilder(ctx context.Context, dir string, trimpath bool) (*builder, error) {
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return nil, fmt.Errorf("find the module: %w", err)
	}
	return &builder{root: strings.TrimSpace(string(root)), dir: dir, trimpath: trimpath}, nil
}

// build builds the binary name with the build tags and linker flags given
// and returns its path and size.
func (b *builder) build(ctx context.Context, name, tags, ldflags string) (string, int64, error) {
	out := filepath.Join(b.dir, name)
	args := []string{"build", "-tags", tags, "-ldflags", ldflags, "-o", out}
	if b.trimpath {
		args = append(args, "-trimpath")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/tether")...)
	cmd.Dir = b.root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", 0, fmt.Errorf("build %s: %w\n%s", name, err, msg)
	}
	fi, err := os.Stat(out)
	if err != nil {
		return "", 0, err
	}
	return out, fi.Size(), nil
}

// buildSizes builds the full binary, unstripped and stripped (-ldflags
// '-s -w'), and the edge build unstripped, and returns their sizes.
// Without trimpath it takes fullBin (the hub's build, `go build
// ./cmd/tether`) as the unstripped full binary.
func buildSizes(ctx context.Context, b *builder, fullBin string) (full, fullStripped, edge int64, err error) {
	if !b.trimpath {
		fi, err := os.Stat(fullBin)
		if err != nil {
			return 0, 0, 0, err
		}
		full = fi.Size()
	}
	for _, bin := range []struct {
		name, tags, ldflags string
		size                *int64
	}{
		{"tether", "", "", &full},
		{"tether-stripped", "", "-s -w", &fullStripped},
		{"tether-edge", "edge", "", &edge},
	} {
		if *bin.size != 0 {
			continue
		}
		if _, *bin.size, err = b.build(ctx, bin.name, bin.tags, bin.ldflags); err != nil {
			return 0, 0, 0, err
		}
	}
	return full, fullStripped, edge, nil
}

// gcCount is the number of garbage collections the runtime's trace
// (GODEBUG=gctrace=1) reported in log.
func gcCount(log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "gc ") {
			n++
		}
	}
	return n
}

// syncBuffer is a bytes.Buffer safe to read while a process writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// cgroup2Root is where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup,
// or /sys/fs/cgroup/unified on hybrid hosts).
func cgroup2Root(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); ok && len(f) > 4 && len(g) > 0 && g[0] == "cgroup2" {
			return f[4]
		}
	}
	t.Fatal("no cgroup v2 hierarchy is mounted; the dataplane needs one")
	return ""
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// usage is what a node pays at one point of the test.
type usage struct {
	referenced      int64 // the agent's working set: Referenced over the window
	exeReferenced   int64 // of it, pages of the executable
	exeLargeFolios  int64 // the executable's resident pages in large folios (-1: unknown)
	window          time.Duration
	gcs             int   // garbage collections in the window
	pss             int64 // the agent's
	rss, anon, file int64 // VmRSS, RssAnon, RssFile
	cpu             time.Duration
	majorFaults     int64 // page faults that read the disk, so far
	memlock         int64 // kernel memory of the eBPF maps the agent holds
	maps            int
	containerdPSS   int64
	shims           int
	shimPSS         int64
}

func (u usage) String() string {
	return fmt.Sprintf("agent working set %s (executable %s; %s of the resident executable in large folios) over %v (%d collections), PSS %s, RSS %s (anonymous %s, file %s), CPU %v and %d major faults so far; %d eBPF maps, %s kernel memory; containerd PSS %s; %d shims PSS %s",
		mib(u.referenced), mib(u.exeReferenced), u.largeFolios(" MiB"), u.window, u.gcs, mib(u.pss), mib(u.rss), mib(u.anon), mib(u.file), u.cpu, u.majorFaults,
		u.maps, mib(u.memlock), mib(u.containerdPSS), u.shims, mib(u.shimPSS))
}

// largeFolios formats exeLargeFolios in MiB followed by unit, or
// "unknown" where it could not be read.
func (u usage) largeFolios(unit string) string {
	if u.exeLargeFolios < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f%s", float64(u.exeLargeFolios)/(1<<20), unit)
}

// footprint reads the memory of the agent, of the containerd it started
// under dir and of that containerd's shims. Shims share most of their
// pages (one executable), so their PSS tells their cost better than their
// RSS.
func footprint(agentPID int, dir string) usage {
	var u usage
	rollup := fmt.Sprintf("/proc/%d/smaps_rollup", agentPID)
	u.referenced, u.pss = kbField(rollup, "Referenced:"), kbField(rollup, "Pss:")
	exe := filepath.Join(dir, "tether")
	u.exeReferenced = exeReferenced(agentPID, exe)
	var err error
	if u.exeLargeFolios, err = exeLargeFolios(agentPID, exe); err != nil {
		u.exeLargeFolios = -1
	}
	u.rss, u.anon, u.file = statusKB(agentPID, "VmRSS:"), statusKB(agentPID, "RssAnon:"), statusKB(agentPID, "RssFile:")
	u.cpu, u.majorFaults = cpuAndFaults(agentPID)
	if b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			u.containerdPSS = pss(pid)
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmd, []byte("containerd-shim")) || !bytes.Contains(cmd, []byte(dir)) {
			continue
		}
		u.shims++
		u.shimPSS += pss(pid)
	}
	return u
}

// exeReferenced sums Referenced over a process's mappings of the
// executable exe, from /proc/PID/smaps.
func exeReferenced(pid int, exe string) (referenced int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0
	}
	inExe := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			inExe = len(f) >= 6 && f[5] == exe
		case len(f) >= 2 && inExe && f[0] == "Referenced:":
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			referenced += kb << 10
		}
	}
	return referenced
}

// mapsMemlock sums the kernel memory (memlock, in bytes) of the eBPF maps
// a process holds descriptors of, each map once, from /proc/PID/fdinfo.
func mapsMemlock(pid int) (total int64, maps int) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, 0
	}
	seen := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err != nil || l != "anon_inode:bpf-map" {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		var id string
		var memlock int64
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			switch f[0] {
			case "map_id:":
				id = f[1]
			case "memlock:":
				memlock, _ = strconv.ParseInt(f[1], 10, 64)
			}
		}
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		total += memlock
		maps++
	}
	return total, maps
}

// cpuAndFaults is the CPU time a process used (user and system) and its
// major page faults, from /proc/PID/stat, whose times are in 1/100 s.
func cpuAndFaults(pid int) (time.Duration, int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// The fields after the command name, which ends with the last ')':
	// state is the first, majflt the 10th, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, 0
	}
	major, _ := strconv.ParseInt(f[9], 10, 64)
	user, _ := strconv.ParseInt(f[11], 10, 64)
	sys, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(user+sys) * 10 * time.Millisecond, major
}

// pss is the proportional set size of a process, in bytes.
func pss(pid int) int64 { return kbField(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:") }

// statusKB reads a kB field of /proc/PID/status, in bytes.
func statusKB(pid int, field string) int64 {
	return kbField(fmt.Sprintf("/proc/%d/status", pid), field)
}

// kbField reads a "Field: N kB" line of a /proc file, in bytes.
func kbField(path, field string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func pctile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}

// copyFile copies the executable src to dst as `tether install` and
// upgrades write an executable: synced, then dropped from the page cache
// (upgrade.Uncache), so that it runs from its own pages, read back by
// its page faults as after a boot.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("sync %s: %w", dst, err)
	}
	if err := upgrade.Uncache(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// agentHost is what a test needs to run `tether edge` with the containerd
// runtime and the dataplane on this machine: a data directory with the
// test images to import, a cgroup of the test's own for the dataplane,
// and a pin directory.
type agentHost struct{ dir, cgroup, pins string }

// newAgentHost makes them, and removes them when the test ends, with the
// pods the agent left running (they outlive the agent by design: a
// runtime of the test's own adopts and removes them, then containerd).
func newAgentHost(t *testing.T, tag, bridge string) *agentHost {
	t.Helper()
	// A short path: containerd's socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "t"+tag[:1])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(testImages(t), filepath.Join(dir, "images", "test.tar")); err != nil {
		t.Fatal(err)
	}
	h := &agentHost{
		dir:    dir,
		cgroup: filepath.Join(cgroup2Root(t), fmt.Sprintf("tether-%s-%d", tag, os.Getpid())),
		pins:   fmt.Sprintf("/sys/fs/bpf/tether-%s-%d", tag, os.Getpid()),
	}
	if err := os.Mkdir(h.cgroup, 0o755); err != nil {
		t.Fatalf("test cgroup: %v", err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err == nil {
			daemon := 0
			if b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid")); err == nil {
				daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			env := &testEnv{dir: dir, bridge: bridge, src: newFakeSources(), daemon: daemon}
			env.rt = env.start(t)
			env.cleanup(t) // stops the daemon too, then removes dir
		}
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(h.pins) // unpinning the links detaches the programs
		_ = os.Remove(h.cgroup)
	})
	return h
}

// startJoinableHub starts a hub process with args and returns it, a join
// token for an agent process, and the admin's client configuration.
func startJoinableHub(t *testing.T, args ...string) (*hubtest.Hub, string, *rest.Config) {
	t.Helper()
	h := hubtest.Start(t, args...)
	tok, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, h.Logs())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return h, strings.TrimSpace(string(tok)), cfg
}
