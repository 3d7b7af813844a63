package edge_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tether-edge/tether/dataplane"
	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// TestAgentLeavesOutDeadSitePeers runs an agent of a site of three nodes
// (the other two exist only as endpoints' nodeNames and in the gossip
// view, a fake) against a real hub, then stops the hub: the site is cut
// off. When the view sees a peer Dead, the agent's DNS server stops
// answering that peer's pods and, as root, the eBPF dataplane's backend
// slots of the ClusterIP lose them; when the peer is Alive again they are
// back. Nobody changes an EndpointSlice meanwhile.
func TestAgentLeavesOutDeadSitePeers(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	const self, peer, other = "edge-site-a", "edge-site-b", "edge-site-c"
	view := edge.NewFakeSiteView("lab",
		sitedigest.Member{Node: self, State: sitedigest.Alive, Incarnation: 1},
		sitedigest.Member{Node: peer, State: sitedigest.Alive, Incarnation: 1},
		sitedigest.Member{Node: other, State: sitedigest.Alive, Incarnation: 1},
	)
	cfg := edge.Config{
		HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: self, Zone: "lab",
		NodeIP:        netip.MustParseAddr("192.0.2.21"),
		WatchServices: true,
		DNSAddr:       netip.MustParseAddrPort("127.0.0.1:0"),
		DNSUpstreams:  []string{startUpstreamDNS(t)},
		SiteView:      view,
		Logger:        log,
	}
	pins := ""
	if os.Geteuid() == 0 {
		// The dataplane attaches to a cgroup of the test's own, which no
		// process joins: only its maps are looked at.
		pins = testBPFFS(t)
		cgroup := newTestCgroup(t)
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
		cfg.Dataplane, cfg.DataplaneCgroup, cfg.DataplaneBPFFS = edge.DataplaneEBPF, cgroup, pins
	} else {
		t.Log("not root: the eBPF dataplane's maps are not checked, only DNS")
	}
	a := startAgent(t, cfg)
	waitNodeReady(t, e, self)
	dnsServer := a.DNSAddr().String()

	web, err := e.client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := netip.MustParseAddr(web.Spec.ClusterIP)
	if _, err := e.client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "pg", Protocol: corev1.ProtocolTCP, Port: 5432}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ep := func(ip, node, hostname string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr(node), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}
		if hostname != "" {
			e.Hostname = ptr(hostname)
		}
		return e
	}
	for _, es := range []*discoveryv1.EndpointSlice{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "web-manual", Labels: map[string]string{
				discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "test.tether.dev"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{ep("10.77.1.1", self, ""), ep("10.77.2.1", peer, ""), ep("10.77.3.1", other, "")},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "db-manual", Labels: map[string]string{
				discoveryv1.LabelServiceName: "db", discoveryv1.LabelManagedBy: "test.tether.dev"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{ep("10.77.1.2", self, "db-0"), ep("10.77.2.2", peer, "db-1"), ep("10.77.3.2", other, "db-2")},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("pg"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(5432))}},
		},
	} {
		if _, err := e.client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// state is what the node serves: the DNS answers for the headless
	// Service and its pod db-1, and (as root) the ClusterIP's backends in
	// the dataplane's maps.
	state := func() string {
		var b strings.Builder
		m, err := queryHost(dnsServer, "db.default.svc.cluster.local.")
		if err != nil {
			return "db: " + err.Error()
		}
		fmt.Fprintf(&b, "db=%v", sortedAnswers(m))
		m, err = queryHost(dnsServer, "db-1.db.default.svc.cluster.local.")
		if err != nil {
			return "db-1: " + err.Error()
		}
		fmt.Fprintf(&b, " db-1=%s%v", dns.RcodeToString[m.Rcode], sortedAnswers(m))
		if pins != "" {
			be, err := clusterIPBackends(pins, clusterIP, 80)
			if err != nil {
				return b.String() + " backends: " + err.Error()
			}
			fmt.Fprintf(&b, " backends=%v", be)
		}
		return b.String()
	}
	want := func(dbAddrs []string, db1 bool, backends []string) string {
		s := fmt.Sprintf("db=%v", dbAddrs)
		if db1 {
			s += " db-1=NOERROR[10.77.2.2]"
		} else {
			s += " db-1=NXDOMAIN[]"
		}
		if pins != "" {
			s += fmt.Sprintf(" backends=%v", backends)
		}
		return s
	}
	allUp := want([]string{"10.77.1.2", "10.77.2.2", "10.77.3.2"}, true, []string{"10.77.1.1:8080", "10.77.2.1:8080", "10.77.3.1:8080"})
	peerDead := want([]string{"10.77.1.2", "10.77.3.2"}, false, []string{"10.77.1.1:8080", "10.77.3.1:8080"})

	eventually(t, 30*time.Second, "the node serves every endpoint", func() (bool, string) {
		if pins != "" && !a.Stats().DataplaneSynced {
			return false, "dataplane not synced"
		}
		got := state()
		return got == allUp, got
	})

	// The site is cut off from the hub.
	e.hub.Stop()
	eventually(t, 10*time.Second, "the agent notices the hub is gone", func() (bool, string) {
		return !a.Stats().Connected, "connected"
	})

	// One change notification: the peer is dead.
	start := time.Now()
	view.Set(peer, sitedigest.Dead)
	eventually(t, 5*time.Second, "the dead peer's endpoints are left out", func() (bool, string) {
		got := state()
		return got == peerDead, got
	})
	t.Logf("dead peer's endpoints left out after %v", time.Since(start))
	if n := a.Stats().SiteEndpointsLeftOut; n != 2 {
		t.Errorf("SiteEndpointsLeftOut = %d, want 2", n)
	}

	// Suspect is not dead: the other peer keeps its endpoints.
	view.Set(other, sitedigest.Suspect)
	time.Sleep(100 * time.Millisecond)
	if got := state(); got != peerDead {
		t.Errorf("with %s suspect: %s, want %s", other, got, peerDead)
	}

	// One change notification: the peer is back.
	start = time.Now()
	view.Set(peer, sitedigest.Alive)
	eventually(t, 5*time.Second, "the peer's endpoints are back", func() (bool, string) {
		got := state()
		return got == allUp, got
	})
	t.Logf("returned peer's endpoints back after %v", time.Since(start))
	if n := a.Stats().SiteEndpointsLeftOut; n != 0 {
		t.Errorf("SiteEndpointsLeftOut = %d, want 0", n)
	}
}

