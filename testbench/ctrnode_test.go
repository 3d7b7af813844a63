package testbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/testbench/images"
)

// ctrNode is a lab node that runs `tether edge --runtime containerd` the
// way a machine does. Besides its network namespace (the lab's), each boot
// of the node gets a PID namespace and a mount namespace of its own:
//
//   - the PID namespace's init is the node's power supply: killing it
//     kills the agent, containerd, the shims and every container at once,
//     as a power cut does. Its parent (unshare --kill-child) is a lab
//     process, so nothing of the node outlives a test process that dies
//     either: the lab's sweep kills the parent, and init goes with it.
//     What does outlive a crash are the empty cgroups runc made for the
//     containers; teardown removes them after a test that ended normally;
//   - the mount namespace holds what a machine keeps in memory: the
//     containers' root file systems, the pods' volumes in memory, the pods'
//     network namespace handles (a tmpfs on /run/netns) and containerd's
//     runtime directory (a tmpfs on /run/containerd: shim sockets, runc
//     state). All of it is gone after a reboot, while the data directory,
//     the node's disk, stays.
//
// The agent runs in both namespaces; containerd is the one it starts
// itself because nothing answers at its address.
type ctrNode struct {
	t     *testing.T
	l     *Lab
	h     *labHub
	name  string
	zone  string
	data  string // the agent's data directory
	sock  string // containerd's socket
	pidf  string // holds the host PID of the current boot's init
	boot  *Process
	agent *Process
	bin   string   // the agent's executable
	args  []string // the agent's arguments after `tether edge`

	mu   sync.Mutex
	pid1 int
	uids map[types.UID]bool // pods seen on the node, for the cgroup sweep
}

// startCtrNode boots node and starts the agent on it, with the image
// archives in imageArchives placed in <data-dir>/images first. Everything
// the node started is removed when the test ends, and checked to be gone.
func startCtrNode(t *testing.T, l *Lab, h *labHub, node, zone string, imageArchives []string, extra ...string) *ctrNode {
	t.Helper()
	return startCtrNodeFrom(t, l, h, h.tether, node, zone, imageArchives, extra...)
}

