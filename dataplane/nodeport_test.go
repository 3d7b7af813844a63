package dataplane

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// npLab is a small site on one L2 segment (a bridge in its own namespace):
// a client, the node under test (uplink up0, plus a pod behind a veth) and
// another node running a backend.
//
//	client 10.214.1.10 ─┐
//	node   10.214.1.1  ─┼─ br0 (lan)      node ── pod0 10.214.3.1 ── pod 10.214.3.2
//	remote 10.214.1.20 ─┘
type npLab struct {
	client, node, remote, pod, lan *testnet.Netns
	dp                             *Dataplane
	cfg                            Config
}

const (
	npNodeIP   = "10.214.1.1"
	npClientIP = "10.214.1.10"
	npRemoteIP = "10.214.1.20"
	npPodIP    = "10.214.3.2"
	npPodGW    = "10.214.3.1" // the node's end of the pod's veth
	npExtIP    = "10.214.1.100"
)

func newNPLab(t *testing.T, tcMode string) *npLab {
	testnet.RequireRoot(t)
	l := &npLab{}
	l.lan = testnet.NewNetns(t, "lan")
	l.client = testnet.NewNetns(t, "npc")
	l.node = testnet.NewNetns(t, "node")
	l.remote = testnet.NewNetns(t, "rem")
	l.pod = testnet.NewNetns(t, "pod")
	testnet.MustIP(t, "-n", l.lan.Name, "link", "add", "br0", "type", "bridge")
	testnet.MustIP(t, "-n", l.lan.Name, "link", "set", "br0", "up")
	for _, m := range []struct {
		ns   *testnet.Netns
		dev  string
		addr string
		port string
	}{{l.client, "eth0", npClientIP + "/24", "lc"}, {l.node, "up0", npNodeIP + "/24", "ln"}, {l.remote, "eth0", npRemoteIP + "/24", "lr"}} {
		testnet.Veth(t, m.ns, m.dev, []string{m.addr}, l.lan, m.port, nil)
		testnet.MustIP(t, "-n", l.lan.Name, "link", "set", m.port, "master", "br0")
	}
	testnet.Veth(t, l.node, "pod0", []string{npPodGW + "/24"}, l.pod, "eth0", []string{npPodIP + "/24"})
	testnet.MustIP(t, "-n", l.pod.Name, "route", "add", "default", "via", npPodGW)
	testnet.MustIP(t, "-n", l.client.Name, "route", "add", npExtIP+"/32", "via", npNodeIP)
	// Forwarding on in the node's namespace only: it routes to its pods.
	l.node.Sysctl(t, "net.ipv4.ip_forward", "1")

	l.cfg = Config{
		CgroupPath: testnet.NewCgroup(t),
		BPFFSPath:  testnet.BPFFSDir(t),
		NodeName:   "node-a",
		// The pods' gateway is a node address too: NodePorts answer
		// the node's own sockets on it. The IPv6 address is put on
		// up0 by the tests that use it.
		NodeIPs:   []netip.Addr{netip.MustParseAddr(npNodeIP), netip.MustParseAddr(npPodGW), netip.MustParseAddr(npNodeIP6)},
		Uplinks:   []string{"up0"},
		NetnsPath: l.node.Path(),
		TCAttach:  tcMode,
		Logger:    testLogger(t),
	}
	dp, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l.dp = dp
	t.Cleanup(func() {
		if err := l.dp.Uninstall(); err != nil {
			t.Errorf("Uninstall: %v", err)
		}
	})
	if err := dp.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	serveTCP(t, l.remote, 8080)
	serveTCP(t, l.pod, 8080)

	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("udp", corev1.ProtocolUDP, 8053)}
	np := func(name, ip string, nodePort, udpNodePort int32) *corev1.Service {
		s := service(name, ip,
			corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: nodePort, TargetPort: intstr.FromString("http")},
			corev1.ServicePort{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: udpNodePort, TargetPort: intstr.FromString("udp")})
		s.Spec.Type = corev1.ServiceTypeNodePort
		return s
	}
	cluster := np("np-cluster", "10.214.101.1", 30080, 30053)
	cluster.Spec.ExternalIPs = []string{npExtIP}
	dp.UpsertService(cluster)
	dp.UpsertEndpointSlice(epSlice("np-cluster-1", "np-cluster", ports, readyEP(npRemoteIP, "node-b")))

	local := np("np-local", "10.214.101.2", 30081, 30054)
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	dp.UpsertService(local)
	dp.UpsertEndpointSlice(epSlice("np-local-1", "np-local", ports, readyEP(npPodIP, "node-a"), readyEP(npRemoteIP, "node-b")))

	dp.UpsertService(np("np-empty", "10.214.101.3", 30082, 30055))

	nolocal := np("np-nolocal", "10.214.101.4", 30083, 30056)
	nolocal.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	dp.UpsertService(nolocal)
	dp.UpsertEndpointSlice(epSlice("np-nolocal-1", "np-nolocal", ports, readyEP(npRemoteIP, "node-b")))
	return l
}

