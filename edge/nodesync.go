package edge

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// nodeSync registers the Node and keeps its status current: it computes
// the status every StatusCheckInterval and writes it when it changed or
// when StatusInterval passed, as a patch of what changed. It never polls:
// besides those writes it reads the Node only while the hub has not yet
// assigned the pod range, and site members see it in their site's Node
// watch (observe).
type nodeSync struct {
	a     *Agent
	host  hostFacts
	ready chan struct{} // closed once registered
	kick  chan struct{} // a report is wanted before the next check (1 slot)
	// runtimeUp says the container runtime answered the last status
	// check.
	runtimeUp atomic.Bool

	mu         sync.Mutex
	node       *corev1.Node // as last returned by the hub
	lastReport time.Time
	// resend makes the next report a write even when the status did not
	// change here: set on every tunnel connect, because while the hub did
	// not hear the node its lifecycle controller may have set the
	// conditions to Unknown, and when its site's Node watch shows the hub
	// marked this node Unknown (observe).
	resend bool
}

// observe takes the node's Node as its site's Node watch shows it. When
// the hub shows the node's Ready condition Unknown while the tunnel is up,
// the hub's node lifecycle set it (the node's heartbeat came late, or its
// site's word made the hub probe it), and nothing the node reports
// changed: the next check writes the status again rather than leave the
// node Unknown until its status is next due. Every node, in a site or
// not, is also told so by the hub holding its tunnel (resendNow, from the
// node server's POST /status/resend): a watch of its own Node would cost
// the hub about 70 KB per node.
func (s *nodeSync) observe(n *corev1.Node) {
	if n.Name != s.a.name || !s.a.tunnel.Connected() {
		return
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown {
			s.resendStatus()
			return
		}
	}
}

// resendStatus asks for the status to be written at the next check.
func (s *nodeSync) resendStatus() {
	s.mu.Lock()
	s.resend = true
	s.mu.Unlock()
}

// resendNow asks for the status to be written at once: the hub saw the
// Node's Ready condition turn Unknown while the tunnel was up.
func (s *nodeSync) resendNow() {
	s.resendStatus()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *nodeSync) input(ctx context.Context) nodeInput {
	info, err := s.a.cfg.Runtime.Info(ctx)
	s.runtimeUp.Store(err == nil)
	return nodeInput{
		name: s.a.name, ip: s.a.nodeIP, zone: s.a.cfg.Zone, labels: s.a.cfg.Labels,
		info: info, infoErr: err, capacity: s.a.cfg.Capacity, host: s.host, version: s.a.cfg.Version, now: time.Now(),
		extra: s.a.extraCondition.Load(), images: s.a.images.get(ctx, s.a.cfg.Runtime),
	}
}

// network returns the node's addresses for the runtime.
func (s *nodeSync) network() Network {
	n := Network{}
	if s.a.nodeIP.IsValid() {
		n.HostIPs = []netip.Addr{s.a.nodeIP}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node != nil {
		cidrs := s.node.Spec.PodCIDRs
		if len(cidrs) == 0 && s.node.Spec.PodCIDR != "" {
			cidrs = []string{s.node.Spec.PodCIDR}
		}
		for _, c := range cidrs {
			if p, err := netip.ParsePrefix(c); err == nil {
				n.PodCIDRs = append(n.PodCIDRs, p)
			}
		}
	}
	n.DataplaneMasquerades = s.a.masquerade(n.PodCIDRs)
	n.DataplaneHostPorts = s.a.net != nil && s.a.net.hostPorts != nil
	return n
}

// uid returns the UID of the registered Node, "" before.
func (s *nodeSync) uid() types.UID {
	if !s.registered() {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node.UID
}

func (s *nodeSync) registered() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// runnable reports whether pods may run: the node is registered, or an
// earlier run registered it and left its pod ranges in the local state, so
// the node's pods start before the hub answers.
func (s *nodeSync) runnable() bool {
	return s.registered() || (s.a.local != nil && s.a.local.hasNode.Load())
}

// seed takes the node's pod ranges from the local state, until the hub
// answers.
func (s *nodeSync) seed() {
	if s.a.local == nil {
		return
	}
	if n := s.a.local.loadNode(s.a.name); n != nil {
		s.mu.Lock()
		if s.node == nil {
			s.node = n
		}
		s.mu.Unlock()
	}
}

// run registers the node, then reports its status until ctx ends.
func (s *nodeSync) run(ctx context.Context) {
	wait := time.Second
	for {
		err := s.register(ctx)
		if err == nil {
			break
		}
		s.a.log.Warn("register node", "err", err, "retry in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
	close(s.ready)
	s.a.pods.wakeAll()
	t := time.NewTicker(s.a.cfg.StatusCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		if err := s.report(ctx); err != nil {
			s.a.log.Warn("report node status", "err", err)
		}
	}
}

// register creates the Node, or takes over the one a previous run of this
// node left.
func (s *nodeSync) register(ctx context.Context) error {
	in := s.input(ctx)
	nodes := s.a.client.Nodes()
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.a.name, Labels: nodeLabels(in), Annotations: s.a.nodeAnnotations()},
		Status:     buildNodeStatus(in, nil),
	}
	node, err := nodes.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		node, err = nodes.Get(ctx, s.a.name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get existing node: %w", err)
		}
		if missingLabels(node.Labels, want.Labels) || missingLabels(node.Annotations, want.Annotations) {
			n := node.DeepCopy()
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			for k, v := range want.Labels {
				n.Labels[k] = v
			}
			if n.Annotations == nil && len(want.Annotations) > 0 {
				n.Annotations = map[string]string{}
			}
			for k, v := range want.Annotations {
				n.Annotations[k] = v
			}
			if node, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update node labels: %w", err)
			}
		}
		s.a.log.Info("node already registered: updating it", "node", s.a.name)
	} else if err != nil {
		return fmt.Errorf("create node: %w", err)
	} else {
		s.a.log.Info("registered node", "node", s.a.name, "podCIDR", node.Spec.PodCIDR)
	}
	s.mu.Lock()
	s.node = node
	s.mu.Unlock()
	s.a.local.saveNode(node)
	s.a.metrics.registrations.Add(1)
	s.observed(node)
	return s.write(ctx, buildNodeStatus(in, &node.Status), true, false)
}

func missingLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return true
		}
	}
	return false
}

// report writes the node status if it changed or is due.
func (s *nodeSync) report(ctx context.Context) error {
	s.mu.Lock()
	old := s.node.Status
	resend := s.resend
	due := time.Since(s.lastReport) >= s.a.cfg.StatusInterval || resend
	s.resend = false
	noCIDR := s.node.Spec.PodCIDR == "" && len(s.node.Spec.PodCIDRs) == 0
	s.mu.Unlock()
	if noCIDR && due {
		// The hub assigns the range at creation; a hub that did not
		// might do so later.
		if n, err := s.a.client.Nodes().Get(ctx, s.a.name, metav1.GetOptions{}); err == nil {
			s.mu.Lock()
			s.node = n
			s.mu.Unlock()
			s.a.local.saveNode(n)
			if n.Spec.PodCIDR != "" {
				s.a.pods.wakeAll()
			}
		}
	}
	st := buildNodeStatus(s.input(ctx), &old)
	err := s.write(ctx, st, due, resend)
	if err != nil && resend {
		s.mu.Lock()
		s.resend = true
		s.mu.Unlock()
	}
	return err
}

// write patches the node status from what the hub last returned to st,
// when it changed or force says so. With full the patch carries every
// condition whole, whatever the hub last returned: the hub may have
// changed them since.
func (s *nodeSync) write(ctx context.Context, st corev1.NodeStatus, force, full bool) error {
	s.mu.Lock()
	old := s.node.Status
	s.mu.Unlock()
	if !force && sameNodeStatus(old, st) {
		return nil
	}
	if full {
		old = *old.DeepCopy()
		old.Conditions = nil
	}
	patch, err := statusPatch(corev1.Node{Status: old}, corev1.Node{Status: st}, corev1.Node{})
	if err != nil {
		return err
	}
	if emptyPatch(patch) {
		// The hub has this status already (the Node was just created
		// with it): that counts as a report.
		s.mu.Lock()
		s.lastReport = time.Now()
		s.mu.Unlock()
		return nil
	}
	node, err := s.a.client.Nodes().Patch(ctx, s.a.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		// Someone deleted the Node: register again.
		s.a.log.Warn("node was deleted from the hub: registering again", "node", s.a.name)
		return s.register(ctx)
	}
	if err != nil {
		return fmt.Errorf("patch node status: %w", err)
	}
	s.mu.Lock()
	s.node, s.lastReport = node, time.Now()
	s.mu.Unlock()
	s.a.metrics.nodeStatusWrites.Add(1)
	s.observed(node)
	return nil
}

// observed hands the Node the hub returned to Config.NodeObserver.
func (s *nodeSync) observed(n *corev1.Node) {
	if f := s.a.cfg.NodeObserver; f != nil {
		f(n)
	}
}
