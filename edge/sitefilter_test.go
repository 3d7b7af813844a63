package edge

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/dataplane/dns"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// fakeSiteView is a SiteView whose changes the test makes; it counts the
// change notifications it gave.
type fakeSiteView struct {
	mu      sync.Mutex
	d       sitedigest.Digest
	ch      chan struct{}
	changes int
}

func newFakeSiteView(site string, members ...sitedigest.Member) *fakeSiteView {
	v := &fakeSiteView{ch: make(chan struct{})}
	v.d = sitedigest.Digest{Site: site, Members: members}
	v.d.Normalize()
	return v
}

func (v *fakeSiteView) View() sitedigest.Digest {
	v.mu.Lock()
	defer v.mu.Unlock()
	return sitedigest.Digest{Site: v.d.Site, Members: slices.Clone(v.d.Members)}
}

func (v *fakeSiteView) Changed() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ch
}

// set changes one member's state and notifies once.
func (v *fakeSiteView) set(node string, st sitedigest.State) {
	v.mu.Lock()
	defer v.mu.Unlock()
	ms := slices.Clone(v.d.Members)
	i := slices.IndexFunc(ms, func(m sitedigest.Member) bool { return m.Node == node })
	if i < 0 {
		ms = append(ms, sitedigest.Member{Node: node, State: st, Incarnation: 1})
	} else {
		ms[i].State = st
		if st == sitedigest.Alive {
			ms[i].Incarnation++ // a node refutes its death with a new incarnation
		}
	}
	v.d.Members = ms
	v.d.Normalize()
	close(v.ch)
	v.ch = make(chan struct{})
	v.changes++
}

// FakeSiteView is a SiteView whose changes a test makes, for the tests
// outside the package.
type FakeSiteView = fakeSiteView

// NewFakeSiteView returns a view of site with members.
func NewFakeSiteView(site string, members ...sitedigest.Member) *FakeSiteView {
	return newFakeSiteView(site, members...)
}

// Set changes one member's state and notifies once.
func (v *fakeSiteView) Set(node string, st sitedigest.State) { v.set(node, st) }

// recordingSink keeps the slices it is given and counts the calls, as the
// dataplane would see them.
type recordingSink struct {
	mu      sync.Mutex
	slices  map[types.NamespacedName]*discoveryv1.EndpointSlice
	history map[types.NamespacedName][][]string // addresses of each version given
	upserts int
}

func newRecordingSink() *recordingSink {
	return &recordingSink{
		slices:  map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		history: map[types.NamespacedName][][]string{},
	}
}

func (r *recordingSink) UpsertService(*corev1.Service) {}
func (r *recordingSink) DeleteService(_, _ string)     {}
func (r *recordingSink) DeleteEndpointSlice(ns, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.slices, types.NamespacedName{Namespace: ns, Name: name})
}

func (r *recordingSink) UpsertEndpointSlice(s *discoveryv1.EndpointSlice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	r.slices[k] = s
	r.history[k] = append(r.history[k], sliceAddrs(s))
	r.upserts++
}

// addrs returns the addresses of the slice name as last given.
func (r *recordingSink) addrs(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slices[types.NamespacedName{Namespace: "default", Name: name}]
	if s == nil {
		return nil
	}
	return sliceAddrs(s)
}

func (r *recordingSink) calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.upserts
}

func sliceAddrs(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, ep := range s.Endpoints {
		out = append(out, ep.Addresses...)
	}
	sort.Strings(out)
	return out
}

func testEndpoint(ip, node, hostname string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: &node}
	if hostname != "" {
		ep.Hostname = &hostname
	}
	return ep
}

func testSlice(name, svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	port, proto := int32(8080), corev1.ProtocolTCP
	pname := "http"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
}

// lookup asks the DNS server for name's A records.
func lookup(t *testing.T, srv *dns.Server, name string) (int, []string) {
	t.Helper()
	req := new(mdns.Msg)
	req.SetQuestion(name, mdns.TypeA)
	m := srv.Answer(req)
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*mdns.A); ok {
			out = append(out, a.A.String())
		}
	}
	sort.Strings(out)
	return m.Rcode, out
}

// waitSite polls f for up to two seconds: the filter follows a view change
// in its own goroutine.
func waitSite(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		ok, got := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %s", what, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func equalAddrs(got []string, want ...string) (bool, string) {
	sort.Strings(want)
	return slices.Equal(got, want), "[" + strings.Join(got, " ") + "]"
}

