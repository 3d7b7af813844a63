package edge_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tether-edge/tether/dataplane"
	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
)

// TestAgentDataplaneAndDNS runs an agent with the eBPF dataplane and the DNS
// server against a real hub. A "pod" network namespace hangs off the host
// by a veth pair, the way a CNI bridge connects pods: it holds a Service's
// backend, and it queries the agent's DNS address through its default route
// to the node. The dataplane is attached to a cgroup of the test's own, which
// the test process joins, so the test's sockets are load-balanced and no
// other process on the host is. Then the hub stops: DNS and ClusterIPs keep
// working from the agent's state. Then the agent stops: the DNS server goes,
// the dataplane stays loaded.
func TestAgentDataplaneAndDNS(t *testing.T) {
	requireNetAdmin(t)
	e := startHub(t) // before the test joins its cgroup: the hub's sockets are not ours
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}

	// The pod: 198.18.x.y/30 (benchmarking range), backend on :8080.
	pod := newTestNetns(t)
	sub := randBytes(2)
	hostSide := netip.AddrFrom4([4]byte{198, 18, sub[0], sub[1]&^3 | 1})
	podIP := hostSide.Next()
	vethName := "tdp" + hex.EncodeToString(randBytes(3))
	mustIP(t, "link", "add", vethName, "type", "veth", "peer", "name", vethName+"p")
	t.Cleanup(func() { _ = runIP("link", "del", vethName) })
	mustIP(t, "link", "set", vethName+"p", "netns", pod.name, "name", "eth0")
	mustIP(t, "addr", "add", hostSide.String()+"/30", "dev", vethName)
	mustIP(t, "link", "set", vethName, "up")
	mustIP(t, "-n", pod.name, "addr", "add", podIP.String()+"/30", "dev", "eth0")
	mustIP(t, "-n", pod.name, "link", "set", "eth0", "up")
	mustIP(t, "-n", pod.name, "route", "add", "default", "via", hostSide.String())
	serveGreeting(t, pod, netip.AddrPortFrom(podIP, 8080))

	// A stand-in for the node's upstream resolver, on loopback.
	upstream := startUpstreamDNS(t)

	// The agent's DNS address: link-local, on an interface the agent
	// creates; random so that parallel runs on one host do not collide.
	ll := randBytes(2)
	dnsIP := netip.AddrFrom4([4]byte{169, 254, 100 + ll[0]%100, ll[1]%250 + 2})
	dnsIf := "tdns" + hex.EncodeToString(randBytes(3))
	t.Cleanup(func() { _ = runIP("link", "del", dnsIf) })

	// The dataplane's cgroup and pins; cleanups run in reverse order:
	// the agent stops, the dataplane is uninstalled, the process leaves
	// the cgroup, the cgroup and the bpffs go.
	pins := testBPFFS(t)
	cgroup := newTestCgroup(t)
	joinTestCgroup(t, cgroup)
	t.Cleanup(func() {
		dp, err := dataplane.New(dataplane.Config{CgroupPath: cgroup, BPFFSPath: pins, Logger: log})
		if err != nil {
			t.Errorf("adopt the dataplane to uninstall it: %v", err)
			return
		}
		if err := dp.Uninstall(); err != nil {
			t.Errorf("uninstall the dataplane: %v", err)
		}
	})

	// A dataplane that cannot load stops the agent with a clear error.
	t.Run("LoadFailure", func(t *testing.T) {
		a, err := edge.New(edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-nodp",
			Runtime: sim.New(sim.Config{}), WatchServices: true, Dataplane: edge.DataplaneEBPF,
			DataplaneCgroup: t.TempDir(), DataplaneBPFFS: filepath.Join(pins, "unused"), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = a.Run(ctx)
		if err == nil || !strings.Contains(err.Error(), "eBPF dataplane") || !strings.Contains(err.Error(), "cgroup2") ||
			!strings.Contains(err.Error(), "--dataplane none") {
			t.Fatalf("Run with an unusable cgroup: %v", err)
		}
		t.Logf("error: %v", err)
	})

	cfg := edge.Config{
		HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-dp",
		NodeIP:        netip.MustParseAddr("192.0.2.20"),
		WatchServices: true, Dataplane: edge.DataplaneEBPF,
		DataplaneCgroup: cgroup, DataplaneBPFFS: pins,
		DNSAddr: netip.AddrPortFrom(dnsIP, 53), DNSInterface: dnsIf,
		DNSUpstreams: []string{upstream},
		Logger:       log,
	}
	a := startAgent(t, cfg)
	waitNodeReady(t, e, "edge-dp")
	if got := a.DNSAddr(); got != netip.AddrPortFrom(dnsIP, 53) {
		t.Fatalf("DNSAddr() = %v, want %v:53", got, dnsIP)
	}
	dnsServer := a.DNSAddr().String()

	// A Service without selector and the EndpointSlice its user manages;
	// a headless Service with a named pod; an ExternalName Service.
	web, err := e.client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := web.Spec.ClusterIP
	if _, err := netip.ParseAddr(clusterIP); err != nil {
		t.Fatalf("web got no ClusterIP: %q", clusterIP)
	}
	ready := true
	httpPort := int32(8080)
	for _, es := range []*discoveryv1.EndpointSlice{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "web-manual", Labels: map[string]string{
				discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "test.tether.dev"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{podIP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: &httpPort}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "db-manual", Labels: map[string]string{
				discoveryv1.LabelServiceName: "db", discoveryv1.LabelManagedBy: "test.tether.dev"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{podIP.String()}, Hostname: ptr("db-0"),
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr("pg"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(5432))}},
		},
	} {
		if _, err := e.client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, svc := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "pg", Protocol: corev1.ProtocolTCP, Port: 5432}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName,
			ExternalName: "www.example.test"}},
	} {
		if _, err := e.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// checkDNS queries the agent from inside the pod, through its
	// default route and the veth, as a pod behind the CNI bridge does.
	checkDNS := func(t *testing.T, forwarded bool) {
		t.Helper()
		want := []struct {
			name  string
			qtype uint16
			rcode int
			ans   string
		}{
			{"web.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A " + clusterIP},
			{"_http._tcp.web.default.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess, "SRV 80 web.default.svc.cluster.local."},
			{"db.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A " + podIP.String()},
			{"db-0.db.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, "A " + podIP.String()},
			{"ext.default.svc.cluster.local.", dns.TypeCNAME, dns.RcodeSuccess, "CNAME www.example.test."},
			{"nothere.default.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, ""},
		}
		if forwarded {
			want = append(want, []struct {
				name  string
				qtype uint16
				rcode int
				ans   string
			}{
				{"www.example.test.", dns.TypeA, dns.RcodeSuccess, "A 192.0.2.80"},
				{"missing.example.test.", dns.TypeA, dns.RcodeNameError, ""},
			}...)
		}
		for _, w := range want {
			m, err := queryIn(pod, dnsServer, w.name, w.qtype)
			if err != nil {
				t.Errorf("%s %s: %v", dns.TypeToString[w.qtype], w.name, err)
				continue
			}
			got := answerStrings(m)
			if m.Rcode != w.rcode || (w.ans != "" && !slices.Contains(got, w.ans)) || (w.ans == "" && len(got) > 0) {
				t.Errorf("%s %s: %s %v, want %s %q", dns.TypeToString[w.qtype], w.name,
					dns.RcodeToString[m.Rcode], got, dns.RcodeToString[w.rcode], w.ans)
			}
		}
	}
	// checkConnect dials the ClusterIP from the host and from the pod.
	checkConnect := func(t *testing.T) {
		t.Helper()
		target := net.JoinHostPort(clusterIP, "80")
		if got, err := greet(target); err != nil || got != "hello from "+podIP.String() {
			t.Errorf("host → %s: %q, %v", target, got, err)
		}
		var got string
		err := pod.do(func() error {
			var err error
			got, err = greet(target)
			return err
		})
		if err != nil || got != "hello from "+podIP.String() {
			t.Errorf("pod → %s: %q, %v", target, got, err)
		}
	}

	eventually(t, 30*time.Second, "the dataplane synced and DNS answers web", func() (bool, string) {
		if !a.Stats().DataplaneSynced {
			return false, "dataplane not synced"
		}
		m, err := queryIn(pod, dnsServer, "web.default.svc.cluster.local.", dns.TypeA)
		if err != nil {
			return false, err.Error()
		}
		return slices.Contains(answerStrings(m), "A "+clusterIP), m.String()
	})
	eventually(t, 10*time.Second, "the headless and ExternalName Services are known", func() (bool, string) {
		m, err := queryIn(pod, dnsServer, "ext.default.svc.cluster.local.", dns.TypeCNAME)
		if err != nil {
			return false, err.Error()
		}
		return len(m.Answer) > 0, m.String()
	})

	t.Run("Online", func(t *testing.T) {
		checkDNS(t, true)
		checkConnect(t)
		start := time.Now()
		const n = 200
		for range n {
			if _, err := greet(net.JoinHostPort(clusterIP, "80")); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%d ClusterIP connections from the host: %v each", n, time.Since(start)/n)
		start = time.Now()
		for range n {
			if _, err := queryIn(pod, dnsServer, "web.default.svc.cluster.local.", dns.TypeA); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%d cluster DNS queries from the pod: %v each (including a netns switch per query)", n, time.Since(start)/n)
		noServiceRules(t, clusterIP)
	})

	t.Run("HubDown", func(t *testing.T) {
		e.hub.Stop()
		// The hub drains and then closes the agent's session with a close
		// frame before it exits: the agent knows at once, not after its
		// idle timeout (45 s) or its reconnect's handshake timeout.
		eventually(t, 10*time.Second, "the agent notices the hub is gone", func() (bool, string) {
			return !a.Stats().Connected, "connected"
		})
		checkDNS(t, true)
		checkConnect(t)
		s := a.Stats()
		t.Logf("agent: DNS queries %d (forwarded %d, SERVFAIL %d)", s.DNSQueries, s.DNSForwarded, s.DNSFailures)
	})

	t.Run("AgentStopped", func(t *testing.T) {
		a.stop(t)
		// The DNS server is gone with the agent...
		if m, err := queryIn(pod, dnsServer, "web.default.svc.cluster.local.", dns.TypeA); err == nil {
			t.Errorf("DNS still answers after the agent stopped: %v", m)
		}
		// ... the dataplane is not: pinned maps keep ClusterIPs working
		// until the next agent adopts them.
		checkConnect(t)
	})

	t.Run("RestartedOffline", func(t *testing.T) {
		// A new agent on the same data directory while the hub is still
		// down: it adopts the pinned dataplane, and its DNS server answers
		// from the Services and EndpointSlices of its local state.
		b := startAgent(t, cfg)
		eventually(t, 20*time.Second, "DNS answers from the local state", func() (bool, string) {
			m, err := queryIn(pod, dnsServer, "web.default.svc.cluster.local.", dns.TypeA)
			if err != nil {
				return false, err.Error()
			}
			return slices.Contains(answerStrings(m), "A "+clusterIP), m.String()
		})
		if b.Stats().Connected {
			t.Error("the agent says it is connected to a stopped hub")
		}
		checkDNS(t, true)
		checkConnect(t)
		b.stop(t)
	})
}

func ptr[T any](v T) *T { return &v }

// requireNetAdmin skips the test unless it runs as root with iproute2; CI
// runs it as root.
func requireNetAdmin(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, interfaces, cgroups and BPF programs")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func mustIP(t *testing.T, args ...string) {
	t.Helper()
	if err := runIP(args...); err != nil {
		t.Fatal(err)
	}
}

// testNetns is a named network namespace removed when the test ends.
type testNetns struct{ name string }

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	n := &testNetns{name: "tedge-" + hex.EncodeToString(randBytes(3))}
	mustIP(t, "netns", "add", n.name)
	t.Cleanup(func() { _ = runIP("netns", "del", n.name) })
	mustIP(t, "-n", n.name, "link", "set", "lo", "up")
	return n
}

// do runs fn on an OS thread inside the namespace; the thread is thrown
// away afterwards.
func (n *testNetns) do(fn func() error) error {
	h, err := netns.GetFromName(n.name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.name, err)
	}
	errc := make(chan error, 1)
	go func() {
		defer h.Close()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// serveGreeting answers every connection on addr, inside n, with "hello
// from <local address>\n".
func serveGreeting(t *testing.T, n *testNetns, addr netip.AddrPort) {
	t.Helper()
	var ln net.Listener
	if err := n.do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", n.name, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			la := c.LocalAddr().(*net.TCPAddr)
			fmt.Fprintf(c, "hello from %s\n", la.IP)
			c.Close()
		}
	}()
}

// greet dials addr and returns the greeting line.
func greet(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func queryIn(n *testNetns, server, name string, qtype uint16) (*dns.Msg, error) {
	var m *dns.Msg
	err := n.do(func() error {
		c := &dns.Client{Net: "udp", Timeout: time.Second}
		req := new(dns.Msg)
		req.SetQuestion(name, qtype)
		var err error
		m, _, err = c.Exchange(req, server)
		return err
	})
	return m, err
}

// answerStrings renders answers as "A 10.0.0.1", "SRV 80 target.",
// "CNAME target.".
func answerStrings(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, "A "+r.A.String())
		case *dns.AAAA:
			out = append(out, "AAAA "+r.AAAA.String())
		case *dns.SRV:
			out = append(out, fmt.Sprintf("SRV %d %s", r.Port, r.Target))
		case *dns.CNAME:
			out = append(out, "CNAME "+r.Target)
		default:
			out = append(out, rr.String())
		}
	}
	return out
}

// startUpstreamDNS serves www.example.test (A 192.0.2.80) and NXDOMAIN for
// every other name, on loopback.
func startUpstreamDNS(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		if strings.EqualFold(q.Name, "www.example.test.") {
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
					A: net.IPv4(192, 0, 2, 80)})
			}
		} else {
			m.Rcode = dns.RcodeNameError
			m.Ns = append(m.Ns, &dns.SOA{Hdr: dns.RR_Header{Name: "example.test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60},
				Ns: "ns.example.test.", Mbox: "hostmaster.example.test.", Serial: 1, Refresh: 60, Retry: 60, Expire: 60, Minttl: 30})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// cgroup2Root finds the cgroup v2 mount.
func cgroup2Root() (string, error) {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 mount")
}

// newTestCgroup creates an empty cgroup, removed when the test ends.
func newTestCgroup(t *testing.T) string {
	t.Helper()
	root, err := cgroup2Root()
	if err != nil {
		t.Fatalf("needs cgroup v2: %v", err)
	}
	dir := filepath.Join(root, "tether-edge-test-"+hex.EncodeToString(randBytes(3)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
	return dir
}

// joinTestCgroup moves the test process into dir and back when the test
// ends. Sockets belong to the cgroup they were created in.
func joinTestCgroup(t *testing.T, dir string) {
	t.Helper()
	root, _ := cgroup2Root()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	orig := ""
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			orig = rest
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		t.Fatalf("join cgroup %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(root, orig, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			t.Errorf("leave cgroup %s: %v", dir, err)
		}
	})
}

// testBPFFS returns a directory for the dataplane's pins in a bpffs: below
// /sys/fs/bpf when that is bpffs, else in a private bpffs mount; either is
// removed when the test ends.
func testBPFFS(t *testing.T) string {
	t.Helper()
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/bpf", &st) == nil && st.Type == unix.BPF_FS_MAGIC {
		dir := filepath.Join("/sys/fs/bpf", "tether-edge-test-"+hex.EncodeToString(randBytes(3)))
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	mnt, err := os.MkdirTemp("", "tether-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(mnt)
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		unix.Unmount(mnt, unix.MNT_DETACH)
		os.Remove(mnt)
	})
	return filepath.Join(mnt, "tether")
}

// noServiceRules checks that no iptables or nftables rule names the
// ClusterIP: Services are the dataplane's alone.
func noServiceRules(t *testing.T, clusterIP string) {
	t.Helper()
	for _, cmd := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}} {
		if _, err := exec.LookPath(cmd[0]); err != nil {
			t.Logf("%s not installed; not inspected", cmd[0])
			continue
		}
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		if err != nil {
			t.Logf("%s: %v", strings.Join(cmd, " "), err)
			continue
		}
		if strings.Contains(string(out), clusterIP) {
			t.Errorf("%s mentions the ClusterIP %s", strings.Join(cmd, " "), clusterIP)
		}
	}
}
