package edge

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/dataplane/policy"
)

// The node enforces NetworkPolicy with dataplane/policy, from three kept
// informers: every NetworkPolicy, every Namespace (its labels) and every
// pod of the cluster, reduced before it is stored to what policies select
// on (labels, node, addresses, named ports). All three are kept in the
// local state, so a node cut off from the hub, or whose agent restarts
// while it is, keeps compiling the same rules; the programs and maps are
// pinned and hold the last rules while no agent runs.

// Local state kinds and watches of the policy informers.
const (
	keptPolicies   = "networkpolicies"
	keptNamespaces = "namespaces"
	keptPeerPods   = "peerpods"
)

// netpolWatch tells whether w is a watch of the policy informers.
func netpolWatch(w string) bool {
	return w == keptPolicies || w == keptNamespaces || w == keptPeerPods
}

// latencyWindow is how many change latencies the agent keeps for its
// quantiles.
const latencyWindow = 1024

// netPolicy feeds the node's policy enforcer.
type netPolicy struct {
	a   *Agent
	enf *policy.Enforcer

	pods, namespaces, policies cache.Store
	ctrls                      []cache.Controller

	kick chan struct{}

	mu        sync.Mutex
	pending   time.Time // the oldest change not yet applied
	latencies []time.Duration
	warnings  []string
	rules     *policy.Rules

	applies, failures atomic.Int64
}

// startNetPolicy loads the policy programs on the dataplane's cgroup and
// pins them beside its maps.
func (a *Agent) startNetPolicy() (*netPolicy, error) {
	enf, err := policy.New(policy.Config{CgroupPath: a.cfg.DataplaneCgroup, BPFFSPath: a.cfg.DataplaneBPFFS, Logger: a.cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("start NetworkPolicy enforcement: %w", err)
	}
	n := &netPolicy{a: a, enf: enf, kick: make(chan struct{}, 1)}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.changed() },
		UpdateFunc: func(any, any) { n.changed() },
		DeleteFunc: func(any) { n.changed() },
	}
	var ctrl cache.Controller
	n.policies, ctrl = newInformer(&listWatch{
		keep: a.keep(keptPolicies),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.NetworkPolicies(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.NetworkPolicies(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &networkingv1.NetworkPolicy{}, h)
	n.ctrls = append(n.ctrls, ctrl)
	n.namespaces, ctrl = newInformer(&listWatch{
		keep: a.keep(keptNamespaces),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := a.client.Namespaces().List(ctx, o)
			if l != nil {
				for i := range l.Items {
					reduceNamespace(&l.Items[i])
				}
			}
			return l, err
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := a.client.Namespaces().Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				if ns, ok := ev.Object.(*corev1.Namespace); ok {
					reduceNamespace(ns)
				}
				return ev, true
			}), nil
		},
	}, &corev1.Namespace{}, h)
	n.ctrls = append(n.ctrls, ctrl)
	n.pods, ctrl = newInformer(&listWatch{
		keep: a.keep(keptPeerPods),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := a.client.Pods(metav1.NamespaceAll).List(ctx, o)
			if l != nil {
				for i := range l.Items {
					reducePod(&l.Items[i])
				}
			}
			return l, err
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := a.client.Pods(metav1.NamespaceAll).Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					reducePod(p)
				}
				return ev, true
			}), nil
		},
	}, &corev1.Pod{}, h)
	n.ctrls = append(n.ctrls, ctrl)
	return n, nil
}

// reducePod keeps of a peer pod what policies select on and where it is.
func reducePod(p *corev1.Pod) {
	var ports []corev1.ContainerPort
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.ContainerPort, Protocol: cp.Protocol})
			}
		}
	}
	p.ObjectMeta = metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion, Labels: p.Labels}
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}
	if len(ports) > 0 {
		p.Spec.Containers = []corev1.Container{{Name: "ports", Ports: ports}}
	}
	p.Status = corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs}
}

// reduceNamespace keeps a namespace's name and labels.
func reduceNamespace(ns *corev1.Namespace) {
	ns.ObjectMeta = metav1.ObjectMeta{Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion, Labels: ns.Labels}
	ns.Spec, ns.Status = corev1.NamespaceSpec{}, corev1.NamespaceStatus{}
}

