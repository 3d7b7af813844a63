package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestSocketLB exercises the socket-level load balancer with real sockets:
// a client namespace dials ClusterIPs whose backends live in a second
// namespace.
func TestSocketLB(t *testing.T) {
	l := newSockLab(t)
	serveTCP(t, l.be, 8080)
	serveTCP(t, l.be, 9100)

	web := service("web", "10.214.100.1",
		svcPort("http", corev1.ProtocolTCP, 80, intstr.FromString("web")),
		svcPort("metrics", corev1.ProtocolTCP, 9090, intstr.FromInt32(9100)))
	webPorts := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("metrics", corev1.ProtocolTCP, 9100)}
	all3 := epSlice("web-abc", "web", webPorts,
		readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-b"), readyEP(labBackends[2], "node-b"))
	l.dp.UpsertService(web)
	l.dp.UpsertEndpointSlice(all3)

	t.Run("Distribution", func(t *testing.T) {
		const n = 3000
		got := countBackends(t, dialN(l.cli, "10.214.100.1:80", n))
		t.Logf("3000 connections: %v", got)
		for _, b := range labBackends {
			// Expected 1000 each; 800 is more than 7 standard
			// deviations away.
			if got[b] < 800 {
				t.Errorf("backend %s got %d of %d connections: %v", b, got[b], n, got)
			}
		}
	})

	t.Run("PeerIsClusterIP", func(t *testing.T) {
		for _, r := range dialN(l.cli, "10.214.100.1:80", 20) {
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.peer != "10.214.100.1:80" {
				t.Fatalf("getpeername = %s, want the ClusterIP 10.214.100.1:80", r.peer)
			}
			if r.client != labClient {
				t.Fatalf("backend saw client %s, want %s (no SNAT at the socket layer)", r.client, labClient)
			}
		}
	})

	t.Run("ReverseTranslationTable", func(t *testing.T) {
		// A connected socket's translation is in lb_sk_rev: in its hot
		// entry (cookie & hot) when that is free, else in its warm entry
		// (cookie & warm), else in its entry of the whole table
		// (cookie & mask), those two counted in the hot entry, else in
		// socket-local storage; sock_release frees it with the socket.
		before, err := l.dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		mask := l.dp.objs.LbSkRev.MaxEntries() - 1
		hot, warm := min(mask+1, 1<<sockHotBits)-1, min(mask+1, 1<<sockWarmBits)-1
		entry := func(idx uint32) lbSkRev {
			var e lbSkRev
			if err := l.dp.objs.LbSkRev.Lookup(idx, &e); err != nil {
				t.Fatal(err)
			}
			return e
		}
		vip := netip.MustParseAddr("10.214.100.1")
		var fds []int
		var cookies []uint64
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
		// sharing opens sockets until one's cookie names the same
		// entries as the first socket's (cookies are handed out in
		// sequence, so some socket soon lands on them) and connects it.
		sharing := func() (int, uint64, error) {
			for range 400000 {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return -1, 0, err
				}
				ck, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
				if err != nil {
					unix.Close(fd)
					return -1, 0, err
				}
				if uint32(ck)&mask == uint32(cookies[0])&mask {
					return fd, ck, unix.Connect(fd, &unix.SockaddrInet4{Addr: vip.As4(), Port: 80})
				}
				unix.Close(fd)
			}
			return -1, 0, errors.New("no socket cookie landed on the first socket's entries")
		}
		// The first socket's entries, without the ones that coincide.
		var tiers []uint32
		err = l.cli.Do(func() error {
			fd, ck, err := connectRaw(vip, 80)
			if err != nil {
				return err
			}
			fds, cookies = append(fds, fd), append(cookies, ck)
			for _, idx := range []uint32{uint32(ck) & hot, uint32(ck) & warm, uint32(ck) & mask} {
				if !slices.Contains(tiers, idx) {
					tiers = append(tiers, idx)
				}
			}
			for len(fds) <= len(tiers) {
				fd, ck, err := sharing()
				if fd >= 0 {
					fds, cookies = append(fds, fd), append(cookies, ck)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// Socket i holds entry tiers[i]; the last one found them all
		// held.
		for i, idx := range tiers {
			e := entry(idx)
			if e.Cookie != cookies[i] || fromLbAddr(e.FeIp).Unmap() != vip || htons(e.FePort) != 80 {
				t.Fatalf("lb_sk_rev entry %d: %+v, want socket %d (cookie %d) and the ClusterIP", idx, e, i, cookies[i])
			}
		}
		if e := entry(tiers[0]); e.Spilled != uint32(len(tiers)-1) {
			t.Fatalf("hot entry %d counts %d claims beyond it, want %d", tiers[0], e.Spilled, len(tiers)-1)
		}
		for _, fd := range fds {
			sa, err := unix.Getpeername(fd)
			if err != nil {
				t.Fatal(err)
			}
			if in, ok := sa.(*unix.SockaddrInet4); !ok || netip.AddrFrom4(in.Addr) != vip || in.Port != 80 {
				t.Fatalf("getpeername = %+v, want the ClusterIP", sa)
			}
		}
		after, err := l.dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if got := after.SocketRevLocal - before.SocketRevLocal; got != 1 {
			t.Fatalf("%d translations went to socket-local storage, want 1", got)
		}
		// All but the first close, newest first.
		for i := len(fds) - 1; i > 0; i-- {
			unix.Close(fds[i])
		}
		fds = fds[:1]
		for _, idx := range tiers[1:] {
			if e := entry(idx); e.Cookie != 0 {
				t.Fatalf("entry %d still held after its socket closed: %+v", idx, e)
			}
		}
		if e := entry(tiers[0]); e.Cookie != cookies[0] || e.Spilled != 0 {
			t.Fatalf("hot entry %d after the other sockets closed: %+v, want the first socket's, counting nothing", tiers[0], e)
		}
		unix.Close(fds[0])
		fds = nil
		if e := entry(tiers[0]); e.Cookie != 0 {
			t.Fatalf("entry still held after close: %+v", e)
		}
		t.Logf("cookies %v share entries %v: the last socket's translation went to socket-local storage", cookies, tiers)
	})

	t.Run("NamedAndMultiPort", func(t *testing.T) {
		// metrics: port 9090 → targetPort 9100; the greeting shows the
		// backend answered, and the port is checked through a second
		// listener-only port.
		got := countBackends(t, dialN(l.cli, "10.214.100.1:9090", 30))
		if len(got) == 0 {
			t.Fatal("no connection on the second port")
		}
		// http: targetPort by name resolved through the slice's port.
		rs := dialN(l.cli, "10.214.100.1:80", 5)
		countBackends(t, rs)
		// A port the Service does not have is not a frontend.
		err := l.cli.Do(func() error {
			_, err := net.DialTimeout("tcp", "10.214.100.1:81", 300*time.Millisecond)
			return err
		})
		if err == nil {
			t.Fatal("dial to a port the Service lacks succeeded")
		}
	})

	t.Run("ConntrackFree", func(t *testing.T) {
		before := map[string]int{}
		for _, ns := range []*struct {
			name string
			n    func() (int, error)
		}{{"client", func() (int, error) { return conntrackCount(l.cli) }}, {"backend", func() (int, error) { return conntrackCount(l.be) }}} {
			v, err := ns.n()
			if err != nil {
				t.Fatal(err)
			}
			before[ns.name] = v
		}
		countBackends(t, dialN(l.cli, "10.214.100.1:80", 300))
		c1, err := conntrackCount(l.cli)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := conntrackCount(l.be)
		if err != nil {
			t.Fatal(err)
		}
		if c1 != before["client"] || c2 != before["backend"] {
			t.Fatalf("conntrack grew: client %d→%d, backend %d→%d", before["client"], c1, before["backend"], c2)
		}
		t.Logf("nf_conntrack_count unchanged over 300 connections: client %d, backend %d", c1, c2)
	})

	t.Run("RemoveBackendWithin100ms", func(t *testing.T) {
		two := epSlice("web-abc", "web", webPorts,
			readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-b"))
		start := time.Now()
		l.dp.UpsertEndpointSlice(two)
		took := time.Since(start)
		if took > 100*time.Millisecond {
			t.Fatalf("removing a backend took %v", took)
		}
		got := countBackends(t, dialN(l.cli, "10.214.100.1:80", 300))
		if got[labBackends[2]] != 0 {
			t.Fatalf("removed backend still got %d connections", got[labBackends[2]])
		}
		t.Logf("backend removed in %v; next 300 connections: %v", took, got)
		l.dp.UpsertEndpointSlice(all3)
	})

	t.Run("NoEndpointsRefuses", func(t *testing.T) {
		l.dp.UpsertService(service("empty", "10.214.100.20", svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))))
		start := time.Now()
		r := dialN(l.cli, "10.214.100.20:80", 1)[0]
		took := time.Since(start)
		if r.err == nil {
			t.Fatal("connection to a Service without endpoints succeeded")
		}
		want := syscall.ECONNREFUSED
		if !haveSetRetval() {
			want = syscall.EPERM
		}
		if !errors.Is(r.err, want) || took > 100*time.Millisecond {
			t.Fatalf("got %v after %v, want %v at once", r.err, took, want)
		}
		// UDP: sendto fails the same way instead of vanishing.
		err := l.cli.Do(func() error {
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer c.Close()
			l.dp.UpsertService(service("empty-udp", "10.214.100.21", svcPort("", corev1.ProtocolUDP, 53, intstr.FromInt32(53))))
			_, err = c.WriteToUDP([]byte("x"), &net.UDPAddr{IP: net.ParseIP("10.214.100.21"), Port: 53})
			return err
		})
		if !errors.Is(err, want) {
			t.Fatalf("UDP send to empty Service: %v, want %v", err, want)
		}
	})

	t.Run("TerminatingFallback", func(t *testing.T) {
		l.dp.UpsertService(service("drain", "10.214.100.22", svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))))
		l.dp.UpsertEndpointSlice(epSlice("drain-1", "drain",
			[]discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 8080)},
			terminatingEP(labBackends[1], "node-b")))
		got := countBackends(t, dialN(l.cli, "10.214.100.22:80", 10))
		if got[labBackends[1]] != 10 {
			t.Fatalf("terminating-but-serving endpoint not used as fallback: %v", got)
		}
		// A ready endpoint takes over from the terminating one.
		l.dp.UpsertEndpointSlice(epSlice("drain-1", "drain",
			[]discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 8080)},
			terminatingEP(labBackends[1], "node-b"), readyEP(labBackends[0], "node-a")))
		got = countBackends(t, dialN(l.cli, "10.214.100.22:80", 20))
		if got[labBackends[0]] != 20 {
			t.Fatalf("ready endpoint must win over terminating: %v", got)
		}
	})

	t.Run("InternalTrafficPolicyLocal", func(t *testing.T) {
		s := service("local", "10.214.100.23", svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		l.dp.UpsertService(s)
		l.dp.UpsertEndpointSlice(epSlice("local-1", "local",
			[]discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 8080)},
			readyEP(labBackends[0], "node-b"), readyEP(labBackends[1], "node-a"), readyEP(labBackends[2], "node-b")))
		got := countBackends(t, dialN(l.cli, "10.214.100.23:80", 50))
		if got[labBackends[1]] != 50 {
			t.Fatalf("internalTrafficPolicy Local must use the node-local endpoint only: %v", got)
		}
	})

	t.Run("SelectorlessAndHeadlessAndExternalName", func(t *testing.T) {
		// Without a selector the user's slice is what counts.
		s := service("manual", "10.214.100.24", svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		s.Spec.Selector = nil
		l.dp.UpsertService(s)
		l.dp.UpsertEndpointSlice(epSlice("manual-x", "manual",
			[]discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 9100)}, readyEP(labBackends[2], "")))
		got := countBackends(t, dialN(l.cli, "10.214.100.24:80", 5))
		if got[labBackends[2]] != 5 {
			t.Fatalf("selectorless Service: %v", got)
		}
		before := l.dp.frontendCount()
		h := service("headless", "None", svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		l.dp.UpsertService(h)
		en := &corev1.Service{}
		en.Namespace, en.Name = "default", "ext"
		en.Spec.Type = corev1.ServiceTypeExternalName
		en.Spec.ExternalName = "example.org"
		l.dp.UpsertService(en)
		if after := l.dp.frontendCount(); after != before {
			t.Fatalf("headless/ExternalName Services programmed frontends: %d → %d", before, after)
		}
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		s := service("sticky", "10.214.100.25", svcPort("", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(1))}}
		l.dp.UpsertService(s)
		l.dp.UpsertEndpointSlice(epSlice("sticky-1", "sticky",
			[]discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 8080)},
			readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-a"), readyEP(labBackends[2], "node-a")))
		got := countBackends(t, dialN(l.cli, "10.214.100.25:80", 100))
		if len(got) != 1 {
			t.Fatalf("affinity broken within the timeout: %v", got)
		}
		var first string
		for b := range got {
			first = b
		}
		// Another client (namespace) has its own affinity.
		other := countBackends(t, dialN(l.be, "10.214.100.25:80", 50))
		if len(other) != 1 {
			t.Fatalf("second client's affinity broken: %v", other)
		}
		// After the timeout the choice is free again: within a few
		// rounds a different backend must come up (1/3 chance each).
		for round := 0; round < 10; round++ {
			time.Sleep(1200 * time.Millisecond)
			r := dialN(l.cli, "10.214.100.25:80", 1)[0]
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.backend != first {
				t.Logf("affinity expired after round %d: %s → %s", round+1, first, r.backend)
				return
			}
		}
		t.Fatal("affinity never expired")
	})

	t.Run("UDPDNSToClusterIP", func(t *testing.T) {
		// A DNS server behind a ClusterIP on another port.
		var pc net.PacketConn
		err := l.be.Do(func() error {
			var err error
			pc, err = net.ListenPacket("udp4", labBackends[0]+":5353")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			rr, _ := dns.NewRR(r.Question[0].Name + " 5 IN A 10.214.7.7")
			m.Answer = append(m.Answer, rr)
			w.WriteMsg(m)
		})}
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
		l.dp.UpsertService(service("kube-dns", "10.214.100.10",
			svcPort("dns", corev1.ProtocolUDP, 53, intstr.FromString("dns")),
			svcPort("dns-tcp", corev1.ProtocolTCP, 53, intstr.FromString("dns-tcp"))))
		l.dp.UpsertEndpointSlice(epSlice("kube-dns-1", "kube-dns",
			[]discoveryv1.EndpointPort{epPort("dns", corev1.ProtocolUDP, 5353), epPort("dns-tcp", corev1.ProtocolTCP, 5353)},
			readyEP(labBackends[0], "node-a")))

		err = l.cli.Do(func() error {
			// Connected UDP (connect4 + getpeername4).
			c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
			q := new(dns.Msg)
			q.SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
			r, _, err := c.Exchange(q, "10.214.100.10:53")
			if err != nil {
				return err
			}
			if len(r.Answer) != 1 {
				return errors.New("no answer over connected UDP")
			}
			// Unconnected UDP (sendmsg4 + recvmsg4): the reply must
			// appear to come from the ClusterIP.
			u, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer u.Close()
			b, _ := q.Pack()
			if _, err := u.WriteToUDP(b, &net.UDPAddr{IP: net.ParseIP("10.214.100.10"), Port: 53}); err != nil {
				return err
			}
			u.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 1500)
			n, from, err := u.ReadFromUDPAddrPort(buf)
			if err != nil {
				return err
			}
			if from != netip.MustParseAddrPort("10.214.100.10:53") {
				return errors.New("reply came from " + from.String() + ", want the ClusterIP")
			}
			m := new(dns.Msg)
			if err := m.Unpack(buf[:n]); err != nil || len(m.Answer) != 1 {
				return errors.New("bad reply over unconnected UDP")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("UDPOneSocketSeveralServices", func(t *testing.T) {
		// A resolver-like socket: unconnected, talking to two Services
		// whose backends differ; each reply must show its own ClusterIP.
		// Then the same socket connects to one of them.
		for _, b := range labBackends[1:] {
			var pc net.PacketConn
			err := l.be.Do(func() error {
				var err error
				pc, err = net.ListenPacket("udp4", b+":7007")
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 64)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo(buf[:n], from)
				}
			}()
		}
		ports := []discoveryv1.EndpointPort{epPort("", corev1.ProtocolUDP, 7007)}
		vips := map[string]string{"10.214.100.30": labBackends[1], "10.214.100.31": labBackends[2]}
		for vip, be := range vips {
			name := "echo-" + vip[len(vip)-2:]
			l.dp.UpsertService(service(name, vip, svcPort("", corev1.ProtocolUDP, 7, intstr.FromInt32(7007))))
			l.dp.UpsertEndpointSlice(epSlice(name+"-1", name, ports, readyEP(be, "node-a")))
		}
		err := l.cli.Do(func() error {
			u, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer u.Close()
			buf := make([]byte, 64)
			for round := range 3 {
				for vip := range vips {
					to := netip.MustParseAddrPort(vip + ":7")
					if _, err := u.WriteToUDPAddrPort([]byte(vip), to); err != nil {
						return err
					}
					u.SetReadDeadline(time.Now().Add(2 * time.Second))
					n, from, err := u.ReadFromUDPAddrPort(buf)
					if err != nil {
						return err
					}
					if from != to || string(buf[:n]) != vip {
						return fmt.Errorf("round %d: reply %q from %s, want %q from %s", round, buf[:n], from, vip, to)
					}
				}
			}
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.214.100.31:7")))
			if err != nil {
				return err
			}
			defer c.Close()
			if got := c.RemoteAddr().String(); got != "10.214.100.31:7" {
				return fmt.Errorf("connected UDP getpeername = %s", got)
			}
			if _, err := c.Write([]byte("c")); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return err
			}
			if from.String() != "10.214.100.31:7" || string(buf[:n]) != "c" {
				return fmt.Errorf("connected UDP reply %q from %s", buf[:n], from)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NodePortBindProtected", func(t *testing.T) {
		s := service("np", "10.214.100.26", corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30111, TargetPort: intstr.FromInt32(8080)})
		s.Spec.Type = corev1.ServiceTypeNodePort
		l.dp.UpsertService(s)
		err := l.cli.Do(func() error {
			ln, err := net.Listen("tcp4", ":30111")
			if err == nil {
				ln.Close()
			}
			return err
		})
		want := syscall.EADDRINUSE
		if !haveSetRetval() {
			want = syscall.EPERM
		}
		if !errors.Is(err, want) {
			t.Fatalf("bind to a NodePort in the node namespace: %v, want %v", err, want)
		}
		// Other namespaces (pods) may use the port.
		err = l.be.Do(func() error {
			ln, err := net.Listen("tcp4", ":30111")
			if err == nil {
				ln.Close()
			}
			return err
		})
		if err != nil {
			t.Fatalf("bind in a pod namespace: %v", err)
		}
	})

	st, err := l.dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	_ = context.Background
}

// connectRaw connects a TCP socket to ip:port from the calling thread and
// returns it with its cookie.
func connectRaw(ip netip.Addr, port int) (int, uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: ip.As4(), Port: port}); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, c, nil
}
