package dns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/tether-edge/tether/dataplane/internal/testnet"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// childEnv makes the test binary act as a resolver client (see TestMain).
const childEnv = "TETHER_DNS_RESOLVER_CHILD"

func TestMain(m *testing.M) {
	if names := os.Getenv(childEnv); names != "" {
		resolverChild(strings.Split(names, ","))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// resolverChild looks names up with Go's own resolver, which reads
// /etc/resolv.conf (bind-mounted by `ip netns exec`), and prints
// "name=addr,addr" or "name=ERR".
func resolverChild(names []string) {
	r := &net.Resolver{PreferGo: true}
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := r.LookupHost(ctx, n)
		cancel()
		if err != nil {
			fmt.Printf("%s=ERR\n", n)
			continue
		}
		sort.Strings(addrs)
		fmt.Printf("%s=%s\n", n, strings.Join(addrs, ","))
	}
}

func ptr[T any](v T) *T { return &v }

// upstream is a fake recursive resolver for names outside the cluster.
type upstream struct {
	addr   string
	mu     sync.Mutex
	counts map[string]int
}

func startUpstream(t *testing.T) *upstream {
	u := &upstream{counts: map[string]int{}}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		u.mu.Lock()
		u.counts[fmt.Sprintf("%s/%s", q.Name, dns.TypeToString[q.Qtype])]++
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		soa, _ := dns.NewRR("example. 600 IN SOA ns.example. admin.example. 1 7200 900 86400 60")
		known := map[string]string{"www.example.org.": "93.184.216.34", "x1.x2.x3.x4.x5.example.": "198.51.100.5"}
		switch ip, ok := known[strings.ToLower(q.Name)]; {
		case ok && q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR(q.Name + " 300 IN A " + ip)
			m.Answer = append(m.Answer, rr)
		case ok:
			m.Ns = append(m.Ns, soa)
		default:
			m.Rcode = dns.RcodeNameError
			m.Ns = append(m.Ns, soa)
		}
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	u.addr = pc.LocalAddr().String()
	return u
}

func (u *upstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[key]
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// clusterState feeds the server the objects the tests resolve.
func clusterState(s *Server) {
	svc := func(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
		v := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: ports}}
		if ip != "None" {
			v.Spec.ClusterIPs = []string{ip}
		}
		return v
	}
	s.UpsertService(svc("default", "web", "10.214.100.1",
		corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80},
		corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}))
	s.UpsertService(svc("other", "web", "10.214.100.2", corev1.ServicePort{Name: "http", Port: 80}))
	s.UpsertService(svc("default", "v6", "fd00:214::1", corev1.ServicePort{Name: "http", Port: 80}))
	s.UpsertService(svc("default", "db", "None", corev1.ServicePort{Name: "pg", Protocol: corev1.ProtocolTCP, Port: 5432}))
	ext := svc("default", "ext", "", corev1.ServicePort{})
	ext.Spec.Type = corev1.ServiceTypeExternalName
	ext.Spec.ExternalName = "www.example.org"
	s.UpsertService(ext)
	alias := svc("default", "alias", "")
	alias.Spec.Type = corev1.ServiceTypeExternalName
	alias.Spec.ExternalName = "web.other.svc.cluster.local"
	s.UpsertService(alias)

	ep := func(ip, host string, ready bool) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)}}
		if host != "" {
			e.Hostname = ptr(host)
		}
		return e
	}
	s.UpsertEndpointSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "db-x", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("pg"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(5432))}},
		Endpoints:   []discoveryv1.Endpoint{ep("10.214.5.1", "db-0", true), ep("10.214.5.2", "db-1", true), ep("10.214.5.3", "db-2", false), ep("10.214.5.4", "", true)},
	})
}

func startServer(t *testing.T, upstreams []string, onQuery func(string, uint16, int, bool)) (*Server, string) {
	s, err := New(Config{Upstreams: upstreams, Logger: quietLogger(), OnQuery: onQuery})
	if err != nil {
		t.Fatal(err)
	}
	clusterState(s)
	// UDP and TCP on the same port: retry when the TCP port is taken.
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ; try++ {
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, pc, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, pc.LocalAddr().String()
}

func query(t *testing.T, addr, name string, qtype uint16, network string) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 3 * time.Second}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	r, _, err := c.Exchange(q, addr)
	if err != nil {
		t.Fatalf("query %s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return r
}

func answers(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, "A "+v.A.String())
		case *dns.AAAA:
			out = append(out, "AAAA "+v.AAAA.String())
		case *dns.CNAME:
			out = append(out, "CNAME "+v.Target)
		case *dns.SRV:
			out = append(out, fmt.Sprintf("SRV %d %s", v.Port, v.Target))
		case *dns.PTR:
			out = append(out, "PTR "+v.Ptr)
		default:
			out = append(out, rr.String())
		}
	}
	sort.Strings(out)
	return out
}