// changed notes a change of any input; the loop applies it.
func (n *netPolicy) changed() {
	n.mu.Lock()
	if n.pending.IsZero() {
		n.pending = time.Now()
	}
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// run runs the informers and, once all three have their objects (from the
// hub or the local state), compiles and applies the rules after every
// change. Changes that come while one is applied are applied together.
func (n *netPolicy) run(ctx context.Context, goRun func(func())) {
	for _, c := range n.ctrls {
		goRun(func() { c.RunWithContext(ctx) })
	}
	goRun(func() {
		synced := make([]cache.InformerSynced, 0, len(n.ctrls))
		for _, c := range n.ctrls {
			synced = append(synced, c.HasSynced)
		}
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		retry := time.NewTimer(time.Hour)
		defer retry.Stop()
		n.changed()
		for {
			select {
			case <-ctx.Done():
				return
			case <-n.kick:
			case <-retry.C:
			}
			if err := n.apply(); err != nil {
				n.a.log.Warn("apply NetworkPolicy rules", "err", err, "retry in", dataplaneResync)
				retry.Reset(dataplaneResync)
			}
		}
	})
}

// apply compiles the stores' objects and writes the differences.
func (n *netPolicy) apply() error {
	n.mu.Lock()
	since := n.pending
	n.pending = time.Time{}
	n.mu.Unlock()
	rules := policy.Compile(n.input())
	_, err := n.enf.Apply(rules)
	n.applies.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.failures.Add(1)
		if n.pending.IsZero() || since.Before(n.pending) {
			n.pending = since
		}
		return err
	}
	if !slices.Equal(rules.Warnings, n.warnings) {
		for _, w := range rules.Warnings {
			n.a.log.Warn("NetworkPolicy not enforced as written", "reason", w)
		}
	}
	n.warnings, n.rules = rules.Warnings, rules
	if !since.IsZero() {
		if len(n.latencies) == latencyWindow {
			n.latencies = n.latencies[1:]
		}
		n.latencies = append(n.latencies, time.Since(since))
	}
	return nil
}

// input gathers the compiler's input from the stores.
func (n *netPolicy) input() policy.Input {
	in := policy.Input{Namespaces: map[string]map[string]string{}, NodeIPs: hostAddrs()}
	for _, o := range n.namespaces.List() {
		ns := o.(*corev1.Namespace)
		in.Namespaces[ns.Name] = ns.Labels
	}
	for _, o := range n.policies.List() {
		in.Policies = append(in.Policies, o.(*networkingv1.NetworkPolicy))
	}
	for _, o := range n.pods.List() {
		p := o.(*corev1.Pod)
		in.Pods = append(in.Pods, policy.PodFromAPI(p, p.Spec.NodeName == n.a.name))
	}
	return in
}

// hostAddrs lists the addresses of the node's interfaces: traffic from
// them into pods is the node's (probes) and always allowed.
func hostAddrs() []netip.Addr {
	var out []netip.Addr
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && !ip.IsLoopback() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// changeLatency returns the p50 and p99 of the time from a change of an
// input to its rules being in the maps, over the last latencyWindow
// changes.
func (n *netPolicy) changeLatency() (p50, p99 time.Duration) {
	n.mu.Lock()
	l := slices.Clone(n.latencies)
	n.mu.Unlock()
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	return l[len(l)/2], l[(len(l)*99)/100]
}

// collect sends the enforcer's counters, and its drops by local pod and
// direction; nothing when the node enforces no NetworkPolicy.
func (n *netPolicy) collect(out sampleWriter) {
	if n == nil {
		return
	}
	n.mu.Lock()
	pods := map[policy.Endpoint]string{}
	if n.rules != nil {
		for ep, name := range n.rules.Isolated {
			pods[ep] = name
		}
	}
	n.mu.Unlock()
	out.counter("tether_edge_netpol_applies_total", "NetworkPolicy rule sets compiled and written to the maps.", float64(n.applies.Load()))
	out.counter("tether_edge_netpol_apply_failures_total", "NetworkPolicy rule sets the maps did not take.", float64(n.failures.Load()))
	if s, err := n.enf.Stats(); err == nil {
		const help = "Packets of isolated pods judged by NetworkPolicy, by verdict."
		out.counter("tether_edge_netpol_packets_total", help, float64(s.Allowed), "verdict", "allowed")
		out.counter("tether_edge_netpol_packets_total", help, float64(s.Dropped), "verdict", "dropped")
		out.counter("tether_edge_netpol_packets_total", help, float64(s.ReplyHits), "verdict", "reply")
	}
	_, p99 := n.changeLatency()
	out.gauge("tether_edge_netpol_change_p99_seconds",
		"99th percentile of the time from a NetworkPolicy, pod or namespace change to its rules being enforced.", p99.Seconds())
	for ep, c := range n.enf.Drops() {
		if name, ok := pods[ep]; ok {
			out.counter("tether_edge_netpol_drops_total", "Packets NetworkPolicy dropped, by local pod and direction.", float64(c),
				"pod", name, "direction", ep.Dir.String())
		}
	}
}

// close releases the enforcer's handles; its programs and rules stay.
func (n *netPolicy) close() {
	n.enf.Close()
}
