package edge

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/identity"
	"github.com/tether-edge/tether/edge/kube"
	"github.com/tether-edge/tether/edge/streaming"
	"github.com/tether-edge/tether/tunnel"
)

// Agent is one edge node's agent. Build it with New and run it with Run.
type Agent struct {
	cfg Config
	log *slog.Logger

	// Set by Run before anything else starts.
	name   string
	nodeIP netip.Addr
	id     *identity.Identity
	tunnel *tunnel.Client
	client *kube.Client // the hub's API over the tunnel
	httpc  *http.Client // plain HTTP to the hub over the tunnel
	hubs   *hubFleet    // the hubs of the fleet (hubs.go)

	local    *localState // what the node runs, kept on disk (offline.go, edge/localstate)
	api      apiCounters
	metrics  metrics
	node     *nodeSync
	pods     *podManager
	refs     *refManager
	status   *statusManager
	services *serviceWatch
	classes  *runtimeClassWatch // pods' runtime handlers (runtimeclasses.go)
	ingress  *ingressWatch      // the ingress controller; nil when off (ingresses.go)
	gossip   *siteGossip        // the site's gossip; nil without a zone
	net      *nodeNet           // dataplane and DNS server; set by Run
	netpol   *netPolicy         // NetworkPolicy enforcement; nil without the eBPF dataplane
	relay    *apiRelay          // pods' connections to the hub; nil when off
	dnsAddr  netip.AddrPort     // where the DNS server listens
	server   *http.Server
	listener *streaming.Listener // the node server's, fed by dialTarget
	sites    *siteFilter         // leaves out dead site peers' endpoints; nil without sinks

	// extraCondition is a Node condition the program around the agent
	// reports (SetNodeCondition); nil: none.
	extraCondition atomic.Pointer[corev1.NodeCondition]

	eventsOnce sync.Once
	events     *eventRecorder // the kubelet's events; see recordEvent
	// images caches the node's image list for its status; staging and
	// share are the ImageStagings it follows and its site's image
	// sharing (imagestaging.go), nil when off.
	images        nodeImages
	staging       *imageStaging
	share         *imageShare
	eventsStopped atomic.Bool

	started sync.Once
	ready   chan struct{} // closed once the identity is known
}