func hasSOA(m *dns.Msg) bool {
	for _, rr := range m.Ns {
		if _, ok := rr.(*dns.SOA); ok {
			return true
		}
	}
	return false
}

// TestRecords checks every record type of the cluster schema with the
// miekg/dns client, over UDP and TCP. The server knows nothing but what it
// was given through Upsert calls: no API server exists in this test.
func TestRecords(t *testing.T) {
	up := startUpstream(t)
	_, addr := startServer(t, []string{up.addr}, nil)

	cases := []struct {
		name  string
		qtype uint16
		rcode int
		want  []string
	}{
		{"web.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.100.1"}},
		{"WEB.Default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.100.1"}},
		{"web.other.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.100.2"}},
		{"v6.default.svc.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, []string{"AAAA fd00:214::1"}},
		// NODATA: the name exists, the type does not.
		{"web.default.svc.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"v6.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, nil},
		{"web.default.svc.cluster.local", dns.TypeTXT, dns.RcodeSuccess, nil},
		{"default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, nil},
		{"svc.cluster.local", dns.TypeA, dns.RcodeSuccess, nil},
		{"cluster.local", dns.TypeA, dns.RcodeSuccess, nil},
		// NXDOMAIN.
		{"nope.default.svc.cluster.local", dns.TypeA, dns.RcodeNameError, nil},
		{"web.nons.svc.cluster.local", dns.TypeA, dns.RcodeNameError, nil},
		{"nons.svc.cluster.local", dns.TypeA, dns.RcodeNameError, nil},
		{"x.web.default.svc.cluster.local", dns.TypeA, dns.RcodeNameError, nil},
		{"foo.cluster.local", dns.TypeA, dns.RcodeNameError, nil},
		// Headless: ready endpoints only.
		{"db.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.5.1", "A 10.214.5.2", "A 10.214.5.4"}},
		{"db-0.db.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.5.1"}},
		{"10-214-5-4.db.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.5.4"}},
		{"db-2.db.default.svc.cluster.local", dns.TypeA, dns.RcodeNameError, nil},
		// SRV for named ports.
		{"_http._tcp.web.default.svc.cluster.local", dns.TypeSRV, dns.RcodeSuccess, []string{"SRV 80 web.default.svc.cluster.local."}},
		{"_dns._udp.web.default.svc.cluster.local", dns.TypeSRV, dns.RcodeSuccess, []string{"SRV 53 web.default.svc.cluster.local."}},
		{"_pg._tcp.db.default.svc.cluster.local", dns.TypeSRV, dns.RcodeSuccess, []string{
			"SRV 5432 10-214-5-4.db.default.svc.cluster.local.", "SRV 5432 db-0.db.default.svc.cluster.local.", "SRV 5432 db-1.db.default.svc.cluster.local."}},
		{"_http._udp.web.default.svc.cluster.local", dns.TypeSRV, dns.RcodeNameError, nil},
		{"web.default.svc.cluster.local", dns.TypeSRV, dns.RcodeSuccess, []string{"SRV 53 web.default.svc.cluster.local.", "SRV 80 web.default.svc.cluster.local."}},
		// ExternalName: CNAME, chased for the stub resolver.
		{"ext.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 93.184.216.34", "CNAME www.example.org."}},
		{"ext.default.svc.cluster.local", dns.TypeCNAME, dns.RcodeSuccess, []string{"CNAME www.example.org."}},
		{"alias.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.100.2", "CNAME web.other.svc.cluster.local."}},
		// Pods by address.
		{"10-214-9-9.default.pod.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"A 10.214.9.9"}},
		{"fd00--9.default.pod.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, []string{"AAAA fd00::9"}},
		// Reverse lookups of cluster addresses.
		{"1.100.214.10.in-addr.arpa", dns.TypePTR, dns.RcodeSuccess, []string{"PTR web.default.svc.cluster.local."}},
		{"1.5.214.10.in-addr.arpa", dns.TypePTR, dns.RcodeSuccess, []string{"PTR db-0.db.default.svc.cluster.local."}},
		// Forwarded.
		{"www.example.org", dns.TypeA, dns.RcodeSuccess, []string{"A 93.184.216.34"}},
		{"nothere.example.org", dns.TypeA, dns.RcodeNameError, nil},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, c := range cases {
			r := query(t, addr, c.name, c.qtype, network)
			if r.Rcode != c.rcode || !slices.Equal(answers(r), c.want) {
				t.Errorf("%s %s %s: rcode %s answers %v; want %s %v", network, c.name, dns.TypeToString[c.qtype],
					dns.RcodeToString[r.Rcode], answers(r), dns.RcodeToString[c.rcode], c.want)
				continue
			}
			if len(r.Answer) == 0 && !hasSOA(r) {
				t.Errorf("%s %s %s: negative answer without SOA in authority", network, c.name, dns.TypeToString[c.qtype])
			}
			local := strings.Contains(strings.ToLower(c.name), "cluster.local") || strings.HasSuffix(c.name, ".arpa")
			if local && !r.Authoritative {
				t.Errorf("%s: cluster answer not authoritative", c.name)
			}
			if local && len(r.Answer) > 0 && r.Answer[0].Header().Ttl != 5 {
				t.Errorf("%s: TTL %d, want 5", c.name, r.Answer[0].Header().Ttl)
			}
		}
	}
	// SRV answers carry the targets' addresses.
	r := query(t, addr, "_pg._tcp.db.default.svc.cluster.local", dns.TypeSRV, "udp")
	if len(r.Extra) != 3 {
		t.Errorf("SRV additional section has %d records, want 3", len(r.Extra))
	}
}

