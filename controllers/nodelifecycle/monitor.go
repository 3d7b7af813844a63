package nodelifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// zoneOf returns a node's zone: its region and zone labels, as upstream
// keys zones.
func zoneOf(n *corev1.Node) string {
	r, z := n.Labels[corev1.LabelTopologyRegion], n.Labels[corev1.LabelTopologyZone]
	if r == "" && z == "" {
		return ""
	}
	return r + ":\x00:" + z
}

// monitor looks at every node once: decides, then applies the decisions
// with the zones' eviction rates.
func (c *Controller) monitor(ctx context.Context) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		c.log.Warn("list nodes", "err", err)
		return
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	now := c.cfg.Clock.Now()
	ages := make([]time.Duration, len(nodes))
	// A site is silent when none of its nodes sent a heartbeat within the
	// grace period, or when the hub hears none of them now.
	silent := map[string]bool{}
	for i, n := range nodes {
		ages[i] = c.heartbeatAge(n.Name, now)
		z := zoneOf(n)
		if _, ok := silent[z]; !ok {
			silent[z] = true
		}
		if ages[i] <= c.cfg.GracePeriod {
			silent[z] = false
		}
	}
	if c.cfg.SiteHeard != nil {
		for _, n := range nodes {
			if site := n.Labels[corev1.LabelTopologyZone]; site != "" && !c.cfg.SiteHeard(site) {
				silent[zoneOf(n)] = true
			}
		}
	}
	decisions := make([]Decision, len(nodes))
	zoneStates := map[string][]State{}
	for i, n := range nodes {
		z := zoneOf(n)
		ev := Evidence{
			LeaseAge:    ages[i],
			GracePeriod: c.cfg.GracePeriod,
			Ready:       readyCondition(n),
			Peers:       c.cfg.Peers(n.Name),
			DeadGrace:   c.cfg.DeadGrace,
			// Upstream's behaviour for dark zones has no SiteDark.
			SiteSilent: silent[z] && !c.cfg.EvictFullyDisruptedZones,
		}
		decisions[i] = Decide(ev)
		zoneStates[z] = append(zoneStates[z], decisions[i].State)
	}
	health := map[string]ZoneHealth{}
	allDown := len(zoneStates) > 0
	for z, states := range zoneStates {
		health[z] = ZoneState(states, c.cfg.UnhealthyZoneThreshold)
		if health[z] != ZoneFullDisruption {
			allDown = false
		}
	}
	limits := RateLimits{
		Rate: c.cfg.EvictionRate, SecondaryRate: c.cfg.SecondaryEvictionRate,
		LargeClusterThreshold: c.cfg.LargeClusterThreshold, EvictFullyDisruptedZones: c.cfg.EvictFullyDisruptedZones,
	}
	for i, n := range nodes {
		z := zoneOf(n)
		rate := ZoneRate(health[z], len(zoneStates[z]), allDown, limits)
		// A zone frozen for a full disruption (or every zone down)
		// also withdraws the NoExecute taints it gave before the last
		// nodes went, so nothing there is evicted.
		zc := zoneContext{
			zone: z, rate: rate, allDown: allDown,
			frozen: allDown || (health[z] == ZoneFullDisruption && rate == 0),
		}
		if err := c.apply(ctx, n, decisions[i], zc, now); err != nil {
			c.log.Info("update node; retrying at the next pass", "node", n.Name, "err", err)
		}
	}
}

// zoneContext is what applying a node's decision needs to know of its
// zone.
type zoneContext struct {
	zone string
	// rate is how many nodes per second of the zone may get a NoExecute
	// taint.
	rate float64
	// frozen says the zone evicts nothing for unreachable nodes.
	frozen bool
	// allDown says every zone is down: the hub's own link, most likely.
	allDown bool
}

