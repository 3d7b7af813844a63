package nodelifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// fakeEnv runs the controller against a fake clientset on a fake clock:
// the tests step time by minutes in milliseconds and call the monitor pass
// themselves.
type fakeEnv struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	client *fake.Clientset
	clk    *clocktesting.FakeClock
	f      informers.SharedInformerFactory
	c      *Controller

	mu    sync.Mutex
	peers map[string]PeerView
}

// newFakeEnv makes the clientset behave enough like a hub for informers
// and controllers: resourceVersions move on every write, and created
// objects get names from generateName, UIDs and creation times on the
// fake clock.
func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	e := &fakeEnv{t: t, client: fake.NewSimpleClientset(), clk: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)), peers: map[string]PeerView{}}
	var rv, seq atomic.Int64
	e.client.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		// Create and update actions both carry the object to store.
		oa, ok := a.(interface{ GetObject() runtime.Object })
		if !ok || (a.GetVerb() != "create" && a.GetVerb() != "update") {
			return false, nil, nil
		}
		obj := oa.GetObject()
		m, err := metaOf(obj)
		if err != nil {
			return false, nil, nil
		}
		if a.GetVerb() == "create" {
			if m.GetName() == "" && m.GetGenerateName() != "" {
				m.SetName(m.GetGenerateName() + strconv.FormatInt(seq.Add(1), 10))
			}
			if m.GetUID() == "" {
				m.SetUID(types.UID(fmt.Sprintf("uid-%d", seq.Add(1))))
			}
			if ct := m.GetCreationTimestamp(); ct.IsZero() {
				m.SetCreationTimestamp(metav1.NewTime(e.clk.Now()))
			}
		}
		m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		return false, nil, nil
	})
	e.ctx, e.cancel = context.WithCancel(context.Background())
	t.Cleanup(e.cancel)
	e.f = informers.NewSharedInformerFactory(e.client, 0)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := New(Config{
		Client: e.client, Informers: e.f, Workers: 2, Logger: log, Clock: e.clk,
		GracePeriod: 40 * time.Second, DeadGrace: 10 * time.Second,
		Peers: func(n string) PeerView {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.peers[n]
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	return e
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("no metadata in %T", obj)
	}
	return m, nil
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// start runs the informers, the controller's workers (not its monitor
// loop: the test runs the passes) and others, which must have been
// created on the factory before.
func (e *fakeEnv) start(others ...interface{ Run(context.Context) error }) {
	var wg sync.WaitGroup
	e.t.Cleanup(func() {
		e.cancel()
		wg.Wait()
	})
	e.f.Start(e.ctx.Done())
	e.f.WaitForCacheSync(e.ctx.Done())
	for _, r := range others {
		wg.Go(func() { _ = r.Run(e.ctx) })
	}
	e.c.events.Start(e.ctx)
	wg.Go(func() { e.c.evictQueue.Run(e.ctx, e.c.cfg.Workers, e.c.log, e.c.syncPod) })
	wg.Go(func() { e.c.nodeQueue.Run(e.ctx, 1, e.c.log, e.c.syncUnschedulable) })
}

func (e *fakeEnv) setPeers(node string, v PeerView) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.peers[node] = v
}

// node creates a Ready node of zone with its Lease.
func (e *fakeEnv) node(name, zone string) {
	e.t.Helper()
	now := metav1.NewTime(e.clk.Now())
	if _, err := e.client.CoreV1().Nodes().Create(e.ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone, corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now,
		}}},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.CoordinationV1().Leases(LeaseNamespace).Create(e.ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: LeaseNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, RenewTime: &metav1.MicroTime{Time: e.clk.Now()}},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// renew renews the nodes' Leases at the fake clock's now and waits until
