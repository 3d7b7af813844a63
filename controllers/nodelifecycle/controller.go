package nodelifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// LeaseNamespace holds the nodes' heartbeat Leases.
const LeaseNamespace = corev1.NamespaceNodeLease

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client writes node status and taints, pod status and deletions.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its Node,
	// Lease and Pod informers on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Workers is the number of pods handled at once by the eviction
	// workers; zero means 4.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger

	// GracePeriod is how long a node may go without a heartbeat before
	// it is taken as unreachable (node-monitor-grace-period); zero means
	// 40s.
	GracePeriod time.Duration
	// MonitorPeriod is how often every node is looked at
	// (node-monitor-period); zero means 5s.
	MonitorPeriod time.Duration
	// EvictionRate is how many nodes per second may get a NoExecute
	// lifecycle taint in a healthy zone; zero means 0.1.
	EvictionRate float64
	// SecondaryEvictionRate applies to a partially disrupted zone larger
	// than LargeClusterThreshold; zero means 0.01.
	SecondaryEvictionRate float64
	// UnhealthyZoneThreshold is the fraction of unhealthy nodes that
	// makes a zone partially disrupted; zero means 0.55.
	UnhealthyZoneThreshold float64
	// LargeClusterThreshold is the zone size up to which a partially
	// disrupted zone stops evictions altogether; zero means 50.
	LargeClusterThreshold int
	// EvictFullyDisruptedZones makes a zone whose every node is down
	// evict at EvictionRate, as upstream does while other zones are
	// healthy. False, the default, freezes such a zone: at the edge a
	// whole site going dark is almost always its uplink.
	EvictFullyDisruptedZones bool
	// Peers reports what a node's site peers say of it (site gossip). A
	// silent node its peers see alive is taken as partitioned from the
	// hub: it gets the unreachable NoSchedule taint and is never evicted.
	// Nil means no such evidence. It must not block.
	Peers func(node string) PeerView
	// SiteHeard reports whether the hub hears a node of zone now (its
	// tunnel is up and carries heartbeats). A zone it does not hear is
	// silent whatever its nodes' Lease ages say: the Leases lag the
	// tunnels by up to the grace period, and nodes that lost their
	// uplink together go stale in different monitor passes, so judging
	// by Lease age alone could take a dark site's first stale node for
	// an unreachable one while its peers' Leases are still fresh. Nil
	// means the Leases alone decide. It must not block.
	SiteHeard func(zone string) bool
	// DeadGrace is how long a node its site peers agree is gone must
	// also have been silent to the hub before it is taken as dead; zero
	// means 10s. It is longer than the hub's Lease renewal period (7s), so
	// a node whose tunnel still carries heartbeats is never taken as dead
	// on a stale or mistaken digest, and short enough that a dead node's
	// pods are replaced well within 30s of its peers' verdict: at most
	// DeadGrace plus MonitorPeriod later the node gets the dead taint,
	// which evicts at once. Negative means none: the source of Peers
	// has already made sure the hub no longer reaches the node (the hub
	// probes a node its site says is dead), and the Lease, which the hub
	// renews for a while after the last heartbeat, would only delay it.
	DeadGrace time.Duration
	// Clock is the controller's time; nil means the real clock.
	Clock clock.WithTicker
}

// Controller watches node heartbeats, marks silent nodes Unknown, taints
// them and evicts their pods after their tolerations.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	events *kit.Recorder

	nodes  corelisters.NodeLister
	pods   cache.Indexer // by namespace/name, and by node
	synced []cache.InformerSynced

	// Pods to look at for NoExecute eviction.
	evictQueue *kit.Queue
	// Nodes whose unschedulable taint disagrees with spec.unschedulable.
	nodeQueue *kit.Queue

	mu sync.Mutex // guards the following fields
	// lastSeen is, by node, the controller's time of the last heartbeat
	// seen, and what it looked like.
	lastSeen map[string]heartbeat
	// taintSeen is, by node and taint, when a NoExecute taint was first
	// seen.
	taintSeen map[taintKey]time.Time
	// zoneNext is, by zone, the earliest time the next node may get a
	// NoExecute taint.
	zoneNext map[string]time.Time
	// states is the last decision per node, to log transitions.
	states map[string]State
	// policyEvict holds the nodes whose pods leave by their tolerations
	// of the unreachable NoExecute taint without the node carrying it
	// (a dark site, see Decision.EvictByPolicy).
	policyEvict map[string]bool
}