// apply makes one node's decision true.
func (c *Controller) apply(ctx context.Context, n *corev1.Node, d Decision, zc zoneContext, now time.Time) error {
	// Every zone down stops even the evictions a dark site's pods ask
	// for: the hub cannot tell anything then.
	policyEvict := d.EvictByPolicy && !zc.allDown
	c.mu.Lock()
	prev := c.states[n.Name]
	c.states[n.Name] = d.State
	policyChanged := c.policyEvict[n.Name] != policyEvict
	if policyEvict {
		c.policyEvict[n.Name] = true
	} else {
		delete(c.policyEvict, n.Name)
	}
	c.mu.Unlock()
	if prev != d.State {
		c.log.Info("node state", "node", n.Name, "from", prev, "to", d.State)
		c.stateEvent(n, d.State)
	}

	var errs []error
	cur := n
	if d.MarkUnknown {
		if u, changed := markUnknown(n, d.Message, now); changed {
			got, err := c.cfg.Client.CoreV1().Nodes().UpdateStatus(ctx, u, metav1.UpdateOptions{})
			if err != nil {
				return fmt.Errorf("mark node conditions unknown: %w", err)
			}
			cur = got
		}
	}

	taints, changed := c.lifecycleTaints(cur, d, zc, now)
	if changed {
		u := cur.DeepCopy()
		u.Spec.Taints = taints
		if _, err := c.cfg.Client.CoreV1().Nodes().Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("update node taints: %w", err))
		}
	}
	if policyChanged {
		c.enqueuePodsOf(n.Name)
	}

	if d.MarkPodsNotReady {
		errs = append(errs, c.markPodsNotReady(ctx, n.Name, now))
	}
	if heard(d.State) {
		errs = append(errs, c.resolveLost(ctx, n.Name))
	}
	return errors.Join(errs...)
}

// heard says whether the hub hears a node in state s: its heartbeats
// arrive.
func heard(s State) bool {
	return s == Healthy || s == Pending || s == NotReady || s == Recovering
}

// stateEvent records the event of a node entering state s.
func (c *Controller) stateEvent(n *corev1.Node, s State) {
	switch s {
	case Unreachable, NotReady:
		c.events.Eventf(nodeRef(n), corev1.EventTypeNormal, eventReasonNodeNotReady, "Node %s status is now: NodeNotReady", n.Name)
	case Partitioned:
		c.events.Eventf(nodeRef(n), corev1.EventTypeNormal, eventReasonNodeUnreachable, "Node %s is cut off from the hub but its site peers see it alive; its pods stay", n.Name)
	case Dead:
		c.events.Eventf(nodeRef(n), corev1.EventTypeWarning, eventReasonNodeDead, "Node %s is gone: its site peers agree and the hub hears nothing; its pods are replaced now", n.Name)
	case SiteDark:
		c.events.Eventf(nodeRef(n), corev1.EventTypeNormal, eventReasonSiteDark, "Node %s: no node of its site is heard by the hub; its pods stay unless their disconnect policy asks for a replacement", n.Name)
	}
}

func nodeRef(n *corev1.Node) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: n.Name, UID: n.UID}
}

// conditionsMarked are the conditions a silent node's status loses, as
// upstream's list.
var conditionsMarked = []corev1.NodeConditionType{
	corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure,
}

// markUnknown returns a copy of n whose conditions read Unknown with msg
// (the upstream message when empty), and whether anything changed.
// lastHeartbeatTime is kept: it says when the node last spoke.
func markUnknown(n *corev1.Node, msg string, now time.Time) (*corev1.Node, bool) {
	if msg == "" {
		msg = MessageStatusUnknown
	}
	u := n.DeepCopy()
	changed := false
	for _, t := range conditionsMarked {
		found := false
		for i := range u.Status.Conditions {
			c := &u.Status.Conditions[i]
			if c.Type != t {
				continue
			}
			found = true
			switch {
			case c.Status != corev1.ConditionUnknown:
				c.Status = corev1.ConditionUnknown
				c.Reason = ReasonStatusUnknown
				c.Message = msg
				c.LastTransitionTime = metav1.NewTime(now)
				changed = true
			case c.Reason == ReasonStatusUnknown && c.Message != msg:
				// Still Unknown, for another reason.
				c.Message = msg
				changed = true
			}
		}
		if !found {
			u.Status.Conditions = append(u.Status.Conditions, corev1.NodeCondition{
				Type: t, Status: corev1.ConditionUnknown,
				Reason: ReasonStatusNeverUpdated, Message: MessageStatusNeverUpdated,
				LastHeartbeatTime: n.CreationTimestamp, LastTransitionTime: metav1.NewTime(now),
			})
			changed = true
		}
	}
	return u, changed
}

