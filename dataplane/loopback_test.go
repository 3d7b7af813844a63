package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestLoopbackNodePort dials NodePorts and host ports on 127.0.0.1 and ::1
// from the node's network namespace, where the socket programs send them to
// a backend as kube-proxy's iptables rules do with route_localnet, and from
// a pod's, whose loopback is its own: there the same ports reach the pod's
// own listeners. Loopback ports that no NodePort or host port owns are left
// alone, and host processes cannot bind the ones that are owned.
func TestLoopbackNodePort(t *testing.T) {
	l := newNPLab(t, "")
	if !slices.Contains(l.dp.sockIPs, netip.MustParseAddr("127.0.0.1")) {
		t.Skip("the kernel cannot name the node's network namespace (SO_NETNS_COOKIE, Linux ≥ 5.14): loopback is not served")
	}
	serveUDPEcho(t, l.remote, npRemoteIP+":8053")
	serveUDPEcho(t, l.pod, npPodIP+":8053")
	testnet.MustIP(t, "-n", l.node.Name, "addr", "add", npNodeIP6+"/64", "dev", "up0", "nodad")
	testnet.MustIP(t, "-n", l.remote.Name, "addr", "add", npRemoteIP6+"/64", "dev", "eth0", "nodad")
	v6 := service("lo-v6", "10.214.101.14", corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30097, TargetPort: intstr.FromString("http")})
	v6.Spec.ClusterIPs = []string{"10.214.101.14", "fd00:214:101::14"}
	v6.Spec.Type = corev1.ServiceTypeNodePort
	l.dp.UpsertService(v6)
	v6eps := epSlice("lo-v6-1", "lo-v6", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, readyEP(npRemoteIP6, "node-b"))
	v6eps.AddressType = discoveryv1.AddressTypeIPv6
	l.dp.UpsertEndpointSlice(v6eps)
	pod := netip.MustParseAddr(npPodIP)
	if err := l.dp.SetHostPorts("uid-lo", []HostPort{
		{Port: 8081, PodIP: pod, PodPort: 8080},
		{Port: 5353, Protocol: corev1.ProtocolUDP, PodIP: pod, PodPort: 8053},
	}); err != nil {
		t.Fatal(err)
	}

	// The pod listens on the same loopback ports itself; the node on
	// ports of its Services that are no NodePort (the Service ports).
	for _, p := range []int{30080, 30097, 8081} {
		serveTCP(t, l.pod, p)
	}
	serveUDPBackend(t, l.pod, "127.0.0.1:30053")
	serveUDPBackend(t, l.pod, "127.0.0.1:5353")
	serveTCP(t, l.node, 80)
	serveUDPBackend(t, l.node, "127.0.0.1:53")

	podCg := filepath.Join(l.cfg.CgroupPath, "pod")
	if err := os.Mkdir(podCg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(podCg) })
	testnet.JoinCgroup(t, l.cfg.CgroupPath)
	into := func(t *testing.T, cg string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// dial checks that connections to addr from ns reach backend, which
	// saw client, while the client saw addr as its peer.
	dial := func(t *testing.T, ns *testnet.Netns, addr, backend, client string) {
		t.Helper()
		for _, r := range dialN(ns, addr, 3) {
			if r.err != nil {
				t.Fatalf("%s: %v", addr, r.err)
			}
			if r.backend != backend || r.client != client || r.peer != addr {
				t.Fatalf("%s: %s saw client %s, client saw peer %s; want %s, %s, %s", addr, r.backend, r.client, r.peer, backend, client, addr)
			}
		}
	}
	// udp checks the answers to a connected and an unconnected socket.
	udp := func(t *testing.T, ns *testnet.Netns, addr, want string) {
		t.Helper()
		err := ns.Do(func() error {
			for _, f := range []func(string) (string, error){udpConnected, udpUnconnected} {
				got, err := f(addr)
				if err != nil {
					return err
				}
				if got != want {
					return fmt.Errorf("answer %q, want %q", got, want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("UDP %s: %v", addr, err)
		}
	}

	t.Run("FromTheNode", func(t *testing.T) {
		into(t, l.cfg.CgroupPath)
		dial(t, l.node, "127.0.0.1:30080", npRemoteIP, npNodeIP)
		dial(t, l.node, "127.0.0.1:30081", npPodIP, npPodGW) // externalTrafficPolicy Local
		dial(t, l.node, "[::1]:30097", npRemoteIP6, npNodeIP6)
		udp(t, l.node, "127.0.0.1:30053", "q from "+npNodeIP)
		// Host ports.
		dial(t, l.node, "127.0.0.1:8081", npPodIP, npPodGW)
		udp(t, l.node, "127.0.0.1:5353", "q from "+npPodGW)
		// Not NodePorts: the node's own listeners.
		dial(t, l.node, "127.0.0.1:80", "127.0.0.1", "127.0.0.1")
		udp(t, l.node, "127.0.0.1:53", "127.0.0.1")
	})
	t.Run("FromAPod", func(t *testing.T) {
		into(t, podCg)
		dial(t, l.pod, "127.0.0.1:30080", "127.0.0.1", "127.0.0.1")
		dial(t, l.pod, "[::1]:30097", "::1", "::1")
		dial(t, l.pod, "127.0.0.1:8081", "127.0.0.1", "127.0.0.1")
		udp(t, l.pod, "127.0.0.1:30053", "127.0.0.1")
		udp(t, l.pod, "127.0.0.1:5353", "127.0.0.1")
	})
	t.Run("BindRefused", func(t *testing.T) {
		into(t, l.cfg.CgroupPath)
		want := syscall.EADDRINUSE
		if !haveSetRetval() {
			want = syscall.EPERM
		}
		bind := func(network, addr string) error {
			return l.node.Do(func() error {
				if network == "udp4" {
					pc, err := net.ListenPacket(network, addr)
					if err == nil {
						pc.Close()
					}
					return err
				}
				ln, err := net.Listen(network, addr)
				if err == nil {
					ln.Close()
				}
				return err
			})
		}
		for _, b := range []struct{ network, addr string }{
			{"tcp4", "127.0.0.1:30080"}, {"tcp6", "[::1]:30097"}, {"udp4", "127.0.0.1:30053"}, {"tcp4", "127.0.0.1:8081"},
		} {
			if err := bind(b.network, b.addr); !errors.Is(err, want) {
				t.Errorf("bind %s in the node namespace: %v, want %v", b.addr, err, want)
			}
		}
		// Loopback addresses that are not translated stay free.
		if err := bind("tcp4", "127.0.0.2:30080"); err != nil {
			t.Errorf("bind 127.0.0.2:30080: %v", err)
		}
	})
}

// TestSockAddrs checks the addresses NodePorts answer the node's sockets
// on: loopback only when the node's namespace is known.
func TestSockAddrs(t *testing.T) {
	node := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("127.0.0.1")}
	if got := sockAddrs(node, 0); !slices.Equal(got, node) {
		t.Fatalf("without a namespace cookie: %v, want %v", got, node)
	}
	want := []netip.Addr{node[0], node[1], netip.IPv6Loopback()}
	if got := sockAddrs(node, 42); !slices.Equal(got, want) {
		t.Fatalf("with a namespace cookie: %v, want %v", got, want)
	}
	if len(node) != 2 {
		t.Fatalf("sockAddrs changed its argument: %v", node)
	}
}
