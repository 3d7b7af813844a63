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

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

var footprintFull = flag.Bool("footprint.full", false, "TestAgentFootprintAndPodStartup: 20 pods one by one, 30 at once, 50 running (default: 5, 10, 20)")

// TestAgentFootprintAndPodStartup runs `tether edge` as its own process
// with the containerd runtime and the eBPF dataplane (on a test cgroup)
// against a real hub, and measures what a node pays: the agent's RSS
// (anonymous and file pages apart) idle, with many pods right after they
// started, and with them once the agent released what the burst used
// (package memtrim) and ran its periodic work again; containerd and the
// shims reported apart; pod start-up from create to Running with a local
// image, one pod at a time and many at once. It checks the agent's memory
// against the targets (20 MB idle, 40 MB with 50 pods) and, in the short
// run CI makes (20 pods), against tighter bounds. The full run:
//
//	go test ./edge/containerd -run TestAgentFootprintAndPodStartup -v -count=1 -args -footprint.full
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
	seq, burst, many := 5, 10, 20
	if *footprintFull {
		seq, burst, many = 20, 30, 50
	}
	h, tok, cfg := startJoinableHub(t, "--cluster-cidr", "10.78.0.0/16")
	// Pods created at once go out at once: no client-side rate limit
	// (client-go's default, 5 per second, would count in their start-up).
	cfg.QPS, cfg.Burst = 1000, 1000
	client := kubernetes.NewForConfigOrDie(cfg)

	const bridge = "ttfoot"
	host := newAgentHost(t, "footprint", bridge)
	dir, cgroup, pins := host.dir, host.cgroup, host.pins

	// The agent runs from a copy of the executable, as on a node where no
	// hub runs: the kernel does not release pages another process (the
	// hub) maps too, which would count in the agent's RSS.
	bin := filepath.Join(dir, "tether")
	if err := copyFile(h.Bin, bin); err != nil {
		t.Fatal(err)
	}
	var agentLog syncBuffer
	agent := exec.Command(bin, "edge", "--hub", "https://"+h.Addr, "--token", tok,
		"--data-dir", dir, "--name", "foot-0", "--runtime", "containerd", "--node-ip", "127.0.0.1",
		"--containerd-address", filepath.Join(dir, "containerd", "containerd.sock"),
		"--dataplane", "ebpf", "--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--uplinks", "none",
		"--dns-addr", "none", "--pod-bridge", bridge, "--log-level", "debug")
	agent.Stdout, agent.Stderr = &agentLog, &agentLog
	// The runtime's line per garbage collection (gctrace) tells the
	// test when one ran: a collection reads the stack maps of every
	// goroutine and the types of the heap's objects, pages that stay
	// resident once touched, and the runtime collects at least every two
	// minutes; a measurement after one includes them.
	agent.Env = append(os.Environ(), "GODEBUG="+strings.TrimPrefix(os.Getenv("GODEBUG")+",gctrace=1", ","))
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
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
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := client.CoreV1().Nodes().Get(context.Background(), "foot-0", metav1.GetOptions{})
		if err == nil && nodeReady(n) {
			break
		}
		if time.Now().After(deadline) {
			fail("node foot-0 not Ready within 60s: %v", err)
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

	// The agent releases what start-up used once the node is registered
	// and it has settled (package memtrim). Idle is measured 30s later,
	// and after a garbage collection: by then the agent has run its
	// periodic work (node status every 10s, tunnel keepalives, the
	// local volumes check, a collection), whose pages stay resident.
	releaseDeadline := time.Now().Add(45 * time.Second)
	for agentLog.count(releaseLine+" after=start-up") == 0 {
		if time.Now().After(releaseDeadline) {
			fail("no release of start-up memory logged within 45s after the node was Ready")
		}
		time.Sleep(200 * time.Millisecond)
	}
	steady := func(what string) usage {
		t.Helper()
		gcs := gcCount(agentLog.String())
		time.Sleep(30 * time.Second)
		deadline := time.Now().Add(2*time.Minute + 30*time.Second)
		for gcCount(agentLog.String()) == gcs {
			if time.Now().After(deadline) {
				fail("%s: no garbage collection in the agent within 3 minutes", what)
			}
			time.Sleep(200 * time.Millisecond)
		}
		time.Sleep(time.Second)
		return footprint(t, agent.Process.Pid, dir)
	}
	idle := steady("idle")
	// The full run idles longer, past the work with a period of five
	// minutes (the node status report, the local state's flush of watch
	// bookmarks, the image store's check).
	// Its RSS is sampled every 5 s meanwhile: the agent hands back what
	// such work brought in once it is quiet again (memtrim), so the
	// samples show how high it goes and for how long.
	longIdle := idle
	var idleMax, idleMean int64
	if *footprintFull {
		var sum int64
		n := 0
		for end := time.Now().Add(6 * time.Minute); time.Now().Before(end); {
			time.Sleep(5 * time.Second)
			r := vmRSS(agent.Process.Pid)
			idleMax = max(idleMax, r)
			sum += r
			n++
		}
		idleMean = sum / int64(n)
		longIdle = footprint(t, agent.Process.Pid, dir)
	}

	var one []time.Duration
	for i := range seq {
		name := fmt.Sprintf("one-%d", i)
		start := create(name)
		waitRunning([]string{name}, time.Minute)
		one = append(one, took(name, start))
		if err := client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	starts := map[string]time.Time{}
	for i := range burst {
		names = append(names, fmt.Sprintf("burst-%d", i))
	}
	burstReleases := agentLog.count(releaseLine + " after=burst")
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
	waitRunning(names, 2*time.Minute)
	var together []time.Duration
	for _, name := range names {
		together = append(together, took(name, starts[name]))
	}
	for i := burst; i < many; i++ {
		name := fmt.Sprintf("burst-%d", i)
		create(name)
		names = append(names, name)
	}
	waitRunning(names, 2*time.Minute)
	allRunning := time.Now()
	time.Sleep(10 * time.Second)
	loaded := footprint(t, agent.Process.Pid, dir)
	// Quiet after the burst of pod starts, the agent releases again (at
	// most every 30s, after 5s of quiet); what a node with the pods pays
	// is measured 30s after that and after a garbage collection, with the
	// periodic work done again (the pods' status, their containers').
	burstDeadline := time.Now().Add(90 * time.Second)
	for agentLog.count(releaseLine+" after=burst") == burstReleases {
		if time.Now().After(burstDeadline) {
			fail("no release of memory logged within 90s after the burst of pod starts")
		}
		time.Sleep(500 * time.Millisecond)
	}
	settled := steady("with the pods")

	// Pods started one at a time again, after the agent released what
	// the burst used: the code they run is read back from the disk, and
	// the major faults tell what that cost.
	_, faults := cpuAndFaults(agent.Process.Pid)
	var again []time.Duration
	for i := range seq {
		name := fmt.Sprintf("again-%d", i)
		start := create(name)
		waitRunning([]string{name}, time.Minute)
		again = append(again, took(name, start))
		if err := client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, faultsAgain := cpuAndFaults(agent.Process.Pid)

	t.Logf("pod start-up, create → Running, local image: one at a time (%d): p50 %v, p99 %v; %d at once: p50 %v, p99 %v; one at a time after the release that followed (%d): p50 %v, p99 %v, %d major faults",
		seq, pctile(one, 0.5), pctile(one, 0.99), burst, pctile(together, 0.5), pctile(together, 0.99),
		seq, pctile(again, 0.5), pctile(again, 0.99), faultsAgain-faults)
	t.Logf("idle: %s", idle)
	if *footprintFull {
		t.Logf("idle 6 minutes later: %s; sampled every 5 s meanwhile: mean %s, max %s", longIdle, mib(idleMean), mib(idleMax))
	}
	t.Logf("%d pods, 10s after the last one runs: %s", many, loaded)
	t.Logf("%d pods, 30s after the agent released memory once quiet, after a collection: %s", many, settled)
	t.Logf("all %d pods Running at %s", many, allRunning.Format(time.RFC3339Nano))
	pagedOut := true
	for _, line := range strings.Split(agentLog.String(), "\n") {
		if strings.Contains(line, releaseLine) {
			t.Logf("agent: %s", line)
			pagedOut = pagedOut && !strings.Contains(line, " executableAdvised=0 ")
		}
	}
	t.Logf("targets: one pod p99 ≤ 1s: %v; agent idle ≤ 20 MB: %v; agent with 50 pods ≤ 40 MB: %v (measured with %d; 10s after the burst: %v)",
		pctile(one, 0.99) <= time.Second, idle.agent <= 20e6, settled.agent <= 40e6, many, loaded.agent <= 40e6)

	// The bounds. The full run holds the targets, 20 MB idle and 40 MB
	// with 50 pods; the short one, in CI, guards against regressions
	// (20 pods, and a tighter bound with them); the anonymous memory is
	// bounded apart, where the kernel maps nothing back. What the runs measured, on two cores shared
	// with other work: idle 15.7-17.5 MiB, 8.8-9.0 anonymous; with 20
	// pods 21.2-21.4 MiB, 12.6-12.8 anonymous; with 50 pods 22.1-24.5
	// MiB, 13.8-16.1 anonymous. In the full run, one pod at a time starts
	// within the target, p99 1s.
	check := func(what string, got, limit int64) {
		t.Helper()
		if got > limit {
			t.Errorf("%s: %s, want at most %s", what, mib(got), mib(limit))
		}
	}
	check("agent anonymous RSS idle", idle.agentAnon, 12<<20)
	check(fmt.Sprintf("agent anonymous RSS with %d pods", many), settled.agentAnon, 20<<20)
	if *footprintFull && pctile(one, 0.99) > time.Second {
		t.Errorf("one pod at a time: p99 %v from create to Running, want at most 1s", pctile(one, 0.99))
	}
	if !pagedOut {
		// Linux before 5.4: the executable's pages stay.
		t.Logf("the kernel has no MADV_PAGEOUT: the agent's file pages are not bounded")
		return
	}
	if *footprintFull {
		check("agent RSS idle (target 20 MB)", idle.agent, 20e6)
		check("agent RSS idle 6 minutes later (target 20 MB)", longIdle.agent, 20e6)
		check("agent RSS idle, mean over those 6 minutes (target 20 MB)", idleMean, 20e6)
		check("agent RSS with 50 pods (target 40 MB)", settled.agent, 40e6)
	} else {
		// A guard against regressions with room for a collection's
		// timing on a loaded machine; the full run holds the targets.
		check("agent RSS idle", idle.agent, 22<<20)
		check("agent RSS with 20 pods", settled.agent, 28<<20)
	}
}

// releaseLine starts the agent's debug line for each release of memory.
const releaseLine = `msg="released memory"`

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

func (b *syncBuffer) count(s string) int { return strings.Count(b.String(), s) }

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
	agent, agentAnon, agentFile int64 // VmRSS, RssAnon, RssFile
	agentExe, agentLibs         int64 // of the file pages: the executable's, the shared libraries'
	agentCPU                    time.Duration
	agentMajorFaults            int64 // page faults that read the disk
	containerd, containerdPSS   int64
	shims                       int
	shimRSS, shimPSS            int64
}

func (u usage) String() string {
	return fmt.Sprintf("agent RSS %s (anonymous %s, file %s: executable %s, libraries %s), CPU %v and %d major faults so far; containerd RSS %s (PSS %s); %d shims RSS %s (PSS %s, %s each)",
		mib(u.agent), mib(u.agentAnon), mib(u.agentFile), mib(u.agentExe), mib(u.agentLibs), u.agentCPU, u.agentMajorFaults, mib(u.containerd), mib(u.containerdPSS),
		u.shims, mib(u.shimRSS), mib(u.shimPSS), mib(u.shimPSS/int64(max(u.shims, 1))))
}

// footprint reads the memory of the agent, of the containerd it started
// under dir and of that containerd's shims. Shims share most of their
// pages (one executable), so their PSS tells their cost better than their
// RSS.
func footprint(t *testing.T, agentPID int, dir string) usage {
	t.Helper()
	var u usage
	u.agent = vmRSS(agentPID)
	u.agentAnon, u.agentFile = statusKB(agentPID, "RssAnon:"), statusKB(agentPID, "RssFile:")
	u.agentExe, u.agentLibs = fileRSS(agentPID, filepath.Join(dir, "tether"))
	u.agentCPU, u.agentMajorFaults = cpuAndFaults(agentPID)
	if b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			u.containerd, u.containerdPSS = vmRSS(pid), pss(pid)
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
		u.shimRSS += vmRSS(pid)
		u.shimPSS += pss(pid)
	}
	return u
}

// fileRSS sums the resident pages of a process's mappings of the
// executable exe and of shared libraries (*.so*), from /proc/PID/smaps.
func fileRSS(pid int, exe string) (exeRSS, libRSS int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0
	}
	var sum *int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			sum = nil
			if len(f) >= 6 && f[5] == exe {
				sum = &exeRSS
			} else if len(f) >= 6 && strings.Contains(filepath.Base(f[5]), ".so") {
				sum = &libRSS
			}
		case len(f) >= 2 && f[0] == "Rss:" && sum != nil:
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			*sum += kb << 10
		}
	}
	return exeRSS, libRSS
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

func vmRSS(pid int) int64 { return statusKB(pid, "VmRSS:") }

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

// copyFile copies the executable src to dst and writes it out, so that it
// runs from clean pages like an installed binary (the kernel cannot release
// dirty pages of an executable).
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