// the controller has seen it.
func (e *fakeEnv) renew(nodes ...string) {
	e.t.Helper()
	for _, n := range nodes {
		l, err := e.client.CoordinationV1().Leases(LeaseNamespace).Get(e.ctx, n, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		l.Spec.RenewTime = &metav1.MicroTime{Time: e.clk.Now()}
		if _, err := e.client.CoordinationV1().Leases(LeaseNamespace).Update(e.ctx, l, metav1.UpdateOptions{}); err != nil {
			e.t.Fatal(err)
		}
		e.wait("lease of "+n+" seen", func() (bool, error) {
			return e.c.heartbeatAge(n, e.clk.Now()) == 0, nil
		})
	}
}

// nodeHeard is the node's agent back: Lease renewed and Ready reposted.
func (e *fakeEnv) nodeHeard(name string) {
	e.t.Helper()
	e.renew(name)
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	now := metav1.NewTime(e.clk.Now())
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.wait("node "+name+" ready in the cache", func() (bool, error) {
		n, err := e.c.nodes.Get(name)
		return err == nil && readyCondition(n).Status == corev1.ConditionTrue, err
	})
}

// pass runs one monitor pass and waits until the informers have seen its
// node writes.
func (e *fakeEnv) pass() {
	e.t.Helper()
	e.c.monitor(e.ctx)
	e.wait("node writes seen", func() (bool, error) {
		l, err := e.client.CoreV1().Nodes().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, n := range l.Items {
			cached, err := e.c.nodes.Get(n.Name)
			if err != nil || cached.ResourceVersion != n.ResourceVersion {
				return false, err
			}
		}
		return true, nil
	})
}

// settle has every pod looked at again and gives the controller a moment,
// before a test checks that nothing happened.
func (e *fakeEnv) settle() {
	for _, k := range e.c.pods.ListKeys() {
		e.c.evictQueue.Add(k)
	}
	e.clk.Step(0)
	time.Sleep(100 * time.Millisecond)
}

// state is the controller's last decision on a node.
func (e *fakeEnv) state(node string) State {
	e.c.mu.Lock()
	defer e.c.mu.Unlock()
	return e.c.states[node]
}

// step moves the fake clock on.
func (e *fakeEnv) step(d time.Duration) { e.clk.Step(d) }

// wait polls cond in real time. Between polls it looks at every pod
// again: a delayed requeue may miss a step of the fake clock that lands
// between the queue reading the clock and setting its timer.
func (e *fakeEnv) wait(what string, cond func() (bool, error)) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		var ok bool
		if ok, err = cond(); ok {
			return
		}
		e.clk.Step(0)
		for _, k := range e.c.pods.ListKeys() {
			e.c.evictQueue.Add(k)
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("timed out waiting for %s: %v", what, err)
}

func tolerateUnreachable(secs *int64) []corev1.Toleration {
	return []corev1.Toleration{{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: secs}}
}

func seconds(s int64) *int64 { return &s }

// pod creates a running, ready pod on node.
func (e *fakeEnv) pod(name, node string, tols []corev1.Toleration) {
	e.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: node, Tolerations: tols, Containers: []corev1.Container{{Name: "c", Image: "app:1"}}},
	}
	p.Status = runningStatus(e.clk.Now())
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.wait("pod "+name+" cached", func() (bool, error) {
		_, ok, err := e.c.pods.GetByKey("default/" + name)
		return ok, err
	})
}

func runningStatus(at time.Time) corev1.PodStatus {
	t := metav1.NewTime(at)
	return corev1.PodStatus{
		Phase: corev1.PodRunning, StartTime: &t,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: t}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true, State: corev1.ContainerState{
			Running: &corev1.ContainerStateRunning{StartedAt: t}}}},
	}
}

func (e *fakeEnv) getPod(name string) (*corev1.Pod, bool) {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return p, true
}

