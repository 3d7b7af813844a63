package nodelifecycle

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-nodelifecycle"}

// TestNodeLifecycleAgainstHub runs pods on hollow nodes, stops the agents
// of two of them as if the machines went off, and follows what the
// controller does: the silent node goes Unknown and gets the unreachable
// taints once its Lease is older than the grace period, its pods go
// unready and those whose toleration runs out are evicted, while a node
// its site peers still see keeps its pods. A NoExecute taint from kubectl
// evicts at once, and the node that comes back loses its taints.
func TestNodeLifecycleAgainstHub(t *testing.T) {
	e := kittest.Start(t, hubArgs, 0)
	ctx := context.Background()
	kube := e.Client
	// Four nodes of one site: one going silent is no zone disruption.
	fleets := map[string]*kittest.Fleet{}
	for _, n := range []string{"dead", "part", "ok1", "ok2"} {
		fleets[n] = e.JoinNodes(t, kittest.Nodes{Prefix: n + "-", N: 1})
	}
	node := func(n string) string { return n + "-00000" }

	// The hub renews a connected node's Lease every 7s: the grace period
	// must outlast that.
	const grace = 12 * time.Second
	f := e.Factory()
	c, err := New(Config{
		Client: kube, Informers: f, Workers: 2, Logger: e.Log,
		GracePeriod: grace, MonitorPeriod: 250 * time.Millisecond,
		Peers: func(n string) PeerView {
			if n == node("part") {
				return PeersSeeAlive
			}
			return PeersUnknown
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)

	secs := func(s int64) *int64 { return &s }
	unreachableFor := func(s *int64) []corev1.Toleration {
		return []corev1.Toleration{{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: s}}
	}
	pod := func(name, on string, tols []corev1.Toleration) *corev1.Pod {
		t.Helper()
		p, err := kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{corev1.LabelHostname: node(on)},
				Tolerations:  tols, Containers: []corev1.Container{{Name: "c", Image: "app:1"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod("short", "dead", unreachableFor(secs(2)))
	pod("forever", "dead", unreachableFor(nil))
	dflt := pod("default", "dead", nil)
	pod("partitioned", "part", unreachableFor(secs(2)))
	pod("plain", "ok1", nil)
	kittest.WaitFor(t, "pods running and ready on their nodes", 60*time.Second, func() (bool, error) {
		l, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, p := range l.Items {
			if kit.IsPodReady(&p) {
				ready++
			}
		}
		return ready == 5, fmt.Errorf("%d of 5 ready", ready)
	})

	// The hub's admission gives pods without one the toleration of the
	// default disconnect policy: an unreachable node's pods stay.
	hasDefault := false
	for _, tol := range dflt.Spec.Tolerations {
		if tol.Key == TaintUnreachable && tol.Effect == corev1.TaintEffectNoExecute && tol.TolerationSeconds == nil {
			hasDefault = true
		}
	}
	if !hasDefault {
		t.Errorf("pod without tolerations did not get the default policy's unreachable toleration: %+v", dflt.Spec.Tolerations)
	}

	// Healthy nodes stay untouched well past the grace period.
	time.Sleep(grace + time.Second)
	for _, n := range []string{"dead", "part", "ok1"} {
		node, err := kube.CoreV1().Nodes().Get(ctx, node(n), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(node.Spec.Taints) != 0 || readyCondition(node).Status != corev1.ConditionTrue {
			t.Fatalf("healthy node %s: taints %v ready %v", n, node.Spec.Taints, readyCondition(node))
		}
	}

	fleets["dead"].Stop()
	fleets["part"].Stop()
	// lastRenewal is when the hub last renewed a stopped node's Lease.
	lastRenewal := func(n string) time.Time {
		t.Helper()
		l, err := kube.CoordinationV1().Leases(LeaseNamespace).Get(ctx, node(n), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Spec.RenewTime.Time
	}

	taintsOf := func(name string) map[string]bool {
		node, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, tn := range node.Spec.Taints {
			out[tn.Key+":"+string(tn.Effect)] = true
		}
		return out
	}
	var tainted time.Duration
	kittest.WaitFor(t, "silent node Unknown with unreachable taints", grace+20*time.Second, func() (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, node("dead"), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r := readyCondition(n)
		tn := taintsOf(node("dead"))
		ok := r.Status == corev1.ConditionUnknown && r.Reason == ReasonStatusUnknown && r.Message == MessageStatusUnknown &&
			tn[TaintUnreachable+":NoSchedule"] && tn[TaintUnreachable+":NoExecute"]
		tainted = time.Since(lastRenewal("dead"))
		return ok, fmt.Errorf("ready %+v taints %v", r, tn)
	})
	t.Logf("silent node marked Unknown and tainted %v after its last renewal (grace %v)", tainted, grace)
	if tainted < grace {
		t.Errorf("node tainted after %v, before the %v grace period", tainted, grace)
	}
	out := e.Kubectl(t, "get", "node", node("dead"), "--no-headers")
	if !strings.Contains(out, "NotReady") {
		t.Errorf("kubectl get node: %s", out)
	}

	kittest.WaitFor(t, "pods of the silent node not ready", 5*time.Second, func() (bool, error) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, "forever", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionFalse, fmt.Errorf("ready %s", c.Status)
			}
		}
		return false, nil
	})

	evicted := func(name string) (bool, error) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return p.DeletionTimestamp != nil, nil
	}
	kittest.WaitFor(t, "pod with a 2s toleration evicted", 10*time.Second, func() (bool, error) { return evicted("short") })
	evictedAfter := time.Since(lastRenewal("dead"))
	t.Logf("pod with tolerationSeconds=2 evicted %v after the last renewal", evictedAfter)
	if evictedAfter < grace+2*time.Second {
		t.Errorf("evicted after %v, before grace + tolerationSeconds", evictedAfter)
	}
	if p, err := kube.CoreV1().Pods("default").Get(ctx, "short", metav1.GetOptions{}); err == nil {
		found := false
		for _, c := range p.Status.Conditions {
			found = found || (c.Type == corev1.DisruptionTarget && c.Reason == reasonDeletionByTaintMgr)
		}
		if !found {
			t.Errorf("evicted pod lacks the DisruptionTarget condition: %+v", p.Status.Conditions)
		}
	}

	// The partitioned node: Unknown, NoSchedule only, pods kept and ready.
	// The hub renewed its Lease up to a renewal period after the silent
	// node's, so it goes stale up to that much later: wait for it, then
	// outlast its pod's 2s toleration.
	kittest.WaitFor(t, "partitioned node Unknown", grace+20*time.Second, func() (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, node("part"), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r := readyCondition(n)
		if r == nil {
			return false, fmt.Errorf("no Ready condition")
		}
		return r.Status == corev1.ConditionUnknown && r.Message == MessagePartitioned, fmt.Errorf("ready %+v", r)
	})
	time.Sleep(3 * time.Second)
	tn := taintsOf(node("part"))
	if !tn[TaintUnreachable+":NoSchedule"] || tn[TaintUnreachable+":NoExecute"] {
		t.Errorf("partitioned node taints %v, want unreachable NoSchedule only", tn)
	}
	for _, name := range []string{"partitioned", "forever", "default"} {
		if gone, err := evicted(name); err != nil || gone {
			t.Errorf("pod %s evicted (err %v)", name, err)
		}
	}
	p, err := kube.CoreV1().Pods("default").Get(ctx, "partitioned", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			t.Errorf("pod of a partitioned node marked %s; it must stay in its Services", c.Status)
		}
	}

	// A NoExecute taint the pod does not tolerate evicts it at once.
	e.Kubectl(t, "taint", "nodes", node("ok1"), "dedicated=x:NoExecute")
	kittest.WaitFor(t, "untolerating pod evicted by kubectl taint", 5*time.Second, func() (bool, error) { return evicted("plain") })

	// The silent node comes back: its taints go.
	fleets["dead"].Restart(t)
	kittest.WaitFor(t, "taints removed from the node that came back", 10*time.Second, func() (bool, error) {
		tn := taintsOf(node("dead"))
		return len(tn) == 0, fmt.Errorf("taints %v", tn)
	})
	if gone, _ := evicted("forever"); gone {
		t.Errorf("pod tolerating for ever was evicted")
	}
}

// TestCordonTaintsNode cordons a node with kubectl and sees the controller
// give it the unschedulable NoSchedule taint, and the hub's scheduler keep
// plain pods off it while pods tolerating the taint, DaemonSet pods by
// default, land there; then uncordons it and sees the taint go, while
// other taints stay.
func TestCordonTaintsNode(t *testing.T) {
	e := kittest.Start(t, hubArgs, 1)
	ctx := context.Background()
	f := e.Factory()
	c, err := New(Config{Client: e.ControllerClient(t, "nodelifecycle"), Informers: f, Workers: 1, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)
	const name = "node-00000"
	e.Kubectl(t, "taint", "node", name, "team=a:NoSchedule")
	unschedulable := func() (*corev1.Taint, []corev1.Taint, error) {
		n, err := e.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		for i, tt := range n.Spec.Taints {
			if tt.Key == corev1.TaintNodeUnschedulable {
				return &n.Spec.Taints[i], n.Spec.Taints, nil
			}
		}
		return nil, n.Spec.Taints, nil
	}

	start := time.Now()
	e.Kubectl(t, "cordon", name)
	kittest.WaitFor(t, "unschedulable taint on the cordoned node", 5*time.Second, func() (bool, error) {
		tt, all, err := unschedulable()
		return tt != nil, fmt.Errorf("taints %v: %v", all, err)
	})
	t.Logf("taint after %v", time.Since(start).Round(time.Millisecond))
	tt, all, _ := unschedulable()
	if tt.Effect != corev1.TaintEffectNoSchedule || tt.Value != "" || tt.TimeAdded == nil {
		t.Errorf("unschedulable taint %+v, want NoSchedule without value, with timeAdded", tt)
	}
	if len(all) != 2 {
		t.Errorf("taints %v, want the user's and the unschedulable one", all)
	}
	if out := e.Kubectl(t, "get", "node", name, "-o", "jsonpath={.spec.taints[*].key}"); !strings.Contains(out, "node.kubernetes.io/unschedulable") {
		t.Errorf("kubectl shows taints %q", out)
	}

	// The hub's scheduler keeps ordinary pods off the cordoned node, and
	// places pods that tolerate the taint there, DaemonSet pods among
	// them.
	pods := e.Client.CoreV1().Pods("default")
	mk := func(podName string, tols []corev1.Toleration) {
		t.Helper()
		if _, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: podName},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{corev1.LabelHostname: name},
				Tolerations:  tols, Containers: []corev1.Container{{Name: "c", Image: "app:1"}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("plain", []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpExists}})
	mk("tolerant", []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpExists},
		{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}})
	e.Apply(t, `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      tolerations: [{key: team, operator: Exists}]
      containers: [{name: c, image: agent:1}]
`)
	kittest.WaitFor(t, "tolerating pods on the cordoned node, the plain one pending", 20*time.Second, func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var state []string
		ok := 0
		for _, p := range l.Items {
			msg := ""
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled {
					msg = c.Message
				}
			}
			state = append(state, fmt.Sprintf("%s on %q (%s)", p.Name, p.Spec.NodeName, msg))
			switch {
			case p.Name == "plain" && p.Spec.NodeName == "" && strings.Contains(msg, "node(s) were unschedulable"):
				ok++
			case p.Name != "plain" && p.Spec.NodeName == name:
				ok++
			}
		}
		return ok == 3 && len(l.Items) == 3, fmt.Errorf("pods %v", state)
	})

	e.Kubectl(t, "uncordon", name)
	kittest.WaitFor(t, "unschedulable taint gone from the uncordoned node", 5*time.Second, func() (bool, error) {
		tt, all, err := unschedulable()
		return tt == nil && len(all) == 1, fmt.Errorf("taints %v: %v", all, err)
	})
}