type heartbeat struct {
	at        time.Time
	renew     time.Time // the Lease's renewTime
	readyBeat time.Time // the Ready condition's lastHeartbeatTime
}

type taintKey struct {
	node, key string
	effect    corev1.TaintEffect
}

const podNodeIndex = "node"

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create node lifecycle controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.GracePeriod <= 0 {
		cfg.GracePeriod = 40 * time.Second
	}
	if cfg.MonitorPeriod <= 0 {
		cfg.MonitorPeriod = 5 * time.Second
	}
	switch {
	case cfg.DeadGrace == 0:
		cfg.DeadGrace = 10 * time.Second
	case cfg.DeadGrace < 0:
		cfg.DeadGrace = 0
	}
	if cfg.EvictionRate <= 0 {
		cfg.EvictionRate = 0.1
	}
	if cfg.SecondaryEvictionRate <= 0 {
		cfg.SecondaryEvictionRate = 0.01
	}
	if cfg.UnhealthyZoneThreshold <= 0 {
		cfg.UnhealthyZoneThreshold = 0.55
	}
	if cfg.LargeClusterThreshold <= 0 {
		cfg.LargeClusterThreshold = 50
	}
	if cfg.Peers == nil {
		cfg.Peers = func(string) PeerView { return PeersUnknown }
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:    cfg,
		log:    log.With("controller", "nodelifecycle"),
		events: kit.NewRecorder(cfg.Client, "node-controller", log),
		// Eviction times are waited for on the controller's clock;
		// failures back off in real time.
		evictQueue: kit.NewQueue("noexecute-eviction", kit.WithClock(cfg.Clock), kit.WithBackoff(50*time.Millisecond, time.Minute)),
		nodeQueue:  kit.NewQueue("node-taints", kit.WithClock(cfg.Clock), kit.WithBackoff(50*time.Millisecond, time.Minute)),
		lastSeen:   map[string]heartbeat{},
		taintSeen:  map[taintKey]time.Time{},
		zoneNext:   map[string]time.Time{},
		states:     map[string]State{},

		policyEvict: map[string]bool{},
	}
	nodeInf := cfg.Informers.Core().V1().Nodes()
	leaseInf := cfg.Informers.Coordination().V1().Leases()
	podInf := cfg.Informers.Core().V1().Pods()
	c.nodes = nodeInf.Lister()
	c.pods = podInf.Informer().GetIndexer()
	if err := podInf.Informer().AddIndexers(cache.Indexers{podNodeIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("index pods by node: %w", err)
	}
	c.synced = []cache.InformerSynced{nodeInf.Informer().HasSynced, leaseInf.Informer().HasSynced, podInf.Informer().HasSynced}

	if _, err := leaseInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.leaseChanged,
		UpdateFunc: func(_, obj any) { c.leaseChanged(obj) },
	}); err != nil {
		return nil, fmt.Errorf("add lease handler: %w", err)
	}
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeChanged(nil, obj) },
		UpdateFunc: c.nodeChanged,
		DeleteFunc: c.nodeDeleted,
	}); err != nil {
		return nil, fmt.Errorf("add node handler: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.podChanged,
		UpdateFunc: func(_, obj any) { c.podChanged(obj) },
	}); err != nil {
		return nil, fmt.Errorf("add pod handler: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then monitors nodes and evicts pods until
// ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.evictQueue.ShutDown()
	defer c.nodeQueue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.events.Start(ctx)
	c.log.Info("node lifecycle controller running", "grace_period", c.cfg.GracePeriod, "dead_grace", c.cfg.DeadGrace, "monitor_period", c.cfg.MonitorPeriod)
	var wg sync.WaitGroup
	wg.Go(func() { c.evictQueue.Run(ctx, c.cfg.Workers, c.log.With("queue", "noexecute-eviction"), c.syncPod) })
	wg.Go(func() { c.nodeQueue.Run(ctx, 1, c.log.With("queue", "node-taints"), c.syncUnschedulable) })
	t := c.cfg.Clock.NewTicker(c.cfg.MonitorPeriod)
	defer t.Stop()
	for {
		c.monitor(ctx)
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-t.C():
		}
	}
}

