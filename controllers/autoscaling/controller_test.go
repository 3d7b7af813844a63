package autoscaling

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// env is a controller on fakes: a fake clientset holding the autoscaler,
// fake metrics, fake /scale and a fake clock.
type env struct {
	t       *testing.T
	c       *Controller
	client  *fake.Clientset
	metrics *fakeMetrics
	scales  *fakeScales
	clock   *clocktesting.FakePassiveClock
	pods    cache.Indexer
	nodes   cache.Indexer
}

// cpuHPA targets Deployment web at utilization percent of CPU, between
// 1 and 10 replicas.
func cpuHPA(utilization int32) *autoscalingv2.HorizontalPodAutoscaler {
	return &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    ptr.To[int32](1),
			MaxReplicas:    10,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.ResourceMetricSourceType,
				Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{
					Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To(utilization),
				}},
			}},
		},
	}
}

func readyNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

func newEnv(t *testing.T, hpa *autoscalingv2.HorizontalPodAutoscaler, replicas int32, pods ...*corev1.Pod) *env {
	t.Helper()
	client := fake.NewClientset(hpa)
	client.Resources = []*metav1.APIResourceList{{
		GroupVersion: "apps/v1",
		APIResources: []metav1.APIResource{{Name: "deployments", Namespaced: true, Kind: "Deployment"}, {Name: "deployments/scale", Namespaced: true, Kind: "Scale", Group: "autoscaling", Version: "v1"}},
	}}
	e := &env{t: t, client: client, metrics: &fakeMetrics{}, scales: newFakeScales(), clock: clocktesting.NewFakePassiveClock(t0)}
	e.scales.put("default", "web", replicas, "app=web")
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(Config{
		Client: client, Informers: factory, Metrics: e.metrics, Scales: e.scales, Clock: e.clock,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.pods = factory.Core().V1().Pods().Informer().GetIndexer()
	e.nodes = factory.Core().V1().Nodes().Informer().GetIndexer()
	for _, n := range []string{"n1", "n2"} {
		_ = e.nodes.Add(readyNode(n))
	}
	for _, p := range pods {
		_ = e.pods.Add(p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.events.Start(ctx)
	return e
}

// usage sets each pod's CPU sample in millicores.
func (e *env) usage(m map[string]int64) {
	s := map[string]PodMetric{}
	for n, v := range m {
		s[n] = sample(v, e.clock.Now())
	}
	e.metrics.set(s)
}

// sync runs one pass over the stored autoscaler and returns it after.
func (e *env) sync() *autoscalingv2.HorizontalPodAutoscaler {
	e.t.Helper()
	ctx := context.Background()
	hpa, err := e.client.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	_ = e.c.reconcile(ctx, hpa, "default/web")
	hpa, err = e.client.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return hpa
}

// wantCondition fails unless hpa has the condition with status, reason
// and, if not empty, a message containing msg.
func wantCondition(t *testing.T, hpa *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason, msg string) {
	t.Helper()
	for _, c := range hpa.Status.Conditions {
		if c.Type != typ {
			continue
		}
		if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
			t.Errorf("%s = %s %s %q; want %s %s %q", typ, c.Status, c.Reason, c.Message, status, reason, msg)
		}
		return
	}
	t.Errorf("no %s condition in %+v", typ, hpa.Status.Conditions)
}

// waitEvent waits for an event of reason whose message contains msg.
func (e *env) waitEvent(reason, msg string) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		list, _ := e.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		var seen []string
		for _, ev := range list.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, msg) {
				return
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %s event with %q; events: %q", reason, msg, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func threePods(opts ...podOpt) []*corev1.Pod {
	return []*corev1.Pod{testPod("web-0", opts...), testPod("web-1"), testPod("web-2")}
}

// TestReconcileScaleUp checks a rescale end to end: /scale written, the
// status (replicas, metrics, last scale time, conditions) and the
// SuccessfulRescale event in upstream's words.
func TestReconcileScaleUp(t *testing.T) {
	e := newEnv(t, cpuHPA(50), 3, threePods()...)
	e.usage(map[string]int64{"web-0": 900, "web-1": 900, "web-2": 900})
	hpa := e.sync()
	if got := e.scales.replicas("default", "web"); got != 6 {
		t.Fatalf("scale = %d, want 6", got)
	}
	st := hpa.Status
	if st.CurrentReplicas != 3 || st.DesiredReplicas != 6 || st.LastScaleTime == nil || !st.LastScaleTime.Time.Equal(t0) {
		t.Errorf("status = %+v", st)
	}
	if len(st.CurrentMetrics) != 1 || *st.CurrentMetrics[0].Resource.Current.AverageUtilization != 90 || st.CurrentMetrics[0].Resource.Current.AverageValue.String() != "900m" {
		t.Errorf("current metrics = %+v", st.CurrentMetrics)
	}
	wantCondition(t, hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededRescale", "the HPA controller was able to update the target scale to 6")
	wantCondition(t, hpa, autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)")
	wantCondition(t, hpa, autoscalingv2.ScalingLimited, corev1.ConditionFalse, "DesiredWithinRange", "the desired count is within the acceptable range")
	e.waitEvent("SuccessfulRescale", "New size: 6; reason: cpu resource utilization (percentage of request) above target")
}

// TestReconcileMissingRequest checks a pod without a CPU request: no
// scale, ScalingActive=False FailedGetResourceMetric and the events.
func TestReconcileMissingRequest(t *testing.T) {
	e := newEnv(t, cpuHPA(50), 3, threePods(func(p *corev1.Pod) { p.Spec.Containers[0].Resources.Requests = nil })...)
	e.usage(map[string]int64{"web-0": 900, "web-1": 900, "web-2": 900})
	hpa := e.sync()
	if len(e.scales.updates) != 0 {
		t.Errorf("scaled: %v", e.scales.updates)
	}
	wantCondition(t, hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, "FailedGetResourceMetric",
		"the HPA was unable to compute the replica count: failed to get cpu utilization: missing request for cpu in container app of Pod web-0")
	e.waitEvent("FailedGetResourceMetric", "missing request for cpu in container app of Pod web-0")
	e.waitEvent("FailedComputeMetricsReplicas", "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value")
}

// TestReconcileScalingDisabled checks a target scaled to zero by hand.
func TestReconcileScalingDisabled(t *testing.T) {
	e := newEnv(t, cpuHPA(50), 0)
	hpa := e.sync()
	wantCondition(t, hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, "ScalingDisabled", "scaling is disabled since the replica count of the target is zero")
	if len(e.scales.updates) != 0 || e.metrics.calls != 0 {
		t.Errorf("scaled %v, read metrics %d times", e.scales.updates, e.metrics.calls)
	}
}

// TestReconcileStabilizedAndLimited checks, through whole passes, the
// default scale-down stabilization (held five minutes, then applied) and
// maxReplicas.
func TestReconcileStabilizedAndLimited(t *testing.T) {
	hpa := cpuHPA(50)
	hpa.Spec.MaxReplicas = 4
	e := newEnv(t, hpa, 3, threePods()...)
	e.usage(map[string]int64{"web-0": 100, "web-1": 100, "web-2": 100})
	got := e.sync()
	if len(e.scales.updates) != 0 {
		t.Fatalf("scaled down at once: %v", e.scales.updates)
	}
	wantCondition(t, got, autoscalingv2.AbleToScale, corev1.ConditionTrue, "ScaleDownStabilized", "recent recommendations were higher than current one")
	e.clock.SetTime(t0.Add(5*time.Minute + time.Second))
	e.sync()
	if r := e.scales.replicas("default", "web"); r != 1 {
		t.Fatalf("after the window: scale %d, want 1", r)
	}
	e.waitEvent("SuccessfulRescale", "New size: 1; reason: All metrics below target")

	_ = e.pods.Delete(testPod("web-1"))
	_ = e.pods.Delete(testPod("web-2"))
	e.usage(map[string]int64{"web-0": 2000})
	e.clock.SetTime(t0.Add(6 * time.Minute))
	e.sync()
	// 200% of a 50% target on 1 replica wants 4; max(2×1, 4) allows it.
	if r := e.scales.replicas("default", "web"); r != 4 {
		t.Fatalf("scale up: %d, want 4", r)
	}
	e.scales.put("default", "web", 4, "app=web")
	for _, n := range []string{"web-1", "web-2", "web-3"} {
		_ = e.pods.Add(testPod(n))
	}
	e.usage(map[string]int64{"web-0": 1000, "web-1": 1000, "web-2": 1000, "web-3": 1000})
	e.clock.SetTime(t0.Add(7 * time.Minute))
	got = e.sync()
	wantCondition(t, got, autoscalingv2.ScalingLimited, corev1.ConditionTrue, "TooManyReplicas", "the desired replica count is more than the maximum replica count")
	if r := e.scales.replicas("default", "web"); r != 4 {
		t.Errorf("scale %d, want 4 (maxReplicas)", r)
	}
}

// TestReconcileBehaviorPolicy checks that a behavior's scale-up policy
// limits a rescale and is reported as ScaleUpLimit.
func TestReconcileBehaviorPolicy(t *testing.T) {
	hpa := cpuHPA(50)
	hpa.Spec.MaxReplicas = 20
	hpa.Spec.Behavior = &autoscalingv2.HorizontalPodAutoscalerBehavior{
		ScaleUp: rules(0, autoscalingv2.MaxChangePolicySelect, pods(1, 60)),
	}
	e := newEnv(t, hpa, 3, threePods()...)
	e.usage(map[string]int64{"web-0": 1000, "web-1": 1000, "web-2": 1000})
	got := e.sync()
	if r := e.scales.replicas("default", "web"); r != 4 {
		t.Fatalf("scale %d, want 4 (one pod per minute)", r)
	}
	wantCondition(t, got, autoscalingv2.ScalingLimited, corev1.ConditionTrue, "ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate")
	e.clock.SetTime(t0.Add(30 * time.Second))
	e.sync()
	if r := e.scales.replicas("default", "web"); r != 4 {
		t.Fatalf("scale %d within the period, want 4", r)
	}
	e.clock.SetTime(t0.Add(61 * time.Second))
	e.sync()
	if r := e.scales.replicas("default", "web"); r != 5 {
		t.Fatalf("scale %d after the period, want 5", r)
	}
}

// TestReconcileHoldsOnUnreachableNodes checks tether's disconnect rule:
// while a pod's node is unreachable (NotReady, or tainted unreachable),
// low samples of the others do not scale the target down; the scale is
// held with ScalingActive=False NodesUnreachable, and scaling resumes
// once the node is back.
func TestReconcileHoldsOnUnreachableNodes(t *testing.T) {
	hpa := cpuHPA(50)
	hpa.Spec.Behavior = &autoscalingv2.HorizontalPodAutoscalerBehavior{
		ScaleDown: rules(0, autoscalingv2.MaxChangePolicySelect, percent(100, 15)),
	}
	pods := append(threePods()[:2], testPod("web-2", onNode("n2")))
	for _, mark := range []struct {
		name string
		set  func(*corev1.Node)
	}{
		{"not ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }},
		{"tainted", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
		}},
	} {
		t.Run(mark.name, func(t *testing.T) {
			e := newEnv(t, hpa, 3, pods...)
			n := readyNode("n2")
			mark.set(n)
			_ = e.nodes.Update(n)
			// The pod on n2 has no sample; the others idle.
			e.usage(map[string]int64{"web-0": 50, "web-1": 50})
			got := e.sync()
			if len(e.scales.updates) != 0 {
				t.Fatalf("scaled while a node is unreachable: %v", e.scales.updates)
			}
			wantCondition(t, got, autoscalingv2.ScalingActive, corev1.ConditionFalse, ReasonNodesUnreachable,
				"1 of 3 pods of the target are on nodes the hub cannot reach; holding the scale at 3 replicas")
			if got.Status.DesiredReplicas != 3 || got.Status.CurrentReplicas != 3 {
				t.Errorf("status = %+v", got.Status)
			}
			e.waitEvent(ReasonNodesUnreachable, "1 of 3 pods")

			// A pod being deleted from the node does not hold it.
			gone := testPod("web-2", onNode("n2"))
			gone.DeletionTimestamp = &metav1.Time{Time: t0}
			_ = e.pods.Update(gone)
			if held, _ := e.c.unreachable("default", labels.Everything(), 3); held {
				t.Errorf("a terminating pod on an unreachable node holds the scale")
			}
			_ = e.pods.Update(testPod("web-2", onNode("n2")))

			_ = e.nodes.Update(readyNode("n2"))
			e.usage(map[string]int64{"web-0": 50, "web-1": 50, "web-2": 50})
			e.clock.SetTime(t0.Add(time.Minute))
			got = e.sync()
			if r := e.scales.replicas("default", "web"); r != 1 {
				t.Fatalf("after the node returned: scale %d, want 1", r)
			}
			wantCondition(t, got, autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", "")
		})
	}
}

// TestUpdatesQueued checks that a spec change syncs an autoscaler at
// once while a status write (the controller's own) waits for the period.
func TestUpdatesQueued(t *testing.T) {
	e := newEnv(t, cpuHPA(50), 3)
	old := cpuHPA(50)
	status := old.DeepCopy()
	status.Status.CurrentReplicas = 3
	e.c.updated(old, status)
	if n := e.c.queue.Len(); n != 0 {
		t.Fatalf("status write queued %d keys", n)
	}
	spec := old.DeepCopy()
	spec.Spec.MaxReplicas = 20
	e.c.updated(old, spec)
	if n := e.c.queue.Len(); n != 1 {
		t.Fatalf("spec change queued %d keys, want 1", n)
	}
}
