package nodes

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/controllers/nodelifecycle"
	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// eventually polls cond for up to five seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func zoneNode(name, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if zone != "" {
		n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
	}
	return n
}

func digest(t *testing.T, site string, members ...sitedigest.Member) []byte {
	t.Helper()
	d := sitedigest.Digest{Site: site, Members: members}
	d.Normalize()
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func member(node string, st sitedigest.State, inc uint32) sitedigest.Member {
	return sitedigest.Member{Node: node, State: st, Incarnation: inc}
}

// TestSitesPeers: digests of a site's members make Peers tell Alive and
// Dead while a member of the site is heard; a digest from a node of
// another site is rejected and counted; stale reporters cannot bring a
// dead node back, a node back at a higher incarnation is alive; members
// that are not nodes of the site are ignored.
func TestSitesPeers(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	now := time.Now()
	cfg := Config{Storage: st, Logger: quiet, Now: func() time.Time { return now }}
	nodesKind := mustKindT(t, "nodes")
	for _, n := range []*corev1.Node{zoneNode("a1", "A"), zoneNode("a2", "A"), zoneNode("a3", "A"), zoneNode("b1", "B"), zoneNode("c1", "")} {
		if _, err := st.Create(ctx, nodesKind, "", n, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	zones := NewZones(cfg)
	leases := NewLeases(cfg)
	sites := NewSites(SitesConfig{Zones: zones, Live: leases.Alive, Logger: quiet})
	go zones.Run(ctx)
	if !zones.WaitSynced(ctx) {
		t.Fatal("zones not synced")
	}
	peers := func(want map[string]nodelifecycle.PeerView) {
		t.Helper()
		for n, w := range want {
			if got := sites.Peers(n); got != w {
				t.Errorf("Peers(%s) = %v, want %v", n, got, w)
			}
		}
	}
	stats := func(want SiteDigestStats) {
		t.Helper()
		if got := sites.Stats(); got != want {
			t.Fatalf("stats %+v, want %+v", got, want)
		}
	}
	const U, Alive, Dead = nodelifecycle.PeersUnknown, nodelifecycle.PeersSeeAlive, nodelifecycle.PeersSeeDead

	peers(map[string]nodelifecycle.PeerView{"a1": U, "a2": U, "c1": U, "nope": U})
	view := digest(t, "A", member("a1", sitedigest.Alive, 1), member("a2", sitedigest.Dead, 3),
		member("a3", sitedigest.Alive, 2), member("b1", sitedigest.Alive, 1), member("x9", sitedigest.Alive, 1))
	sites.Report("a1", view)
	stats(SiteDigestStats{Accepted: 1, IgnoredMembers: 2})
	// No member of A is heard by the hub: the view is no evidence.
	peers(map[string]nodelifecycle.PeerView{"a2": U, "a3": U})
	leases.Connected("a1")
	peers(map[string]nodelifecycle.PeerView{"a1": Alive, "a2": Dead, "a3": Alive, "b1": U, "c1": U, "x9": U})

	sites.Report("a1", view)
	stats(SiteDigestStats{Accepted: 1, Duplicate: 1, IgnoredMembers: 2})

	// b1 is in site B: its word on A is refused.
	sites.Report("b1", digest(t, "A", member("a2", sitedigest.Alive, 9)))
	sites.Report("a1", []byte("not a digest"))
	stats(SiteDigestStats{Accepted: 1, Duplicate: 1, Rejected: 2, IgnoredMembers: 2})
	peers(map[string]nodelifecycle.PeerView{"a2": Dead})

	// a3 has an older view of a2: alive at the incarnation its death was
	// seen at. It does not bring a2 back; a2 rejoining does.
	sites.Report("a3", digest(t, "A", member("a2", sitedigest.Alive, 3), member("a3", sitedigest.Suspect, 2)))
	peers(map[string]nodelifecycle.PeerView{"a2": Dead, "a3": U})
	sites.Report("a3", digest(t, "A", member("a2", sitedigest.Alive, 4), member("a3", sitedigest.Left, 2)))
	peers(map[string]nodelifecycle.PeerView{"a2": Alive, "a3": U})
	stats(SiteDigestStats{Accepted: 3, Duplicate: 1, Rejected: 2, IgnoredMembers: 2})

	// The site goes dark: no evidence.
	leases.Disconnected("a1")
	peers(map[string]nodelifecycle.PeerView{"a1": U, "a2": U})
	leases.Connected("a3")
	peers(map[string]nodelifecycle.PeerView{"a1": Alive, "a2": Alive})

	// A node reporting before its Node is registered is refused, and
	// taken in once it is; so is a member the digest named early.
	early := digest(t, "A", member("a4", sitedigest.Alive, 1), member("a5", sitedigest.Dead, 1), member("a1", sitedigest.Dead, 7))
	sites.Report("a4", early)
	stats(SiteDigestStats{Accepted: 3, Duplicate: 1, Rejected: 3, IgnoredMembers: 2})
	peers(map[string]nodelifecycle.PeerView{"a1": Alive})
	if _, err := st.Create(ctx, nodesKind, "", zoneNode("a4", "A"), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the held digest taken in", func() bool { return sites.Peers("a1") == Dead })
	stats(SiteDigestStats{Accepted: 4, Duplicate: 1, Rejected: 3, IgnoredMembers: 3})
	if _, err := st.Create(ctx, nodesKind, "", zoneNode("a5", "A"), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a member registered late", func() bool { return sites.Peers("a5") == Dead })

	// A node moving to another site leaves its old site's view.
	if _, err := st.GuaranteedUpdate(ctx, nodesKind, "", "a2", storage.Options{}, func(cur runtime.Object) (runtime.Object, error) {
		n := cur.(*corev1.Node)
		n.Labels[corev1.LabelTopologyZone] = "B"
		return n, nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a2 in site B", func() bool { z, _ := zones.Zone("a2"); return z == "B" })
	peers(map[string]nodelifecycle.PeerView{"a2": U})

	reg := prometheus.NewRegistry()
	reg.MustRegister(sites.Collectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var m strings.Builder
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&m, f); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{
		`tether_site_digests_total{result="accepted"} 4`,
		`tether_site_digests_total{result="duplicate"} 1`,
		`tether_site_digests_total{result="rejected"} 3`,
	} {
		if !strings.Contains(m.String(), want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, m.String())
		}
	}
}

// TestSiteKeyAuthorizer: a node reads (get, and list or watch by name)
// its own site's gossip key Secret, and no other site's; it writes none.
func TestSiteKeyAuthorizer(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Storage: st, Logger: quiet}
	nodesKind := mustKindT(t, "nodes")
	for _, n := range []*corev1.Node{zoneNode("a1", "site-a"), zoneNode("b1", "Site_B"), zoneNode("c1", "")} {
		if _, err := st.Create(ctx, nodesKind, "", n, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	zones := NewZones(cfg)
	go zones.Run(ctx)
	a := NewAuthorizer(cfg)
	a.Zones = zones
	go a.Run(ctx)
	keyA, keyB := sitedigest.KeySecretName("site-a"), sitedigest.KeySecretName("Site_B")
	res := func(verb, ns, name, fieldSel string) apiserver.Attributes {
		return apiserver.Attributes{Verb: verb, Resource: true, Version: "v1", Kind: "secrets", Namespace: ns, Name: name, FieldSelector: fieldSel}
	}
	ns := sitedigest.KeySecretNamespace
	for _, c := range []struct {
		node string
		at   apiserver.Attributes
		ok   bool
	}{
		{"a1", res("get", ns, keyA, ""), true},
		{"a1", res("list", ns, "", "metadata.name="+keyA), true},
		{"a1", res("watch", ns, "", "metadata.name="+keyA), true},
		{"b1", res("get", ns, keyB, ""), true},
		{"a1", res("get", ns, keyB, ""), false},
		{"b1", res("get", ns, keyA, ""), false},
		{"b1", res("watch", ns, "", "metadata.name="+keyA), false},
		{"a1", res("list", ns, "", ""), false},
		{"a1", res("update", ns, keyA, ""), false},
		{"a1", res("delete", ns, keyA, ""), false},
		{"a1", res("get", "default", keyA, ""), false},
		{"c1", res("get", ns, sitedigest.KeySecretName(""), ""), false},
		// A node that registered a moment ago (the store is read).
		{"a9", res("get", ns, keyA, ""), false},
	} {
		err := a.Authorize(nodeUser(c.node), c.at)
		if c.ok && err != nil {
			t.Errorf("%s: %s %s/%s (%s) refused: %v", c.node, c.at.Verb, c.at.Namespace, c.at.Name, c.at.FieldSelector, err)
		}
		if !c.ok {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %s %s/%s (%s) = %v, want 403", c.node, c.at.Verb, c.at.Namespace, c.at.Name, c.at.FieldSelector, err)
				continue
			}
			if c.at.Verb == "get" && !strings.Contains(err.Error(), "no relationship found between node '"+c.node+"' and this object") {
				t.Errorf("%s: message %q", c.node, err)
			}
		}
	}
	want := `secrets "` + keyB + `" is forbidden: User "system:node:a1" cannot get resource "secrets" in API group "" in the namespace "kube-system": no relationship found between node 'a1' and this object`
	if err := a.Authorize(nodeUser("a1"), res("get", ns, keyB, "")); err == nil || err.Error() != want {
		t.Errorf("message:\n got %v\nwant %s", err, want)
	}
	if _, err := st.Create(ctx, nodesKind, "", zoneNode("a9", "site-a"), storage.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Authorize(nodeUser("a9"), res("get", ns, keyA, "")); err != nil {
		t.Errorf("new node of site-a refused its site's keys: %v", err)
	}
}

// TestSitesProbeBeforeDead shows that a node its site says is dead reads
// dead only once the hub's own probe of it goes unanswered, and that a
// node that answers is not taken as dead on its peers' word.
func TestSitesProbeBeforeDead(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Storage: st, Logger: quiet}
	nodesKind := mustKindT(t, "nodes")
	for _, n := range []*corev1.Node{zoneNode("a1", "A"), zoneNode("gone", "A"), zoneNode("lan-cut", "A")} {
		if _, err := st.Create(ctx, nodesKind, "", n, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	zones := NewZones(cfg)
	leases := NewLeases(cfg)
	probed := make(chan string, 10)
	sites := NewSites(SitesConfig{Zones: zones, Live: leases.Alive, Logger: quiet,
		Probe: func(ctx context.Context, node string) error {
			probed <- node
			if node == "lan-cut" {
				return nil // its tunnel still answers
			}
			<-ctx.Done()
			return ctx.Err()
		},
		ProbeTimeout: 100 * time.Millisecond,
	})
	go zones.Run(ctx)
	if !zones.WaitSynced(ctx) {
		t.Fatal("zones not synced")
	}
	leases.Connected("a1")
	sites.Report("a1", digest(t, "A", member("a1", sitedigest.Alive, 1), member("gone", sitedigest.Dead, 2), member("lan-cut", sitedigest.Dead, 1)))

	for _, n := range []string{"gone", "lan-cut"} {
		if got := sites.Peers(n); got != nodelifecycle.PeersUnknown {
			t.Fatalf("Peers(%s) before its probe = %v, want Unknown", n, got)
		}
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case n := <-probed:
			seen[n] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("probes started: %v", seen)
		}
	}
	eventually(t, "gone read dead after its probe went unanswered", func() bool {
		return sites.Peers("gone") == nodelifecycle.PeersSeeDead
	})
	if got := sites.Peers("lan-cut"); got != nodelifecycle.PeersUnknown {
		t.Fatalf("Peers(lan-cut), which answered its probe = %v, want Unknown", got)
	}
	select {
	case n := <-probed:
		t.Fatalf("%s probed again within %v", n, probeAgain)
	default:
	}
	// Back at a higher incarnation: alive, and a later death is probed
	// afresh.
	sites.Report("a1", digest(t, "A", member("a1", sitedigest.Alive, 1), member("gone", sitedigest.Alive, 3), member("lan-cut", sitedigest.Dead, 1)))
	if got := sites.Peers("gone"); got != nodelifecycle.PeersSeeAlive {
		t.Fatalf("Peers(gone) after it came back = %v", got)
	}
	sites.Report("a1", digest(t, "A", member("a1", sitedigest.Alive, 1), member("gone", sitedigest.Dead, 3), member("lan-cut", sitedigest.Dead, 1)))
	if got := sites.Peers("gone"); got != nodelifecycle.PeersUnknown {
		t.Fatalf("Peers(gone) dead again before a new probe = %v", got)
	}
}

// TestSitesHeartbeatOverridesProbe: a node its site says is dead whose
// probe went unanswered is still not dead when the hub hears its
// heartbeat after the probe started (an overloaded agent answers late);
// one whose last heartbeat came before the probe is dead.
func TestSitesHeartbeatOverridesProbe(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Storage: st, Logger: quiet}
	nodesKind := mustKindT(t, "nodes")
	for _, n := range []*corev1.Node{zoneNode("a1", "A"), zoneNode("slow", "A"), zoneNode("gone", "A")} {
		if _, err := st.Create(ctx, nodesKind, "", n, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	zones := NewZones(cfg)
	leases := NewLeases(cfg)
	var mu sync.Mutex
	beats := map[string]time.Time{"gone": time.Now().Add(-time.Minute), "slow": time.Now().Add(-10 * time.Second)}
	sites := NewSites(SitesConfig{Zones: zones, Live: leases.Alive, Logger: quiet,
		Probe:        func(ctx context.Context, node string) error { <-ctx.Done(); return ctx.Err() },
		ProbeTimeout: 50 * time.Millisecond,
		LastHeartbeat: func(node string) time.Time {
			mu.Lock()
			defer mu.Unlock()
			return beats[node]
		},
	})
	go zones.Run(ctx)
	if !zones.WaitSynced(ctx) {
		t.Fatal("zones not synced")
	}
	leases.Connected("a1")
	sites.Report("a1", digest(t, "A", member("a1", sitedigest.Alive, 1), member("slow", sitedigest.Dead, 2), member("gone", sitedigest.Dead, 2)))
	sites.Peers("slow")
	sites.Peers("gone")
	eventually(t, "gone read dead after its probe went unanswered", func() bool {
		return sites.Peers("gone") == nodelifecycle.PeersSeeDead
	})
	// The slow node's heartbeat arrives after its probe started.
	mu.Lock()
	beats["slow"] = time.Now()
	mu.Unlock()
	time.Sleep(100 * time.Millisecond) // its probe has timed out
	if got := sites.Peers("slow"); got != nodelifecycle.PeersUnknown {
		t.Fatalf("Peers(slow), heard after its probe started = %v, want Unknown", got)
	}
}
