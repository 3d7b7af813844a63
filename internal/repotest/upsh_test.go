package repotest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/hub/hubtest"
)

// What the local edge of scripts/up.sh puts on a node under its default
// flags, besides what lives in its data directory.
const (
	upBPFPins   = "/sys/fs/bpf/tether"
	upCgroups   = "tether" // under each cgroup hierarchy's root
	upBridge    = "tether0"
	upDNSLink   = "tether-dns"
	upNetnsPref = "tether-"
)

// TestUpScriptInterruptThenResetLeavesNothing runs scripts/up.sh as a user
// would (as root: a hub, a local edge with containerd and the demo
// Deployment), stops it with Ctrl-C (SIGINT to its process group), runs the
// `tether edge reset --purge --data-dir` it prints, and checks that nothing
// of the run is left: processes, mounts, network namespaces, veths,
// cgroups, pinned eBPF objects, the pod bridge and the DNS interface. Each
// kind is listed while the demo runs (so that the check is not vacuous)
// and again after the reset. up.sh runs with a temporary HOME and data
// directory and a free port; it installs nothing when scripts/test.sh's
// packages are there, which the test requires.
func TestUpScriptInterruptThenResetLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("up.sh runs containers, the pod network and the eBPF dataplane only as root")
	}
	for _, p := range []string{"gcc", "libc6-dev", "containerd", "runc", "containernetworking-plugins", "iproute2"} {
		if err := exec.Command("dpkg", "-s", p).Run(); err != nil {
			t.Fatalf("needs the Debian package %s (scripts/test.sh installs it; up.sh would fetch it with apt-get): %v", p, err)
		}
	}
	// The defaults up.sh's edge uses must be free: another tether edge
	// on this machine would be taken over and then reset.
	for _, p := range []string{upBPFPins} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s exists: a tether edge is installed on this machine; reset it first", p)
		}
	}
	for _, l := range []string{upBridge, upDNSLink} {
		if linkExists(l) {
			t.Fatalf("interface %s exists: a tether edge is installed on this machine; reset it first", l)
		}
	}
	// CI builds kubectl first (scripts/test.sh); otherwise hubtest does.
	kubectl := os.Getenv("TETHER_KUBECTL")
	if kubectl == "" {
		_, kubectl = hubtest.Binaries(t)
	}
	start := time.Now()
	root := hubtest.RepoRoot()
	tmp := t.TempDir()
	data, home := filepath.Join(tmp, "data"), filepath.Join(tmp, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	before := takeSnapshot(t)

	// A fresh HOME would also give Go a fresh module and build cache:
	// up.sh keeps the ones this test runs with.
	goenv, err := exec.Command("go", "env", "GOPATH", "GOMODCACHE", "GOCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	gv := strings.Fields(string(goenv))
	if len(gv) != 3 {
		t.Fatalf("go env GOPATH GOMODCACHE GOCACHE: %q", goenv)
	}
	up := exec.Command("bash", filepath.Join(root, "scripts", "up.sh"))
	up.Env = append(os.Environ(), "HOME="+home, "GOPATH="+gv[0], "GOMODCACHE="+gv[1], "GOCACHE="+gv[2],
		"TETHER_DATA="+data, "TETHER_LISTEN="+freeAddr(t), "TETHER_KUBECTL="+kubectl)
	up.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &lockedBuffer{}
	up.Stdout, up.Stderr = out, out
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- up.Wait() }()
	reset := func() ([]byte, error) {
		cmd := exec.Command(filepath.Join(root, "bin", "tether"), "edge", "reset", "--purge", "--data-dir", filepath.Join(data, "edge"))
		cmd.Env = append(os.Environ(), "HOME="+home)
		return cmd.CombinedOutput()
	}
	interrupted := false
	t.Cleanup(func() {
		// A failure half way: leave the machine as clean as a user would.
		if !interrupted {
			_ = syscall.Kill(-up.Process.Pid, syscall.SIGKILL)
			<-exited
			if _, err := os.Stat(data); err == nil {
				_, _ = reset()
			}
		}
		if t.Failed() {
			t.Logf("up.sh output:\n%s", out.String())
			for _, f := range []string{"hub.log", "edge.log"} {
				if b, err := os.ReadFile(filepath.Join(data, f)); err == nil {
					t.Logf("%s (last 3 KiB):\n%s", f, tail(b, 3<<10))
				}
			}
		}
	})

	// up.sh is up when it prints how to use and stop it; the demo's pods
	// then run real containers.
	waitFor(t, "up.sh to say tether is up", 4*time.Minute, exited, func() bool {
		return strings.Contains(out.String(), "== tether is up")
	})
	if !strings.Contains(out.String(), "tether edge reset --purge --data-dir "+filepath.Join(data, "edge")) {
		t.Errorf("up.sh does not print how to reset the edge:\n%s", out.String())
	}
	var pods []corev1.Pod
	waitFor(t, "the demo's two pods to run", 2*time.Minute, exited, func() bool {
		pods = runningPods(kubectl, filepath.Join(data, "admin.kubeconfig"), "app=demo")
		return len(pods) == 2
	})
	during := takeSnapshot(t)
	ours := runObjects(pods, tmp, before, during)
	t.Logf("demo running %v after up.sh started; while it runs: %s", time.Since(start).Round(time.Second), ours.summary())
	for kind, n := range map[string]int{"processes": len(ours.procs), "mounts": len(ours.mounts), "network namespaces": len(ours.netns),
		"veths": len(ours.veths), "cgroups": len(ours.cgroups), "pinned eBPF objects": len(ours.pins)} {
		if n == 0 {
			t.Errorf("found no %s of the run while the demo runs: the check after the reset would prove nothing", kind)
		}
	}
	if !linkExists(upBridge) || !linkExists(upDNSLink) {
		t.Errorf("interfaces %s and %s should exist while the demo runs", upBridge, upDNSLink)
	}

	// Ctrl-C: the terminal sends SIGINT to the foreground process group.
	interrupted = true
	if err := syscall.Kill(-up.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-up.Process.Pid, syscall.SIGKILL)
		t.Fatalf("up.sh did not exit within 30s of SIGINT")
	}
	// By design the containers, their containerd, the pod network and the
	// dataplane outlive Ctrl-C: the same listing finds every kind of them
	// now, which shows that it would find them after a reset that left
	// them.
	kept := strings.Join(ours.leftIn(takeSnapshot(t), tmp), "\n")
	for _, kind := range []string{"process ", "mount ", "network namespace ", "veth ", "cgroup ", "pinned eBPF object "} {
		if !strings.Contains(kept, kind) {
			t.Errorf("after Ctrl-C and before the reset, no %sof the run is listed; listed:\n%s", kind, kept)
		}
	}
	stopped := time.Now()
	if b, err := reset(); err != nil {
		t.Fatalf("tether edge reset --purge: %v\n%s", err, b)
	}
	t.Logf("tether edge reset --purge took %v", time.Since(stopped).Round(100*time.Millisecond))

	// Whatever the kernel tears down asynchronously gets a few seconds.
	var left []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		left = ours.leftIn(takeSnapshot(t), tmp)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, l := range []string{upBridge, upDNSLink} {
		if linkExists(l) {
			left = append(left, "interface "+l)
		}
	}
	if _, err := os.Stat(filepath.Join(data, "edge")); !errors.Is(err, fs.ErrNotExist) {
		left = append(left, "data directory "+filepath.Join(data, "edge")+" (--purge)")
	}
	if len(left) > 0 {
		t.Errorf("after Ctrl-C and tether edge reset --purge, left on the node:\n\t%s", strings.Join(left, "\n\t"))
	}
}

