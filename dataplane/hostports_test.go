package dataplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A second pod of the node under test, behind its own veth.
const (
	hpPod2IP = "10.214.4.2"
	hpPod2GW = "10.214.4.1"
)

// TestHostPort publishes ports of the NodePort lab's pod on the node, as a
// container's hostPort does, and reaches them from a client beyond the
// uplink (tc: DNAT only, the pod sees the client), from the node and from
// another pod (socket programs), over TCP and UDP. Removing them, or an
// agent that restarts without giving them before its first Sync, takes
// them away; one that gives them keeps them across the restart.
func TestHostPort(t *testing.T) {
	l := newNPLab(t, "")
	serveUDPEcho(t, l.pod, npPodIP+":8053")
	pod2 := testnet.NewNetns(t, "pod2")
	testnet.Veth(t, l.node, "pod1", []string{hpPod2GW + "/24"}, pod2, "eth0", []string{hpPod2IP + "/24"})
	testnet.MustIP(t, "-n", pod2.Name, "route", "add", "default", "via", hpPod2GW)

	pod := netip.MustParseAddr(npPodIP)
	ports := []HostPort{
		{Port: 8081, PodIP: pod, PodPort: 8080},
		{Port: 5353, Protocol: corev1.ProtocolUDP, PodIP: pod, PodPort: 8053},
		{HostIP: netip.MustParseAddr(npNodeIP), Port: 8082, PodIP: pod, PodPort: 8080},
		{Port: 9000, Protocol: corev1.ProtocolSCTP, PodIP: pod, PodPort: 9000},
	}
	before := l.dp.frontendCount()
	err := l.dp.SetHostPorts("uid-a", ports)
	if err == nil || !strings.Contains(err.Error(), "SCTP is not supported") {
		t.Fatalf("SetHostPorts with an SCTP port: %v, want it refused", err)
	}
	// 8081 and 5353: the uplink key, one per IPv4 node address (two) and
	// 127.0.0.1 when the node's namespace is known; 8082 on its host
	// address only, for both.
	loopback := 0
	if slices.Contains(l.dp.sockIPs, netip.MustParseAddr("127.0.0.1")) {
		loopback = 1
	}
	added := 2*(1+2+loopback) + 2
	if got := l.dp.frontendCount() - before; got != added {
		t.Fatalf("host ports added %d frontends, want %d", got, added)
	}

	fromClient := func(t *testing.T, addr string) {
		t.Helper()
		for _, r := range dialN(l.client, addr, 5) {
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.backend != npPodIP || r.client != npClientIP || r.peer != addr {
				t.Fatalf("pod %s saw client %s, client saw peer %s; want %s, %s (no SNAT), %s", r.backend, r.client, r.peer, npPodIP, npClientIP, addr)
			}
		}
	}
	udpFromClient := func() (string, error) {
		var reply string
		err := l.client.Do(func() error {
			c, err := net.Dial("udp4", npNodeIP+":5353")
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("q")); err != nil {
				return err
			}
			buf := make([]byte, 64)
			n, err := c.Read(buf) // connected: only a reply from the node's address
			reply = string(buf[:n])
			return err
		})
		return reply, err
	}

	t.Run("FromClient", func(t *testing.T) {
		fromClient(t, npNodeIP+":8081")
		fromClient(t, npNodeIP+":8082")
		got, err := udpFromClient()
		if err != nil || got != "q from "+npClientIP {
			t.Fatalf("UDP: %q, %v; want the pod's echo naming the client %s", got, err, npClientIP)
		}
	})

	podCg := filepath.Join(l.cfg.CgroupPath, "pod")
	if err := os.Mkdir(podCg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(podCg) })
	// The node's processes live in the dataplane's cgroup, pods in one
	// below it; the test process leaves both when this subtest ends.
	t.Run("FromTheNode", func(t *testing.T) {
		testnet.JoinCgroup(t, l.cfg.CgroupPath)
		for _, c := range []struct {
			name, cgroup, client string
			ns                   *testnet.Netns
			addrs                []string
		}{
			{"FromNode", l.cfg.CgroupPath, npPodGW, l.node, []string{npNodeIP + ":8081", npPodGW + ":8081", npNodeIP + ":8082"}},
			{"FromPod", podCg, hpPod2IP, pod2, []string{npNodeIP + ":8081", npNodeIP + ":8082"}},
			{"FromItself", podCg, npPodIP, l.pod, []string{npNodeIP + ":8081", npPodGW + ":8081"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				if err := os.WriteFile(filepath.Join(c.cgroup, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
					t.Fatal(err)
				}
				for _, addr := range c.addrs {
					for _, r := range dialN(c.ns, addr, 3) {
						if r.err != nil {
							t.Fatalf("%s: %v", addr, r.err)
						}
						if r.backend != npPodIP || r.client != c.client || r.peer != addr {
							t.Fatalf("%s: pod %s saw client %s, client saw peer %s; want %s, %s, %s", addr, r.backend, r.client, r.peer, npPodIP, c.client, addr)
						}
					}
				}
				err := c.ns.Do(func() error {
					b, err := udpConnected(npNodeIP + ":5353")
					if err == nil && b != "q from "+c.client {
						err = fmt.Errorf("echo %q, want it to name %s", b, c.client)
					}
					return err
				})
				if err != nil {
					t.Fatalf("UDP: %v", err)
				}
				// 8082 is published on npNodeIP only.
				if r := dialN(c.ns, npPodGW+":8082", 1)[0]; r.err == nil {
					t.Fatalf("%s:8082 reached %s; the port is published on %s only", npPodGW, r.backend, npNodeIP)
				}
			})
		}
	})

	t.Run("KeptAcrossRestart", func(t *testing.T) {
		if err := l.dp.Close(); err != nil {
			t.Fatal(err)
		}
		dp, err := New(l.cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.dp = dp
		// Pinned: served while no agent runs and before the first Sync.
		fromClient(t, npNodeIP+":8081")
		if err := dp.SetHostPorts("uid-a", ports[:3]); err != nil {
			t.Fatal(err)
		}
		if err := dp.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		fromClient(t, npNodeIP+":8081")
		if _, err := udpFromClient(); err != nil {
			t.Fatalf("UDP after the restart: %v", err)
		}
	})

	t.Run("Removed", func(t *testing.T) {
		// The restart dropped the lab's Services, which nobody gave again.
		if got := l.dp.frontendCount(); got != added {
			t.Fatalf("%d frontends before removal, want the host ports' %d", got, added)
		}
		if err := l.dp.SetHostPorts("uid-a", nil); err != nil {
			t.Fatal(err)
		}
		if got := l.dp.frontendCount(); got != 0 {
			t.Fatalf("%d frontends after removal, want none", got)
		}
		if r := dialN(l.client, npNodeIP+":8081", 1)[0]; r.err == nil {
			t.Fatalf("removed host port still reaches %s", r.backend)
		}
		if r := dialN(l.node, npNodeIP+":8081", 1)[0]; r.err == nil {
			t.Fatalf("removed host port still reaches %s from the node", r.backend)
		}
		if l.dp.SetHostPorts("uid-a", nil) != nil || l.dp.frontendCount() != 0 {
			t.Fatal("removing the host ports again changed something")
		}
		if got, err := udpFromClient(); err == nil {
			t.Fatalf("removed UDP host port answered %q", got)
		}
	})

	t.Run("DroppedByRestartWithoutThem", func(t *testing.T) {
		if err := l.dp.SetHostPorts("uid-b", ports[:1]); err != nil {
			t.Fatal(err)
		}
		fromClient(t, npNodeIP+":8081")
		l.dp.Close()
		dp, err := New(l.cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.dp = dp
		if err := dp.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := dialN(l.client, npNodeIP+":8081", 1)[0]; r.err == nil {
			t.Fatalf("host port nobody gave at the first Sync still reaches %s", r.backend)
		}
	})

	// A NodePort and a host port on the same port: whoever holds the
	// frontend keeps it through full Syncs, and with nobody holding it
	// (a restart) the Service gets it, whatever order they were given in.
	t.Run("ConflictWithNodePort", func(t *testing.T) {
		svc := service("np-clash", "10.214.101.9",
			corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 8081, TargetPort: intstr.FromString("http")})
		svc.Spec.Type = corev1.ServiceTypeNodePort
		slice := epSlice("np-clash-1", "np-clash", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, readyEP(npRemoteIP, "node-b"))
		backendOf := func() string {
			t.Helper()
			r := dialN(l.client, npNodeIP+":8081", 1)[0]
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.backend
		}
		if err := l.dp.SetHostPorts("uid-c", ports[:1]); err != nil {
			t.Fatal(err)
		}
		l.dp.UpsertService(svc)
		l.dp.UpsertEndpointSlice(slice)
		for range 3 {
			l.dp.mu.Lock()
			l.dp.resync = true
			l.dp.mu.Unlock()
			if err := l.dp.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := backendOf(); got != npPodIP {
				t.Fatalf("after a full Sync port 8081 reaches %s, want the pod %s that held it", got, npPodIP)
			}
		}
		for range 3 {
			l.dp.Close()
			dp, err := New(l.cfg)
			if err != nil {
				t.Fatal(err)
			}
			l.dp = dp
			if err := dp.SetHostPorts("uid-c", ports[:1]); err != nil {
				t.Fatal(err)
			}
			dp.UpsertService(svc)
			dp.UpsertEndpointSlice(slice)
			if err := dp.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := backendOf(); got != npRemoteIP {
				t.Fatalf("after a restart port 8081 reaches %s, want the Service's backend %s", got, npRemoteIP)
			}
		}
	})
}

// TestHostPortFrontends checks the frontends of host ports: a port on
// every node address is the uplinks' any-address key plus the node's
// addresses of the pod's family; one with a host address is that address
// only; every one is Local with the pod as its only backend.
func TestHostPortFrontends(t *testing.T) {
	node4, node6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	pod4, pod6 := netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("fd01::5")
	got := desiredHostPorts([]HostPort{
		{Port: 80, PodIP: pod4, PodPort: 8080},
		{Port: 80, PodIP: pod4, PodPort: 8080}, // listed twice
		{Port: 53, Protocol: corev1.ProtocolUDP, PodIP: pod6, PodPort: 53},
		{HostIP: netip.MustParseAddr("0.0.0.0"), Port: 81, PodIP: pod4, PodPort: 8081},
		{HostIP: node4, Port: 82, PodIP: pod4, PodPort: 8082},
		{HostIP: node6, Port: 83, PodIP: pod4, PodPort: 8083}, // families differ
		{Port: 84, Protocol: corev1.ProtocolSCTP, PodIP: pod4, PodPort: 84},
	}, []netip.Addr{node4, node6})
	var keys []string
	for _, d := range got {
		if d.Flags != feLocalOnly || len(d.Backends) != 1 || d.Backends[0].Flags != beLocal {
			t.Errorf("%+v: want Local with one local backend", d)
		}
		keys = append(keys, fmt.Sprintf("%s:%d/%d/%d->%s:%d", d.Key.IP.Unmap(), d.Key.Port, d.Key.Proto, d.Key.Scope,
			d.Backends[0].IP.Unmap(), d.Backends[0].Port))
	}
	want := []string{
		"0.0.0.0:80/6/1->10.1.0.5:8080", "10.0.0.1:80/6/0->10.1.0.5:8080",
		":::53/17/1->fd01::5:53", "fd00::1:53/17/0->fd01::5:53",
		"0.0.0.0:81/6/1->10.1.0.5:8081", "10.0.0.1:81/6/0->10.1.0.5:8081",
		"10.0.0.1:82/6/1->10.1.0.5:8082", "10.0.0.1:82/6/0->10.1.0.5:8082",
	}
	if strings.Join(keys, " ") != strings.Join(want, " ") {
		t.Fatalf("frontends\n %v\nwant\n %v", keys, want)
	}
}
