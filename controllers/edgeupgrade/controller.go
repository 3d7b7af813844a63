package edgeupgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// Name is the controller's name in --controllers and its events' source.
const Name = "edgeupgrade"

// Events the controller records on an EdgeUpgrade.
const (
	EventNodeStarted  = "NodeUpgradeStarted"
	EventNodeUpgraded = "NodeUpgraded"
	EventNodeFailed   = "NodeUpgradeFailed"
	EventPaused       = "Paused"
	EventComplete     = "Complete"
)

// expectTTL is how long the controller waits to see its own node writes
// in its cache before it syncs on what the cache holds anyway.
const expectTTL = 30 * time.Second

// nudgeTimeout bounds one status-resend request to a node's agent.
const nudgeTimeout = 10 * time.Second

// Config configures the controller. Client, Informers and RestConfig are
// required.
type Config struct {
	// Client patches Nodes, nudges their agents through nodes/proxy and
	// writes events.
	Client kubernetes.Interface
	// Informers is the shared factory the Node informer is registered
	// on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// RestConfig reaches the API as the controller: it watches
	// EdgeUpgrades and Releases and writes EdgeUpgrade status.
	RestConfig *rest.Config
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the controller's time (requests' asked-at, timeouts,
	// windows); nil means the real clock.
	Clock clock.WithTicker
	// ResyncPeriod is how often the EdgeUpgrade and Release informers
	// replay their caches; zero means 10 minutes.
	ResyncPeriod time.Duration
}

// Controller rolls versions out to agents as EdgeUpgrades say.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	clock    clock.WithTicker
	queue    *kit.Queue
	recorder *kit.Recorder
	dyn      dynamic.Interface
	dynInf   dynamicinformer.DynamicSharedInformerFactory
	upgrades cache.GenericLister
	releases cache.GenericLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced

	// The fields below are touched by the one worker only.

	// expect are node writes not yet seen in the node cache, by node.
	expect map[string]expectation
	// upgrading are, per rollout, the nodes last seen upgrading on its
	// request, so that their success is an event once.
	upgrading map[types.UID]map[string]bool
	// unwritten are, per rollout, failures recorded on their nodes whose
	// status write has not succeeded yet: a node marked failed is not
	// failing again, so its record would be lost with the write.
	unwritten map[types.UID][]fleetapi.NodeFailure
}

// expectation is a node write the cache has not shown yet: the
// annotations it set ("" for removed).
type expectation struct {
	annotations map[string]string
	until       time.Time
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil || cfg.RestConfig == nil {
		return nil, errors.New("create edgeupgrade controller: client, informers and rest config are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = 10 * time.Minute
	}
	dyn, err := dynamic.NewForConfig(cfg.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("create edgeupgrade controller: %w", err)
	}
	c := &Controller{
		cfg:       cfg,
		log:       log,
		clock:     cfg.Clock,
		queue:     kit.NewQueue(Name, kit.WithBackoff(100*time.Millisecond, time.Minute), kit.WithClock(cfg.Clock)),
		recorder:  kit.NewRecorder(cfg.Client, Name, log),
		dyn:       dyn,
		dynInf:    dynamicinformer.NewDynamicSharedInformerFactory(dyn, cfg.ResyncPeriod),
		expect:    map[string]expectation{},
		upgrading: map[types.UID]map[string]bool{},
		unwritten: map[types.UID][]fleetapi.NodeFailure{},
	}
	upInf := c.dynInf.ForResource(fleetapi.EdgeUpgradesResource)
	relInf := c.dynInf.ForResource(fleetapi.ReleasesResource)
	nodeInf := cfg.Informers.Core().V1().Nodes()
	c.upgrades, c.releases, c.nodes = upInf.Lister(), relInf.Lister(), nodeInf.Lister()
	c.synced = []cache.InformerSynced{upInf.Informer().HasSynced, relInf.Informer().HasSynced, nodeInf.Informer().HasSynced}

	if _, err := upInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.enqueueAll() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(metav1.Object)
			n, ok2 := cur.(metav1.Object)
			// Which nodes a rollout owns depends on the others' specs.
			if !ok1 || !ok2 || o.GetGeneration() != n.GetGeneration() || (o.GetDeletionTimestamp() == nil) != (n.GetDeletionTimestamp() == nil) {
				c.enqueueAll()
				return
			}
			c.queue.Enqueue(cur)
		},
		DeleteFunc: func(any) { c.enqueueAll() },
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	if _, err := relInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.enqueueAll() },
		DeleteFunc: func(any) { c.enqueueAll() },
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	// A node's other status updates (heartbeats, pods' resources) change
	// nothing a rollout sees.
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.enqueueAll() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || nodeView(o) != nodeView(n) {
				c.enqueueAll()
			}
		},
		DeleteFunc: func(any) { c.enqueueAll() },
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return c, nil
}