func TestNodePort(t *testing.T) {
	for _, mode := range []string{"tcx", "clsact"} {
		t.Run(mode, func(t *testing.T) {
			l := newNPLab(t, mode)
			if got := l.dp.tcMode(); got != mode {
				t.Fatalf("attached with %s, want %s", got, mode)
			}
			serveUDPEcho(t, l.remote, npRemoteIP+":8053")

			t.Run("ClusterPolicyToRemoteBackend", func(t *testing.T) {
				for _, r := range dialN(l.client, npNodeIP+":30080", 20) {
					if r.err != nil {
						t.Fatal(r.err)
					}
					if r.backend != npRemoteIP || r.client != npNodeIP || r.peer != npNodeIP+":30080" {
						t.Fatalf("got backend %s, backend saw %s, client saw %s; want %s behind SNAT to %s", r.backend, r.client, r.peer, npRemoteIP, npNodeIP)
					}
				}
			})
			t.Run("ExternalIP", func(t *testing.T) {
				r := dialN(l.client, npExtIP+":80", 1)[0]
				if r.err != nil || r.backend != npRemoteIP || r.peer != npExtIP+":80" {
					t.Fatalf("externalIP: %+v", r)
				}
			})
			t.Run("LocalPolicyKeepsClientIP", func(t *testing.T) {
				for _, r := range dialN(l.client, npNodeIP+":30081", 20) {
					if r.err != nil {
						t.Fatal(r.err)
					}
					if r.backend != npPodIP || r.client != npClientIP || r.peer != npNodeIP+":30081" {
						t.Fatalf("got backend %s, backend saw client %s, client saw %s; want local pod seeing %s", r.backend, r.client, r.peer, npClientIP)
					}
				}
			})
			t.Run("UDP", func(t *testing.T) {
				err := l.client.Do(func() error {
					c, err := net.Dial("udp4", npNodeIP+":30053")
					if err != nil {
						return err
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(2 * time.Second))
					if _, err := c.Write([]byte("ping")); err != nil {
						return err
					}
					buf := make([]byte, 64)
					n, err := c.Read(buf)
					if err != nil {
						return err
					}
					if string(buf[:n]) != "ping from "+npNodeIP {
						return errors.New("unexpected UDP reply " + string(buf[:n]))
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
			t.Run("NoEndpointsRefuses", func(t *testing.T) {
				start := time.Now()
				r := dialN(l.client, npNodeIP+":30082", 1)[0]
				if !errors.Is(r.err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
					t.Fatalf("got %v after %v, want connection refused at once", r.err, time.Since(start))
				}
			})
			t.Run("LocalPolicyWithoutLocalEndpointDrops", func(t *testing.T) {
				err := l.client.Do(func() error {
					_, err := net.DialTimeout("tcp", npNodeIP+":30083", 300*time.Millisecond)
					return err
				})
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Fatalf("got %v, want a timeout (dropped, not refused)", err)
				}
			})
			st, _ := l.dp.Stats()
			t.Logf("stats: %+v", st)
		})
	}
}

func serveUDPEcho(t testing.TB, ns *testnet.Netns, addr string) {
	var pc net.PacketConn
	if err := ns.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			ip := from.(*net.UDPAddr).IP.String()
			pc.WriteTo(append(buf[:n:n], []byte(" from "+ip)...), from)
		}
	}()
}

// Packet crafting for the BPF_PROG_RUN tests.

type pkt struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8
	flags        uint8 // TCP flags
	seq, ack     uint32
}

func csum16(b []byte, sum uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func l4sum(src, dst netip.Addr, proto uint8, l4 []byte) uint16 {
	s4, d4 := src.As4(), dst.As4()
	ph := append(append(s4[:], d4[:]...), 0, proto, byte(len(l4)>>8), byte(len(l4)))
	return fold(csum16(l4, csum16(ph, 0)))
}

func (p pkt) bytes() []byte {
	var l4 []byte
	if p.proto == protoTCP {
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint32(l4[4:], p.seq)
		binary.BigEndian.PutUint32(l4[8:], p.ack)
		l4[12] = 5 << 4
		l4[13] = p.flags
		binary.BigEndian.PutUint16(l4[14:], 65535)
	} else {
		l4 = make([]byte, 8+4)
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
		copy(l4[8:], "ping")
	}
	binary.BigEndian.PutUint16(l4[0:], p.sport)
	binary.BigEndian.PutUint16(l4[2:], p.dport)
	ck := l4sum(p.src, p.dst, p.proto, l4)
	if p.proto == protoTCP {
		binary.BigEndian.PutUint16(l4[16:], ck)
	} else {
		binary.BigEndian.PutUint16(l4[6:], ck)
	}
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	ip[8] = 64
	ip[9] = p.proto
	s4, d4 := p.src.As4(), p.dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], fold(csum16(ip, 0)))
	eth := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00}
	return append(append(eth, ip...), l4...)
}

