package testbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("testbench needs root to create network namespaces")
	}
}

func newLab(t *testing.T, spec Spec) *Lab {
	t.Helper()
	requireRoot(t)
	l, err := Up(context.Background(), Config{Spec: spec, Output: t.Output(),
		Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// listenIn opens a listener inside host; the socket stays in that
// namespace whatever thread later serves it.
func listenIn(t *testing.T, l *Lab, host, network, addr string) (ln net.Listener, pc net.PacketConn) {
	t.Helper()
	err := l.InHost(host, func() error {
		var err error
		if network == "tcp" {
			ln, err = net.Listen("tcp4", addr)
		} else {
			pc, err = net.ListenPacket("udp4", addr)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, host, err)
	}
	t.Cleanup(func() {
		if ln != nil {
			ln.Close()
		}
		if pc != nil {
			pc.Close()
		}
	})
	return ln, pc
}

func dialIn(l *Lab, host, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := l.InHost(host, func() error {
		var err error
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}

func serveEcho(ln net.Listener, pc net.PacketConn) {
	if ln != nil {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
	}
	if pc != nil {
		go func() {
			buf := make([]byte, 2048)
			for {
				n, a, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], a)
			}
		}()
	}
}

func TestReachabilityAndNAT(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "east", Nodes: 2}, {Name: "west", Nodes: 2}}})
	hubAddr := l.Hub().Addr
	ln, _ := listenIn(t, l, "hub", "tcp", hubAddr+":7000")
	_, pc := listenIn(t, l, "hub", "udp", hubAddr+":7001")
	serveEcho(ln, pc)

	var nodes []*Host
	for _, s := range []string{"east", "west"} {
		nodes = append(nodes, l.Nodes(s)...)
	}
	if len(nodes) != 4 {
		t.Fatalf("got %d nodes, want 4", len(nodes))
	}
	for _, n := range nodes {
		for _, network := range []string{"tcp4", "udp4"} {
			port := map[string]string{"tcp4": "7000", "udp4": "7001"}[network]
			t.Run(n.Name+"/"+network, func(t *testing.T) {
				c, err := dialIn(l, n.Name, network, hubAddr+":"+port, 2*time.Second)
				if err != nil {
					t.Fatalf("dial hub: %v", err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(2 * time.Second))
				msg := []byte("hello from " + n.Name)
				if _, err := c.Write(msg); err != nil {
					t.Fatalf("write: %v", err)
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(c, got); err != nil {
					t.Fatalf("read echo: %v", err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("echo = %q, want %q", got, msg)
				}
			})
		}
	}

	// The hub must see the router's public address, not the node's.
	c, err := dialIn(l, "east-n1", "tcp4", hubAddr+":7000", 2*time.Second)
	if err != nil {
		t.Fatalf("dial hub: %v", err)
	}
	c.Close()
	ln2, _ := listenIn(t, l, "hub", "tcp", hubAddr+":7002")
	go func() {
		c, err := dialIn(l, "east-n2", "tcp4", hubAddr+":7002", 2*time.Second)
		if err == nil {
			c.Close()
		}
	}()
	ac, err := ln2.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	if got, want := ac.RemoteAddr().(*net.TCPAddr).IP.String(), l.Host("east-router").Addr; got != want {
		t.Errorf("hub sees node as %s, want router address %s", got, want)
	}
	ac.Close()

	// Nothing on the hub can open a connection to a node: neither to its
	// private address nor through its router's public address.
	nln, _ := listenIn(t, l, "east-n1", "tcp", "0.0.0.0:7003")
	var accepted atomic.Bool
	go func() {
		if c, err := nln.Accept(); err == nil {
			accepted.Store(true)
			c.Close()
		}
	}()
	for _, target := range []string{l.Host("east-n1").Addr, l.Host("east-router").Addr} {
		c, err := dialIn(l, "hub", "tcp4", target+":7003", time.Second)
		if err == nil {
			c.Close()
			t.Errorf("hub connected to %s:7003; NAT must not let it in", target)
		}
	}
	if accepted.Load() {
		t.Errorf("node accepted a connection from the hub")
	}
}

// udpProbe sends n numbered datagrams from node to the hub's echo and
// returns the round-trip times of those that came back.
func udpRTTs(t *testing.T, l *Lab, node string, target string, n int) []time.Duration {
	t.Helper()
	c, err := dialIn(l, node, "udp4", target, time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	var rtts []time.Duration
	buf := make([]byte, 64)
	for i := range n {
		start := time.Now()
		fmt.Fprintf(c, "%d", i)
		c.SetReadDeadline(time.Now().Add(time.Second))
		for {
			m, err := c.Read(buf)
			if err != nil {
				break
			}
			if string(buf[:m]) == fmt.Sprint(i) {
				rtts = append(rtts, time.Since(start))
				break
			}
		}
	}
	return rtts
}

func TestShaping(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}})
	hubAddr := l.Hub().Addr
	ln, _ := listenIn(t, l, "hub", "tcp", hubAddr+":7000")
	_, pc := listenIn(t, l, "hub", "udp", hubAddr+":7001")
	serveEcho(nil, pc)

	t.Run("bandwidth", func(t *testing.T) {
		const rate = 1_000_000
		if err := l.Shape("shop", LinkParams{Rate: rate}); err != nil {
			t.Fatal(err)
		}
		var got atomic.Int64
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				got.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		c, err := dialIn(l, "shop-n1", "tcp4", hubAddr+":7000", 2*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		stop := make(chan struct{})
		go func() {
			buf := make([]byte, 16<<10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.SetWriteDeadline(time.Now().Add(time.Second))
				c.Write(buf)
			}
		}()
		defer close(stop)
		time.Sleep(time.Second) // past slow start
		b0, t0 := got.Load(), time.Now()
		time.Sleep(4 * time.Second)
		b1, t1 := got.Load(), time.Now()
		secs := t1.Sub(t0).Seconds()
		goodput := float64(b1-b0) * 8 / secs
		// The link carries whole IP packets: 1448 bytes of payload in 1500
		// with TCP timestamps.
		wire := goodput * 1500 / 1448
		t.Logf("configured %d bit/s: goodput %.0f bit/s, on the wire ≈%.0f bit/s", rate, goodput, wire)
		if wire < 0.9*rate || wire > 1.1*rate {
			t.Errorf("measured %.0f bit/s on a %d bit/s link, want within 10%%", wire, rate)
		}
	})

	t.Run("delay", func(t *testing.T) {
		if err := l.Shape("shop", LinkParams{Delay: Duration(100 * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
		udpRTTs(t, l, "shop-n1", hubAddr+":7001", 1) // warm neighbour and conntrack entries
		rtts := udpRTTs(t, l, "shop-n1", hubAddr+":7001", 40)
		if len(rtts) < 36 {
			t.Fatalf("only %d of 40 probes returned", len(rtts))
		}
		sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
		p25, med, p90 := rtts[len(rtts)/4], rtts[len(rtts)/2], rtts[len(rtts)*9/10]
		t.Logf("100ms one-way: RTT min %v p25 %v median %v p90 %v max %v", rtts[0], p25, med, p90, rtts[len(rtts)-1])
		// A busy machine only ever adds delay (the relay and the probes
		// wait for a CPU), never removes it, so the lower quartile is what
		// the link itself shows; the rest is logged.
		if p25 < 190*time.Millisecond || p25 > 210*time.Millisecond {
			t.Errorf("RTT lower quartile %v, want 200±10ms", p25)
		}
		if rtts[0] < 190*time.Millisecond {
			t.Errorf("minimum RTT %v is below the configured 200ms", rtts[0])
		}
	})

	t.Run("loss", func(t *testing.T) {
		if err := l.Shape("shop", LinkParams{Loss: 0.05}); err != nil {
			t.Fatal(err)
		}
		_, sink := listenIn(t, l, "hub", "udp", hubAddr+":7005")
		// A big buffer keeps the receiver from adding its own loss.
		sink.(*net.UDPConn).SetReadBuffer(4 << 20)
		var recv atomic.Int64
		go func() {
			buf := make([]byte, 64)
			for {
				if _, _, err := sink.ReadFrom(buf); err != nil {
					return
				}
				recv.Add(1)
			}
		}()
		c, err := dialIn(l, "shop-n1", "udp4", hubAddr+":7005", time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		before := l.Stats().Links["shop"].Up
		const n = 10000
		for i := range n {
			c.Write([]byte("x"))
			if i%10 == 9 {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(300 * time.Millisecond)
		after := l.Stats().Links["shop"].Up
		sent := after.Packets - before.Packets
		loss := 1 - float64(recv.Load())/n
		t.Logf("5%% configured: %d sent, %d reached the link, %d received, loss %.2f%%", n, sent, recv.Load(), loss*100)
		if sent < n {
			t.Errorf("%d of %d packets reached the link; the measurement needs all", sent, n)
		}
		if loss < 0.04 || loss > 0.06 {
			t.Errorf("loss %.2f%%, want 5±1%%", loss*100)
		}
	})
}

func TestPartitionAndRebind(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}})
	hubAddr := l.Hub().Addr
	_, pc := listenIn(t, l, "hub", "udp", hubAddr+":7001")

	var mu sync.Mutex
	var lastFrom net.Addr
	var lastAt time.Time
	arrivals := make(chan time.Time, 10000)
	go func() {
		buf := make([]byte, 64)
		for {
			_, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			lastFrom, lastAt = a, now
			mu.Unlock()
			select {
			case arrivals <- now:
			default:
			}
		}
	}()
	c, err := dialIn(l, "shop-n1", "udp4", hubAddr+":7001", time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				c.Write([]byte("tick"))
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(200 * time.Millisecond)

	// Partition: nothing arrives later than 100ms after the call.
	call := time.Now()
	if err := l.Partition("shop", Both); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	last := lastAt
	mu.Unlock()
	if d := last.Sub(call); d > 100*time.Millisecond {
		t.Errorf("packets arrived %v after Partition, want within 100ms", d)
	}
	t.Logf("last arrival %v after Partition", last.Sub(call))

	// Heal: traffic is back within 100ms.
	for len(arrivals) > 0 {
		<-arrivals
	}
	call = time.Now()
	if err := l.Heal("shop"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-arrivals:
		t.Logf("first arrival %v after Heal", at.Sub(call))
		if d := at.Sub(call); d > 100*time.Millisecond {
			t.Errorf("first packet %v after Heal, want within 100ms", d)
		}
	case <-time.After(time.Second):
		t.Fatal("no packet within 1s of Heal")
	}

	// One-way partition: upstream cut, and still nothing arrives.
	if err := l.Partition("shop", Upstream); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	last = lastAt
	mu.Unlock()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	if !lastAt.Equal(last) {
		t.Errorf("packets arrived through an upstream partition")
	}
	mu.Unlock()
	l.Heal("shop")
	time.Sleep(100 * time.Millisecond)

	// Rebind: the same flow shows up from a new public port.
	mu.Lock()
	before := lastFrom.String()
	mu.Unlock()
	if err := l.Rebind(context.Background(), "shop"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	after := lastFrom.String()
	mu.Unlock()
	t.Logf("hub saw the flow from %s before rebinding and from %s after", before, after)
	if before == after {
		t.Errorf("source address %s unchanged after Rebind", after)
	}
}

func TestFaultsOnProcessesAndDisks(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}, DiskSize: 8})
	p, err := l.Start("shop-n1", "sleeper", "sleep", "1000")
	if err != nil {
		t.Fatal(err)
	}
	state := func() string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID()))
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			return s[i+2 : i+3]
		}
		return ""
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return state() == "T" }, "process stopped")
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return state() == "S" }, "process continued")
	old := p.PID()
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if p.PID() == old {
		t.Errorf("restart kept pid %d", old)
	}
	p.Kill()
	if err := p.Wait(); err == nil {
		t.Errorf("killed process exited cleanly")
	}

	path, err := l.FillDisk("shop-n1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Host("shop-n1").DataDir, "more"), make([]byte, 8192), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write to a full disk: %v, want ENOSPC", err)
	}
	if err := os.Remove(path); err != nil {
		t.Errorf("free the filled disk: %v", err)
	}
	if err := os.WriteFile(filepath.Join(l.Host("shop-n1").DataDir, "more"), make([]byte, 8192), 0o600); err != nil {
		t.Errorf("write after freeing the disk: %v", err)
	}

	// Samples accumulate for running processes.
	q, err := l.Start("shop-n1", "busy", "sh", "-c", "while :; do :; done")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		s := l.Stats().Procs["busy"].Samples
		return len(s) > 0 && s[len(s)-1].CPU > 0 && s[len(s)-1].RSS > 0
	}, "CPU and RSS samples")
	q.Kill()
	var tbl bytes.Buffer
	l.Stats().WriteTable(&tbl)
	t.Logf("stats:\n%s", tbl.String())
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

