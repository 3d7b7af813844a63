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
)

// TestLockFreeTables connects to a Service in a tight loop while the agent
// keeps rewriting its lb_fe_fast entry (the backend set switches between
// three and two endpoints): every connect must reach a backend of the
// Service and getpeername must show the ClusterIP. It runs the programs
// both as loaded on this CPU and with strong_order off, the code path of
// CPUs that reorder loads (arm64), whose fences are atomic operations.
func TestLockFreeTables(t *testing.T) {
	for _, order := range []uint8{strongOrder(), 0} {
		t.Run(fmt.Sprintf("strong_order=%d", order), func(t *testing.T) {
			prev := strongOrder
			strongOrder = func() uint8 { return order }
			defer func() { strongOrder = prev }()
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
			var wg sync.WaitGroup
			var conns, failed int
			var firstErr error
			wg.Add(1)
			err := l.cli.Go(func() {
				defer wg.Done()
				fail := func(err error) {
					failed++
					if firstErr == nil {
						firstErr = err
					}
				}
				linger := &unix.Linger{Onoff: 1, Linger: 0}
				for {
					select {
					case <-stop:
						return
					default:
					}
					fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
					if err != nil {
						fail(err)
						return
					}
					unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, linger)
					conns++
					if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: vip.As4(), Port: 80}); err != nil {
						fail(fmt.Errorf("connect: %w", err))
					} else if sa, err := unix.Getpeername(fd); err != nil {
						fail(err)
					} else if in, ok := sa.(*unix.SockaddrInet4); !ok || netip.AddrFrom4(in.Addr) != vip || in.Port != 80 {
						fail(fmt.Errorf("getpeername = %+v, want %s:80", sa, vip))
					}
					unix.Close(fd)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
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
			wg.Wait()
			if failed > 0 || conns < 100 {
				t.Fatalf("%d of %d connects failed while the entry was rewritten %d times; first: %v", failed, conns, switches, firstErr)
			}
			st, err := l.dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d connects, all to the ClusterIP's backends, while the entry was rewritten %d times (retries %d)", conns, switches, st.SocketRetries)
		})
	}
}
