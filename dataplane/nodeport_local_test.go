package dataplane

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// More backends for the NodePort lab: a second one on the other node and
// a second address of the pod on this node.
const (
	npRemoteIP2 = "10.214.1.21"
	npPodIP2    = "10.214.3.3"
	npNodeIP6   = "fd00:214:1::1"
	npRemoteIP6 = "fd00:214:1::20"
)

// TestNodePortFromNode dials NodePorts on the node's addresses from the
// node's own network namespace and cgroup (a host process) and from a
// pod's (its namespace, a cgroup below the node's): the socket programs
// balance them as kube-proxy's rules would, since such connections never
// cross the uplink where the tc programs wait.
func TestNodePortFromNode(t *testing.T) {
	l := newNPLab(t, "")
	testnet.MustIP(t, "-n", l.remote.Name, "addr", "add", npRemoteIP2+"/24", "dev", "eth0")
	testnet.MustIP(t, "-n", l.pod.Name, "addr", "add", npPodIP2+"/24", "dev", "eth0")
	testnet.MustIP(t, "-n", l.node.Name, "addr", "add", npNodeIP6+"/64", "dev", "up0", "nodad")
	testnet.MustIP(t, "-n", l.remote.Name, "addr", "add", npRemoteIP6+"/64", "dev", "eth0", "nodad")
	// Pod addresses are routed to their node, as a site's routes do.
	testnet.MustIP(t, "-n", l.remote.Name, "route", "add", "10.214.3.0/24", "via", npNodeIP)
	for _, b := range []struct {
		ns *testnet.Netns
		ip string
	}{{l.remote, npRemoteIP}, {l.remote, npRemoteIP2}, {l.pod, npPodIP}, {l.pod, npPodIP2}} {
		serveUDPBackend(t, b.ns, b.ip+":8054")
	}

	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("udp", corev1.ProtocolUDP, 8054)}
	np := func(name, ip string, nodePort int32, policy corev1.ServiceExternalTrafficPolicy, eps ...discoveryv1.Endpoint) {
		s := service(name, ip,
			corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: nodePort, TargetPort: intstr.FromString("http")},
			corev1.ServicePort{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: nodePort + 1, TargetPort: intstr.FromString("udp")})
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = policy
		l.dp.UpsertService(s)
		l.dp.UpsertEndpointSlice(epSlice(name+"-1", name, ports, eps...))
	}
	np("fn-cluster", "10.214.101.10", 30090, corev1.ServiceExternalTrafficPolicyCluster,
		readyEP(npRemoteIP, "node-b"), readyEP(npRemoteIP2, "node-b"), readyEP(npPodIP, "node-a"))
	np("fn-local", "10.214.101.11", 30092, corev1.ServiceExternalTrafficPolicyLocal,
		readyEP(npRemoteIP, "node-b"), readyEP(npPodIP, "node-a"), readyEP(npPodIP2, "node-a"))
	np("fn-nolocal", "10.214.101.12", 30094, corev1.ServiceExternalTrafficPolicyLocal,
		readyEP(npRemoteIP, "node-b"), readyEP(npRemoteIP2, "node-b"))

	v6 := service("fn-v6", "10.214.101.13", corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30096, TargetPort: intstr.FromString("http")})
	v6.Spec.ClusterIPs = []string{"10.214.101.13", "fd00:214:101::13"}
	v6.Spec.Type = corev1.ServiceTypeNodePort
	l.dp.UpsertService(v6)
	v6eps := epSlice("fn-v6-1", "fn-v6", ports[:1], readyEP(npRemoteIP6, "node-b"))
	v6eps.AddressType = discoveryv1.AddressTypeIPv6
	l.dp.UpsertEndpointSlice(v6eps)

	// The node's processes live in the dataplane's cgroup, the pod's in
	// one below it. Sockets take the cgroup of the process that creates
	// them.
	podCg := filepath.Join(l.cfg.CgroupPath, "pod")
	if err := os.Mkdir(podCg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(podCg) })
	testnet.JoinCgroup(t, l.cfg.CgroupPath)
	refused := syscall.ECONNREFUSED
	if !haveSetRetval() {
		refused = syscall.EPERM
	}

	for _, c := range []struct {
		name   string
		ns     *testnet.Netns
		cgroup string
	}{{"Host", l.node, l.cfg.CgroupPath}, {"Pod", l.pod, podCg}} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(c.cgroup, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
				t.Fatal(err)
			}
			// client checks what a backend saw as the client: the pod's
			// own address, untranslated; a node address for the host.
			client := func(r dialResult) bool {
				if c.ns == l.pod {
					return r.client == npPodIP || r.client == npPodIP2
				}
				return r.client == npNodeIP || r.client == npPodGW
			}
			for _, node := range []string{npNodeIP, npPodGW} {
				t.Run("ClusterPolicyOn"+node, func(t *testing.T) {
					const n = 300
					addr := node + ":30090"
					got := map[string]int{}
					for _, r := range dialN(c.ns, addr, n) {
						if r.err != nil {
							t.Fatal(r.err)
						}
						if r.peer != addr || !client(r) {
							t.Fatalf("backend %s saw client %s, client saw peer %s; want peer %s and no SNAT", r.backend, r.client, r.peer, addr)
						}
						got[r.backend]++
					}
					t.Logf("%d connections to %s: %v", n, addr, got)
					// 100 expected each; 50 is six standard
					// deviations away.
					for _, b := range []string{npRemoteIP, npRemoteIP2, npPodIP} {
						if got[b] < 50 {
							t.Errorf("backend %s got %d of %d connections: %v", b, got[b], n, got)
						}
					}
				})
			}
			t.Run("LocalPolicyLocalBackendsOnly", func(t *testing.T) {
				const n = 200
				got := countBackends(t, dialN(c.ns, npNodeIP+":30092", n))
				t.Logf("%d connections: %v", n, got)
				if got[npRemoteIP] != 0 || got[npPodIP] < 50 || got[npPodIP2] < 50 {
					t.Fatalf("externalTrafficPolicy Local: %v, want both local backends and never %s", got, npRemoteIP)
				}
			})
			t.Run("LocalPolicyWithoutLocalBackendFails", func(t *testing.T) {
				start := time.Now()
				r := dialN(c.ns, npNodeIP+":30094", 1)[0]
				if took := time.Since(start); !errors.Is(r.err, refused) || took > 100*time.Millisecond {
					t.Fatalf("got %+v after %v, want %v at once", r, took, refused)
				}
				err := c.ns.Do(func() error {
					u, err := net.ListenUDP("udp4", nil)
					if err != nil {
						return err
					}
					defer u.Close()
					_, err = u.WriteToUDPAddrPort([]byte("x"), netip.MustParseAddrPort(npNodeIP+":30095"))
					return err
				})
				if !errors.Is(err, refused) {
					t.Fatalf("UDP: %v, want %v", err, refused)
				}
			})
			t.Run("UDP", func(t *testing.T) {
				err := c.ns.Do(func() error {
					// Unconnected: the reply shows the NodePort
					// (recvmsg), and datagrams spread over the
					// backends by socket.
					seen := map[string]int{}
					for range 40 {
						b, err := udpUnconnected(npPodGW + ":30091")
						if err != nil {
							return err
						}
						seen[b]++
					}
					if len(seen) != 3 {
						return fmt.Errorf("40 sockets reached %v, want the three backends", seen)
					}
					// Connected: getpeername shows the NodePort;
					// Local keeps to this node's backends.
					for range 20 {
						b, err := udpConnected(npNodeIP + ":30093")
						if err != nil {
							return err
						}
						if b != npPodIP && b != npPodIP2 {
							return fmt.Errorf("Local policy over UDP reached %s", b)
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		})
	}

	t.Run("BindStillProtected", func(t *testing.T) {
		want := syscall.EADDRINUSE
		if !haveSetRetval() {
			want = syscall.EPERM
		}
		if err := os.WriteFile(filepath.Join(l.cfg.CgroupPath, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, addr := range []string{":30090", npNodeIP + ":30092"} {
			err := l.node.Do(func() error {
				ln, err := net.Listen("tcp4", addr)
				if err == nil {
					ln.Close()
				}
				return err
			})
			if !errors.Is(err, want) {
				t.Fatalf("bind %s in the node namespace: %v, want %v", addr, err, want)
			}
		}
	})
	t.Run("IPv6", func(t *testing.T) {
		// The process is in the node's cgroup again (BindStillProtected).
		addr := "[" + npNodeIP6 + "]:30096"
		for _, r := range dialN(l.node, addr, 5) {
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.backend != npRemoteIP6 || r.client != npNodeIP6 || r.peer != addr {
				t.Fatalf("backend %s saw client %s, client saw peer %s; want %s, %s, %s", r.backend, r.client, r.peer, npRemoteIP6, npNodeIP6, addr)
			}
		}
	})
	st, err := l.dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
}

// serveUDPBackend answers every datagram to addr in ns with addr's IP, so
// that the client learns which backend it reached.
func serveUDPBackend(t testing.TB, ns *testnet.Netns, addr string) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	ip := netip.MustParseAddrPort(addr).Addr().String()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(ip), from)
		}
	}()
}

