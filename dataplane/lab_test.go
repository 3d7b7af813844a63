package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Addresses used by the tests: 10.214.0.0/16 only.
const (
	labClient  = "10.214.0.2"
	labBackend = "10.214.0.1" // the backend namespace's own address
)

var labBackends = []string{"10.214.0.11", "10.214.0.12", "10.214.0.13"}

// sockLab is a client namespace ("a pod") wired to a backend namespace that
// holds three backend addresses, plus a Dataplane whose socket programs are
// attached to a cgroup the test process has joined.
type sockLab struct {
	t      *testing.T
	cli    *testnet.Netns
	be     *testnet.Netns
	cgroup string
	pins   string
	dp     *Dataplane
	cfg    Config
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newSockLab(t *testing.T) *sockLab {
	l := newSockNet(t)
	dp, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l.dp = dp
	if err := dp.Sync(context.Background()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	testnet.JoinCgroup(t, l.cgroup)
	return l
}

// newSockNet is newSockLab without the Dataplane: the namespaces, the
// cgroup, the pin directory and the configuration. A Dataplane stored in
// l.dp later is uninstalled when the test ends.
func newSockNet(t *testing.T) *sockLab {
	testnet.RequireRoot(t)
	l := &sockLab{t: t}
	l.cli = testnet.NewNetns(t, "cli")
	l.be = testnet.NewNetns(t, "be")
	addrs := []string{labBackend + "/24"}
	for _, a := range labBackends {
		addrs = append(addrs, a+"/24")
	}
	testnet.Veth(t, l.cli, "eth0", []string{labClient + "/24"}, l.be, "eth0", addrs)
	l.cgroup = testnet.NewCgroup(t)
	l.pins = testnet.BPFFSDir(t)
	l.cfg = Config{
		CgroupPath: l.cgroup,
		BPFFSPath:  l.pins,
		NodeName:   "node-a",
		NetnsPath:  l.cli.Path(), // binds in the client namespace are kept off NodePorts
		Logger:     testLogger(t),
	}
	t.Cleanup(func() {
		if l.dp != nil {
			if err := l.dp.Uninstall(); err != nil {
				t.Errorf("Uninstall: %v", err)
			}
		}
	})
	return l
}

// serveTCP starts, in ns, a TCP server on port that answers every
// connection with "<local address> <remote address>\n" and then echoes.
func serveTCP(t testing.TB, ns *testnet.Netns, port int) {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				la := c.LocalAddr().(*net.TCPAddr)
				ra := c.RemoteAddr().(*net.TCPAddr)
				fmt.Fprintf(c, "%s %s\n", la.IP, ra.IP)
				io.Copy(c, c)
			}()
		}
	}()
}

// dialResult is what one connection through a Service saw.
type dialResult struct {
	backend string // the backend address that accepted
	client  string // the client address the backend saw
	peer    string // getpeername() on the client side
	err     error
}

// dialN makes n connections to addr from ns, one after another.
func dialN(ns *testnet.Netns, addr string, n int) []dialResult {
	out := make([]dialResult, 0, n)
	ns.Do(func() error {
		for range n {
			out = append(out, dialOnce(addr))
		}
		return nil
	})
	return out
}

func dialOnce(addr string) dialResult {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return dialResult{err: err}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return dialResult{err: fmt.Errorf("read greeting: %w", err)}
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return dialResult{err: fmt.Errorf("bad greeting %q", line)}
	}
	return dialResult{backend: f[0], client: f[1], peer: c.RemoteAddr().String()}
}

func countBackends(t testing.TB, rs []dialResult) map[string]int {
	t.Helper()
	m := map[string]int{}
	for _, r := range rs {
		if r.err != nil {
			t.Fatalf("dial: %v", r.err)
		}
		m[r.backend]++
	}
	return m
}

// Object builders.

func ptr[T any](v T) *T { return &v }

func service(name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      ports,
		},
	}
}

func svcPort(name string, proto corev1.Protocol, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: target}
}

func epSlice(name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func epPort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(port)}
}

func readyEP(ip, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}}
}

func terminatingEP(ip, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}}
}

// conntrackCount reads nf_conntrack_count in ns (0 when conntrack never
// started there).
func conntrackCount(ns *testnet.Netns) (int, error) {
	var n int
	err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = fmt.Sscan(string(b), &n)
		return err
	})
	return n, err
}

// hammer dials addr from ns in a loop until stop is closed and counts the
// outcomes; used to show that traffic never stops during an agent restart.
type hammer struct {
	mu       sync.Mutex
	ok, fail int
	lastErr  error
	done     chan struct{}
}

func startHammer(t testing.TB, ns *testnet.Netns, addr string, stop <-chan struct{}) *hammer {
	h := &hammer{done: make(chan struct{})}
	err := ns.Go(func() {
		defer close(h.done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r := dialOnce(addr)
			h.mu.Lock()
			if r.err != nil {
				h.fail++
				h.lastErr = r.err
			} else {
				h.ok++
			}
			h.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *hammer) counts() (int, int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ok, h.fail, h.lastErr
}
