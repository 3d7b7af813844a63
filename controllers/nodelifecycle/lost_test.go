package nodelifecycle

import (
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/replicaset"
	"github.com/tether-edge/tether/internal/disconnect"
)

// lostEnv adds a real ReplicaSet controller to the fake environment and
// one ReplicaSet "web" of one replica whose pod template carries the
// disconnect policy and the toleration the hub's admission gives it.
type lostEnv struct {
	*fakeEnv
}

func newLostEnv(t *testing.T, reconcile disconnect.Reconcile) *lostEnv {
	t.Helper()
	e := &lostEnv{newFakeEnv(t)}
	rs, err := replicaset.New(replicaset.Config{Client: e.client, Informers: e.f, Workers: 1,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.node("a1", "a")
	e.node("b1", "b")
	e.node("b2", "b")
	e.start(rs)
	annotations := map[string]string{
		disconnect.LostAfterAnnotation: "60s",
		disconnect.ReplaceAnnotation:   "true",
		disconnect.ReconcileAnnotation: string(reconcile),
	}
	policy, errs := disconnect.Parse(annotations, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	one := int32(1)
	if _, err := e.client.AppsV1().ReplicaSets("default").Create(e.ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}, Annotations: annotations},
				Spec: corev1.PodSpec{
					Tolerations: []corev1.Toleration{policy.Toleration()},
					Containers:  []corev1.Container{{Name: "c", Image: "web:1"}},
				},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// webPods returns the ReplicaSet's live pods.
func (e *lostEnv) webPods() []corev1.Pod {
	e.t.Helper()
	l, err := e.client.CoreV1().Pods("default").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

// bindNew waits for a pod of the ReplicaSet without a node, and binds it
// to node, running and ready: the scheduler and the node's agent.
func (e *lostEnv) bindNew(node string) string {
	e.t.Helper()
	var name string
	e.wait("a new pod of web", func() (bool, error) {
		for _, p := range e.webPods() {
			if p.Spec.NodeName == "" {
				name = p.Name
				return true, nil
			}
		}
		return false, fmt.Errorf("pods %d", len(e.webPods()))
	})
	p, _ := e.getPod(name)
	p.Spec.NodeName = node
	p.Status = runningStatus(e.clk.Now())
	if _, err := e.client.CoreV1().Pods("default").Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.wait("pod "+name+" bound in the cache", func() (bool, error) {
		o, ok, err := e.c.pods.GetByKey("default/" + name)
		return ok && o.(*corev1.Pod).Spec.NodeName == node, err
	})
	return name
}

// reportReady is the pod's agent reposting its status after the node is
// heard again: ready, other conditions kept, containers started at
// startedAt.
func (e *lostEnv) reportReady(name string, startedAt time.Time) {
	e.t.Helper()
	p, ok := e.getPod(name)
	if !ok {
		e.t.Fatalf("pod %s gone", name)
	}
	now := metav1.NewTime(e.clk.Now())
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.PodReady {
			c.Status, c.Reason, c.LastTransitionTime = corev1.ConditionTrue, "", now
		}
	}
	p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(startedAt)
	if _, err := e.client.CoreV1().Pods("default").UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.wait("pod "+name+" ready in the cache", func() (bool, error) {
		o, ok, err := e.c.pods.GetByKey("default/" + name)
		return ok && kit.IsPodReady(o.(*corev1.Pod)), err
	})
}

func (e *lostEnv) waitLost(name string, lost bool) {
	e.t.Helper()
	e.wait(fmt.Sprintf("pod %s Lost=%v", name, lost), func() (bool, error) {
		p, ok := e.getPod(name)
		return ok && kit.IsPodLost(p) == lost, nil
	})
}

func (e *fakeEnv) waitGone(name string) {
	e.t.Helper()
	e.wait("pod "+name+" deleted", func() (bool, error) {
		_, ok := e.getPod(name)
		return !ok, nil
	})
}

// TestLostPodKeepOriginal: a ReplicaSet pod with replace=true and
// reconcile=keepOriginal on a dark site is marked Lost (and unready) when
// its 60s lost-after runs out, not deleted; the ReplicaSet starts a
// replacement. When the node is heard again and the original reads ready,
// the replacement gets the lowest deletion cost, the Lost mark goes, and
// the ReplicaSet removes exactly the replacement.
func TestLostPodKeepOriginal(t *testing.T) {
	e := newLostEnv(t, disconnect.KeepOriginal)
	orig := e.bindNew("b1")

	// Site b goes dark.
	e.step(41 * time.Second)
	e.renew("a1")
	e.pass()
	if s := e.state("b1"); s != SiteDark {
		t.Fatalf("b1 is %v, want SiteDark", s)
	}
	e.step(59 * time.Second)
	e.settle()
	if p, _ := e.getPod(orig); kit.IsPodLost(p) || !kit.IsPodReady(p) {
		t.Fatalf("pod marked lost or unready before its lost-after")
	}
	e.step(time.Second)
	e.waitLost(orig, true)
	p, _ := e.getPod(orig)
	if kit.IsPodReady(p) || p.DeletionTimestamp != nil {
		t.Errorf("lost pod ready %v, deleting %v", kit.IsPodReady(p), p.DeletionTimestamp)
	}
	if c := lostCondition(p); c.Reason != reasonNodeLost || c.Message == "" {
		t.Errorf("lost condition %+v", c)
	}
	repl := e.bindNew("a1")

	// The site comes back: the node first, the pod's status after.
	e.step(10 * time.Second)
	e.nodeHeard("b1")
	e.nodeHeard("b2")
	e.renew("a1")
	e.pass()
	if _, ok := e.getPod(repl); !ok {
		t.Fatalf("replacement deleted before the original reads ready")
	}
	e.waitLost(orig, true)
	e.reportReady(orig, p.Status.StartTime.Time)
	e.pass()
	e.waitLost(orig, false)
	e.waitGone(repl)
	e.settle()
	pods := e.webPods()
	if len(pods) != 1 || pods[0].Name != orig {
		t.Errorf("pods %v, want only the original %s", podNames(pods), orig)
	}
}

// TestLostPodLongestRunning: with reconcile=longestRunning on an
// unreachable node (its site still heard), the original is marked Lost
// after lost-after and replaced; its node rebooted meanwhile, so it comes
// back younger than the replacement and is the one deleted.
func TestLostPodLongestRunning(t *testing.T) {
	e := newLostEnv(t, disconnect.LongestRunning)
	orig := e.bindNew("b1")

	e.step(41 * time.Second)
	e.renew("a1", "b2")
	e.pass()
	if keys, _ := noExecute(e.getNode("b1")); len(keys) != 1 || keys[0] != TaintUnreachable {
		t.Fatalf("b1 NoExecute taints %v, want unreachable", keys)
	}
	e.step(60 * time.Second)
	e.waitLost(orig, true)
	repl := e.bindNew("b2")

	e.step(30 * time.Second)
	e.nodeHeard("b1")
	e.renew("a1", "b2")
	e.reportReady(orig, e.clk.Now()) // restarted with the node
	e.pass()
	e.waitGone(orig)
	e.settle()
	pods := e.webPods()
	if len(pods) != 1 || pods[0].Name != repl {
		t.Errorf("pods %v, want only the replacement %s", podNames(pods), repl)
	}
	if v, ok := pods[0].Annotations[DeletionCostAnnotation]; ok {
		t.Errorf("replacement has deletion cost %s", v)
	}
}

// TestLostPodLongestRunningKeepsOriginal: the original ran all along, so
// under longestRunning it is the replacement that goes.
func TestLostPodLongestRunningKeepsOriginal(t *testing.T) {
	e := newLostEnv(t, disconnect.LongestRunning)
	orig := e.bindNew("b1")
	started := e.clk.Now()
	e.step(41 * time.Second)
	e.renew("a1", "b2")
	e.pass()
	e.step(60 * time.Second)
	e.waitLost(orig, true)
	repl := e.bindNew("b2")
	e.step(30 * time.Second)
	e.nodeHeard("b1")
	e.renew("a1", "b2")
	e.reportReady(orig, started)
	e.pass()
	e.waitGone(repl)
	e.waitLost(orig, false)
	p, _ := e.getPod(orig)
	if p.DeletionTimestamp != nil {
		t.Errorf("original deleted")
	}
	r, _ := e.getPod(repl)
	if r != nil {
		t.Errorf("replacement still there, deletion cost %q", r.Annotations[DeletionCostAnnotation])
	}
}

// TestLostPathOnlyForReplicaSets: a bare pod with a keepOriginal policy
// is evicted as keepReplacement: nobody would start its replacement.
func TestLostPathOnlyForReplicaSets(t *testing.T) {
	e := newFakeEnv(t)
	e.node("a1", "a")
	e.node("a2", "a")
	e.start()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "default", Annotations: map[string]string{
			disconnect.ReplaceAnnotation: "true", disconnect.ReconcileAnnotation: string(disconnect.KeepOriginal),
			disconnect.LostAfterAnnotation: "30s"}},
		Spec:   corev1.PodSpec{NodeName: "a1", Tolerations: tolerateUnreachable(seconds(30)), Containers: []corev1.Container{{Name: "c", Image: "app:1"}}},
		Status: runningStatus(e.clk.Now()),
	}
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("pod cached", func() (bool, error) {
		_, ok, err := e.c.pods.GetByKey("default/bare")
		return ok, err
	})
	e.step(41 * time.Second)
	e.renew("a2")
	e.pass()
	e.step(30 * time.Second)
	e.waitGone("bare")
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name+"("+strconv.FormatBool(kit.IsPodLost(&p))+")")
	}
	return out
}