// startCtrNodeFrom is startCtrNode with the agent run from the executable
// bin.
func startCtrNodeFrom(t *testing.T, l *Lab, h *labHub, bin, node, zone string, imageArchives []string, extra ...string) *ctrNode {
	t.Helper()
	host := l.Host(node)
	if host == nil || host.DataDir == "" {
		t.Fatalf("no lab node %q", node)
	}
	n := &ctrNode{t: t, l: l, h: h, bin: bin, name: node, zone: zone, data: filepath.Join(host.DataDir, "edge"),
		pidf: filepath.Join(l.Dir(), node+".init.pid"), uids: map[types.UID]bool{}}
	n.sock = filepath.Join(n.data, "containerd", "containerd.sock")
	if err := os.MkdirAll(filepath.Join(n.data, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range imageArchives {
		if err := copyFileTo(a, filepath.Join(n.data, "images", filepath.Base(a))); err != nil {
			t.Fatal(err)
		}
	}
	// Registered before the agent starts, so it runs after the agent's
	// own stop.
	t.Cleanup(n.teardown)
	n.powerOn(t)
	n.args = append([]string{"edge", "--hub", "https://" + h.api, "--token", h.token(time.Hour),
		"--data-dir", n.data, "--name", node, "--zone", zone, "--runtime", "containerd",
		"--containerd-address", n.sock,
		// The eBPF data plane attaches to the host's cgroup v2 root
		// and pins in the host's bpffs: not for a node that shares the
		// machine with others.
		"--dataplane", "none"}, extra...)
	p, err := l.Start(node, "edge-"+node, n.agentCommand()...)
	if err != nil {
		t.Fatal(err)
	}
	n.agent = p
	return n
}

// agentCommand enters the current boot's namespaces, whose init PID it
// reads at each start, and runs the agent there.
func (n *ctrNode) agentCommand() []string {
	return append([]string{"sh", "-c", `exec nsenter -t "$(cat "$0")" -p -m -- "$@"`, n.pidf, n.bin}, n.args...)
}

// powerOn boots the node: a new PID and mount namespace whose init only
// mounts the node's in-memory directories and waits.
func (n *ctrNode) powerOn(t *testing.T) {
	t.Helper()
	src := "tl" + n.l.ID() + "-" + n.name
	script := fmt.Sprintf(`set -e
mkdir -p /run/containerd /run/netns
mount -t tmpfs -o mode=0711 %[1]s /run/containerd
mount -t tmpfs -o mode=0755 %[1]s /run/netns
exec sleep infinity`, src)
	// `ip netns exec` gave the process a mount namespace with a /sys of
	// the node's network namespace, which lacks the cgroup file systems
	// runc needs: start from the test's own mount namespace instead.
	args := []string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", os.Getpid()), "--",
		"unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "slave", "--mount-proc",
		"--", "sh", "-c", script}
	var err error
	if n.boot == nil {
		n.boot, err = n.l.Start(n.name, "boot-"+n.name, args...)
	} else {
		err = n.boot.Restart()
	}
	if err != nil {
		t.Fatalf("boot %s: %v", n.name, err)
	}
	parent := n.boot.PID()
	deadline := time.Now().Add(10 * time.Second)
	for {
		kids := childPIDs(parent)
		if len(kids) == 1 && procComm(kids[0]) == "sleep" {
			n.mu.Lock()
			n.pid1 = kids[0]
			n.mu.Unlock()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("boot %s: init did not come up (children of %d: %v); log in %s", n.name, parent, kids, n.boot.LogPath())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(n.pidf, []byte(strconv.Itoa(n.pid1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// powerOff cuts the node's power: its init dies, and the kernel kills
// every process of its PID namespace with it. The network state a reboot
// clears (pod bridge, CNI's rules) is removed from the node's network
// namespace too; its uplink address and route stay, as the machine's
// configuration would set them again.
func (n *ctrNode) powerOff(t *testing.T) {
	t.Helper()
	if n.boot == nil {
		return
	}
	n.mu.Lock()
	pid1 := n.pid1
	n.mu.Unlock()
	start := procStart(pid1)
	if err := n.boot.Kill(); err != nil {
		t.Errorf("power off %s: %v", n.name, err)
	}
	// init becomes a zombie only once every other process of its
	// namespace is gone.
	for deadline := time.Now().Add(30 * time.Second); alive(pid1, start); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("power off %s: init %d still runs after 30s", n.name, pid1)
		}
	}
	if n.agent != nil {
		n.waitAgentExit(10 * time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := n.l.Exec(ctx, n.name, "nft", "flush", "ruleset"); err != nil {
		t.Errorf("power off %s: flush rules: %v\n%s", n.name, err, out)
	}
	out, err := n.l.Exec(ctx, n.name, "ip", "-o", "link", "show")
	if err != nil {
		t.Errorf("power off %s: list links: %v\n%s", n.name, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if name == "lo" || name == "eth0" {
			continue
		}
		if out, err := n.l.Exec(ctx, n.name, "ip", "link", "del", name); err != nil && !strings.Contains(string(out), "Cannot find device") {
			t.Errorf("power off %s: delete link %s: %v\n%s", n.name, name, err, out)
		}
	}
}

// reboot powers the node off and on and starts the agent again, as its
// service manager would.
func (n *ctrNode) reboot(t *testing.T) {
	t.Helper()
	n.powerOff(t)
	n.powerOn(t)
	if err := n.agent.Restart(); err != nil {
		t.Fatalf("start agent on %s: %v", n.name, err)
	}
}

// agentPID returns the agent's own PID (the child of nsenter), or 0. An
// agent upgraded in place runs a staged executable, .tether.DIGEST.
func (n *ctrNode) agentPID() int {
	for _, k := range childPIDs(n.agent.PID()) {
		if strings.HasPrefix(strings.TrimPrefix(procComm(k), "."), "tether") {
			return k
		}
	}
	return 0
}

// stopAgent sends sig to the agent and waits for it to exit, killing it
// after timeout.
func (n *ctrNode) stopAgent(t *testing.T, sig syscall.Signal, timeout time.Duration) {
	t.Helper()
	if pid := n.agentPID(); pid != 0 {
		_ = syscall.Kill(pid, sig)
	}
	if !n.waitAgentExit(timeout) {
		t.Errorf("agent on %s did not exit within %v of %v; killing it", n.name, timeout, sig)
		if pid := n.agentPID(); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		n.waitAgentExit(10 * time.Second)
	}
}

func (n *ctrNode) waitAgentExit(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() { _ = n.agent.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// restartAgent stops the agent with SIGTERM, as a service manager does,
// and starts it again; containerd and the containers stay.
func (n *ctrNode) restartAgent(t *testing.T) {
	t.Helper()
	n.stopAgent(t, syscall.SIGTERM, 20*time.Second)
	if err := n.agent.Restart(); err != nil {
		t.Fatalf("restart agent on %s: %v", n.name, err)
	}
}

// exec runs a command inside the node's current boot.
func (n *ctrNode) exec(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n.mu.Lock()
	pid1 := n.pid1
	n.mu.Unlock()
	out, err := n.l.Exec(ctx, n.name, append([]string{"nsenter", "-t", strconv.Itoa(pid1), "-p", "-m", "--"}, args...)...)
	return string(out), err
}

// ctrContainer is a container of containerd's tether namespace on the node.
type ctrContainer struct {
	ID     string
	PID    int    // task's PID in the node's PID namespace; 0 without a task
	Status string // task status (RUNNING, STOPPED...); empty without a task
}

// containers lists the node's containers and their tasks with ctr, the
// containerd client, so that it answers while the hub is out of reach.
func (n *ctrNode) containers() (map[string]ctrContainer, error) {
	out, err := n.exec("ctr", "--address", n.sock, "-n", "tether", "containers", "ls", "-q")
	if err != nil {
		return nil, fmt.Errorf("ctr containers ls: %w: %s", err, out)
	}
	cs := map[string]ctrContainer{}
	for _, id := range strings.Fields(out) {
		cs[id] = ctrContainer{ID: id}
	}
	out, err = n.exec("ctr", "--address", n.sock, "-n", "tether", "tasks", "ls")
	if err != nil {
		return nil, fmt.Errorf("ctr tasks ls: %w: %s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] == "TASK" {
			continue
		}
		pid, _ := strconv.Atoi(f[1])
		cs[f[0]] = ctrContainer{ID: f[0], PID: pid, Status: f[2]}
	}
	return cs, nil
}

// podContainerPrefix is how the runtime's container IDs of a pod begin.
func podContainerPrefix(uid types.UID) string {
	h := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(h[:6]) + "-"
}

// latestInstance returns the newest instance (highest attempt) of the
// named container of pod uid among cs.
func latestInstance(cs map[string]ctrContainer, uid types.UID, name string) (c ctrContainer, attempt int, ok bool) {
	prefix := podContainerPrefix(uid) + name + "-"
	attempt = -1
	for id, cc := range cs {
		rest, found := strings.CutPrefix(id, prefix)
		if !found {
			continue
		}
		a, err := strconv.Atoi(rest)
		if err != nil {
			continue
		}
		if a > attempt {
			c, attempt, ok = cc, a, true
		}
	}
	return c, attempt, ok
}

// track remembers pods that ran on the node.
func (n *ctrNode) track(pods ...*corev1.Pod) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range pods {
		if p.Spec.NodeName == n.name {
			n.uids[p.UID] = true
		}
	}
}

// teardown stops the agent, cuts the node's power and checks that
// nothing of it is left: no process running from its data directory, no
// mount of it in the test's mount namespace, no cgroup of its containers.
func (n *ctrNode) teardown() {
	t := n.t
	if t.Failed() {
		n.dumpLogs()
	}
	if n.agent != nil {
		n.stopAgent(t, syscall.SIGTERM, 15*time.Second)
	}
	n.powerOff(t)
	for _, pid := range procsMentioning(n.data) {
		t.Errorf("process %d (%s) of node %s outlived its power-off; killing it", pid, procComm(pid), n.name)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, line := range strings.Split(string(mountinfo()), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], n.data) {
			t.Errorf("mount of node %s left in the test's mount namespace: %s", n.name, line)
		}
	}
	// Containers killed with the node (by a reboot, or now) leave their
	// empty cgroups behind, as runc's state went with the node's memory:
	// a real reboot would clear them.
	n.mu.Lock()
	var prefixes []string
	for uid := range n.uids {
		prefixes = append(prefixes, podContainerPrefix(uid))
	}
	n.mu.Unlock()
	if ents, err := os.ReadDir(filepath.Join(n.data, "pods")); err == nil {
		for _, e := range ents {
			prefixes = append(prefixes, podContainerPrefix(types.UID(e.Name())))
		}
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/tether/*")
	for _, d := range dirs {
		base := filepath.Base(d)
		mine := false
		for _, p := range prefixes {
			mine = mine || strings.HasPrefix(base, p)
		}
		if !mine {
			continue
		}
		var err error
		for i := 0; i < 50; i++ {
			if err = unix.Rmdir(d); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup %s of node %s: %v", d, n.name, err)
		}
	}
}

// dumpLogs prints the end of the agent's and containerd's logs.
func (n *ctrNode) dumpLogs() {
	files := []string{filepath.Join(n.data, "containerd", "containerd.log")}
	if n.agent != nil {
		files = append(files, n.agent.LogPath())
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 150 {
			lines = lines[len(lines)-150:]
		}
		n.t.Logf("last lines of %s:\n%s", f, strings.Join(lines, "\n"))
	}
}

// childPIDs returns the processes whose parent is pid.
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[0] != "Z" && f[1] == strconv.Itoa(pid) {
			kids = append(kids, p)
		}
	}
	sort.Ints(kids)
	return kids
}

func procComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// procsMentioning returns live processes whose command line contains s.
func procsMentioning(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, p)
		}
	}
	return pids
}

func copyFileTo(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// requireContainerdNode skips unless a containerd node can run here:
// root, containerd, runc, ctr, util-linux's nsenter and unshare, the CNI
// plugins, and a static busybox for the test images' shell.
func requireContainerdNode(t *testing.T) {
	t.Helper()
	requireRoot(t)
	for _, bin := range []string{"containerd", "runc", "ctr", "nsenter", "unshare", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		if _, err2 := os.Stat("/opt/cni/bin/bridge"); err2 != nil {
			t.Skip("needs the CNI plugins (containernetworking-plugins)")
		}
	}
	if !images.HasShell() {
		t.Skip("needs a static busybox (busybox-static) for the test images' shell")
	}
}

// streamCmd is kubectl, as the admin, in the hub's namespace, for
// commands that stream or need their own stdio.
func (h *labHub) streamCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.l.Hub().Netns,
		h.kubectl, "--kubeconfig", h.kubeconfig()}, args...)...)
}

// applyManifest writes yaml to a file and applies it.
func (h *labHub) applyManifest(t *testing.T, yaml string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "manifest-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(yaml); err != nil {
		t.Fatal(err)
	}
	f.Close()
	h.must(t, "apply", "-f", f.Name())
}

// must runs kubectl as the admin and fails t when it fails.
func (h *labHub) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.run(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// podsByName lists the default namespace's pods.
func (h *labHub) podsByName() (map[string]*corev1.Pod, error) {
	out, err := h.run("get", "pods", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("kubectl get pods: %w: %s", err, out)
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode pod list: %w", err)
	}
	m := map[string]*corev1.Pod{}
	for i := range list.Items {
		m[list.Items[i].Name] = &list.Items[i]
	}
	return m, nil
}

// pod gets one pod of the default namespace.
func (h *labHub) pod(name string) (*corev1.Pod, error) {
	out, err := h.run("get", "pod", name, "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("kubectl get pod %s: %w: %s", name, err, out)
	}
	var p corev1.Pod
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("decode pod %s: %w", name, err)
	}
	return &p, nil
}

// containerState returns the status of a pod's container or init
// container.
func containerState(p *corev1.Pod, name string) (corev1.ContainerStatus, bool) {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for _, c := range list {
			if c.Name == name {
				return c, true
			}
		}
	}
	return corev1.ContainerStatus{}, false
}

// eventually polls f until it says yes, failing the test with f's last
// word after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, s := f()
		if ok {
			return
		}
		last = s
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, timeout, last)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// dialInHost opens a connection from inside a lab host.
func dialInHost(l *Lab, host, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.InHost(host, func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	return c, err
}

// openTerminal opens a pseudo-terminal pair.
func openTerminal() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	num, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", num), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// syncBuffer is a strings.Builder safe for one writer and many readers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// upCtrLab builds the project's test images into dir and brings up a lab
// of one site for containerd nodes (on plain disks: containerd's overlayfs
// snapshots cannot have their upper directories on the FUSE delay layer),
// closed when the test ends, with its hub. It returns the image archive.
func upCtrLab(t *testing.T, dir string, diskMiB int, site SiteSpec) (*Lab, *labHub, string) {
	t.Helper()
	archive := filepath.Join(dir, "test-images.tar")
	if err := images.Build(archive); err != nil {
		t.Fatalf("build test images: %v", err)
	}
	l, err := Up(context.Background(), Config{
		Spec:       Spec{DiskSize: diskMiB, Sites: []SiteSpec{site}},
		PlainDisks: true,
		Log:        slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l, startLabHub(t, l), archive
}