// TestForwardCache checks that forwarded answers are cached for their TTL,
// negative ones for the SOA's negative TTL, and that TTLs count down.
func TestForwardCache(t *testing.T) {
	up := startUpstream(t)
	s, addr := startServer(t, []string{up.addr}, nil)
	clock := time.Now()
	s.fwd.cache.now = func() time.Time { return clock }

	for range 3 {
		query(t, addr, "www.example.org", dns.TypeA, "udp")
		query(t, addr, "missing.example.org", dns.TypeA, "udp")
		query(t, addr, "www.example.org", dns.TypeAAAA, "udp") // NODATA upstream
	}
	for _, k := range []string{"www.example.org./A", "missing.example.org./A", "www.example.org./AAAA"} {
		if n := up.count(k); n != 1 {
			t.Errorf("%s asked upstream %d times, want 1 (cached)", k, n)
		}
	}
	clock = clock.Add(100 * time.Second)
	r := query(t, addr, "www.example.org", dns.TypeA, "udp")
	if ttl := r.Answer[0].Header().Ttl; ttl != 200 {
		t.Errorf("cached TTL after 100 s = %d, want 200", ttl)
	}
	// The negative TTL is min(SOA TTL 600, minimum 60): expired by now.
	query(t, addr, "missing.example.org", dns.TypeA, "udp")
	if n := up.count("missing.example.org./A"); n != 2 {
		t.Errorf("negative answer asked upstream %d times after its TTL, want 2", n)
	}
	clock = clock.Add(201 * time.Second)
	query(t, addr, "www.example.org", dns.TypeA, "udp")
	if n := up.count("www.example.org./A"); n != 2 {
		t.Errorf("positive answer asked upstream %d times after its TTL, want 2", n)
	}
}