// TestSiteFilterLeavesOutDeadPeers feeds the filter a Service with
// endpoints on three nodes of the site and one of another site, a headless
// Service with a named pod on each node of the site, and a fake gossip
// view; the sinks are a recorder (what the dataplane is given) and a real
// DNS server. A node the view sees Dead loses its endpoints in both after
// one change notification, and gets them back when it is Alive again;
// Suspect and Left nodes, nodes of other sites and the node itself keep
// theirs.
func TestSiteFilterLeavesOutDeadPeers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := newRecordingSink()
	srv, err := dns.New(dns.Config{Upstreams: []string{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var leftOut atomic.Int64
	f := newSiteFilter("node-a", []serviceSink{rec, srv}, slog.New(slog.NewTextHandler(io.Discard, nil)), &leftOut)
	view := newFakeSiteView("lab",
		sitedigest.Member{Node: "node-a", State: sitedigest.Alive, Incarnation: 1},
		sitedigest.Member{Node: "node-b", State: sitedigest.Alive, Incarnation: 1},
		sitedigest.Member{Node: "node-c", State: sitedigest.Alive, Incarnation: 1},
	)
	done := make(chan struct{})
	go func() { defer close(done); f.follow(ctx, view) }()
	defer func() { cancel(); <-done }()

	f.UpsertService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
	f.UpsertService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
	web := testSlice("web-1", "web",
		testEndpoint("10.0.1.1", "node-a", ""), testEndpoint("10.0.2.1", "node-b", ""),
		testEndpoint("10.0.3.1", "node-c", ""), testEndpoint("10.9.0.1", "far-x", ""))
	f.UpsertEndpointSlice(web)
	f.UpsertEndpointSlice(testSlice("db-1", "db",
		testEndpoint("10.0.1.2", "node-a", "db-0"), testEndpoint("10.0.2.2", "node-b", "db-1"),
		testEndpoint("10.0.3.2", "node-c", "db-2")))
	f.UpsertEndpointSlice(testSlice("web-2", "web", testEndpoint("10.0.3.3", "node-c", "")))

	allWeb := []string{"10.0.1.1", "10.0.2.1", "10.0.3.1", "10.9.0.1"}
	allDB := []string{"10.0.1.2", "10.0.2.2", "10.0.3.2"}
	check := func(what string, webWant, dbWant []string, db1 bool) {
		t.Helper()
		waitSite(t, what+": dataplane's web-1", func() (bool, string) { return equalAddrs(rec.addrs("web-1"), webWant...) })
		waitSite(t, what+": DNS answer of db", func() (bool, string) {
			_, got := lookup(t, srv, "db.default.svc.cluster.local.")
			return equalAddrs(got, dbWant...)
		})
		rcode, got := lookup(t, srv, "db-1.db.default.svc.cluster.local.")
		if db1 && (rcode != mdns.RcodeSuccess || !slices.Equal(got, []string{"10.0.2.2"})) {
			t.Errorf("%s: db-1.db = %s %v, want 10.0.2.2", what, mdns.RcodeToString[rcode], got)
		}
		if !db1 && rcode != mdns.RcodeNameError {
			t.Errorf("%s: db-1.db = %s %v, want NXDOMAIN", what, mdns.RcodeToString[rcode], got)
		}
	}
	check("all alive", allWeb, allDB, true)

	// Suspect is not enough.
	calls := rec.calls()
	view.set("node-b", sitedigest.Suspect)
	time.Sleep(50 * time.Millisecond)
	check("node-b suspect", allWeb, allDB, true)
	if got := rec.calls(); got != calls {
		t.Errorf("a Suspect peer made %d slice upserts, want none", got-calls)
	}

	// Dead: gone from the dataplane and DNS after this one notification;
	// only the two slices with node-b's endpoints are given again.
	view.set("node-b", sitedigest.Dead)
	check("node-b dead", []string{"10.0.1.1", "10.0.3.1", "10.9.0.1"}, []string{"10.0.1.2", "10.0.3.2"}, false)
	if got := rec.calls() - calls; got != 2 {
		t.Errorf("node-b's death made %d slice upserts, want 2 (web-1 and db-1)", got)
	}
	if got := leftOut.Load(); got != 2 {
		t.Errorf("endpoints left out = %d, want 2", got)
	}
	if len(web.Endpoints) != 4 {
		t.Errorf("the watch's slice was modified: %d endpoints", len(web.Endpoints))
	}

	// A change of the slice while node-b is dead stays filtered.
	web2 := web.DeepCopy()
	web2.Endpoints = append(web2.Endpoints, testEndpoint("10.0.2.9", "node-b", ""), testEndpoint("10.0.1.9", "node-a", ""))
	f.UpsertEndpointSlice(web2)
	check("slice changed while node-b is dead", []string{"10.0.1.1", "10.0.1.9", "10.0.3.1", "10.9.0.1"},
		[]string{"10.0.1.2", "10.0.3.2"}, false)
	if got := leftOut.Load(); got != 3 {
		t.Errorf("endpoints left out = %d, want 3", got)
	}

	// Left (a clean goodbye) and the node itself are never left out; nor
	// are nodes the view does not know (far-x).
	view.set("node-c", sitedigest.Left)
	view.set("node-a", sitedigest.Dead)
	time.Sleep(50 * time.Millisecond)
	check("node-c left, node-a seen dead", []string{"10.0.1.1", "10.0.1.9", "10.0.3.1", "10.9.0.1"},
		[]string{"10.0.1.2", "10.0.3.2"}, false)
	if got := rec.addrs("web-2"); !slices.Equal(got, []string{"10.0.3.3"}) {
		t.Errorf("web-2 = %v, want node-c's endpoint", got)
	}

	// Alive again: back after one notification.
	view.set("node-b", sitedigest.Alive)
	check("node-b alive", []string{"10.0.1.1", "10.0.1.9", "10.0.2.1", "10.0.2.9", "10.0.3.1", "10.9.0.1"}, allDB, true)
	if got := leftOut.Load(); got != 0 {
		t.Errorf("endpoints left out = %d, want 0", got)
	}

	// Deleted slices are forgotten: a later death gives nothing again.
	f.DeleteEndpointSlice("default", "db-1")
	calls = rec.calls()
	view.set("node-b", sitedigest.Dead)
	check("db-1 deleted, node-b dead", []string{"10.0.1.1", "10.0.1.9", "10.0.3.1", "10.9.0.1"}, nil, false)
	if got := rec.calls() - calls; got != 1 {
		t.Errorf("node-b's death made %d slice upserts, want 1 (web-1)", got)
	}
}

// TestSiteFilterAgreesWithTheHub plays what happens when the hub is
// reachable: the gossip sees node-b dead, then the hub's node lifecycle
// takes node-b's pods out of the slices, then node-b comes back. The
// dataplane is never given node-b's endpoint again once it lost it.
func TestSiteFilterAgreesWithTheHub(t *testing.T) {
	rec := newRecordingSink()
	var leftOut atomic.Int64
	f := newSiteFilter("node-a", []serviceSink{rec}, slog.New(slog.NewTextHandler(io.Discard, nil)), &leftOut)
	alive := sitedigest.Digest{Site: "lab", Members: []sitedigest.Member{
		{Node: "node-a", State: sitedigest.Alive, Incarnation: 1},
		{Node: "node-b", State: sitedigest.Alive, Incarnation: 1},
	}}
	dead := sitedigest.Digest{Site: "lab", Members: []sitedigest.Member{
		{Node: "node-a", State: sitedigest.Alive, Incarnation: 1},
		{Node: "node-b", State: sitedigest.Dead, Incarnation: 1},
	}}
	back := sitedigest.Digest{Site: "lab", Members: []sitedigest.Member{
		{Node: "node-a", State: sitedigest.Alive, Incarnation: 1},
		{Node: "node-b", State: sitedigest.Alive, Incarnation: 2},
	}}
	f.setView(alive)
	s := testSlice("web-1", "web", testEndpoint("10.0.1.1", "node-a", ""), testEndpoint("10.0.2.1", "node-b", ""))
	f.UpsertEndpointSlice(s)
	f.setView(dead)
	f.setView(dead) // the same view again gives nothing
	// The hub marks node-b's pod not ready, then its replacement is
	// added on node-a and the original goes.
	s2 := s.DeepCopy()
	no := false
	s2.Endpoints[1].Conditions.Ready = &no
	f.UpsertEndpointSlice(s2)
	s3 := testSlice("web-1", "web", testEndpoint("10.0.1.1", "node-a", ""), testEndpoint("10.0.1.7", "node-a", ""))
	f.UpsertEndpointSlice(s3)
	f.setView(back)

	want := [][]string{
		{"10.0.1.1", "10.0.2.1"}, // as the hub said
		{"10.0.1.1"},             // node-b dead
		{"10.0.1.1"},             // the hub's not-ready endpoint stays out
		{"10.0.1.1", "10.0.1.7"}, // the replacement
	}
	got := rec.history[types.NamespacedName{Namespace: "default", Name: "web-1"}]
	if !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Errorf("web-1 as given to the dataplane: %v, want %v", got, want)
	}
	if n := leftOut.Load(); n != 0 {
		t.Errorf("endpoints left out = %d, want 0", n)
	}
}
