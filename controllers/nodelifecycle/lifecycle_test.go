package nodelifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-nodelifecycle"}

// kubeletStandIn plays the kubelets of Node objects no agent runs: it
// registers them Ready and renews their Leases until told to stop, as a
// node that loses its link would.
type kubeletStandIn struct {
	t    *testing.T
	kube kubernetes.Interface
	mu   sync.Mutex
	live map[string]bool
}

func (k *kubeletStandIn) register(name, zone string) {
	k.t.Helper()
	ctx := context.Background()
	n, err := k.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone, corev1.LabelHostname: name},
	}}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	k.postReady(n)
	_, err = k.kube.CoordinationV1().Leases(LeaseNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: new(int32(40)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	k.mu.Lock()
	k.live[name] = true
	k.mu.Unlock()
}

func (k *kubeletStandIn) postReady(n *corev1.Node) {
	k.t.Helper()
	now := metav1.Now()
	n = n.DeepCopy()
	n.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := k.kube.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

func (k *kubeletStandIn) setLive(name string, live bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.live[name] = live
}

// run renews the live nodes' Leases every 500ms.
func (k *kubeletStandIn) run(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.mu.Lock()
		var names []string
		for n, live := range k.live {
			if live {
				names = append(names, n)
			}
		}
		k.mu.Unlock()
		for _, n := range names {
			l, err := k.kube.CoordinationV1().Leases(LeaseNamespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				continue
			}
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, _ = k.kube.CoordinationV1().Leases(LeaseNamespace).Update(ctx, l, metav1.UpdateOptions{})
		}
	}
}

func TestNodeLifecycleAgainstHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h, _, kube := kittest.Hub(t, hubArgs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	kl := &kubeletStandIn{t: t, kube: kube, live: map[string]bool{}}
	// Four nodes of one site: one going silent is no zone disruption.
	for _, n := range []string{"n-dead", "n-part", "n-ok1", "n-ok2"} {
		kl.register(n, "site-a")
	}
	go kl.run(ctx)

	const grace = 3 * time.Second
	factory := informers.NewSharedInformerFactory(kube, 0)
	c, err := New(Config{
		Client: kube, Informers: factory, Workers: 2, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		GracePeriod: grace, MonitorPeriod: 250 * time.Millisecond,
		PeersSeeAlive: func(node string) bool { return node == "n-part" },
	})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		factory.Shutdown()
	}()

	secs := func(s int64) *int64 { return &s }
	unreachableFor := func(s *int64) []corev1.Toleration {
		return []corev1.Toleration{{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: s}}
	}
	pod := func(name, node string, tols []corev1.Toleration) *corev1.Pod {
		t.Helper()
		p, err := kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: node, Tolerations: tols, Containers: []corev1.Container{{Name: "c", Image: "app:1"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.9", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if p, err = kube.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod("short", "n-dead", unreachableFor(secs(2)))
	pod("forever", "n-dead", unreachableFor(nil))
	dflt := pod("default", "n-dead", nil)
	pod("partitioned", "n-part", unreachableFor(secs(2)))
	pod("plain", "n-ok1", nil)

	// The hub's admission gives pods without one the 300s toleration.
	hasDefault := false
	for _, tol := range dflt.Spec.Tolerations {
		if tol.Key == TaintUnreachable && tol.TolerationSeconds != nil && *tol.TolerationSeconds == 300 {
			hasDefault = true
		}
	}
	if !hasDefault {
		t.Errorf("pod without tolerations did not get the default 300s unreachable toleration: %+v", dflt.Spec.Tolerations)
	}

	// Healthy nodes stay untouched well past the grace period.
	time.Sleep(grace + time.Second)
	for _, n := range []string{"n-dead", "n-part", "n-ok1"} {
		node, err := kube.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(node.Spec.Taints) != 0 || readyCondition(node).Status != corev1.ConditionTrue {
			t.Fatalf("healthy node %s: taints %v ready %v", n, node.Spec.Taints, readyCondition(node))
		}
	}

	stopped := time.Now()
	kl.setLive("n-dead", false)
	kl.setLive("n-part", false)

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
	kittest.WaitFor(t, "silent node Unknown with unreachable taints", grace+10*time.Second, func() (bool, error) {
		node, err := kube.CoreV1().Nodes().Get(ctx, "n-dead", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r := readyCondition(node)
		tn := taintsOf("n-dead")
		ok := r.Status == corev1.ConditionUnknown && r.Reason == ReasonStatusUnknown && r.Message == MessageStatusUnknown &&
			tn[TaintUnreachable+":NoSchedule"] && tn[TaintUnreachable+":NoExecute"]
		tainted = time.Since(stopped)
		return ok, fmt.Errorf("ready %+v taints %v", r, tn)
	})
	t.Logf("silent node marked Unknown and tainted %v after its last renewal (grace %v)", tainted, grace)
	if tainted < grace {
		t.Errorf("node tainted after %v, before the %v grace period", tainted, grace)
	}
	out := h.MustRun("get", "node", "n-dead", "--no-headers")
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
	evictedAfter := time.Since(stopped)
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
	time.Sleep(2 * time.Second)
	tn := taintsOf("n-part")
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
	h.MustRun("taint", "nodes", "n-ok1", "dedicated=x:NoExecute")
	kittest.WaitFor(t, "untolerating pod evicted by kubectl taint", 5*time.Second, func() (bool, error) { return evicted("plain") })

	// The silent node comes back: its taints go.
	kl.setLive("n-dead", true)
	node, err := kube.CoreV1().Nodes().Get(ctx, "n-dead", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kl.postReady(node)
	kittest.WaitFor(t, "taints removed from the node that came back", 10*time.Second, func() (bool, error) {
		tn := taintsOf("n-dead")
		return len(tn) == 0, fmt.Errorf("taints %v", tn)
	})
	if gone, _ := evicted("forever"); gone {
		t.Errorf("pod tolerating for ever was evicted")
	}
}
