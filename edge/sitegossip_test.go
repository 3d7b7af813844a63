package edge_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// freePort returns a TCP port free on loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// siteView returns a's view of its site as "node=State" pairs.
func siteView(a *runningAgent) string {
	s := a.Site()
	if s == nil {
		return "no site"
	}
	var out []string
	for _, m := range s.View().Members {
		out = append(out, m.Node+"="+m.State.String())
	}
	return strings.Join(out, ",")
}

// TestSiteGossipWiring runs three agents of one site against a real hub:
// they publish their gossip port, learn each other from the hub's Nodes,
// wait for the site key Secret before gossiping, form the site, and the
// one connected member with the lowest name reports the view. After a
// reboot with the hub down, the site forms again from the local state.
func TestSiteGossipWiring(t *testing.T) {
	// Without the site key controller, which would make the site's key
	// as soon as its nodes exist: the test makes it, after checking that
	// nothing gossips before.
	e := startHubArgs(t, "--controllers=*,-sitekeys")
	port := freePort(t)
	const zone = "shop-7"
	names := []string{"edge-s0", "edge-s1", "edge-s2"}
	cfgs := make([]edge.Config, len(names))
	agents := make([]*runningAgent, len(names))
	for i, name := range names {
		ip := fmt.Sprintf("127.0.0.%d", 70+i)
		cfgs[i] = edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: name, Zone: zone,
			NodeIP: netip.MustParseAddr(ip), GossipPort: port, GossipBind: ip}
		agents[i] = startAgent(t, cfgs[i])
	}
	ctx := context.Background()
	for _, name := range names {
		waitNodeReady(t, e, name)
		n, err := e.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Annotations[edge.AnnotationGossipPort]; got != strconv.Itoa(port) {
			t.Errorf("node %s: %s = %q, want %d", name, edge.AnnotationGossipPort, got, port)
		}
	}
	// No key yet: nothing listens.
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.70:%d", port)); err == nil {
		c.Close()
		t.Error("gossip listens before the site key Secret exists")
	}

	// The site key Secret, as the hub's site key controller makes it.
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sitedigest.KeySecretName(zone), Namespace: sitedigest.KeySecretNamespace},
		Type:       sitedigest.KeySecretType,
		Data:       map[string][]byte{sitedigest.KeySecretKey: bytes.Repeat([]byte{7}, 32)},
	}
	if _, err := e.client.CoreV1().Secrets(sec.Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	allAlive := func(a *runningAgent) bool {
		s := a.Site()
		if s == nil {
			return false
		}
		v := s.View()
		if len(v.Members) != len(names) {
			return false
		}
		for _, m := range v.Members {
			if m.State != sitedigest.Alive {
				return false
			}
		}
		return true
	}
	start := time.Now()
	for i, a := range agents {
		eventually(t, 20*time.Second, names[i]+" sees the site alive", func() (bool, string) { return allAlive(a), siteView(a) })
	}
	t.Logf("site formed %v after its key Secret appeared", time.Since(start).Round(time.Millisecond))

	// Exactly one sender, the lowest name, reports the view.
	eventually(t, 10*time.Second, "edge-s0 reports the view", func() (bool, string) {
		n, last := edge.SiteReports(agents[0].Agent)
		d, err := sitedigest.Unmarshal(last)
		return n > 0 && err == nil && len(d.Members) == 3 && d.Site == zone, fmt.Sprintf("%d reports, %v %v", n, d, err)
	})
	// The hub took it through the tunnel.
	eventually(t, 10*time.Second, "the hub accepts the site's digest", func() (bool, string) {
		m, err := e.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, l := range strings.Split(string(m), "\n") {
			if strings.HasPrefix(l, `tether_site_digests_total{result="accepted"} `) {
				return !strings.HasSuffix(l, " 0"), l
			}
		}
		return false, "no tether_site_digests_total"
	})
	for i := 1; i < len(agents); i++ {
		if n, _ := edge.SiteReports(agents[i].Agent); n != 0 || agents[i].Site().Sender() {
			t.Errorf("%s reported %d views: only edge-s0 sends", names[i], n)
		}
	}
	if v := edge.FollowedSiteView(agents[0].Agent); v != edge.SiteView(agents[0].Site()) {
		t.Errorf("the Service filter follows %v, not the node's site gossip", v)
	}
	st := agents[1].Stats()
	// Non-member refusals may happen while the site forms: a member
	// can hear of a peer before the hub told it of the peer's Node.
	if st.GossipMembers != 3 || st.GossipDroppedKey != 0 {
		t.Errorf("gossip stats: members %d, dropped for key %d", st.GossipMembers, st.GossipDroppedKey)
	}
	var m strings.Builder
	edge.WriteMetrics(agents[1].Agent, &m)
	for _, want := range []string{"tether_gossip_members 3\n", `tether_gossip_dropped_total{reason="key"} 0`,
		fmt.Sprintf(`tether_gossip_dropped_total{reason="non_member"} %d`, agents[1].Stats().GossipDroppedNonMember)} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// The hub marks a connected node Unknown (as its node lifecycle
	// controller does on a site's word): the agent sees it through its
	// site's Node watch and writes its status again at its next check.
	n, err := e.client.CoreV1().Nodes().Get(ctx, "edge-s1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
			n.Status.Conditions[i].Message = "Site peers agree the node is gone."
		}
	}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	marked := time.Now()
	waitNodeReady(t, e, "edge-s1")
	t.Logf("edge-s1 reported Ready %v after the hub marked it Unknown", time.Since(marked).Round(time.Millisecond))

	// A reboot of the whole site with the hub down: peers and keys come
	// from the local state.
	for _, a := range agents {
		a.stop(t)
	}
	e.hub.Stop()
	start = time.Now()
	for i := range agents {
		cfgs[i].Token = ""
		agents[i] = startAgent(t, cfgs[i])
	}
	for i, a := range agents {
		eventually(t, 20*time.Second, names[i]+" sees the site alive offline", func() (bool, string) { return allAlive(a), siteView(a) })
	}
	t.Logf("site formed again offline %v after the agents restarted", time.Since(start).Round(time.Millisecond))
	for _, a := range agents {
		if a.Site().Sender() {
			t.Errorf("%s sends with no tunnel up", a.NodeName())
		}
		// Second start of each: incarnations carry generation 2.
		for _, m := range a.Site().View().Members {
			if m.Incarnation>>16 != 2 {
				t.Errorf("%s sees %s at incarnation %#x, want generation 2", a.NodeName(), m.Node, m.Incarnation)
			}
		}
	}
}