// parsePkt decodes an Ethernet/IPv4 packet and verifies both checksums.
func parsePkt(t *testing.T, b []byte) pkt {
	t.Helper()
	if len(b) < 34 {
		t.Fatalf("short packet: %d bytes", len(b))
	}
	ip := b[14:34]
	if fold(csum16(ip, 0)) != 0 {
		t.Fatalf("bad IP checksum")
	}
	p := pkt{
		src:   netip.AddrFrom4([4]byte(ip[12:16])),
		dst:   netip.AddrFrom4([4]byte(ip[16:20])),
		proto: ip[9],
	}
	l4 := b[34 : 14+int(binary.BigEndian.Uint16(ip[2:]))]
	p.sport = binary.BigEndian.Uint16(l4[0:])
	p.dport = binary.BigEndian.Uint16(l4[2:])
	if p.proto == protoTCP {
		p.seq = binary.BigEndian.Uint32(l4[4:])
		p.ack = binary.BigEndian.Uint32(l4[8:])
		p.flags = l4[13]
	}
	s4, d4 := p.src.As4(), p.dst.As4()
	ph := append(append(s4[:], d4[:]...), 0, p.proto, byte(len(l4)>>8), byte(len(l4)))
	if fold(csum16(l4, csum16(ph, 0))) != 0 {
		t.Fatalf("bad L4 checksum in %+v", p)
	}
	return p
}

const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