// TestOffline: with no upstream and no API server reachable, cluster names
// still resolve from local state; other names fail with SERVFAIL.
func TestOffline(t *testing.T) {
	_, addr := startServer(t, []string{"127.0.0.1:1"}, nil)
	r := query(t, addr, "web.default.svc.cluster.local", dns.TypeA, "udp")
	if !slices.Equal(answers(r), []string{"A 10.214.100.1"}) {
		t.Fatalf("offline cluster answer: %v", answers(r))
	}
	r = query(t, addr, "www.example.org", dns.TypeA, "udp")
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("offline external name: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}

// TestGoResolver resolves through Go's net.Resolver pointed at the server.
func TestGoResolver(t *testing.T) {
	up := startUpstream(t)
	_, addr := startServer(t, []string{up.addr}, nil)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ctx := context.Background()
	hosts, err := r.LookupHost(ctx, "web.default.svc.cluster.local.")
	if err != nil || !slices.Equal(hosts, []string{"10.214.100.1"}) {
		t.Errorf("LookupHost: %v %v", hosts, err)
	}
	hosts, err = r.LookupHost(ctx, "db.default.svc.cluster.local.")
	sort.Strings(hosts)
	if err != nil || !slices.Equal(hosts, []string{"10.214.5.1", "10.214.5.2", "10.214.5.4"}) {
		t.Errorf("LookupHost headless: %v %v", hosts, err)
	}
	cname, srvs, err := r.LookupSRV(ctx, "pg", "tcp", "db.default.svc.cluster.local.")
	if err != nil || len(srvs) != 3 || cname != "_pg._tcp.db.default.svc.cluster.local." {
		t.Errorf("LookupSRV: %s %v %v", cname, srvs, err)
	}
	target, err := r.LookupCNAME(ctx, "ext.default.svc.cluster.local.")
	if err != nil || target != "www.example.org." {
		t.Errorf("LookupCNAME: %q %v", target, err)
	}
	names, err := r.LookupAddr(ctx, "10.214.100.1")
	if err != nil || !slices.Equal(names, []string{"web.default.svc.cluster.local."}) {
		t.Errorf("LookupAddr: %v %v", names, err)
	}
	_, err = r.LookupHost(ctx, "nope.default.svc.cluster.local.")
	var de *net.DNSError
	if !errors.As(err, &de) || !de.IsNotFound {
		t.Errorf("LookupHost of a missing Service: %v, want not found", err)
	}
	ips, err := r.LookupNetIP(ctx, "ip6", "v6.default.svc.cluster.local.")
	if err != nil || len(ips) != 1 || ips[0] != netip.MustParseAddr("fd00:214::1") {
		t.Errorf("LookupNetIP ip6: %v %v", ips, err)
	}
}

// TestSearchPathNdots runs Go's stub resolver in a child process inside a
// network namespace whose /etc/resolv.conf is the one ResolvConf renders for
// a ClusterFirst pod, and checks the search-path walk that ndots:5 causes.
func TestSearchPathNdots(t *testing.T) {
	testnet.RequireRoot(t)
	up := startUpstream(t)
	var mu sync.Mutex
	var asked []string
	s, err := New(Config{Upstreams: []string{up.addr}, Logger: quietLogger(), OnQuery: func(name string, qtype uint16, _ int, _ bool) {
		if qtype == dns.TypeA {
			mu.Lock()
			asked = append(asked, strings.ToLower(name))
			mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	clusterState(s)

	ns := testnet.NewNetns(t, "dns")
	var pc net.PacketConn
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:53"); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", "127.0.0.1:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, pc, ln); close(done) }()
	defer func() { cancel(); <-done }()

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "client"}}
	conf, err := ResolvConf(pod, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, "cluster.local", HostResolvConf{Searches: []string{"corp.example"}})
	if err != nil {
		t.Fatal(err)
	}
	wantConf := "search default.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 127.0.0.1\noptions ndots:5\n"
	if conf != wantConf {
		t.Fatalf("resolv.conf:\n%s\nwant:\n%s", conf, wantConf)
	}
	// `ip netns exec` bind-mounts /etc/netns/<name>/resolv.conf over
	// /etc/resolv.conf for the command it runs.
	etc := filepath.Join("/etc/netns", ns.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(etc)
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	names := []string{"web", "web.other", "db-0.db", "www.example.org", "x1.x2.x3.x4.x5.example", "nope"}
	cmd := exec.Command("ip", "netns", "exec", ns.Name, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(names, ","), "GODEBUG=netdns=go")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("resolver child: %v\n%s", err, out)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
		}
	}
	want := map[string]string{
		"web":                    "10.214.100.1", // via default.svc.cluster.local
		"web.other":              "10.214.100.2", // via svc.cluster.local
		"db-0.db":                "10.214.5.1",
		"www.example.org":        "93.184.216.34", // search list exhausted, then absolute
		"x1.x2.x3.x4.x5.example": "198.51.100.5",  // 5 dots ≥ ndots: absolute first
		"nope":                   "ERR",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("lookup %q = %q, want %q", k, got[k], v)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var walk []string
	for _, n := range asked {
		if strings.HasPrefix(n, "www.example.org.") {
			walk = append(walk, n)
		}
	}
	wantWalk := []string{
		"www.example.org.default.svc.cluster.local.", "www.example.org.svc.cluster.local.",
		"www.example.org.cluster.local.", "www.example.org.corp.example.", "www.example.org.",
	}
	if !slices.Equal(walk, wantWalk) {
		t.Errorf("ndots:5 search walk for www.example.org:\n got %v\nwant %v", walk, wantWalk)
	}
	for _, n := range asked {
		if strings.HasPrefix(n, "x1.") {
			if n != "x1.x2.x3.x4.x5.example." {
				t.Errorf("a name with 5 dots was first tried as %s, want the absolute name", n)
			}
			break
		}
	}
}

func TestResolvConfPolicies(t *testing.T) {
	dnsIP := []netip.Addr{netip.MustParseAddr("10.214.100.10")}
	host := HostResolvConf{Nameservers: []string{"192.0.2.1"}, Searches: []string{"lan"}, Options: []string{"edns0"}}
	cases := []struct {
		name string
		spec corev1.PodSpec
		want string
	}{
		{"ClusterFirst", corev1.PodSpec{}, "search ns1.svc.cluster.local svc.cluster.local cluster.local lan\nnameserver 10.214.100.10\noptions ndots:5\n"},
		{"HostNetworkFallsBackToDefault", corev1.PodSpec{HostNetwork: true}, "search lan\nnameserver 192.0.2.1\noptions edns0\n"},
		{"ClusterFirstWithHostNet", corev1.PodSpec{HostNetwork: true, DNSPolicy: corev1.DNSClusterFirstWithHostNet}, "search ns1.svc.cluster.local svc.cluster.local cluster.local lan\nnameserver 10.214.100.10\noptions ndots:5\n"},
		{"Default", corev1.PodSpec{DNSPolicy: corev1.DNSDefault}, "search lan\nnameserver 192.0.2.1\noptions edns0\n"},
		{"NoneWithConfig", corev1.PodSpec{DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"1.2.3.4"}, Searches: []string{"ns1.svc.cluster.local", "my.dns.search.suffix"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("2")}, {Name: "edns0"}}}},
			"search ns1.svc.cluster.local my.dns.search.suffix\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"},
		{"ClusterFirstMerge", corev1.PodSpec{DNSConfig: &corev1.PodDNSConfig{
			Searches: []string{"svc.cluster.local", "extra"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}}}},
			"search ns1.svc.cluster.local svc.cluster.local cluster.local lan extra\nnameserver 10.214.100.10\noptions ndots:1\n"},
	}
	for _, c := range cases {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1"}, Spec: c.spec}
		got, err := ResolvConf(pod, dnsIP, "", host)
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	if _, err := ResolvConf(&corev1.Pod{Spec: corev1.PodSpec{DNSPolicy: corev1.DNSNone}}, dnsIP, "", host); err == nil {
		t.Error("dnsPolicy None without nameservers must fail")
	}
}

// TestWaitForState: until SetReady the cluster zone gets SERVFAIL (which
// resolvers retry and do not cache), not an NXDOMAIN for Services the
// server has not been given yet; other names are forwarded meanwhile. An
// empty, non-nil upstream list forwards nothing.
func TestWaitForState(t *testing.T) {
	up := startUpstream(t)
	s, err := New(Config{Upstreams: []string{up.addr}, Logger: quietLogger(), WaitForState: true})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(name string) *dns.Msg {
		req := new(dns.Msg)
		req.SetQuestion(name, dns.TypeA)
		return s.Answer(req)
	}
	if r := ask("web.default.svc.cluster.local."); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("cluster name before SetReady: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if r := ask("www.example.org."); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Errorf("forwarded name before SetReady: %s %v", dns.RcodeToString[r.Rcode], answers(r))
	}
	clusterState(s)
	s.SetReady()
	if r := ask("web.default.svc.cluster.local."); !slices.Equal(answers(r), []string{"A 10.214.100.1"}) {
		t.Errorf("cluster name after SetReady: %s %v", dns.RcodeToString[r.Rcode], answers(r))
	}
	if r := ask("nothere.default.svc.cluster.local."); r.Rcode != dns.RcodeNameError {
		t.Errorf("unknown Service after SetReady: %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}

	none, err := New(Config{Upstreams: []string{}, ResolvConfPath: "/nonexistent", Logger: quietLogger()})
	if err != nil {
		t.Fatalf("New with an empty upstream list read the resolv.conf: %v", err)
	}
	req := new(dns.Msg)
	req.SetQuestion("www.example.org.", dns.TypeA)
	if r := none.Answer(req); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("no upstreams: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}