// New checks cfg and returns an agent; nothing happens until Run.
func New(cfg Config) (*Agent, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("create edge agent: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("component", "edge"), ready: make(chan struct{})}
	a.node = &nodeSync{a: a, ready: make(chan struct{}), kick: make(chan struct{}, 1)}
	a.pods = newPodManager(a)
	a.refs = newRefManager(a)
	a.listener = streaming.NewListener()
	return a, nil
}

// Run joins the hub if the node has no certificate yet, connects the
// tunnel, registers the Node and runs the node's pods until ctx ends. It
// returns an error only when the agent cannot work at all (the hub refused
// the join token, the data directory is unusable); an unreachable hub is
// waited for. Pods are left running when Run returns.
func (a *Agent) Run(ctx context.Context) error {
	ran := false
	a.started.Do(func() { ran = true })
	if !ran {
		return errors.New("edge agent already ran")
	}
	id, err := identity.Establish(ctx, identity.Params{
		DataDir: a.cfg.DataDir, NodeName: a.cfg.NodeName, HubURL: a.cfg.HubURL, Token: a.cfg.Token,
	}, a.log)
	if err != nil {
		return fmt.Errorf("establish node identity: %w", err)
	}
	a.id, a.name = id, id.Node()
	a.log = a.log.With("node", a.name)
	a.nodeIP = a.cfg.NodeIP
	if !a.nodeIP.IsValid() {
		a.nodeIP = primaryIP(hubHost(a.cfg.HubURL))
	}
	a.node.host = readHostFacts()
	// Local state: the node's pods start from it without the hub.
	if err := a.openLocal(); err != nil {
		return err
	}
	defer a.local.close()
	a.node.seed()
	nn, err := a.startNodeNet()
	if err != nil {
		return err
	}
	// Closing leaves the dataplane loaded (pinned maps keep Services
	// working across an agent restart) and stops the DNS server.
	defer nn.close()
	if nn.dp != nil {
		if a.netpol, err = a.startNetPolicy(); err != nil {
			return err
		}
		defer a.netpol.close()
	}
	if a.relay, err = a.startAPIRelay(); err != nil {
		return err
	}
	if a.relay != nil {
		defer a.relay.close()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.hubs = loadHubFleet(a.cfg.DataDir)
	hubsConnected := make(chan struct{}, 1)
	tc, err := tunnel.NewClient(tunnel.ClientConfig{
		Addr:              a.cfg.TunnelAddr,
		Addrs:             a.hubs.Addrs,
		TLS:               id.TLSConfig(hubHost(a.cfg.HubURL)),
		Hello:             a.hello,
		HeartbeatInterval: a.cfg.HeartbeatInterval,
		DialTarget:        a.dialTarget,
		BackoffBase:       a.cfg.TunnelBackoffBase,
		BackoffCap:        a.cfg.TunnelBackoffCap,
		OnConnect: func(p tunnel.Peer) {
			a.metrics.connected.Store(true)
			a.metrics.connects.Add(1)
			// The hub may have set the node's conditions to Unknown.
			a.node.resendStatus()
			a.log.Info("tunnel connected", "transport", p.Transport, "hub", p.Addr)
			select {
			case hubsConnected <- struct{}{}:
			default:
			}
			// Watches waiting to retry resume now; pods report the
			// status they could not send.
			a.local.Reconnected()
			a.pods.wakeAll()
			a.gossip.poke()
		},
		OnDisconnect: func(err error) {
			a.metrics.connected.Store(false)
			a.metrics.disconnects.Add(1)
			a.log.Info("tunnel disconnected", "err", err)
			a.gossip.poke()
		},
		Logger: a.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("create tunnel client: %w", err)
	}
	a.tunnel = tc
	rc := restConfig(tc.DialContext, a.cfg.Version, &a.api)
	if a.client, err = kube.New(rc); err != nil {
		return fmt.Errorf("create API client: %w", err)
	}
	a.httpc = &http.Client{Transport: &http.Transport{DialContext: tc.DialContext}, Timeout: time.Minute}
	a.status = newStatusManager(func(ns string) podPatcher { return a.client.Pods(ns) }, &a.metrics)
	if a.cfg.Zone != "" && a.cfg.GossipPort > 0 {
		if a.gossip, err = newSiteGossip(a); err != nil {
			return fmt.Errorf("start site gossip: %w", err)
		}
	}
	if a.share, err = newImageShare(a); err != nil {
		return err
	}
	if st, ok := a.cfg.Runtime.(ImageStager); ok {
		a.staging = newImageStaging(a, st)
	}
	a.net = nn
	close(a.ready)

	resource, cadvisor := a.usageHandlers()
	a.server = &http.Server{
		Handler: streaming.NewServer(streaming.Config{
			Runtime: a.cfg.Runtime, Pods: a.pods.pods, Metrics: a.metricsHandler(), Logger: a.log,
			Resource: resource, Cadvisor: cadvisor, ResendStatus: a.node.resendNow,
		}),
		ReadHeaderTimeout: 30 * time.Second,
	}

	var wg sync.WaitGroup
	goRun := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	goRun(func() {
		if err := tc.Run(ctx); err != nil && ctx.Err() == nil {
			a.log.Error("tunnel stopped", "err", err)
		}
	})
	goRun(func() {
		if err := a.server.Serve(a.listener); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			a.log.Error("node server stopped", "err", err)
		}
	})
	if a.cfg.WatchServices {
		// Before the pods start: their containers' Service variables
		// are read from it.
		sinks := a.serviceSinks(nn)
		if a.cfg.Ingress != nil {
			if a.ingress, err = newIngressWatch(a); err != nil {
				return fmt.Errorf("start the ingress controller: %w", err)
			}
			sinks = append(sinks, a.ingress.ctrl)
		}
		if len(sinks) > 0 {
			a.sites = newSiteFilter(a.name, sinks, a.log, &a.metrics.siteEndpointsLeftOut)
			sinks = []serviceSink{a.sites}
		}
		a.services = newServiceWatch(a, sinks)
	}
	a.classes = newRuntimeClassWatch(a)
	if u, ok := a.cfg.Runtime.(SourceUser); ok {
		u.SetSources(agentSources{a: a})
	}
	defer func() {
		a.eventsStopped.Store(true)
		a.eventsOnce.Do(func() {}) // no recorder after this
		if a.events != nil {
			a.events.stop()
		}
	}()
	if er, ok := a.cfg.Runtime.(EventReporter); ok {
		er.ReportEvents(a.recordEvent)
	}
	a.cfg.Runtime.Notify(a.pods.runtimeChanged)
	a.pods.start(ctx)
	a.refs.start(ctx)
	if a.cfg.PodManifestPath != "" {
		src := newStaticSource(a, a.cfg.PodManifestPath)
		goRun(func() { src.run(ctx) })
	} else {
		a.pods.staticSynced()
	}
	goRun(func() { a.node.run(ctx) })
	podInformer := a.pods.informer()
	goRun(func() { podInformer.RunWithContext(ctx) })
	if view := a.siteView(); a.sites != nil && view != nil {
		goRun(func() { a.sites.follow(ctx, view) })
	}
	if a.services != nil {
		a.services.run(ctx, goRun)
	}
	goRun(func() { a.classes.run(ctx) })
	if a.ingress != nil {
		a.ingress.run(ctx, goRun)
	}
	nn.run(ctx, a, goRun)
	if a.netpol != nil {
		a.netpol.run(ctx, goRun)
	}
	if a.relay != nil {
		a.relay.dial = tc.DialContext
		goRun(func() { a.relay.serve(ctx) })
	}
	goRun(func() { a.certLoop(ctx) })
	goRun(func() { a.hubsLoop(ctx, hubsConnected) })
	if sp, ok := a.cfg.Runtime.(StatsProvider); ok && a.cfg.MetricsPeriod > 0 {
		goRun(func() { a.usageLoop(ctx, sp) })
	}
	if a.gossip != nil {
		a.gossip.run(ctx, goRun)
	}
	if a.share != nil {
		a.share.run(ctx, goRun)
	}
	if a.staging != nil {
		a.staging.run(ctx, goRun)
	}
	if rm, ok := a.cfg.Runtime.(LocalVolumeRemover); ok {
		goRun(func() { a.localVolumeLoop(ctx, rm) })
	}

	<-ctx.Done()
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	_ = a.server.Shutdown(shutdown)
	a.listener.Close()
	a.httpc.CloseIdleConnections()
	wg.Wait()
	a.log.Info("edge agent stopped")
	return nil
}

// recordEvent reports an event of the node's kubelet about a pod.
func (a *Agent) recordEvent(ev PodEvent) {
	if r := a.eventRecorder(); r != nil {
		r.record(ev)
	}
}

// RecordNodeEvent reports an event about the node itself, as the kubelet
// reports "Starting" or "Rebooted"; best effort, as every event. It does
// nothing before Run established the node's identity or after Run
// returned.
func (a *Agent) RecordNodeEvent(warning bool, reason, message string) {
	if a.NodeName() == "" {
		return
	}
	if r := a.eventRecorder(); r != nil {
		r.node(a.name, warning, reason, message)
	}
}

// SetNodeCondition makes c (its type, status, reason and message) one of
// the conditions the node reports, in place of the last one set, and has
// the status written at once when the node is registered. Its transition
// time changes when its status, reason or message does.
func (a *Agent) SetNodeCondition(c corev1.NodeCondition) {
	c.LastHeartbeatTime, c.LastTransitionTime = metav1.Time{}, metav1.Time{}
	if old := a.extraCondition.Load(); old != nil && *old == c {
		return
	}
	a.extraCondition.Store(&c)
	if a.node != nil && a.node.registered() {
		a.node.resendNow()
	}
}

// HubClient returns an HTTP client whose requests to http://hub reach the
// hub's API server over the tunnel as this node, without a time limit:
// for downloads, which the caller bounds by its context.
func (a *Agent) HubClient() *http.Client {
	<-a.ready
	return &http.Client{Transport: a.httpc.Transport}
}

// ClusterRoots returns the cluster's CA as the node pinned it when it
// joined: what it trusts the hub's signatures by.
func (a *Agent) ClusterRoots() *x509.CertPool {
	<-a.ready
	return a.id.Roots()
}

// eventRecorder returns the recorder, started with the first event so
// that agents that never report one (hollow nodes) do not pay for it; nil
// once Run ended.
func (a *Agent) eventRecorder() *eventRecorder {
	if a.eventsStopped.Load() {
		return nil
	}
	a.eventsOnce.Do(func() { a.events = newEventRecorder(a.client, a.name) })
	return a.events
}

// hello is sent to the hub at every tunnel connect. The resourceVersion
// of the pod watch lets the hub tell what the node has seen.
func (a *Agent) hello() tunnel.Hello {
	h := tunnel.Hello{Node: a.name, Version: a.cfg.Version}
	if rv := a.pods.resourceVersion(); rv != "" {
		h.ResourceVersions = map[string]string{"pods": rv}
	}
	return h
}

var errUnknownTarget = errors.New("unknown tunnel target")

// dialTarget connects a stream the hub opened to its target: the node
// server, or "tcp:IP:PORT" of one of the node's pods.
func (a *Agent) dialTarget(ctx context.Context, target string) (net.Conn, error) {
	if target == tunnel.TargetNode {
		return a.listener.Dial(ctx)
	}
	if addr, ok := strings.CutPrefix(target, "tcp:"); ok {
		return a.dialPod(ctx, addr)
	}
	return nil, fmt.Errorf("%w %q", errUnknownTarget, target)
}

// hostIPs are the node's addresses as pod status reports them.
func (a *Agent) hostIPs() []string {
	if !a.nodeIP.IsValid() {
		return nil
	}
	return []string{a.nodeIP.String()}
}

// certLoop renews the node certificate at CertRenewFraction of its
// lifetime, over the tunnel; once it expired (the agent was cut off too
// long) it re-attests directly with the hub.
func (a *Agent) certLoop(ctx context.Context) {
	retry := 30 * time.Second
	for {
		leaf := a.id.Current().Leaf
		life := leaf.NotAfter.Sub(leaf.NotBefore)
		renewAt := leaf.NotBefore.Add(time.Duration(float64(life) * a.cfg.CertRenewFraction))
		t := time.NewTimer(time.Until(renewAt))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var err error
		if time.Now().After(leaf.NotAfter) {
			err = a.id.Reattest(ctx, a.cfg.HubURL)
		} else {
			err = a.id.Renew(ctx, a.httpc)
		}
		if err == nil {
			a.log.Info("renewed node certificate", "expires", a.id.Current().Leaf.NotAfter)
			retry = 30 * time.Second
			continue
		}
		a.log.Warn("renew node certificate", "err", err, "retry in", retry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, 10*time.Minute)
	}
}

// Stats are an agent's counters.
type Stats struct {
	Node       string
	Connected  bool // the tunnel is up
	Registered bool // the Node was registered
	// RuntimeUp says the container runtime answered the node's last
	// status check (the Node's Ready condition follows it).
	RuntimeUp bool
	// Connects and Disconnects count tunnel connections.
	Connects, Disconnects int64
	// Lists, Watches, Gets and Writes count requests to the hub's API;
	// RequestFailures those that got no answer or a 5xx.
	Lists, Watches, Gets, Writes, RequestFailures int64
	NodeStatusWrites, PodStatusWrites             int64
	// Pods is the number of pods the agent runs; WatchedObjects the
	// ConfigMaps and Secrets it watches for them.
	Pods, WatchedObjects int
	// TunnelBytesSent and TunnelBytesReceived count the tunnel's wire
	// bytes.
	TunnelBytesSent, TunnelBytesReceived uint64
	CertificateExpiry                    time.Time
	// DataplaneSynced tells that the eBPF dataplane was programmed with
	// the full state of the Service watches.
	DataplaneSynced bool
	// DNSQueries counts the questions the DNS server answered,
	// DNSForwarded those sent to the upstream resolvers, DNSFailures
	// those answered with SERVFAIL.
	DNSQueries, DNSForwarded, DNSFailures int64
	// SiteEndpointsLeftOut is the number of endpoints the Service load
	// balancing and DNS leave out now because the site's gossip sees
	// their node dead.
	SiteEndpointsLeftOut int64
	// APIRelayActive is the number of pod connections the API relay
	// pipes to the hub now; APIRelayConnections counts those it piped,
	// APIRelayRejected those it refused (over its bound, or not TLS) and
	// APIRelayFailures those it found no tunnel stream for.
	APIRelayActive                                          int64
	APIRelayConnections, APIRelayRejected, APIRelayFailures int64
	// GossipMembers is the number of site members this node's gossip
	// sees alive or suspect (itself included; 0 without site gossip);
	// GossipDroppedKey and GossipDroppedNonMember count gossip messages
	// dropped for a wrong or missing key and alive announcements of nodes
	// that are not the site's.
	GossipMembers                            int
	GossipDroppedKey, GossipDroppedNonMember uint64
	// UsagePushes and UsagePushedBytes count the usage samples pushed to
	// the hub and their bytes (usagepush.go).
	UsagePushes, UsagePushedBytes int64
}

// Stats returns the agent's counters; it may be called at any time.
func (a *Agent) Stats() Stats {
	s := Stats{
		Connected:        a.metrics.connected.Load(),
		Registered:       a.node.registered(),
		RuntimeUp:        a.node.runtimeUp.Load(),
		Connects:         a.metrics.connects.Load(),
		Disconnects:      a.metrics.disconnects.Load(),
		Lists:            a.api.lists.Load(),
		Watches:          a.api.watches.Load(),
		Gets:             a.api.gets.Load(),
		Writes:           a.api.writes.Load(),
		RequestFailures:  a.api.failures.Load(),
		NodeStatusWrites: a.metrics.nodeStatusWrites.Load(),
		PodStatusWrites:  a.metrics.podStatusWrites.Load(),
		Pods:             len(a.pods.pods()),
		WatchedObjects:   a.refs.watched(),
	}
	s.SiteEndpointsLeftOut = a.metrics.siteEndpointsLeftOut.Load()
	s.UsagePushes, s.UsagePushedBytes = a.metrics.usagePushes.Load(), a.metrics.usagePushedBytes.Load()
	select {
	case <-a.ready:
		s.Node = a.name
		ts := a.tunnel.Stats()
		s.TunnelBytesSent, s.TunnelBytesReceived = ts.BytesSent, ts.BytesReceived
		s.CertificateExpiry = a.id.Current().Leaf.NotAfter
		s.DataplaneSynced = a.net.synced.Load()
		s.DNSQueries = a.net.dnsQueries.Load()
		s.DNSForwarded = a.net.dnsForwarded.Load()
		s.DNSFailures = a.net.dnsFailures.Load()
		if g := a.gossip; g != nil {
			gs := g.site.Stats()
			s.GossipMembers, s.GossipDroppedKey, s.GossipDroppedNonMember = gs.Members, gs.DroppedKey, gs.DroppedNonMember
		}
		if r := a.relay; r != nil {
			s.APIRelayActive = r.active.Load()
			s.APIRelayConnections = r.relayed.Load()
			s.APIRelayRejected = r.rejected.Load()
			s.APIRelayFailures = r.failures.Load()
		}
	default:
	}
	return s
}

// NodeName returns the node's name once Run established the identity, or
// "" before.
func (a *Agent) NodeName() string {
	select {
	case <-a.ready:
		return a.name
	default:
		return ""
	}
}

// DNSAddr returns the address the node's DNS server listens on once Run
// started it, or the zero AddrPort.
func (a *Agent) DNSAddr() netip.AddrPort {
	select {
	case <-a.ready:
		return a.dnsAddr
	default:
		return netip.AddrPort{}
	}
}

// APIRelayAddr returns the address the API relay listens on once Run
// started it, or the zero AddrPort when it is off.
func (a *Agent) APIRelayAddr() netip.AddrPort {
	select {
	case <-a.ready:
		if a.relay != nil {
			return a.relay.addr
		}
	default:
	}
	return netip.AddrPort{}
}

// Registered is closed once the Node is registered with the hub.
func (a *Agent) Registered() <-chan struct{} { return a.node.ready }