func isLifecycleTaint(t corev1.Taint) bool {
	return ((t.Key == TaintUnreachable || t.Key == TaintNotReady) &&
		(t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute)) ||
		(t.Key == TaintDead && t.Effect == corev1.TaintEffectNoExecute)
}

// lifecycleTaints returns the node's taints with the lifecycle ones as
// the decision wants them, and whether they changed. A NoExecute taint is
// added only when the zone's rate allows one now, unless the decision
// says at once; otherwise the next pass tries again.
func (c *Controller) lifecycleTaints(n *corev1.Node, d Decision, zc zoneContext, now time.Time) ([]corev1.Taint, bool) {
	frozen := zc.frozen && !d.Immediate
	var out []corev1.Taint
	has := func(key string, effect corev1.TaintEffect) *corev1.Taint {
		for i := range n.Spec.Taints {
			if t := n.Spec.Taints[i]; t.Key == key && t.Effect == effect {
				return &n.Spec.Taints[i]
			}
		}
		return nil
	}
	changed := false
	for _, t := range n.Spec.Taints {
		if !isLifecycleTaint(t) {
			out = append(out, t)
			continue
		}
		keep := (t.Effect == corev1.TaintEffectNoSchedule && t.Key == d.NoSchedule) ||
			(t.Effect == corev1.TaintEffectNoExecute && t.Key == d.NoExecute && !frozen)
		if keep {
			out = append(out, t)
		} else {
			changed = true
		}
	}
	if d.NoSchedule != "" && has(d.NoSchedule, corev1.TaintEffectNoSchedule) == nil {
		out = append(out, corev1.Taint{Key: d.NoSchedule, Effect: corev1.TaintEffectNoSchedule, TimeAdded: ptrTime(now)})
		changed = true
	}
	if d.NoExecute != "" && !frozen && has(d.NoExecute, corev1.TaintEffectNoExecute) == nil && (d.Immediate || c.takeToken(zc.zone, zc.rate, now)) {
		out = append(out, corev1.Taint{Key: d.NoExecute, Effect: corev1.TaintEffectNoExecute, TimeAdded: ptrTime(now)})
		changed = true
	}
	return out, changed
}

// takeToken says whether a node of zone may get a NoExecute taint now, at
// rate nodes per second, and if so uses the zone's turn.
func (c *Controller) takeToken(zone string, rate float64, now time.Time) bool {
	if rate <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Before(c.zoneNext[zone]) {
		return false
	}
	c.zoneNext[zone] = now.Add(time.Duration(float64(time.Second) / rate))
	return true
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}

// markPodsNotReady sets Ready=False on the node's pods that still read
// ready, so Services stop sending them traffic.
func (c *Controller) markPodsNotReady(ctx context.Context, node string, now time.Time) error {
	objs, err := c.pods.ByIndex(podNodeIndex, node)
	if err != nil {
		return fmt.Errorf("list pods of node: %w", err)
	}
	var errs []error
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		idx := -1
		for i, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status != corev1.ConditionFalse {
				idx = i
			}
		}
		if idx < 0 {
			continue
		}
		u := p.DeepCopy()
		u.Status.Conditions[idx].Status = corev1.ConditionFalse
		u.Status.Conditions[idx].Reason = ""
		u.Status.Conditions[idx].LastTransitionTime = metav1.NewTime(now)
		if _, err := c.cfg.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); ignoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("mark pod %s/%s not ready: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}