// udpUnconnected sends a datagram to addr from a fresh unconnected socket
// and returns the backend that answered. The answer must come from addr.
func udpUnconnected(addr string) (string, error) {
	to := netip.MustParseAddrPort(addr)
	u, err := net.ListenUDP("udp4", nil)
	if err != nil {
		return "", err
	}
	defer u.Close()
	if _, err := u.WriteToUDPAddrPort([]byte("q"), to); err != nil {
		return "", err
	}
	u.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, from, err := u.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", err
	}
	if from != to {
		return "", fmt.Errorf("reply from %s, want %s", from, to)
	}
	return string(buf[:n]), nil
}

// udpConnected is udpUnconnected with a connected socket, whose peer must
// be addr.
func udpConnected(addr string) (string, error) {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != addr {
		return "", fmt.Errorf("getpeername = %s, want %s", got, addr)
	}
	if _, err := c.Write([]byte("q")); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// TestNodePortFrontends checks the frontends a NodePort Service gets for
// the node's own sockets: one per node address of the Service's families,
// with the backends and flags of its externalTrafficPolicy.
func TestNodePortFrontends(t *testing.T) {
	s := service("dual", "10.214.102.1", corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30100, TargetPort: intstr.FromInt32(8080)})
	s.Spec.ClusterIPs = []string{"10.214.102.1", "fd00:214::1"}
	s.Spec.Type = corev1.ServiceTypeNodePort
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	v4 := epSlice("dual-4", "dual", ports, readyEP("10.214.0.11", "node-a"), readyEP("10.214.0.12", "node-b"))
	v6 := epSlice("dual-6", "dual", ports, readyEP("fd00:214::11", "node-b"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	nodeIPs := nodeAddrs([]netip.Addr{netip.MustParseAddr("::ffff:192.0.2.1"), netip.MustParseAddr("192.0.2.1"),
		netip.MustParseAddr("2001:db8::1"), netip.IPv4Unspecified(), {}})
	if want := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}; !slices.Equal(nodeIPs, want) {
		t.Fatalf("nodeAddrs = %v, want %v", nodeIPs, want)
	}
	got := map[feKey]desiredFE{}
	for _, d := range desiredFrontends(s, []*discoveryv1.EndpointSlice{v4, v6}, "node-a", nodeIPs) {
		got[d.Key] = d
	}
	for _, c := range []struct {
		ip       string
		backends []string
	}{{"192.0.2.1", []string{"10.214.0.11"}}, {"2001:db8::1", nil}} {
		k := feKey{IP: as16(netip.MustParseAddr(c.ip)), Port: 30100, Proto: protoTCP, Scope: scopeInternal}
		d, ok := got[k]
		if !ok {
			t.Fatalf("no frontend %s:30100 for the node's sockets; have %v", c.ip, slices.Collect(maps.Keys(got)))
		}
		var bes []string
		for _, b := range d.Backends {
			bes = append(bes, b.IP.Unmap().String())
		}
		if d.Flags&feLocalOnly == 0 || !slices.Equal(bes, c.backends) {
			t.Fatalf("%s:30100: flags %#x backends %v, want Local with %v", c.ip, d.Flags, bes, c.backends)
		}
		// The same as what the uplink's NodePort frontend of the family has.
		ext := got[feKey{IP: anyAddr(k.IP.Unmap().Is6()), Port: 30100, Proto: protoTCP, Scope: scopeExternal}]
		if ext.Flags != d.Flags || !slices.Equal(ext.Backends, d.Backends) {
			t.Fatalf("%s:30100 differs from the uplink's NodePort frontend: %+v vs %+v", c.ip, d, ext)
		}
	}
	if len(got) != 6 {
		t.Fatalf("%d frontends, want 6 (ClusterIP, NodePort, node address for each family)", len(got))
	}
}
