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
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
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

// benchWorkingSet is how many Services the benchmark's clients talk to: a
// node's pods each use a few Services, not every Service of a large
// cluster. The set is drawn at random from all Services loaded, so it
// spreads over the whole address range and the whole frontend table.
const benchWorkingSet = 1000

// workingSet draws min(n, benchWorkingSet) distinct Services of n.
func workingSet(n int) []int {
	return rand.Perm(n)[:min(n, benchWorkingSet)]
}

// benchFixedSet is the size of a second working set, the same at every n:
// its cost shows what the number of Services loaded does on its own, where
// the working set of min(n, benchWorkingSet) also grows with n.
const benchFixedSet = 100

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

// hookChunk is how many connections one sample of a program's run-time
// statistic covers.
const hookChunk = 100

// connRun is what one run of connections measured.
type connRun struct {
	conns []time.Duration // socket+connect+close of each connection
	// The run-time statistic (run_time / run_count) of the connect4
	// program over the whole run, and its median over chunks of hookChunk
	// connections: the whole-run figure also carries every interrupt that
	// landed inside the program, the median is the steady cost.
	hook, hookMed time.Duration
	release       time.Duration // the same whole-run statistic of sock_release
	floor         time.Duration // ... of an empty connect4 program: what the statistic itself costs
}

// hookProgs are the programs whose run-time statistics a run samples; any
// may be nil.
type hookProgs struct {
	connect, release, floor *ebpf.Program
}

// connectCost times socket+connect+close to random Services of n from the
// calling thread. Sockets close with a reset (SO_LINGER 0): a graceful close
// leaves a TIME_WAIT socket per connection, whose timers fire a minute later
// into whatever is being measured then, and whose ports run out. It samples
// the run-time statistics of the programs of p along the way.
func connectCost(target func(i int) (netip.Addr, int32), n, conns int, p hookProgs) (connRun, error) {
	connect, release := p.connect, p.release
	r := connRun{conns: make([]time.Duration, 0, conns)}
	stats := func(p *ebpf.Program) *ebpf.ProgramStats {
		if p == nil {
			return nil
		}
		s, err := p.Stats()
		if err != nil {
			return nil
		}
		return s
	}
	per := func(a, b *ebpf.ProgramStats) time.Duration {
		if a == nil || b == nil || b.RunCount == a.RunCount {
			return 0
		}
		return (b.Runtime - a.Runtime) / time.Duration(b.RunCount-a.RunCount)
	}
	first, firstRel, firstFloor := stats(connect), stats(release), stats(p.floor)
	last := first
	var chunks []time.Duration
	linger := &unix.Linger{Onoff: 1, Linger: 0}
	for i := range conns {
		ip, port := target(rand.IntN(n))
		sa := &unix.SockaddrInet4{Addr: ip.As4(), Port: int(port)}
		start := time.Now()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return r, err
		}
		if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, linger); err != nil {
			unix.Close(fd)
			return r, err
		}
		err = unix.Connect(fd, sa)
		unix.Close(fd)
		r.conns = append(r.conns, time.Since(start))
		if err != nil {
			return r, fmt.Errorf("connect %s:%d: %w", ip, port, err)
		}
		if connect != nil && (i+1)%hookChunk == 0 {
			s := stats(connect)
			chunks = append(chunks, per(last, s))
			last = s
		}
	}
	r.hook, r.release, r.floor = per(first, stats(connect)), per(firstRel, stats(release)), per(firstFloor, stats(p.floor))
	if len(chunks) > 0 {
		r.hookMed = pct(chunks, 0.5)
	}
	return r, nil
}