// nodeView is what of a node the rollouts decide on.
func nodeView(n *corev1.Node) string {
	b, _ := json.Marshal([]any{n.Labels, n.Annotations[fleetapi.AnnotationRelease], n.Annotations[fleetapi.AnnotationEdgeUpgrade],
		n.Annotations[fleetapi.AnnotationAskedAt], n.Annotations[AnnotationFailed], n.Status.NodeInfo.KubeletVersion,
		n.Status.NodeInfo.Architecture, Ready(n), agentReport(n)})
	return string(b)
}

// agentReport is what of node's AgentUpgrade condition a rollout reads:
// all but its heartbeat.
func agentReport(n *corev1.Node) string {
	c := upgradeCondition(n)
	if c == nil {
		return ""
	}
	return fmt.Sprint(c.Status, c.Reason, c.Message, c.LastTransitionTime.UTC())
}

// enqueueAll queues every rollout: few exist, and a node or a rollout
// may matter to any of them.
func (c *Controller) enqueueAll() {
	objs, err := c.upgrades.List(labels.Everything())
	if err != nil {
		return
	}
	for _, o := range objs {
		c.queue.Enqueue(o)
	}
}

// Run waits for the informers, then follows the rollouts until ctx ends.
// One worker syncs them, so that two rollouts never decide on a node at
// once.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.recorder.Start(ctx)
	if !c.waitServed(ctx) {
		return nil
	}
	c.dynInf.Start(ctx.Done())
	defer c.dynInf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("edgeupgrade controller running")
	c.enqueueAll()
	c.queue.Run(ctx, 1, c.log, c.sync)
	return nil
}

// waitServed waits until the hub serves EdgeUpgrades and Releases (the
// hub installs their definitions at start), so that the informers do not
// fail and log until then; false when ctx ended first.
func (c *Controller) waitServed(ctx context.Context) bool {
	logged := false
	for {
		list, err := c.cfg.Client.Discovery().ServerResourcesForGroupVersion(fleetapi.EdgeUpgradesResource.GroupVersion().String())
		if err == nil {
			found := 0
			for _, r := range list.APIResources {
				if r.Name == fleetapi.EdgeUpgradesResource.Resource || r.Name == fleetapi.ReleasesResource.Resource {
					found++
				}
			}
			if found == 2 {
				return true
			}
		}
		if !logged {
			c.log.Info("waiting for the hub to serve edgeupgrades and releases", "group", fleetapi.Group)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Second):
		}
	}
}

// toUpgrade converts an informer object into an EdgeUpgrade.
func toUpgrade(obj runtime.Object) (*fleetapi.EdgeUpgrade, *unstructured.Unstructured, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil, fmt.Errorf("edgeupgrade informer object is %T", obj)
	}
	up := &fleetapi.EdgeUpgrade{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, up); err != nil {
		return nil, nil, fmt.Errorf("decode edgeupgrade %s: %w", u.GetName(), err)
	}
	return up, u, nil
}

// waitingOnCache reports whether a node write of the controller's has
// not shown in the cache yet, forgetting those that did or expired.
func (c *Controller) waitingOnCache(now time.Time) bool {
	waiting := false
	for name, e := range c.expect {
		n, err := c.nodes.Get(name)
		seen := err != nil // a node gone needs no waiting
		if err == nil {
			seen = true
			for k, v := range e.annotations {
				if n.Annotations[k] != v {
					seen = false
				}
			}
		}
		if seen || !now.Before(e.until) {
			delete(c.expect, name)
			continue
		}
		waiting = true
	}
	return waiting
}

