package edge

import (
	"bytes"
	"context"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/localstate"
	"github.com/tether-edge/tether/edge/site"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// The agent of a node with a zone is a member of its site's gossip cluster
// (edge/site). It learns its peers from the hub's Nodes of the same zone
// (their InternalIP and the port each publishes in AnnotationGossipPort)
// and the site's keys from the site key Secret; both are kept informers,
// so after a reboot with the hub out of reach the site forms again from
// the local state. The member that Sender() elects reports the site's view
// to the hub through the tunnel whenever it changes.

// AnnotationGossipPort is the Node annotation in which an agent publishes
// its site gossip port.
const AnnotationGossipPort = "site.tether.io/gossip-port"

// DefaultGossipPort is the site gossip port when Config.GossipPort is zero.
const DefaultGossipPort = site.DefaultPort

// Local state kinds and watches of the site gossip.
const (
	keptSiteNodes = "sitenodes"
	keptSiteKeys  = "sitekeys"
)

// siteGossip is the agent's membership of its site.
type siteGossip struct {
	a     *Agent
	site  *site.Site
	nodes cache.Store
	keys  cache.Store
	// changed is poked by the informers' handlers.
	changed chan struct{}
	ctrls   []cache.Controller
	// report is where the view goes: the tunnel client's Report.
	report func([]byte)
	// reports counts the views reported; lastReport is the latest.
	reports    atomic.Int64
	lastReport atomic.Pointer[[]byte]
}

// newSiteGossip prepares the site membership of a node with a zone, from
// the local state first. Run by Run after the API client exists.
func newSiteGossip(a *Agent) (*siteGossip, error) {
	s, err := site.New(site.Config{
		Site:          a.cfg.Zone,
		Node:          a.name,
		BindAddr:      a.cfg.GossipBind,
		BindPort:      a.cfg.GossipPort,
		AdvertiseAddr: advertiseAddr(a.nodeIP),
		Generation:    a.nextGeneration(),
		Log:           a.log,
	})
	if err != nil {
		return nil, err
	}
	g := &siteGossip{a: a, site: s, changed: make(chan struct{}, 1), report: a.tunnel.Report}
	poke := func(any) {
		select {
		case g.changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { g.ownNode(o); poke(o) },
		UpdateFunc: func(_, o any) { g.ownNode(o); poke(o) },
		DeleteFunc: poke,
	}

	nodes := a.client.Nodes()
	sel := labels.SelectorFromSet(labels.Set{LabelZone: a.cfg.Zone}).String()
	nlw := labelListWatch(sel, nodes.List, nodes.Watch)
	if a.local != nil {
		nlw.keep = &localstate.Spec{State: a.local.State, Kind: keptSiteNodes, Watch: keptSiteNodes, Changed: siteNodeChanged}
	}
	var nc, kc cache.Controller
	g.nodes, nc = newInformer(nlw, &corev1.Node{}, h)

	name := sitedigest.KeySecretName(a.cfg.Zone)
	secrets := a.client.Secrets(sitedigest.KeySecretNamespace)
	klw := namedListWatch(fields.OneTermEqualSelector("metadata.name", name).String(), secrets.List, secrets.Watch)
	if a.local != nil {
		klw.keep = &localstate.Spec{State: a.local.State, Kind: keptSiteKeys, Watch: keptSiteKeys, Namespace: sitedigest.KeySecretNamespace, Name: name}
	}
	g.keys, kc = newInformer(klw, &corev1.Secret{}, h)
	g.ctrls = []cache.Controller{nc, kc}
	// What the local state had: the site can form before the hub answers.
	g.sync()
	return g, nil
}

// siteNodeChanged says whether a site Node's update changed what the site
// reads from it after a restart: its labels and annotations (zone, gossip
// and image share ports) and its addresses. Status updates, which every
// member's Node gets at each change of its conditions, are left unwritten:
// a site of twenty would otherwise cost each member twenty synchronous
// writes whenever the site's nodes change state together.
func siteNodeChanged(old, cur runtime.Object) bool {
	o, c := old.(*corev1.Node), cur.(*corev1.Node)
	return !maps.Equal(o.Labels, c.Labels) || !maps.Equal(o.Annotations, c.Annotations) ||
		!slices.Equal(o.Status.Addresses, c.Status.Addresses)
}

// advertiseAddr is the address the other members reach this one at: the
// node's InternalIP, which is what they read from its Node.
func advertiseAddr(ip netip.Addr) string {
	if !ip.IsValid() {
		return ""
	}
	return ip.String()
}

// ownNode passes this node's Node, as the site's Node watch shows it, to
// the node status reporter.
func (g *siteGossip) ownNode(o any) {
	if n, ok := o.(*corev1.Node); ok && n.Name == g.a.name {
		g.a.node.observe(n)
	}
}

// run runs the informers and the site until ctx ends.
func (g *siteGossip) run(ctx context.Context, goRun func(func())) {
	for _, c := range g.ctrls {
		goRun(func() { c.RunWithContext(ctx) })
	}
	goRun(func() {
		if err := g.site.Run(ctx); err != nil {
			g.a.log.Error("site gossip stopped", "err", err)
		}
	})
	goRun(func() { g.loop(ctx) })
}

// senderSettle is how long a member must have been the site's sender
// before it reports: while a site forms, each member briefly sees itself
// alone, and its partial view should not reach the hub (the tunnel client
// would even send it again after a reconnect).
const senderSettle = 2 * time.Second

// loop applies peers and keys as they change and reports the view while
// this member is the site's sender.
func (g *siteGossip) loop(ctx context.Context) {
	var sent []byte
	var reported sitedigest.Digest
	var senderSince time.Time
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		g.site.SetConnected(g.a.metrics.connected.Load())
		switch {
		case !g.site.Sender():
			// Report afresh when this member sends again.
			sent, reported, senderSince = nil, sitedigest.Digest{}, time.Time{}
		case senderSince.IsZero():
			senderSince = time.Now()
		case time.Since(senderSince) >= senderSettle:
			g.reportView(&sent, &reported)
		}
		select {
		case <-ctx.Done():
			return
		case <-g.site.Changed():
		case <-g.changed:
			g.sync()
		case <-tick.C:
		}
	}
}

// reportView reports the view if what the hub acts on changed since the
// last report (see steadyView).
func (g *siteGossip) reportView(sent *[]byte, reported *sitedigest.Digest) {
	v := steadyView(*reported, g.site.View())
	b, err := v.Marshal()
	if err != nil {
		g.a.log.Warn("encode site view", "err", err)
		return
	}
	if bytes.Equal(b, *sent) {
		return
	}
	g.report(b)
	*sent, *reported = b, v
	g.reports.Add(1)
	g.lastReport.Store(&b)
}

// sync hands the site the peers and keys the informers hold.
func (g *siteGossip) sync() {
	g.site.SetPeers(sitePeers(g.nodes.List(), g.a.name, g.a.cfg.Zone))
	objs := g.keys.List()
	if len(objs) == 0 {
		if len(g.site.Keys()) == 0 {
			g.a.log.Info("site gossip not started: no site key Secret yet", "secret", sitedigest.KeySecretNamespace+"/"+sitedigest.KeySecretName(g.a.cfg.Zone))
		}
		return
	}
	keys := siteKeys(objs[0].(*corev1.Secret))
	if len(keys) == 0 {
		g.a.log.Warn("site key Secret holds no key", "secret", sitedigest.KeySecretName(g.a.cfg.Zone))
		return
	}
	if slices.EqualFunc(keys, g.site.Keys(), bytes.Equal) {
		return
	}
	if err := g.site.SetKeys(keys); err != nil {
		g.a.log.Warn("set site keys", "err", err)
	}
}

// sitePeers returns the gossip addresses of the site's other nodes: their
// InternalIP and published port. Nodes that publish no port run no gossip.
func sitePeers(objs []any, self, zone string) []string {
	var peers []string
	for _, o := range objs {
		n := o.(*corev1.Node)
		if n.Name == self || n.Labels[LabelZone] != zone {
			continue
		}
		port, err := strconv.ParseUint(n.Annotations[AnnotationGossipPort], 10, 16)
		if err != nil || port == 0 {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				peers = append(peers, net.JoinHostPort(a.Address, strconv.FormatUint(port, 10)))
				break
			}
		}
	}
	return peers
}

