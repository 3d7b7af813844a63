package dataplane

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/tether-edge/tether/dataplane/internal/testnet"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var benchFull = flag.Bool("dpbench.full", false, "run the dataplane benchmark at full size (100 to 50,000 Services, 10,000 for programming and resync)")

// benchVIP spreads Services over 10.214.64.0/18 (eBPF) or 10.214.192.0/18
// (iptables) and, past 16,384, over ports.
func benchVIP(base byte, i int) (netip.Addr, int32) {
	n := i % 16384
	return netip.AddrFrom4([4]byte{10, 214, base + byte(n>>8), byte(n)}), int32(80 + i/16384)
}

const benchBackends = 10

func benchBackendIP(j int) string { return fmt.Sprintf("10.214.50.%d", j+1) }

func benchObjects(n, backends int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*corev1.Service, n)
	slices := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		ip, port := benchVIP(64, i)
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = service(name, ip.String(), svcPort("http", corev1.ProtocolTCP, port, intstr.FromInt32(8080)))
		eps := make([]discoveryv1.Endpoint, backends)
		for j := range eps {
			eps[j] = readyEP(benchBackendIP(j), "node-a")
		}
		slices[i] = epSlice(name+"-1", name, []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, eps...)
	}
	return svcs, slices
}

// connectCost times socket+connect+close to random Services of n from the
// calling thread, returning the per-connection durations.
func connectCost(target func(i int) (netip.Addr, int32), n, conns int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, conns)
	for range conns {
		ip, port := target(rand.IntN(n))
		sa := &unix.SockaddrInet4{Addr: ip.As4(), Port: int(port)}
		start := time.Now()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		err = unix.Connect(fd, sa)
		unix.Close(fd)
		out = append(out, time.Since(start))
		if err != nil {
			return nil, fmt.Errorf("connect %s:%d: %w", ip, port, err)
		}
	}
	return out, nil
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// acceptAll drains a listener so that connect() never waits on a full
// backlog.
func acceptAll(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// iptablesRules renders kube-proxy's iptables mode for n Services with two
// endpoints each: KUBE-SERVICES → KUBE-SVC (statistic random) → KUBE-SEP
// (DNAT).
func iptablesRules(n int) []byte {
	var b bytes.Buffer
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	for i := range n {
		fmt.Fprintf(&b, ":KUBE-SVC-%d - [0:0]\n:KUBE-SEP-%d-0 - [0:0]\n:KUBE-SEP-%d-1 - [0:0]\n", i, i, i)
	}
	b.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	for i := range n {
		ip, port := benchVIP(192, i)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"default/svc-%d:http cluster IP\" -m tcp --dport %d -j KUBE-SVC-%d\n", ip, i, port, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%d -m comment --comment \"default/svc-%d:http\" -m statistic --mode random --probability 0.5 -j KUBE-SEP-%d-0\n", i, i, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%d -m comment --comment \"default/svc-%d:http\" -j KUBE-SEP-%d-1\n", i, i, i)
		for j := range 2 {
			fmt.Fprintf(&b, "-A KUBE-SEP-%d-%d -s %s/32 -j KUBE-MARK-MASQ\n", i, j, benchBackendIP(j))
			fmt.Fprintf(&b, "-A KUBE-SEP-%d-%d -p tcp -m tcp -j DNAT --to-destination %s:8080\n", i, j, benchBackendIP(j))
		}
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// iptablesChange is kube-proxy's partial sync (KEP-3453) for one Service
// whose second endpoint changed.
func iptablesChange(i, gen int) []byte {
	var b bytes.Buffer
	ep := benchBackendIP(1 + gen%2)
	fmt.Fprintf(&b, "*nat\n:KUBE-SVC-%d - [0:0]\n:KUBE-SEP-%d-1 - [0:0]\n", i, i)
	fmt.Fprintf(&b, "-A KUBE-SVC-%d -m statistic --mode random --probability 0.5 -j KUBE-SEP-%d-0\n-A KUBE-SVC-%d -j KUBE-SEP-%d-1\n", i, i, i, i)
	fmt.Fprintf(&b, "-A KUBE-SEP-%d-1 -s %s/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-%d-1 -p tcp -m tcp -j DNAT --to-destination %s:8080\nCOMMIT\n", i, ep, i, ep)
	return b.Bytes()
}

func iptablesRestore(ns *testnet.Netns, rules []byte, noflush bool) (time.Duration, error) {
	args := []string{"netns", "exec", ns.Name, "iptables-restore", "-w"}
	if noflush {
		args = append(args, "--noflush")
	}
	cmd := exec.Command("ip", args...)
	cmd.Stdin = bytes.NewReader(rules)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("iptables-restore: %w: %s", err, out)
	}
	return time.Since(start), nil
}

type benchRow struct {
	n                      int
	bpfMed, bpfP99, hookNs time.Duration
	iptMed, iptP99         time.Duration
	iptLoad                time.Duration
}

// TestDataplaneBench compares the eBPF dataplane with kube-proxy-style
// iptables rules in one run and prints a table. Default sizes keep it
// short for CI; -dpbench.full runs the sizes of the design targets:
//
//	go test ./dataplane/ -run TestDataplaneBench -v -dpbench.full
func TestDataplaneBench(t *testing.T) {
	testnet.RequireRoot(t)
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		t.Skip("needs iptables-restore (Debian package iptables) for the comparison")
	}
	sizes, progN, conns := []int{100, 1000}, 1000, 1000
	if *benchFull {
		sizes, progN, conns = []int{100, 1000, 10000, 50000}, 10000, 3000
	}
	maxN := slices.Max(append(slices.Clone(sizes), progN))

	ns := testnet.NewNetns(t, "bench")
	for j := range benchBackends {
		testnet.MustIP(t, "-n", ns.Name, "addr", "add", benchBackendIP(j)+"/32", "dev", "lo")
	}
	// A route for the iptables VIPs, as a node's default route would give:
	// nat OUTPUT runs only after routing found a way out.
	testnet.MustIP(t, "-n", ns.Name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	testnet.MustIP(t, "-n", ns.Name, "addr", "add", "10.214.51.1/24", "dev", "v0")
	testnet.MustIP(t, "-n", ns.Name, "addr", "add", "10.214.51.2/24", "dev", "v1")
	testnet.MustIP(t, "-n", ns.Name, "link", "set", "v0", "up")
	testnet.MustIP(t, "-n", ns.Name, "link", "set", "v1", "up")
	testnet.MustIP(t, "-n", ns.Name, "route", "add", "10.214.192.0/18", "via", "10.214.51.2")
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", ":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go acceptAll(ln)

	rows := map[int]*benchRow{}
	for _, n := range sizes {
		rows[n] = &benchRow{n: n}
	}

	// iptables first, while this process is outside the cgroup with the
	// socket programs (its VIPs are a different range anyway).
	for _, n := range sizes {
		rules := iptablesRules(n)
		load, err := iptablesRestore(ns, rules, false)
		if err != nil {
			t.Fatal(err)
		}
		rows[n].iptLoad = load
		var ds []time.Duration
		err = ns.Do(func() error {
			ds, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(192, i) }, n, conns)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		rows[n].iptMed, rows[n].iptP99 = pct(ds, 0.5), pct(ds, 0.99)
	}
	// kube-proxy's partial sync of one changed Service with progN loaded.
	var iptChange []time.Duration
	if _, err := iptablesRestore(ns, iptablesRules(progN), false); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		d, err := iptablesRestore(ns, iptablesChange(i*7%progN, i), true)
		if err != nil {
			t.Fatal(err)
		}
		iptChange = append(iptChange, d)
	}
	iptFull, err := iptablesRestore(ns, iptablesRules(progN), false)
	if err != nil {
		t.Fatal(err)
	}
	testnet.IP("netns", "exec", ns.Name, "iptables", "-t", "nat", "-F")

	// eBPF.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enable BPF run-time stats: %v", err)
	}
	defer stats.Close()
	cg := testnet.NewCgroup(t)
	cfg := Config{CgroupPath: cg, BPFFSPath: testnet.BPFFSDir(t), NodeName: "node-a", Logger: testLogger(t),
		Maps: MapSizes{Frontends: maxN + 1024, Backends: maxN*benchBackends + 1024}}
	svcs, eps := benchObjects(maxN, benchBackends)

	// Full resync: a fresh agent with progN Services × 10 backends.
	dp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range progN {
		dp.UpsertService(svcs[i])
		dp.UpsertEndpointSlice(eps[i])
	}
	cpu0 := cpuTime()
	start := time.Now()
	if err := dp.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	resync := time.Since(start)
	resyncCPU := cpuTime() - cpu0
	mem, err := dp.MapMemory()
	if err != nil {
		t.Fatal(err)
	}
	// Programming latency: one EndpointSlice change with progN loaded.
	var bpfChange []time.Duration
	for i := range 200 {
		k := rand.IntN(progN)
		s := eps[k].DeepCopy()
		s.Endpoints = s.Endpoints[:benchBackends-1-i%2]
		start := time.Now()
		dp.UpsertEndpointSlice(s)
		bpfChange = append(bpfChange, time.Since(start))
		dp.UpsertEndpointSlice(eps[k])
	}

	testnet.JoinCgroup(t, cg)
	loaded := progN
	load := func(n int) {
		for i := loaded; i < n; i++ {
			dp.UpsertService(svcs[i])
			dp.UpsertEndpointSlice(eps[i])
		}
		for i := n; i < loaded; i++ {
			dp.DeleteService("default", svcs[i].Name)
			dp.DeleteEndpointSlice("default", eps[i].Name)
		}
		loaded = n
	}
	for _, n := range sizes {
		load(n)
		before, err := dp.objs.Sock4Connect.Stats()
		if err != nil {
			t.Fatal(err)
		}
		var ds []time.Duration
		err = ns.Do(func() error {
			ds, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(64, i) }, n, conns)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		after, _ := dp.objs.Sock4Connect.Stats()
		runs := after.RunCount - before.RunCount
		if runs > 0 {
			rows[n].hookNs = (after.Runtime - before.Runtime) / time.Duration(runs)
		}
		rows[n].bpfMed, rows[n].bpfP99 = pct(ds, 0.5), pct(ds, 0.99)
	}
	if err := dp.Uninstall(); err != nil {
		t.Fatal(err)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nPer-connection cost (TCP socket+connect+close to a random ClusterIP, %d connections, loopback backend)\n", conns)
	fmt.Fprintf(&b, "%8s | %10s %10s %9s | %10s %10s %12s | %9s %9s\n", "services", "eBPF p50", "eBPF p99", "hook", "ipt p50", "ipt p99", "ipt restore", "p50 ratio", "p99 ratio")
	hooks := []time.Duration{}
	for _, n := range sizes {
		r := rows[n]
		hooks = append(hooks, r.hookNs)
		fmt.Fprintf(&b, "%8d | %10v %10v %9v | %10v %10v %12v | %8.2fx %8.2fx\n", n, r.bpfMed, r.bpfP99, r.hookNs,
			r.iptMed, r.iptP99, r.iptLoad.Round(time.Millisecond), float64(r.iptMed)/float64(r.bpfMed), float64(r.iptP99)/float64(r.bpfP99))
	}
	fmt.Fprintf(&b, "\nProgramming one change with %d Services loaded: eBPF p50 %v p99 %v (200 changes) | iptables-restore --noflush of the changed chains p50 %v p99 %v, full iptables-restore %v | p99 ratio %.0fx\n",
		progN, pct(bpfChange, 0.5), pct(bpfChange, 0.99), pct(iptChange, 0.5), pct(iptChange, 0.99), iptFull.Round(time.Millisecond),
		float64(pct(iptChange, 0.99))/float64(pct(bpfChange, 0.99)))
	fmt.Fprintf(&b, "Full resync of %d Services × %d backends: %v (process CPU time %v, load average %s); pinned map memory %.1f MiB\n",
		progN, benchBackends, resync, resyncCPU, loadAvg(), float64(mem)/(1<<20))
	t.Log(b.String())

	// The design targets are reported, not enforced: on a shared 2-vCPU
	// machine the in-kernel run time includes preemption by neighbours.
	// Short runs only guard against gross regressions.
	var mean float64
	for _, h := range hooks {
		mean += float64(h) / float64(len(hooks))
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	if *benchFull {
		flat := true
		for _, h := range hooks {
			if d := float64(h)/mean - 1; d > 0.2 || d < -0.2 {
				flat = false
			}
		}
		t.Logf("targets: hook ≤ 250 ns: %s (max %v); hook flat within ±20%% of its mean %v: %s; programming p99 ≤ 20 ms: %s; resync ≤ 250 ms: %s",
			verdict(slices.Max(hooks) <= 250*time.Nanosecond), slices.Max(hooks), time.Duration(mean), verdict(flat),
			verdict(pct(bpfChange, 0.99) <= 20*time.Millisecond), verdict(resync <= 250*time.Millisecond))
	} else if p := pct(bpfChange, 0.99); p > 100*time.Millisecond {
		t.Errorf("programming p99 %v", p)
	}
}

// cpuTime is the user and system CPU time the test process has used; on a
// shared machine it shows the work a step did where wall time shows the
// neighbours too.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the one-minute load average, for the record.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
