package dataplane

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"golang.org/x/sys/unix"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
)

// TestLockFreeTables connects to a Service in a tight loop while the agent
// keeps rewriting its lb_fe_fast entry (the backend set switches between
// three and two endpoints): every connect must reach a backend of the
// Service and getpeername must show the ClusterIP. It runs the programs
// both as loaded on this CPU and with strong_order off, the code path of
// CPUs that reorder loads (arm64), whose fences are atomic operations.
func TestLockFreeTables(t *testing.T) {
	forEachOrder(t, func(t *testing.T) {
		l := newSockLab(t)
		serveTCP(t, l.be, 8080)

		vip := netip.MustParseAddr("10.214.100.7")
		l.dp.UpsertService(service("churn", vip.String(), svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080))))
		ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
		three := epSlice("churn-1", "churn", ports,
			readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-a"), readyEP(labBackends[2], "node-a"))
		two := epSlice("churn-1", "churn", ports, readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-a"))
		l.dp.UpsertEndpointSlice(three)

		stop := make(chan struct{})
		rc := startRawConnects(t, l.cli, stop, func(int) (netip.Addr, uint16) { return vip, 80 })
		deadline := time.Now().Add(time.Second)
		switches := 0
		for time.Now().Before(deadline) {
			if switches%2 == 0 {
				l.dp.UpsertEndpointSlice(two)
			} else {
				l.dp.UpsertEndpointSlice(three)
			}
			switches++
		}
		close(stop)
		rc.wg.Wait()
		if rc.failed > 0 || rc.conns < 100 {
			t.Fatalf("%d of %d connects failed while the entry was rewritten %d times; first: %v", rc.failed, rc.conns, switches, rc.firstErr)
		}
		st, err := l.dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d connects, all to the ClusterIP's backends, while the entry was rewritten %d times (retries %d)", rc.conns, switches, st.SocketRetries)
	})
}

// TestLockFreeMoves connects in a tight loop to Services whose fast lines
// keep changing hands: four frontends share their first line, so they sit
// in its three choices and lb_frontends, and the agent keeps deleting and
// re-adding two of them, which moves the others between lines and the
// hash map. No connect may take a Service for no Service (the ClusterIPs
// have no route: such a connect fails), and every one must reach a backend
// and show the ClusterIP as its peer. (The window that lb_fe_gen closes,
// between two line writes of one run of fast_write, is too short for a
// test to hit reliably.)
func TestLockFreeMoves(t *testing.T) {
	forEachOrder(t, func(t *testing.T) {
		l := newSockLab(t)
		serveTCP(t, l.be, 8080)

		// Addresses in 10.214.0.0/16 whose first line is that of
		// 10.214.100.1:80 (only the low 16 bits of the address
		// move the index of a 65,536-line table).
		l.dp.mu.Lock()
		bits := l.dp.rec.fast.bits
		l.dp.mu.Unlock()
		first := fastIndex(fastKey("10.214.100.1", 80), bits)
		type fe struct {
			vip  netip.Addr
			port uint16
		}
		var fes []fe
		for p := uint16(80); len(fes) < fastChoices+1; p++ {
			off := first - fastIndex(fastKey("10.214.0.0", p), bits)
			if off>>8&0xff == 0 {
				continue // the lab's own subnet
			}
			vip := netip.AddrFrom4([4]byte{10, 214, byte(off >> 8), byte(off)})
			if fastIndex(fastKey(vip.String(), p), bits) != first {
				t.Fatalf("%s:%d: index %d, want %d", vip, p, fastIndex(fastKey(vip.String(), p), bits), first)
			}
			fes = append(fes, fe{vip, p})
		}
		ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
		svc := func(i int) *corev1.Service {
			return service(fmt.Sprintf("moves-%d", i), fes[i].vip.String(),
				svcPort("http", corev1.ProtocolTCP, int32(fes[i].port), intstr.FromInt32(8080)))
		}
		for i := range fes {
			l.dp.UpsertService(svc(i))
			l.dp.UpsertEndpointSlice(epSlice(fmt.Sprintf("moves-%d-1", i), fmt.Sprintf("moves-%d", i), ports,
				readyEP(labBackends[i%len(labBackends)], "node-a")))
		}
		st, err := l.dp.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.FastSpilled != 1 {
			t.Fatalf("%d frontends in lb_frontends only, want 1", st.FastSpilled)
		}

		// The two that stay: the last one (in lb_frontends only
		// at first) and the third.
		targets := []int{len(fes) - 1, len(fes) - 2}
		stop := make(chan struct{})
		rc := startRawConnects(t, l.cli, stop, func(i int) (netip.Addr, uint16) {
			f := fes[targets[i%len(targets)]]
			return f.vip, f.port
		})
		deadline := time.Now().Add(time.Second)
		rounds := 0
		for time.Now().Before(deadline) {
			for _, i := range []int{0, 1} {
				l.dp.DeleteService("default", fmt.Sprintf("moves-%d", i))
			}
			for _, i := range []int{1, 0} {
				l.dp.UpsertService(svc(i))
			}
			rounds++
		}
		close(stop)
		rc.wg.Wait()
		if rc.failed > 0 || rc.conns < 100 {
			t.Fatalf("%d of %d connects failed while frontends moved between lines %d times; first: %v", rc.failed, rc.conns, rounds, rc.firstErr)
		}
		t.Logf("%d connects, all to the ClusterIPs' backends, while frontends moved between lines %d times", rc.conns, rounds)
	})
}

// forEachOrder runs f with the programs loaded as on this CPU and with
// strong_order off, the code path of CPUs that reorder loads (arm64).
func forEachOrder(t *testing.T, f func(t *testing.T)) {
	for _, order := range []uint8{strongOrder(), 0} {
		t.Run(fmt.Sprintf("strong_order=%d", order), func(t *testing.T) {
			prev := strongOrder
			strongOrder = func() uint8 { return order }
			defer func() { strongOrder = prev }()
			f(t)
		})
	}
}

// rawConnects counts the connects of startRawConnects; read it after wg.Wait.
type rawConnects struct {
	wg            sync.WaitGroup
	conns, failed int
	firstErr      error
}

// startRawConnects connects raw sockets (reset on close) in ns, one after
// another until stop is closed, to the address next gives for the i-th
// connect; each must connect and show that address as its peer.
func startRawConnects(t *testing.T, ns *testnet.Netns, stop <-chan struct{}, next func(i int) (netip.Addr, uint16)) *rawConnects {
	t.Helper()
	rc := &rawConnects{}
	rc.wg.Add(1)
	err := ns.Go(func() {
		defer rc.wg.Done()
		fail := func(err error) {
			rc.failed++
			if rc.firstErr == nil {
				rc.firstErr = err
			}
		}
		linger := &unix.Linger{Onoff: 1, Linger: 0}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			vip, port := next(i)
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				fail(err)
				return
			}
			unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, linger)
			rc.conns++
			if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: vip.As4(), Port: int(port)}); err != nil {
				fail(fmt.Errorf("connect %s:%d: %w", vip, port, err))
			} else if sa, err := unix.Getpeername(fd); err != nil {
				fail(err)
			} else if in, ok := sa.(*unix.SockaddrInet4); !ok || netip.AddrFrom4(in.Addr) != vip || in.Port != int(port) {
				fail(fmt.Errorf("getpeername = %+v, want %s:%d", sa, vip, port))
			}
			unix.Close(fd)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return rc
}
