package containerd

import (
	"bytes"
	"context"
	"flag"
	"fmt"
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
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

var footprintFull = flag.Bool("footprint.full", false, "TestAgentFootprintAndPodStartup: 20 pods one by one, 30 at once, 50 running (default: 5, 10, 20)")

// TestAgentFootprintAndPodStartup runs `tether edge` as its own process
// with the containerd runtime and the eBPF dataplane (on a test cgroup)
// against a real hub, and measures what a node pays: the agent's RSS idle
// and with many pods (containerd and the shims reported apart), and pod
// start-up from create to Running with a local image, one pod at a time
// and many at once. CI runs a short version; the full one:
//
//	go test ./edge/containerd -run TestAgentFootprintAndPodStartup -v -count=1 -args -footprint.full
func TestAgentFootprintAndPodStartup(t *testing.T) {
	requireContainerd(t)
	seq, burst, many := 5, 10, 20
	if *footprintFull {
		seq, burst, many = 20, 30, 50
	}
	h := hubtest.Start(t, "--cluster-cidr", "10.78.0.0/16")
	tok, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, h.Logs())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)

	// A short path: containerd's socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "tf")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(testImages(t), filepath.Join(dir, "images", "test.tar")); err != nil {
		t.Fatal(err)
	}
	cgroup := filepath.Join(cgroup2Root(t), fmt.Sprintf("tether-footprint-%d", os.Getpid()))
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatalf("test cgroup: %v", err)
	}
	pins := fmt.Sprintf("/sys/fs/bpf/tether-footprint-%d", os.Getpid())
	const bridge = "ttfoot"
	t.Cleanup(func() {
		// The pods outlive the agent by design: adopt them with a runtime
		// of the test's own and remove them, then containerd.
		daemon := 0
		if b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid")); err == nil {
			daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		env := &testEnv{dir: dir, bridge: bridge, src: newFakeSources(), daemon: daemon}
		env.rt = env.start(t)
		env.cleanup(t) // stops the daemon too, then removes dir
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(pins) // unpinning the links detaches the programs
		_ = os.Remove(cgroup)
	})

	var agentLog bytes.Buffer
	agent := exec.Command(h.Bin, "edge", "--hub", "https://"+h.Addr, "--token", strings.TrimSpace(string(tok)),
		"--data-dir", dir, "--name", "foot-0", "--runtime", "containerd", "--node-ip", "127.0.0.1",
		"--containerd-address", filepath.Join(dir, "containerd", "containerd.sock"),
		"--dataplane", "ebpf", "--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--uplinks", "none",
		"--dns-addr", "none", "--pod-bridge", bridge)
	agent.Stdout, agent.Stderr = &agentLog, &agentLog
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

	time.Sleep(15 * time.Second)
	idle := footprint(t, agent.Process.Pid, dir)

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
	time.Sleep(10 * time.Second)
	loaded := footprint(t, agent.Process.Pid, dir)

	t.Logf("pod start-up, create → Running, local image: one at a time (%d): p50 %v, p99 %v; %d at once: p50 %v, p99 %v",
		seq, pctile(one, 0.5), pctile(one, 0.99), burst, pctile(together, 0.5), pctile(together, 0.99))
	t.Logf("RSS idle: agent %s (anon %s, file %s), containerd %s", mib(idle.agent), mib(idle.agentAnon), mib(idle.agentFile), mib(idle.containerd))
	t.Logf("RSS with %d pods: agent %s (anon %s, file %s), containerd %s, %d shims %s in all (%s each)",
		many, mib(loaded.agent), mib(loaded.agentAnon), mib(loaded.agentFile), mib(loaded.containerd), loaded.shims, mib(loaded.shimRSS), mib(loaded.shimRSS/int64(max(loaded.shims, 1))))
	t.Logf("targets: one pod p99 ≤ 1s: %v; agent idle ≤ 20 MB: %v; agent with 50 pods ≤ 40 MB: %v (measured with %d)",
		pctile(one, 0.99) <= time.Second, idle.agent <= 20<<20, loaded.agent <= 40<<20, many)
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

type rss struct {
	agent, containerd, shimRSS int64
	agentAnon, agentFile       int64
	shims                      int
}

// footprint reads the VmRSS of the agent, of the containerd it started
// under dir and of that containerd's shims.
func footprint(t *testing.T, agentPID int, dir string) rss {
	t.Helper()
	var r rss
	r.agent = vmRSS(agentPID)
	r.agentAnon, r.agentFile = statusKB(agentPID, "RssAnon:"), statusKB(agentPID, "RssFile:")
	if b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			r.containerd = vmRSS(pid)
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
		r.shims++
		r.shimRSS += vmRSS(pid)
	}
	return r
}

func vmRSS(pid int) int64 { return statusKB(pid, "VmRSS:") }

// statusKB reads a kB field of /proc/PID/status, in bytes.
func statusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
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