// snapshot lists, kind by kind, what is on the machine.
type snapshot struct {
	procs   map[int]proc // by pid
	mounts  []string     // lines of /proc/self/mountinfo
	netns   []string     // ip netns
	veths   map[string]string
	cgroups []string // directories under upCgroups of every cgroup hierarchy
	pins    []string // files under upBPFPins
}

type proc struct {
	start   string // field 22 of /proc/PID/stat, to tell a reused pid
	cmdline string
	cgroup  string
}

func takeSnapshot(t *testing.T) snapshot {
	t.Helper()
	s := snapshot{procs: map[int]proc{}, veths: map[string]string{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 20 {
			continue
		}
		s.procs[pid] = proc{start: f[19], cmdline: strings.ReplaceAll(string(cmd), "\x00", " "), cgroup: strings.TrimSpace(string(cg))}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	s.mounts = strings.Split(strings.TrimSpace(string(mi)), "\n")
	ns, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for _, l := range strings.Split(string(ns), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			s.netns = append(s.netns, f[0])
		}
	}
	js, err := exec.Command("ip", "-j", "link", "show", "type", "veth").Output()
	if err != nil {
		t.Fatalf("ip link show type veth: %v", err)
	}
	var links []struct {
		Name   string `json:"ifname"`
		Master string `json:"master"`
	}
	if err := json.Unmarshal(js, &links); err != nil {
		t.Fatalf("decode ip -j link: %v", err)
	}
	for _, l := range links {
		s.veths[l.Name] = l.Master
	}
	// cgroup v2, or v1 and v2 side by side (a hybrid host): the
	// containers' cgroups are under upCgroups in every hierarchy mounted.
	for _, m := range s.mounts {
		_, rest, ok := strings.Cut(m, " - ")
		f, mf := strings.Fields(rest), strings.Fields(m)
		if ok && len(f) > 0 && len(mf) > 4 && (f[0] == "cgroup" || f[0] == "cgroup2") {
			s.cgroups = append(s.cgroups, walk(filepath.Join(mf[4], upCgroups), true)...)
		}
	}
	s.pins = walk(upBPFPins, false)
	return s
}

// walk lists the directories (dirs) or the files under root, root
// excluded; nothing when root does not exist.
func walk(root string, dirs bool) []string {
	var out []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		if d.IsDir() == dirs {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// objects are the run's own objects of each kind.
type objects struct {
	procs   map[int]proc
	mounts  []string
	netns   []string
	veths   []string
	cgroups []string
	pins    []string
}

// runObjects picks out of during what the run made: processes and mounts
// that name the run's temporary directory or one of its pods or
// containers, and processes in a cgroup of its containers; its pods'
// network namespaces; the veths on the pod bridge; the cgroups of its
// containers; every pin under upBPFPins (absent before the run).
func runObjects(pods []corev1.Pod, tmp string, before, during snapshot) objects {
	var ids []string
	for _, p := range pods {
		ids = append(ids, string(p.UID))
		for _, c := range p.Status.ContainerStatuses {
			if _, id, ok := strings.Cut(c.ContainerID, "://"); ok {
				ids = append(ids, id)
			}
		}
	}
	mentions := func(s string) bool {
		if strings.Contains(s, tmp) {
			return true
		}
		for _, id := range ids {
			if strings.Contains(s, id) {
				return true
			}
		}
		return false
	}
	o := objects{procs: map[int]proc{}, pins: during.pins}
	for _, c := range during.cgroups {
		if mentions(c) && !slices.Contains(before.cgroups, c) {
			o.cgroups = append(o.cgroups, c)
		}
	}
	for pid, p := range during.procs {
		if _, old := before.procs[pid]; old && before.procs[pid].start == p.start {
			continue
		}
		// A container's processes sit in cgroups named by its id.
		if mentions(p.cmdline) || mentions(p.cgroup) {
			o.procs[pid] = p
		}
	}
	for _, m := range during.mounts {
		if mentions(m) && !slices.Contains(before.mounts, m) {
			o.mounts = append(o.mounts, m)
		}
	}
	for _, n := range during.netns {
		if strings.HasPrefix(n, upNetnsPref) && mentions(n) {
			o.netns = append(o.netns, n)
		}
	}
	for name, master := range during.veths {
		if master == upBridge {
			o.veths = append(o.veths, name)
		}
	}
	return o
}

func (o objects) summary() string {
	return fmt.Sprintf("%d processes, %d mounts, %d network namespaces, %d veths, %d cgroups, %d pinned eBPF objects",
		len(o.procs), len(o.mounts), len(o.netns), len(o.veths), len(o.cgroups), len(o.pins))
}

// leftIn lists the run's objects still in after, and anything else after
// holds that names the run's temporary directory or sits where only the
// run's edge puts things.
func (o objects) leftIn(after snapshot, tmp string) []string {
	var left []string
	for pid, p := range after.procs {
		if q, ok := o.procs[pid]; ok && q.start == p.start || strings.Contains(p.cmdline, tmp) {
			left = append(left, fmt.Sprintf("process %d: %s", pid, p.cmdline))
		}
	}
	for _, m := range after.mounts {
		if slices.Contains(o.mounts, m) || strings.Contains(m, tmp) {
			left = append(left, "mount "+m)
		}
	}
	for _, n := range after.netns {
		if slices.Contains(o.netns, n) {
			left = append(left, "network namespace "+n)
		}
	}
	for _, v := range o.veths {
		if _, ok := after.veths[v]; ok {
			left = append(left, "veth "+v)
		}
	}
	for _, c := range after.cgroups {
		if slices.Contains(o.cgroups, c) {
			left = append(left, "cgroup "+c)
		}
	}
	for _, p := range after.pins {
		left = append(left, "pinned eBPF object "+p)
	}
	if _, err := os.Stat(upBPFPins); err == nil {
		left = append(left, "pin directory "+upBPFPins)
	}
	slices.Sort(left)
	return left
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// runningPods returns the pods matching selector that run with every
// container started.
func runningPods(kubectl, kubeconfig, selector string) []corev1.Pod {
	b, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "get", "pods", "-l", selector, "-o", "json").Output()
	if err != nil {
		return nil
	}
	var l corev1.PodList
	if json.Unmarshal(b, &l) != nil {
		return nil
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
			continue
		}
		ok := true
		for _, c := range p.Status.ContainerStatuses {
			ok = ok && c.State.Running != nil && c.ContainerID != ""
		}
		if ok {
			out = append(out, p)
		}
	}
	return out
}

// waitFor polls cond until it holds, failing the test after timeout or
// when up.sh exits first.
func waitFor(t *testing.T, what string, timeout time.Duration, exited <-chan error, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		select {
		case err := <-exited:
			t.Fatalf("up.sh exited (%v) while waiting for %s", err, what)
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
	}
}

// freeAddr returns a loopback address whose port is free for TCP (the
// API) and UDP (the tunnel).
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no port free for both TCP and UDP on 127.0.0.1")
	return ""
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return b
}

// lockedBuffer collects a process's output for reading while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