// siteKeys splits the site key Secret's keys.
func siteKeys(s *corev1.Secret) [][]byte {
	b := s.Data[sitedigest.KeySecretKey]
	var keys [][]byte
	for len(b) >= 32 {
		keys = append(keys, bytes.Clone(b[:32]))
		b = b[32:]
	}
	return keys
}

// labelListWatch lists and watches through a typed client with the label
// selector sel.
func labelListWatch[L runtime.Object](sel string,
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *listWatch {
	return selectedListWatch(func(o *metav1.ListOptions) { o.LabelSelector = sel }, list, watchFn)
}

// nodeAnnotations are the annotations the agent owns on its Node: the
// gossip port of a node with site gossip.
func (a *Agent) nodeAnnotations() map[string]string {
	if a.gossip == nil {
		return nil
	}
	m := map[string]string{AnnotationGossipPort: strconv.Itoa(a.cfg.GossipPort)}
	if a.cfg.ImageSharePort > 0 {
		m[AnnotationImageSharePort] = strconv.Itoa(a.cfg.ImageSharePort)
	}
	return m
}

// poke wakes the loop: the tunnel went up or down. Nil-safe.
func (g *siteGossip) poke() {
	if g == nil {
		return
	}
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// Site returns the node's site gossip membership once Run started it, or
// nil (no zone, gossip off, or not started yet). Its View and Changed are
// the node's view of its site.
func (a *Agent) Site() *site.Site {
	select {
	case <-a.ready:
		if a.gossip != nil {
			return a.gossip.site
		}
	default:
	}
	return nil
}

// siteView is the view the Service filter follows: Config.SiteView, or
// else the node's own site gossip.
func (a *Agent) siteView() SiteView {
	if a.cfg.SiteView != nil {
		return a.cfg.SiteView
	}
	if a.gossip != nil {
		return a.gossip.site
	}
	return nil
}

// siteGenerationKey names the count of the site gossip's starts in the
// local state (kept with the watches' resourceVersions).
const siteGenerationKey = "site-generation"

// siteWatch reports whether w is one of the site gossip's entries among
// the local state's watches.
func siteWatch(w string) bool {
	return w == keptSiteNodes || w == keptSiteKeys || w == siteGenerationKey
}

// nextGeneration counts this start of the site gossip in the local state.
func (a *Agent) nextGeneration() uint16 {
	if a.local == nil {
		return 0
	}
	prev, err := a.local.DB().Watch(siteGenerationKey)
	if err != nil {
		a.log.Warn("read site gossip generation", "err", err)
	}
	n, _ := strconv.ParseUint(prev, 10, 16)
	next := uint16(n + 1) // wraps after 65535 starts
	if err := a.local.DB().Commit(nil, map[string]string{siteGenerationKey: strconv.FormatUint(uint64(next), 10)}); err != nil {
		a.log.Warn("count site gossip generation", "err", err)
	}
	return next
}

// steadyView returns the view to report given the one last reported: what
// the hub acts on, and only that. The hub takes a suspect member as no
// evidence and cares about a member's state, not about each refutation of
// a suspicion, which bumps the incarnation. On a loaded or lossy LAN
// members flap between alive and suspect every few seconds; reporting
// each flip would cost the uplink a digest each time for nothing. So a
// suspect member keeps the state and incarnation last reported for it,
// and a member whose state is the one last reported keeps that report's
// incarnation, and a suspect member with no report yet (a member that
// just became the sender, or a site still forming) is left out: the hub
// keeps what it knew of it. Were it reported, the hub would hold it
// suspect, and take no word of the site for it, until its incarnation
// grew: suspect outranks alive at the same incarnation, and the sender
// reports a member alive again at the incarnation it reported. Reported
// incarnations still only grow, so the hub's merge (sitedigest.Newer)
// stays right.
func steadyView(last, cur sitedigest.Digest) sitedigest.Digest {
	if last.Site != cur.Site {
		last = sitedigest.Digest{}
	}
	prev := make(map[string]sitedigest.Member, len(last.Members))
	for _, m := range last.Members {
		prev[m.Node] = m
	}
	out := sitedigest.Digest{Site: cur.Site, Members: make([]sitedigest.Member, 0, len(cur.Members))}
	for _, m := range cur.Members {
		p, ok := prev[m.Node]
		switch {
		case ok && (m.State == sitedigest.Suspect || m.State == p.State) && m.Incarnation >= p.Incarnation:
			m = p
		case !ok && m.State == sitedigest.Suspect:
			continue
		}
		out.Members = append(out.Members, m)
	}
	return out
}