// quiesce collects the garbage of the setup and stops the collector until
// the returned function is called: its work on the other CPU (and the
// TLB shootdowns of returning memory) would otherwise land in the kernel
// time being measured.
func quiesce() func() {
	runtime.GC()
	debug.FreeOSMemory()
	prev := debug.SetGCPercent(-1)
	return func() { debug.SetGCPercent(prev) }
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
	ws                     []int // the Services connected to
	fixed                  []int // benchFixedSet Services of n
	bpfMed, bpfP99         time.Duration
	hook, hookMed, release time.Duration
	floor                  time.Duration // an empty connect4 program in the working-set run
	hookWarm, hookWarmMed  time.Duration // the working set again, every line touched before
	hookFix, hookFixMed    time.Duration // connecting to the fixed set
	relFix                 time.Duration
	hookAll, hookAllMed    time.Duration // connecting to any of all n Services
	fastByChoice           [fastChoices]int
	fastSpills             int
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
		rows[n] = &benchRow{n: n, ws: workingSet(n), fixed: rand.Perm(n)[:min(n, benchFixedSet)]}
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
		var r connRun
		resume := quiesce()
		err = ns.Do(func() error {
			ws := rows[n].ws
			r, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(192, ws[i]) }, len(ws), conns, hookProgs{})
			return err
		})
		resume()
		if err != nil {
			t.Fatal(err)
		}
		rows[n].iptMed, rows[n].iptP99 = pct(r.conns, 0.5), pct(r.conns, 0.99)
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

	// An empty connect4 program next to the dataplane's: its statistic is
	// what measuring a program costs.
	floor, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer floor.Close()
	floorLink, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupInet4Connect, Program: floor})
	if err != nil {
		t.Fatal(err)
	}
	defer floorLink.Close()

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
		var r, warm, fix, all connRun
		ws, fixed := rows[n].ws, rows[n].fixed
		progs := hookProgs{connect: dp.objs.Sock4Connect, release: dp.objs.SockRelease, floor: floor}
		resume := quiesce()
		err = ns.Do(func() error {
			r, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(64, ws[i]) }, len(ws), conns, progs)
			if err != nil {
				return err
			}
			// The working set again: in the first run, about a
			// third of the connections at 1,000 Services were the
			// first to their Service since the agent wrote its
			// line; now every line has been read before.
			warm, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(64, ws[i]) }, len(ws), conns, progs)
			if err != nil {
				return err
			}
			// The same number of connections to benchFixedSet
			// Services of n: the same working set at every n.
			fix, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(64, fixed[i]) }, len(fixed), conns, progs)
			if err != nil {
				return err
			}
			// The same number of connections, each to any of all n
			// Services: nearly every one finds its frontend's
			// entry out of the CPU caches.
			all, err = connectCost(func(i int) (netip.Addr, int32) { return benchVIP(64, i) }, n, conns,
				hookProgs{connect: dp.objs.Sock4Connect})
			return err
		})
		resume()
		if err != nil {
			t.Fatal(err)
		}
		row := rows[n]
		row.hook, row.hookMed, row.release, row.floor = r.hook, r.hookMed, r.release, r.floor
		row.hookWarm, row.hookWarmMed = warm.hook, warm.hookMed
		row.hookFix, row.hookFixMed, row.relFix = fix.hook, fix.hookMed, fix.release
		row.hookAll, row.hookAllMed = all.hook, all.hookMed
		row.bpfMed, row.bpfP99 = pct(r.conns, 0.5), pct(r.conns, 0.99)
		st, err := dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		row.fastByChoice, row.fastSpills = st.FastByChoice, st.FastSpilled
	}
	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Uninstall(); err != nil {
		t.Fatal(err)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\nPer-connection cost (TCP socket+connect+close with reset, %d connections to a working set of min(n, %d) Services drawn at random from all n, each connection to one of them at random; loopback backend; load average %s)\n",
		conns, benchWorkingSet, loadAvg())
	fmt.Fprintf(&b, "%8s | %10s %10s | %9s %9s %9s %9s | %9s %9s | %9s %9s %9s | %9s %9s | %9s | %22s | %10s %10s %12s | %9s %9s\n", "services", "eBPF p50", "eBPF p99",
		"hook", "hook med", "release", "per conn", "again", "again med", "fix100", "fix med", "fix conn", "hook all", "all med", "floor", "fast 1st/2nd/3rd/spilled", "ipt p50", "ipt p99", "ipt restore", "p50 ratio", "p99 ratio")
	var hooks, meds, warms, alls, conn, fixes, fixConn []time.Duration
	for _, n := range sizes {
		r := rows[n]
		hooks, meds, warms, alls = append(hooks, r.hook), append(meds, r.hookMed), append(warms, r.hookWarm), append(alls, r.hookAll)
		conn, fixes, fixConn = append(conn, r.hook+r.release), append(fixes, r.hookFix), append(fixConn, r.hookFix+r.relFix)
		fmt.Fprintf(&b, "%8d | %10v %10v | %9v %9v %9v %9v | %9v %9v | %9v %9v %9v | %9v %9v | %9v | %22s | %10v %10v %12v | %8.2fx %8.2fx\n", n, r.bpfMed, r.bpfP99,
			r.hook, r.hookMed, r.release, r.hook+r.release, r.hookWarm, r.hookWarmMed, r.hookFix, r.hookFixMed, r.hookFix+r.relFix, r.hookAll, r.hookAllMed, r.floor,
			fmt.Sprintf("%d/%d/%d/%d", r.fastByChoice[0], r.fastByChoice[1], r.fastByChoice[2], r.fastSpills),
			r.iptMed, r.iptP99, r.iptLoad.Round(time.Millisecond), float64(r.iptMed)/float64(r.bpfMed), float64(r.iptP99)/float64(r.bpfP99))
	}
	fmt.Fprintf(&b, "hook: run-time statistic of connect4 (run_time / run_count) over the %d connections to the working set; hook med: its median over chunks of %d; release: sock_release per closed socket; per conn: hook + release, the programs' cost per connection; again / again med: connect4 for %d more connections to the same working set, whose lines have all been read before; fix100 / fix med / fix conn: the same for %d connections to a fixed set of %d Services drawn from all n (the working set is the same at every n, only the tables grow); hook all / all med: connect4 for %d connections each to any of all n Services (few find their frontend in the CPU caches); floor: an empty connect4 program attached next to the dataplane's, in the working-set run (what the statistic itself costs, included in every figure); fast 1st/2nd/3rd/spilled: frontends served from the first, second, third of their lb_fe_fast lines / from lb_frontends\n",
		conns, hookChunk, conns, conns, benchFixedSet, conns)
	fmt.Fprintf(&b, "\nProgramming one change with %d Services loaded: eBPF p50 %v p99 %v (200 changes) | iptables-restore --noflush of the changed chains p50 %v p99 %v, full iptables-restore %v | p99 ratio %.0fx\n",
		progN, pct(bpfChange, 0.5), pct(bpfChange, 0.99), pct(iptChange, 0.5), pct(iptChange, 0.99), iptFull.Round(time.Millisecond),
		float64(pct(iptChange, 0.99))/float64(pct(bpfChange, 0.99)))
	fmt.Fprintf(&b, "Full resync of %d Services × %d backends: %v (process CPU time %v); pinned map memory %.1f MiB\n",
		progN, benchBackends, resync, resyncCPU, float64(mem)/(1<<20))
	t.Log(b.String())

	// What holds on any machine: no connect fell back to socket-local
	// storage (the per-connect allocation that lb_sk_rev replaced), and
	// the dense ClusterIP range of the run never spilled out of the fast
	// table below 16,384 Services (one port each).
	if st.SocketRevLocal != 0 {
		t.Errorf("%d connects kept their reverse translation in socket-local storage; want 0", st.SocketRevLocal)
	}
	for _, n := range sizes {
		if r := rows[n]; n <= 16384 && r.fastSpills != 0 {
			t.Errorf("%d Services: %d frontends spilled out of lb_fe_fast; want 0", n, r.fastSpills)
		}
	}
	// The design targets are reported, not enforced: on a shared 2-vCPU
	// VM a cold cache line costs hundreds of nanoseconds and the
	// neighbours decide how cold. Short runs guard against gross
	// regressions with the median, which interrupts do not move.
	mean := func(ds []time.Duration) time.Duration {
		var m time.Duration
		for _, d := range ds {
			m += d / time.Duration(len(ds))
		}
		return m
	}
	flat := func(ds []time.Duration) bool {
		m := float64(mean(ds))
		for _, d := range ds {
			if r := float64(d)/m - 1; r > 0.2 || r < -0.2 {
				return false
			}
		}
		return true
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	if *benchFull {
		// One line per measure, each judged against ≤ 250 ns and flat
		// within ±20 % of its mean over the sizes. The target's own
		// figure is the first: connect4 over the working set.
		judge := func(what string, ds []time.Duration) string {
			return fmt.Sprintf("%s: max %v (%s), mean %v, flat within ±20%%: %s", what, slices.Max(ds),
				verdict(slices.Max(ds) <= 250*time.Nanosecond), mean(ds), verdict(flat(ds)))
		}
		t.Logf("targets (≤ 250 ns, flat within ±20 %%), judged on connect4 over the working set of min(n, %d); the other measures for comparison:\n  %s\n  %s\n  %s\n  %s\n  %s\n  %s\n  %s\nprogramming p99 ≤ 20 ms: %s; resync ≤ 250 ms: %s",
			benchWorkingSet,
			judge("connect4, working set (the target's figure)", hooks),
			judge("connect4, working set, chunk medians", meds),
			judge("connect4, working set again", warms),
			judge(fmt.Sprintf("connect4, fixed %d of n", benchFixedSet), fixes),
			judge("connect4, any of all n", alls),
			judge("connect4 + sock_release per connection, working set", conn),
			judge(fmt.Sprintf("connect4 + sock_release per connection, fixed %d of n", benchFixedSet), fixConn),
			verdict(pct(bpfChange, 0.99) <= 20*time.Millisecond), verdict(resync <= 250*time.Millisecond))
		return
	}
	if p := pct(bpfChange, 0.99); p > 100*time.Millisecond {
		t.Errorf("programming p99 %v", p)
	}
	if m := slices.Max(meds); m > shortHookLimit {
		t.Errorf("connect4 hook median %v at up to %d Services; want ≤ %v", m, slices.Max(sizes), shortHookLimit)
	}
}

// shortHookLimit bounds the median hook cost in short runs: several times
// what a quiet machine shows, below what one allocation per connect costs.
const shortHookLimit = time.Microsecond

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