// queryHost asks server for name's A records from the test's own network.
func queryHost(server, name string) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: time.Second}
	req := new(dns.Msg)
	req.SetQuestion(name, dns.TypeA)
	m, _, err := c.Exchange(req, server)
	return m, err
}

func sortedAnswers(m *dns.Msg) []string {
	out := []string{}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	sort.Strings(out)
	return out
}

// The layouts of bpf/lb.h's fe_key, fe_val and slot, as pinned.
type lbFeKey struct {
	IP    [16]byte
	Port  [2]byte // network byte order
	Proto uint8
	Scope uint8
}

type lbFeVal struct {
	ID, Base        uint32
	Count           uint16
	Flags, State    uint8
	AffinityTimeout uint32
}

type lbSlot struct {
	IP              [16]byte
	Port            [2]byte
	Flags, Pad      uint8
	BackendID, FeID uint32
	Pad2            uint32
}

// clusterIPBackends reads the backends of the ClusterIP frontend ip:port
// (TCP, socket scope) from the dataplane's pinned lb_frontends and
// lb_slots, as "ip:port".
func clusterIPBackends(pins string, ip netip.Addr, port uint16) ([]string, error) {
	fe, err := ebpf.LoadPinnedMap(filepath.Join(pins, "maps", "lb_frontends"), nil)
	if err != nil {
		return nil, err
	}
	defer fe.Close()
	sl, err := ebpf.LoadPinnedMap(filepath.Join(pins, "maps", "lb_slots"), nil)
	if err != nil {
		return nil, err
	}
	defer sl.Close()
	k := lbFeKey{IP: ip.As16(), Proto: 6}
	binary.BigEndian.PutUint16(k.Port[:], port)
	var v lbFeVal
	if err := fe.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return []string{}, nil
		}
		return nil, err
	}
	out := []string{}
	for i := v.Base; i < v.Base+uint32(v.Count); i++ {
		var s lbSlot
		if err := sl.Lookup(&i, &s); err != nil {
			return nil, fmt.Errorf("slot %d: %w", i, err)
		}
		a := netip.AddrFrom16(s.IP).Unmap()
		out = append(out, netip.AddrPortFrom(a, binary.BigEndian.Uint16(s.Port[:])).String())
	}
	slices.Sort(out)
	return out, nil
}