const crashEnv = "TETHER_LAB_CRASH_CHILD"

// TestMain turns the test binary into the crash child of
// TestTeardownAfterCrash when the environment asks for it.
func TestMain(m *testing.M) {
	if id := os.Getenv(crashEnv); id != "" {
		crashChild(id)
		return
	}
	os.Exit(m.Run())
}

// crashChild builds a lab, starts a process in it and waits to be killed.
func crashChild(id string) {
	l, err := Up(context.Background(), Config{Spec: Spec{ID: id, Sites: []SiteSpec{{Name: "shop", Nodes: 2}}}})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	// A slowed FUSE data dir with a process inside it must be swept too.
	if err := l.SlowDisk("shop-n1", 20*time.Millisecond); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	p, err := l.Start("shop-n1", "sleeper", "sh", "-c", `cd "$1" && echo x > held && exec sleep 1000 < held`, "sh", l.Host("shop-n1").DataDir)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	for i := 0; i < 500 && !fileExists(filepath.Join(l.Host("shop-n1").DataDir, "held")); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("READY %d\n", p.PID())
	time.Sleep(time.Minute)
	os.Exit(1)
}

func TestTeardownAfterCrash(t *testing.T) {
	requireRoot(t)
	id := fmt.Sprintf("c%d", os.Getpid()%100000)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), crashEnv+"="+id)
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var sleeper int
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "READY %d", &sleeper); err == nil {
			break
		}
	}
	if sleeper == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("child did not build its lab")
	}
	start := procStart(sleeper)
	if fuseAvailable() && !bytes.Contains(mountinfo(), []byte("fuse."+fuseFSType+" tl"+id+" ")) {
		t.Errorf("crashed lab %s had no FUSE data dir; the sweep of one goes untested", id)
	}
	cmd.Process.Kill()
	cmd.Wait()
	go io.Copy(io.Discard, stdout)

	ids, err := Sweep(nil)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if !contains(ids, id) {
		t.Errorf("Sweep removed %v, want %s among them", ids, id)
	}
	assertGone(t, id)
	if alive(sleeper, start) {
		t.Errorf("process %d the lab started still runs", sleeper)
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	requireRoot(t)
	l, err := Up(context.Background(), Config{Spec: Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Start("shop-n1", "sleeper", "sleep", "1000")
	if err != nil {
		t.Fatal(err)
	}
	pid, start := p.PID(), procStart(p.PID())
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	assertGone(t, l.ID())
	if alive(pid, start) {
		t.Errorf("process %d still runs", pid)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// assertGone checks that no namespace, mount or runtime dir of lab id is
// left. Links, tuns, bridges and nftables tables all live inside the
// namespaces, so the namespaces being gone covers them.
func assertGone(t *testing.T, id string) {
	t.Helper()
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "tl"+id+"-") {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
	mounts := mountinfo()
	if bytes.Contains(mounts, []byte(filepath.Join(RuntimeRoot, id))) {
		t.Errorf("mounts under %s left behind", filepath.Join(RuntimeRoot, id))
	}
	// Data dir mounts (tmpfs and FUSE) carry the source tl<id>, wherever
	// they ended up.
	for _, line := range strings.Split(string(mounts), "\n") {
		if _, after, ok := strings.Cut(line, " - "); ok {
			if f := strings.Fields(after); len(f) >= 2 && f[1] == "tl"+id {
				t.Errorf("mount of lab %s left behind: %s", id, line)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(RuntimeRoot, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runtime dir of lab %s left behind", id)
	}
	// Only names with the lab prefix can be tun or veth ends in the root
	// namespace; there must be none.
	links, _ := exec.Command("ip", "-o", "link").Output()
	if bytes.Contains(links, []byte("tl"+id)) {
		t.Errorf("links of lab %s in the root namespace", id)
	}
}

func mountinfo() []byte {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return b
}

func isRoot() bool { return os.Geteuid() == 0 }