func (c *Controller) leaseChanged(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Namespace != LeaseNamespace || l.Spec.RenewTime == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hb := c.lastSeen[l.Name]
	if !hb.renew.Equal(l.Spec.RenewTime.Time) {
		hb.renew = l.Spec.RenewTime.Time
		hb.at = c.cfg.Clock.Now()
		c.lastSeen[l.Name] = hb
	}
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func (c *Controller) nodeChanged(oldObj, obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	c.mu.Lock()
	hb, known := c.lastSeen[n.Name]
	now := c.cfg.Clock.Now()
	if !known {
		// First sight: the node gets a full grace period from now.
		hb.at = now
	}
	// The controller keeps lastHeartbeatTime when it writes Unknown, so
	// only the node moves it.
	if r := readyCondition(n); r != nil && !r.LastHeartbeatTime.Time.Equal(hb.readyBeat) {
		if known {
			hb.at = now
		}
		hb.readyBeat = r.LastHeartbeatTime.Time
	}
	c.lastSeen[n.Name] = hb
	c.mu.Unlock()

	if unschedulableOutOfStep(n) {
		c.nodeQueue.Add(n.Name)
	}

	// A change of NoExecute taints concerns every pod of the node, and
	// so does any change of a node whose pods leave by their policy
	// alone: their clock starts with its unreachable NoSchedule taint.
	c.mu.Lock()
	policy := c.policyEvict[n.Name]
	c.mu.Unlock()
	if o, ok := oldObj.(*corev1.Node); !ok || !sameNoExecute(o.Spec.Taints, n.Spec.Taints) || policy {
		c.forgetRemovedTaints(n)
		c.enqueuePodsOf(n.Name)
	}
}

func (c *Controller) nodeDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.lastSeen, n.Name)
	delete(c.states, n.Name)
	delete(c.policyEvict, n.Name)
	for k := range c.taintSeen {
		if k.node == n.Name {
			delete(c.taintSeen, k)
		}
	}
}

// forgetRemovedTaints drops what was seen of taints the node no longer
// has, so a taint added again later counts from then.
func (c *Controller) forgetRemovedTaints(n *corev1.Node) {
	present := map[taintKey]bool{}
	for _, t := range n.Spec.Taints {
		present[taintKey{node: n.Name, key: t.Key, effect: t.Effect}] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.taintSeen {
		if k.node == n.Name && !present[k] {
			delete(c.taintSeen, k)
		}
	}
}

func sameNoExecute(a, b []corev1.Taint) bool {
	var x, y []corev1.Taint
	for _, t := range a {
		if t.Effect == corev1.TaintEffectNoExecute {
			x = append(x, t)
		}
	}
	for _, t := range b {
		if t.Effect == corev1.TaintEffectNoExecute {
			y = append(y, t)
		}
	}
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i].Key != y[i].Key || x[i].Value != y[i].Value {
			return false
		}
	}
	return true
}

func (c *Controller) enqueuePodsOf(node string) {
	objs, err := c.pods.ByIndex(podNodeIndex, node)
	if err != nil {
		return
	}
	for _, o := range objs {
		if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			c.evictQueue.Add(key)
		}
	}
}

func (c *Controller) podChanged(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return
	}
	n, err := c.nodes.Get(p.Spec.NodeName)
	if err != nil {
		return
	}
	c.mu.Lock()
	policy := c.policyEvict[n.Name]
	c.mu.Unlock()
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoExecute || (policy && t.Key == TaintUnreachable) {
			c.evictQueue.Add(p.Namespace + "/" + p.Name)
			return
		}
	}
	// A pod on an unreachable node that reads ready (a late status
	// write) is corrected at the next monitor pass.
}

// heartbeatAge returns how long ago the node's last heartbeat was seen.
func (c *Controller) heartbeatAge(node string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	hb, ok := c.lastSeen[node]
	if !ok {
		hb.at = now
		c.lastSeen[node] = hb
	}
	return now.Sub(hb.at)
}

// taintSince returns when a node's taint was added. timeAdded is kept in
// whole seconds, so taken alone it would make tolerations run out up to a
// second early; when the controller saw the taint appear within moments of
// timeAdded, its own observation is used instead. After a restart it is
// timeAdded that counts, so a restart does not grant pods a fresh
// toleration.
func (c *Controller) taintSince(node string, t corev1.Taint) time.Time {
	k := taintKey{node: node, key: t.Key, effect: t.Effect}
	c.mu.Lock()
	seen, ok := c.taintSeen[k]
	if !ok {
		seen = c.cfg.Clock.Now()
		c.taintSeen[k] = seen
	}
	c.mu.Unlock()
	if t.TimeAdded == nil {
		return seen
	}
	added := t.TimeAdded.Time
	if d := seen.Sub(added); d >= 0 && d < 2*time.Second {
		return seen
	}
	return added
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