func (e *fakeEnv) getNode(name string) *corev1.Node {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// noExecute returns the node's NoExecute taint keys, and whether it has
// the unreachable NoSchedule taint.
func noExecute(n *corev1.Node) (keys []string, noSchedule bool) {
	for _, t := range n.Spec.Taints {
		switch {
		case t.Effect == corev1.TaintEffectNoExecute:
			keys = append(keys, t.Key)
		case t.Key == TaintUnreachable && t.Effect == corev1.TaintEffectNoSchedule:
			noSchedule = true
		}
	}
	return keys, noSchedule
}

func podReady(p *corev1.Pod) bool { return kit.IsPodReady(p) }

// TestDeadNodeReplacedAtOnce: a node its site peers agree is gone, and
// that the hub has not heard for DeadGrace (well inside the 40s grace
// period), gets the dead taint at once and loses every pod, even one
// tolerating the unreachable taint for ever.
func TestDeadNodeReplacedAtOnce(t *testing.T) {
	e := newFakeEnv(t)
	e.node("a1", "a")
	e.node("a2", "a")
	e.start()
	e.pod("forever", "a1", tolerateUnreachable(nil))
	e.pod("default", "a1", tolerateUnreachable(seconds(300)))
	e.pod("other", "a2", nil)

	// Peers see a1 dead; the hub last heard it 5s ago: not yet.
	e.setPeers("a1", PeersSeeDead)
	e.step(5 * time.Second)
	e.renew("a2")
	e.pass()
	if keys, _ := noExecute(e.getNode("a1")); len(keys) != 0 {
		t.Fatalf("taints %v within the dead grace", keys)
	}

	e.step(6 * time.Second) // 11s of silence
	e.renew("a2")
	e.pass()
	n := e.getNode("a1")
	keys, noSchedule := noExecute(n)
	if len(keys) != 1 || keys[0] != TaintDead || !noSchedule {
		t.Fatalf("dead node taints %+v, want %s NoExecute and unreachable NoSchedule", n.Spec.Taints, TaintDead)
	}
	if r := readyCondition(n); r.Status != corev1.ConditionUnknown || r.Message != MessageDead {
		t.Errorf("dead node Ready %+v, want Unknown with %q", r, MessageDead)
	}
	for _, name := range []string{"forever", "default"} {
		e.wait("pod "+name+" of the dead node deleted", func() (bool, error) {
			_, ok := e.getPod(name)
			return !ok, nil
		})
	}
	if _, ok := e.getPod("other"); !ok {
		t.Errorf("pod of the healthy node deleted")
	}
	if keys, _ := noExecute(e.getNode("a2")); len(keys) != 0 {
		t.Errorf("healthy node tainted %v", keys)
	}
}

// TestSiteDarkEvictsByPolicyOnly: every node of site b goes silent with no
// word from peers (site a is fine). The site's nodes read Unknown with the
// unreachable NoSchedule taint only; their pods stay ready; a pod whose
// toleration says 60s leaves 60s after the NoSchedule taint, a pod
// tolerating for ever and one with no toleration stay.
func TestSiteDarkEvictsByPolicyOnly(t *testing.T) {
	e := newFakeEnv(t)
	e.node("a1", "a")
	e.node("b1", "b")
	e.node("b2", "b")
	e.start()
	e.pod("t60", "b1", tolerateUnreachable(seconds(60)))
	e.pod("forever", "b1", tolerateUnreachable(nil))
	e.pod("none", "b2", nil)

	e.step(41 * time.Second)
	e.renew("a1")
	e.pass()
	for _, name := range []string{"b1", "b2"} {
		n := e.getNode(name)
		keys, noSchedule := noExecute(n)
		if len(keys) != 0 || !noSchedule {
			t.Fatalf("dark site node %s taints %+v, want unreachable NoSchedule only", name, n.Spec.Taints)
		}
		if r := readyCondition(n); r.Status != corev1.ConditionUnknown || r.Message != MessageSiteDark {
			t.Errorf("dark site node %s Ready %+v", name, r)
		}
	}
	if keys, noSchedule := noExecute(e.getNode("a1")); len(keys) != 0 || noSchedule {
		t.Errorf("node of the healthy site tainted")
	}

	e.step(59 * time.Second)
	e.renew("a1")
	e.pass()
	for _, name := range []string{"t60", "forever", "none"} {
		p, ok := e.getPod(name)
		if !ok {
			t.Fatalf("pod %s gone before its toleration ran out", name)
		}
		if !podReady(p) {
			t.Errorf("pod %s of a dark site marked not ready", name)
		}
	}
	e.step(time.Second)
	e.wait("pod with the 60s toleration evicted", func() (bool, error) {
		_, ok := e.getPod("t60")
		return !ok, nil
	})
	e.step(time.Hour - 2*time.Minute)
	e.renew("a1")
	e.pass()
	e.settle()
	for _, name := range []string{"forever", "none"} {
		if _, ok := e.getPod(name); !ok {
			t.Errorf("pod %s evicted from a dark site", name)
		}
	}
}

// TestEveryZoneDownEvictsNothing: when every site is dark, the hub's own
// link is the likely cause: not even pods asking to be replaced leave.
func TestEveryZoneDownEvictsNothing(t *testing.T) {
	e := newFakeEnv(t)
	e.node("a1", "a")
	e.node("b1", "b")
	e.start()
	e.pod("t60", "b1", tolerateUnreachable(seconds(60)))
	e.step(41 * time.Second)
	e.pass()
	e.step(2 * time.Minute)
	e.pass()
	e.settle()
	if _, ok := e.getPod("t60"); !ok {
		t.Errorf("pod evicted while every zone is down")
	}
	if keys, noSchedule := noExecute(e.getNode("b1")); len(keys) != 0 || !noSchedule {
		t.Errorf("taints %v, want unreachable NoSchedule only", keys)
	}
}

// TestPartitionedKeepsPods: a silent node its peers see alive gets the
// unreachable NoSchedule taint only and keeps its pods, ready, however
// long the cut lasts.
func TestPartitionedKeepsPods(t *testing.T) {
	e := newFakeEnv(t)
	e.node("a1", "a")
	e.node("a2", "a")
	e.start()
	e.pod("short", "a1", tolerateUnreachable(seconds(1)))
	e.pod("none", "a1", nil)
	e.setPeers("a1", PeersSeeAlive)
	e.step(41 * time.Second)
	e.renew("a2")
	e.pass()
	n := e.getNode("a1")
	if keys, noSchedule := noExecute(n); len(keys) != 0 || !noSchedule {
		t.Fatalf("partitioned node taints %+v", n.Spec.Taints)
	}
	if r := readyCondition(n); r.Status != corev1.ConditionUnknown || r.Message != MessagePartitioned {
		t.Errorf("partitioned node Ready %+v", r)
	}
	e.step(time.Hour)
	e.renew("a2")
	e.pass()
	e.settle()
	for _, name := range []string{"short", "none"} {
		p, ok := e.getPod(name)
		if !ok || !podReady(p) {
			t.Errorf("pod %s of a partitioned node evicted or unready", name)
		}
	}
}

// TestSiteGoingDarkUnevenly: the nodes of a site that lost its uplink go
// stale in different monitor passes, since their Leases lag their
// tunnels. While one node's Lease is still fresh but the hub hears no
// node of the site any more, the stale one is SiteDark (NoSchedule only,
// its pods stay ready), not unreachable; without word of the tunnels it
// would be taken as unreachable.
func TestSiteGoingDarkUnevenly(t *testing.T) {
	for _, heardKnown := range []bool{true, false} {
		t.Run(fmt.Sprintf("tunnels_known=%v", heardKnown), func(t *testing.T) {
			e := newFakeEnv(t)
			if heardKnown {
				e.c.cfg.SiteHeard = func(zone string) bool { return zone != "b" }
			}
			e.node("a1", "a")
			e.node("b1", "b")
			e.node("b2", "b")
			e.start()
			e.pod("p", "b1", nil)

			e.step(41 * time.Second)
			e.renew("a1", "b2")
			e.pass()
			n := e.getNode("b1")
			keys, noSchedule := noExecute(n)
			if !heardKnown {
				if len(keys) == 0 {
					t.Fatalf("without word of the tunnels b1 taints %+v, want unreachable NoExecute", n.Spec.Taints)
				}
				return
			}
			if len(keys) != 0 || !noSchedule {
				t.Fatalf("b1 of a site the hub no longer hears taints %+v, want unreachable NoSchedule only", n.Spec.Taints)
			}
			if r := readyCondition(n); r.Status != corev1.ConditionUnknown || r.Message != MessageSiteDark {
				t.Errorf("b1 Ready %+v, want Unknown with the site-dark message", r)
			}
			e.settle()
			if p, ok := e.getPod("p"); !ok || !podReady(p) {
				t.Errorf("pod of a dark site gone or marked not ready")
			}
			if keys, noSchedule := noExecute(e.getNode("b2")); len(keys) != 0 || noSchedule {
				t.Errorf("b2, whose Lease is fresh, tainted")
			}
		})
	}
}
