package containerd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/testbench/images"
)

// TestEdgeReset runs `tether edge` with containerd, the eBPF dataplane and
// its DNS interface, starts a pod, stops the agent (the pod keeps running,
// as it must) and runs `tether edge reset`: the pod's containers and
// shims, the agent's containerd, the pod bridge, the DNS interface and the
// dataplane's programs and pins are gone; with --purge, the data directory
// too. Reset refuses to run while an agent runs on the directory.
func TestEdgeReset(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containers and attach eBPF programs")
	}
	h, tok, rc := startJoinableHub(t)
	client := kubernetes.NewForConfigOrDie(rc)

	const bridge, dnsIf = "ttreset", "ttresetdns"
	host := newAgentHost(t, "reset", bridge)
	dir, cgroup, pins := host.dir, host.cgroup, host.pins
	dnsAddr := fmt.Sprintf("169.254.%d.%d", 100+os.Getpid()%100, 2+os.Getpid()%250)
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(dnsIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})

	agentArgs := []string{"--data-dir", dir, "--containerd-address", filepath.Join(dir, "containerd", "containerd.sock"),
		"--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--dns-interface", dnsIf, "--pod-bridge", bridge}
	var agentLog syncBuffer
	agent := exec.Command(h.Bin, append([]string{"edge", "--hub", "https://" + h.Addr, "--token", tok,
		"--name", "reset-0", "--runtime", "containerd", "--node-ip", "127.0.0.1", "--dataplane", "ebpf", "--uplinks", "none",
		"--dns-addr", dnsAddr}, agentArgs...)...)
	agent.Stdout, agent.Stderr = &agentLog, &agentLog
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	agentDone := make(chan struct{})
	go func() { _ = agent.Wait(); close(agentDone) }()
	stopAgent := func() {
		_ = agent.Process.Signal(syscall.SIGTERM)
		select {
		case <-agentDone:
		case <-time.After(20 * time.Second):
			_ = agent.Process.Kill()
			<-agentDone
		}
	}
	t.Cleanup(stopAgent)
	waitUntil := func(what string, timeout time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(timeout); !ok(); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v\nagent log:\n%s", what, timeout, agentLog.String())
			}
		}
	}
	waitUntil("node Ready", 60*time.Second, func() bool {
		n, err := client.CoreV1().Nodes().Get(context.Background(), "reset-0", metav1.GetOptions{})
		return err == nil && nodeReady(n)
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{NodeName: "reset-0",
			Containers: []corev1.Container{{Name: "c", Image: images.Echo, ImagePullPolicy: corev1.PullNever}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil("pod Running", 60*time.Second, func() bool {
		p, err := client.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
	if len(shimsOf(dir)) == 0 {
		t.Fatal("no containerd shim runs the pod")
	}

	reset := func(args ...string) (string, error) {
		out, err := exec.Command(h.Bin, append([]string{"edge", "reset"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := reset(agentArgs...); err == nil || !strings.Contains(out, "an agent runs on "+dir) {
		t.Fatalf("reset while the agent runs: %v\n%s", err, out)
	}

	stopAgent()
	// The pod outlives the agent, and so do its containerd and the rest.
	if len(shimsOf(dir)) == 0 {
		t.Fatal("the pod stopped with the agent")
	}
	if _, err := os.Stat(filepath.Join(pins, "links")); err != nil {
		t.Fatalf("dataplane pins after the agent stopped: %v", err)
	}
	daemon := 0
	if b, err := os.ReadFile(filepath.Join(dir, "containerd", "containerd.pid")); err == nil {
		daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if daemon == 0 || syscall.Kill(daemon, 0) != nil {
		t.Fatalf("the agent's containerd (%d) is not running after the agent stopped", daemon)
	}

	// Reset finds the agent's containerd from what the agent recorded in
	// its data directory, as after scripts/up.sh, which runs one there.
	var resetArgs []string
	for i := 0; i < len(agentArgs); i++ {
		if agentArgs[i] == "--containerd-address" {
			i++
			continue
		}
		resetArgs = append(resetArgs, agentArgs[i])
	}
	start := time.Now()
	out, err := reset(resetArgs...)
	if err != nil {
		t.Fatalf("tether edge reset: %v\n%s", err, out)
	}
	t.Logf("reset took %v:\n%s", time.Since(start).Round(time.Millisecond), out)
	if s := shimsOf(dir); len(s) > 0 {
		t.Errorf("shims still running after the reset: %v", s)
	}
	if syscall.Kill(daemon, 0) == nil {
		t.Errorf("the agent's containerd (%d) still runs after the reset", daemon)
	}
	for _, name := range []string{bridge, dnsIf} {
		if _, err := netlink.LinkByName(name); err == nil {
			t.Errorf("interface %s still exists after the reset", name)
		}
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Errorf("pin directory after the reset: %v", err)
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCgroupInet4GetPeername} {
		q, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %v programs: %v", at, err)
		}
		if len(q.Programs) > 0 {
			t.Errorf("%d %v programs still attached to the cgroup after the reset", len(q.Programs), at)
		}
	}
	// The node keeps its identity without --purge.
	if _, err := os.Stat(filepath.Join(dir, "state.db")); err != nil {
		t.Errorf("local state after a reset without --purge: %v", err)
	}

	// Again, with --purge: nothing left to remove but the directory.
	if out, err := reset(append(agentArgs, "--purge")...); err != nil {
		t.Fatalf("tether edge reset --purge: %v\n%s", err, out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data directory after --purge: %v", err)
	}
}

// shimsOf returns the process IDs of containerd shims whose command line
// names dir.
func shimsOf(dir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(cmd, []byte("containerd-shim")) && bytes.Contains(cmd, []byte(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}