// TestLostPodAgainstHub runs the Lost path on a real hub with hollow
// nodes: a ReplicaSet pod with replace=true and reconcile=keepOriginal on
// a node that goes silent is marked Lost (the hub takes the condition and
// the controller's role allows it), and the hub's ReplicaSet controller
// starts a replacement on the other node without counting the original.
func TestLostPodAgainstHub(t *testing.T) {
	e := kittest.Start(t, hubArgs, 0)
	ctx := context.Background()
	kube := e.Client
	cut := e.JoinNodes(t, kittest.Nodes{Prefix: "cut-", N: 1})
	const grace = 12 * time.Second
	f := e.Factory()
	c, err := New(Config{Client: e.ControllerClient(t, "nodelifecycle"), Informers: f, Workers: 2, Logger: e.Log,
		GracePeriod: grace, MonitorPeriod: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)
	e.Apply(t, `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations:
        disconnect.tether.io/replace: "true"
        disconnect.tether.io/lost-after: 2s
        disconnect.tether.io/reconcile: keepOriginal
    spec:
      tolerations: [{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}]
      containers: [{name: c, image: web:1}]
`)
	pods := func() []corev1.Pod {
		t.Helper()
		l, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	var orig string
	kittest.WaitFor(t, "the original ready on the node to be cut", 30*time.Second, func() (bool, error) {
		for _, p := range pods() {
			if kit.IsPodReady(&p) {
				orig = p.Name
				return true, nil
			}
		}
		return false, nil
	})
	e.JoinNodes(t, kittest.Nodes{Prefix: "ok-", N: 1})
	cut.Stop()

	kittest.WaitFor(t, "the original marked Lost", grace+30*time.Second, func() (bool, error) {
		p, err := kube.CoreV1().Pods("default").Get(ctx, orig, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return kit.IsPodLost(p) && p.DeletionTimestamp == nil, fmt.Errorf("conditions %+v", p.Status.Conditions)
	})
	var repl string
	kittest.WaitFor(t, "a replacement ready on the other node", 30*time.Second, func() (bool, error) {
		var state []string
		for _, p := range pods() {
			state = append(state, p.Name+" on "+p.Spec.NodeName)
			if p.Name != orig && kit.IsPodReady(&p) && strings.HasPrefix(p.Spec.NodeName, "ok-") {
				repl = p.Name
				return true, nil
			}
		}
		return false, fmt.Errorf("pods %v", state)
	})
	t.Logf("original %s Lost, replacement %s ready", orig, repl)
	kittest.WaitFor(t, "ReplicaSet counting only the replacement", 10*time.Second, func() (bool, error) {
		out := e.Kubectl(t, "get", "rs", "web", "-o", "jsonpath={.status.replicas}/{.status.readyReplicas}")
		return out == "1/1", fmt.Errorf("replicas/ready %q", out)
	})

	p, err := kube.CoreV1().Pods("default").Get(ctx, orig, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kit.IsPodReady(p) || !kit.IsPodLost(p) {
		t.Errorf("original ready %v lost %v, want unready and Lost", kit.IsPodReady(p), kit.IsPodLost(p))
	}

	// The node comes back: keepOriginal keeps the original and the
	// ReplicaSet removes the replacement.
	cut.Restart(t)
	kittest.WaitFor(t, "the replacement removed and the original kept", 60*time.Second, func() (bool, error) {
		var state []string
		names := map[string]bool{}
		for _, p := range pods() {
			state = append(state, fmt.Sprintf("%s on %s ready=%v lost=%v deleting=%v", p.Name, p.Spec.NodeName, kit.IsPodReady(&p), kit.IsPodLost(&p), p.DeletionTimestamp != nil))
			if p.DeletionTimestamp == nil {
				names[p.Name] = true
			}
		}
		return len(names) == 1 && names[orig], fmt.Errorf("pods %v", state)
	})
	p, err = kube.CoreV1().Pods("default").Get(ctx, orig, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kit.IsPodLost(p) {
		t.Errorf("original still marked Lost after its node came back")
	}
}