// TestNodePortPrograms runs the tc programs on crafted packets with
// BPF_PROG_RUN: DNAT, SNAT, the reverse paths and the reset for a frontend
// without backends. The programs run inside the lab's node namespace so the
// FIB lookups see its routes.
func TestNodePortPrograms(t *testing.T) {
	l := newNPLab(t, "")
	ingress, egress := l.dp.objs.NodeportIngress, l.dp.objs.NodeportEgress
	node, client, remote, podIP := netip.MustParseAddr(npNodeIP), netip.MustParseAddr(npClientIP), netip.MustParseAddr(npRemoteIP), netip.MustParseAddr(npPodIP)
	run := func(prog interface {
		Test([]byte) (uint32, []byte, error)
	}, in pkt) (uint32, pkt) {
		t.Helper()
		var rc uint32
		var out []byte
		err := l.node.Do(func() error {
			var err error
			rc, out, err = prog.Test(in.bytes())
			return err
		})
		if err != nil {
			t.Fatalf("run program: %v", err)
		}
		if rc == tcActShot {
			return rc, pkt{}
		}
		return rc, parsePkt(t, out)
	}
	const syn, ack, rst = 0x02, 0x10, 0x04

	t.Run("SNATToRemoteAndBack", func(t *testing.T) {
		rc, out := run(ingress, pkt{src: client, dst: node, sport: 40000, dport: 30080, proto: protoTCP, flags: syn, seq: 100})
		if rc != tcActRedirect {
			t.Fatalf("verdict %d, want redirect", rc)
		}
		if out.dst != remote || out.dport != 8080 || out.src != node || out.sport < defaultSNATMin {
			t.Fatalf("forward packet %+v: want %s:%d → %s:8080 from an SNAT port", out, node, out.sport, remote)
		}
		snatPort := out.sport
		// The same flow keeps its translation.
		_, again := run(ingress, pkt{src: client, dst: node, sport: 40000, dport: 30080, proto: protoTCP, flags: ack, seq: 101})
		if again.sport != snatPort || again.dst != remote {
			t.Fatalf("flow lost its translation: %+v", again)
		}
		// The backend's reply is turned back towards the client.
		rc, back := run(ingress, pkt{src: remote, dst: node, sport: 8080, dport: snatPort, proto: protoTCP, flags: syn | ack, seq: 7, ack: 101})
		if rc != tcActRedirect {
			t.Fatalf("reply verdict %d, want redirect", rc)
		}
		if back.src != node || back.sport != 30080 || back.dst != client || back.dport != 40000 {
			t.Fatalf("reply %+v, want %s:30080 → %s:40000", back, node, client)
		}
	})
	t.Run("UDPSNAT", func(t *testing.T) {
		rc, out := run(ingress, pkt{src: client, dst: node, sport: 40001, dport: 30053, proto: protoUDP})
		if rc != tcActRedirect || out.dst != remote || out.dport != 8053 || out.src != node {
			t.Fatalf("verdict %d packet %+v", rc, out)
		}
		_, back := run(ingress, pkt{src: remote, dst: node, sport: 8053, dport: out.sport, proto: protoUDP})
		if back.src != node || back.sport != 30053 || back.dst != client || back.dport != 40001 {
			t.Fatalf("UDP reply %+v", back)
		}
	})
	t.Run("DNATToLocalAndBack", func(t *testing.T) {
		rc, out := run(ingress, pkt{src: client, dst: node, sport: 40002, dport: 30081, proto: protoTCP, flags: syn})
		if rc != tcActOK {
			t.Fatalf("verdict %d, want pass to the stack", rc)
		}
		if out.src != client || out.sport != 40002 || out.dst != podIP || out.dport != 8080 {
			t.Fatalf("DNAT packet %+v, want %s:40002 → %s:8080", out, client, podIP)
		}
		rc, back := run(egress, pkt{src: podIP, dst: client, sport: 8080, dport: 40002, proto: protoTCP, flags: syn | ack})
		if rc != tcActOK || back.src != node || back.sport != 30081 || back.dst != client || back.dport != 40002 {
			t.Fatalf("egress verdict %d packet %+v, want %s:30081 → %s:40002", rc, back, node, client)
		}
	})
	t.Run("ResetWithoutBackends", func(t *testing.T) {
		rc, out := run(ingress, pkt{src: client, dst: node, sport: 40003, dport: 30082, proto: protoTCP, flags: syn, seq: 1000})
		if rc != tcActRedirect {
			t.Fatalf("verdict %d, want the reset sent back", rc)
		}
		if out.flags&rst == 0 || out.src != node || out.sport != 30082 || out.dst != client || out.dport != 40003 || out.ack != 1001 {
			t.Fatalf("reset %+v", out)
		}
	})
	t.Run("UnrelatedTrafficPasses", func(t *testing.T) {
		rc, out := run(ingress, pkt{src: client, dst: node, sport: 40004, dport: 22, proto: protoTCP, flags: syn})
		if rc != tcActOK || out.dport != 22 || out.dst != node {
			t.Fatalf("verdict %d packet %+v", rc, out)
		}
		rc, _ = run(egress, pkt{src: node, dst: client, sport: 22, dport: 40004, proto: protoTCP, flags: syn | ack})
		if rc != tcActOK {
			t.Fatalf("egress verdict %d", rc)
		}
	})
	t.Run("LocalPolicyWithoutLocalDrops", func(t *testing.T) {
		rc, _ := run(ingress, pkt{src: client, dst: node, sport: 40005, dport: 30083, proto: protoTCP, flags: syn})
		if rc != tcActShot {
			t.Fatalf("verdict %d, want drop", rc)
		}
	})
}