// sync follows one rollout: it records the failures of its nodes, asks
// the next ones and writes its status.
func (c *Controller) sync(ctx context.Context, key string) error {
	_, name := kit.SplitKey(key)
	obj, err := c.upgrades.Get(name)
	if apierrors.IsNotFound(err) {
		c.forget()
		return nil
	}
	if err != nil {
		return err
	}
	up, u, err := toUpgrade(obj)
	if err != nil {
		c.log.Warn("skip edgeupgrade", "err", err)
		return nil
	}
	if up.DeletionTimestamp != nil {
		return nil
	}
	now := c.clock.Now()
	if c.waitingOnCache(now) {
		// The node events that end the wait queue every rollout.
		return kit.RequeueAfter(time.Second)
	}
	all, err := c.allUpgrades()
	if err != nil {
		return err
	}
	others := map[string]*fleetapi.EdgeUpgrade{}
	for _, o := range all {
		if o.Name != up.Name {
			others[o.Name] = o
		}
	}
	nodeList, err := c.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	cands := candidates(all)
	var mine []*corev1.Node
	for _, n := range nodeList {
		if o := owner(n, cands); o != nil && o.UID == up.UID {
			mine = append(mine, n)
		}
	}
	p := decide(up, mine, c.hasRelease, func(n string) *fleetapi.EdgeUpgrade { return others[n] }, now)

	var errs []error
	var recorded []fleetapi.NodeFailure
	was := c.upgrading[up.UID]
	seen := map[string]bool{}
	for _, np := range p.nodes {
		switch np.state {
		case failing:
			if err := c.fail(ctx, up, np, now); err != nil {
				errs = append(errs, err)
				continue
			}
			f := np.failure
			f.Time = metav1.NewTime(now.Truncate(time.Second))
			recorded = append(recorded, f)
			c.recorder.Eventf(u, corev1.EventTypeWarning, EventNodeFailed, "node %s failed to run %s: %s: %s", f.Node, f.Release, f.Reason, f.Message)
			c.log.Info("node upgrade failed", "edgeupgrade", up.Name, "node", f.Node, "release", f.Release, "reason", f.Reason, "message", f.Message)
		case upgrading:
			seen[np.node.Name] = true
		case done:
			if np.asked && was[np.node.Name] {
				c.recorder.Eventf(u, corev1.EventTypeNormal, EventNodeUpgraded, "node %s runs %s", np.node.Name, np.release)
				c.log.Info("node upgraded", "edgeupgrade", up.Name, "node", np.node.Name, "release", np.release)
			}
		}
	}
	for _, i := range p.ask {
		np := p.nodes[i]
		if err := c.ask(ctx, up, np, now); err != nil {
			errs = append(errs, err)
			p.upgrading--
			continue
		}
		seen[np.node.Name] = true
		c.recorder.Eventf(u, corev1.EventTypeNormal, EventNodeStarted, "asked node %s to run %s", np.node.Name, np.release)
		c.log.Info("node asked to upgrade", "edgeupgrade", up.Name, "node", np.node.Name, "release", np.release)
	}
	c.upgrading[up.UID] = seen

	// Records an earlier sync could not write come first, unless the
	// status in the cache has them after all.
	var pending []fleetapi.NodeFailure
	for _, f := range c.unwritten[up.UID] {
		if !slices.ContainsFunc(up.Status.Failures, func(g fleetapi.NodeFailure) bool { return equality.Semantic.DeepEqual(f, g) }) {
			pending = append(pending, f)
		}
	}
	recorded = append(pending, recorded...)
	st := status(up, p, recorded, now)
	oldPaused := meta.FindStatusCondition(up.Status.Conditions, ConditionPaused)
	if st.Phase != up.Status.Phase || p.phase == fleetapi.PhasePaused && (oldPaused == nil || oldPaused.Reason != p.pausedReason) {
		switch st.Phase {
		case fleetapi.PhasePaused:
			typ := corev1.EventTypeNormal
			if p.pausedReason != ReasonSpecPaused {
				typ = corev1.EventTypeWarning
			}
			c.recorder.Eventf(u, typ, EventPaused, "%s: %s", p.pausedReason, p.pausedMessage)
		case fleetapi.PhaseComplete:
			c.recorder.Eventf(u, corev1.EventTypeNormal, EventComplete, "%d of %d nodes run %s, %d failed", p.upgraded, len(p.nodes), up.Spec.Version, p.failed)
		}
		c.log.Info("edgeupgrade phase", "edgeupgrade", up.Name, "phase", st.Phase, "nodes", len(p.nodes), "upgraded", p.upgraded, "failed", p.failed)
	}
	delete(c.unwritten, up.UID)
	if !equality.Semantic.DeepEqual(st, up.Status) {
		if err := c.writeStatus(ctx, u, st); err != nil {
			errs = append(errs, err)
			if len(recorded) > 0 {
				c.unwritten[up.UID] = recorded
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !p.wake.IsZero() {
		// A second late, so that the deadline has passed when it syncs.
		return kit.RequeueAfter(p.wake.Sub(now) + time.Second)
	}
	return nil
}

// forget drops what the controller remembers of rollouts deleted.
func (c *Controller) forget() {
	objs, err := c.upgrades.List(labels.Everything())
	if err != nil {
		return
	}
	live := map[types.UID]bool{}
	for _, o := range objs {
		if m, ok := o.(metav1.Object); ok {
			live[m.GetUID()] = true
		}
	}
	for uid := range c.upgrading {
		if !live[uid] {
			delete(c.upgrading, uid)
		}
	}
	for uid := range c.unwritten {
		if !live[uid] {
			delete(c.unwritten, uid)
		}
	}
}

// allUpgrades lists the rollouts in the cache.
func (c *Controller) allUpgrades() ([]*fleetapi.EdgeUpgrade, error) {
	objs, err := c.upgrades.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list edgeupgrades: %w", err)
	}
	out := make([]*fleetapi.EdgeUpgrade, 0, len(objs))
	for _, o := range objs {
		up, _, err := toUpgrade(o)
		if err != nil {
			continue
		}
		out = append(out, up)
	}
	return out, nil
}

// hasRelease reports whether the hub holds the Release name.
func (c *Controller) hasRelease(name string) bool {
	_, err := c.releases.Get(name)
	return err == nil
}

// patchNode sets (or, for "", removes) annotations on np's node, if the
// node is still as the controller saw it.
func (c *Controller) patchNode(ctx context.Context, node *corev1.Node, set map[string]string, now time.Time) error {
	ann := map[string]any{}
	for k, v := range set {
		if v == "" {
			ann[k] = nil
		} else {
			ann[k] = v
		}
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": node.ResourceVersion, "annotations": ann}})
	if err != nil {
		return err
	}
	if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch node %s: %w", node.Name, err)
	}
	c.expect[node.Name] = expectation{annotations: set, until: now.Add(expectTTL)}
	return nil
}

// ask sets the request for np's release on its node, with the rollout's
// download cap (or none), and nudges its agent.
func (c *Controller) ask(ctx context.Context, up *fleetapi.EdgeUpgrade, np nodePlan, now time.Time) error {
	limit := ""
	if q := up.Spec.BandwidthLimit; q != nil && q.Value() > 0 {
		limit = strconv.FormatInt(q.Value(), 10)
	}
	if err := c.patchNode(ctx, np.node, map[string]string{
		fleetapi.AnnotationRelease:        np.release,
		fleetapi.AnnotationEdgeUpgrade:    up.Name,
		fleetapi.AnnotationAskedAt:        now.UTC().Format(time.RFC3339),
		fleetapi.AnnotationBandwidthLimit: limit,
		AnnotationFailed:                  "",
	}, now); err != nil {
		return err
	}
	go c.nudge(ctx, np.node.Name)
	return nil
}

// fail withdraws the rollout's request from np's node, if it carries it,
// and marks the node failed in this generation.
func (c *Controller) fail(ctx context.Context, up *fleetapi.EdgeUpgrade, np nodePlan, now time.Time) error {
	set := map[string]string{AnnotationFailed: failedMark(up)}
	if np.asked {
		set[fleetapi.AnnotationRelease] = ""
		set[fleetapi.AnnotationAskedAt] = ""
		set[fleetapi.AnnotationBandwidthLimit] = ""
	}
	return c.patchNode(ctx, np.node, set, now)
}

// nudge asks node's agent to write its status now, so that it reads the
// request from the answer; an agent out of reach reads it at its next
// status write or reconnect, so failures are only logged.
func (c *Controller) nudge(ctx context.Context, node string) {
	ctx, cancel := context.WithTimeout(ctx, nudgeTimeout)
	defer cancel()
	err := c.cfg.Client.CoreV1().RESTClient().Post().AbsPath("/api/v1/nodes", node, "proxy", "status", "resend").Do(ctx).Error()
	if err != nil {
		c.log.Debug("nudge node agent", "node", node, "err", err)
	}
}

// writeStatus writes st through u's status subresource.
func (c *Controller) writeStatus(ctx context.Context, u *unstructured.Unstructured, st fleetapi.EdgeUpgradeStatus) error {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return err
	}
	u = u.DeepCopy()
	u.Object["status"] = m
	_, err = c.dyn.Resource(fleetapi.EdgeUpgradesResource).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update status of edgeupgrade %s: %w", u.GetName(), err)
	}
	return nil
}
