package autoscaling

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller, which runs in
// the test process with fake metrics, and the node lifecycle controller,
// which would lift a taint the test puts on a healthy node.
var hubArgs = []string{"--controllers=*,-horizontalpodautoscaling,-nodelifecycle"}

// uniformMetrics samples every running pod selector matches at the same
// CPU usage, read from the hub's pods.
type uniformMetrics struct {
	kube     kubernetes.Interface
	millicpu atomic.Int64
	lastPods atomic.Int64
}

func (m *uniformMetrics) ResourceMetric(ctx context.Context, _ corev1.ResourceName, namespace string, selector labels.Selector, _ string) (PodMetrics, time.Time, error) {
	l, err := m.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		return nil, time.Time{}, err
	}
	now := time.Now()
	out := PodMetrics{}
	for _, p := range l.Items {
		if p.Status.Phase == corev1.PodRunning {
			out[p.Name] = PodMetric{Value: m.millicpu.Load(), Timestamp: now}
		}
	}
	m.lastPods.Store(int64(len(out)))
	return out, now, nil
}

// TestAutoscalerAgainstHub runs the controller, acting as its own
// ServiceAccount, against a hub with hollow nodes: an autoscaling/v2
// HorizontalPodAutoscaler applied with kubectl scales a Deployment up
// through /scale when its pods run hot, holds the scale while one of
// their nodes is unreachable although the samples ask for less, and
// scales down once the node is back.
func TestAutoscalerAgainstHub(t *testing.T) {
	e := kittest.Start(t, hubArgs, 2)
	ctx := context.Background()
	kube := e.Client
	metrics := &uniformMetrics{kube: kube}
	metrics.millicpu.Store(150)
	f := e.Factory()
	c, err := New(Config{
		Client: e.ControllerClient(t, "horizontalpodautoscaling"), Informers: f, Logger: e.Log,
		Metrics: metrics, SyncPeriod: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)

	e.Apply(t, `
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: app:1
        resources: {requests: {cpu: 100m}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 5
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 0}
`)
	replicas := func(want int32) {
		t.Helper()
		kittest.WaitFor(t, fmt.Sprintf("deployment scaled to %d", want), 60*time.Second, func() (bool, error) {
			d, err := kube.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return *d.Spec.Replicas == want, fmt.Errorf("replicas %d", *d.Spec.Replicas)
		})
	}
	condition := func(typ autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason, msg string) *autoscalingv2.HorizontalPodAutoscaler {
		t.Helper()
		var hpa *autoscalingv2.HorizontalPodAutoscaler
		kittest.WaitFor(t, fmt.Sprintf("%s=%s %s", typ, status, reason), 30*time.Second, func() (bool, error) {
			var err error
			hpa, err = kube.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range hpa.Status.Conditions {
				if c.Type == typ && c.Status == status && c.Reason == reason && strings.Contains(c.Message, msg) {
					return true, nil
				}
			}
			return false, fmt.Errorf("conditions %+v", hpa.Status.Conditions)
		})
		return hpa
	}
	event := func(reason, msg string) {
		t.Helper()
		kittest.WaitFor(t, reason+" event", 30*time.Second, func() (bool, error) {
			l, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name=web"})
			if err != nil {
				return false, err
			}
			for _, ev := range l.Items {
				if ev.Reason == reason && strings.Contains(ev.Message, msg) {
					return true, nil
				}
			}
			return false, fmt.Errorf("%d events", len(l.Items))
		})
	}

	// One pod at 150% of its request against a 50% target: three.
	replicas(3)
	event("SuccessfulRescale", "New size: 3; reason: cpu resource utilization (percentage of request) above target")
	hpa := condition(autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", "cpu resource utilization (percentage of request)")
	if hpa.Status.LastScaleTime == nil || hpa.Status.DesiredReplicas < 3 {
		t.Errorf("status after the rescale: %+v", hpa.Status)
	}

	// Three running pods, one of whose nodes the hub then cannot reach.
	var node string
	kittest.WaitFor(t, "3 ready pods", 60*time.Second, func() (bool, error) {
		l, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, p := range l.Items {
			if kit.IsPodReady(&p) {
				ready++
				node = p.Spec.NodeName
			}
		}
		return ready == 3 && len(l.Items) == 3, fmt.Errorf("%d of %d ready", ready, len(l.Items))
	})
	metrics.millicpu.Store(50) // steady at 100%: three is right
	condition(autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", "")
	e.Kubectl(t, "taint", "node", node, corev1.TaintNodeUnreachable+":NoSchedule")
	metrics.millicpu.Store(5) // would scale down to one
	hpa = condition(autoscalingv2.ScalingActive, corev1.ConditionFalse, ReasonNodesUnreachable, "pods of the target are on nodes the hub cannot reach; holding the scale at 3 replicas")
	event(ReasonNodesUnreachable, "holding the scale at 3 replicas")
	time.Sleep(2 * time.Second) // several sync periods
	d, err := kube.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 3 || hpa.Status.DesiredReplicas != 3 {
		t.Fatalf("scale while a node is unreachable: deployment %d, desired %d", *d.Spec.Replicas, hpa.Status.DesiredReplicas)
	}

	// Back: the samples count again.
	e.Kubectl(t, "taint", "node", node, corev1.TaintNodeUnreachable+":NoSchedule-")
	replicas(1)
	condition(autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", "")
	event("SuccessfulRescale", "New size: 1; reason: All metrics below target")
}

// TestAutoscalerInHub checks the hub's own controller: registered under
// --controllers, acting as horizontal-pod-autoscaler, it reads the
// target's /scale and, with no pod to sample (no nodes), says it cannot
// compute a replica count, in upstream's words; synced every
// --horizontal-pod-autoscaler-sync-period, it soon sees the target
// scaled to zero by hand.
func TestAutoscalerInHub(t *testing.T) {
	h, _, kube := kittest.Hub(t, []string{"--horizontal-pod-autoscaler-sync-period=1s"})
	ctx := context.Background()
	if _, err := h.RunInput(ctx, `
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: app, image: app:1, resources: {requests: {cpu: 100m}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
`, nil, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	kittest.WaitFor(t, "the hub's controller to report", 60*time.Second, func() (bool, error) {
		hpa, err := kube.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got := map[autoscalingv2.HorizontalPodAutoscalerConditionType]string{}
		for _, c := range hpa.Status.Conditions {
			got[c.Type] = string(c.Status) + " " + c.Reason
		}
		ok := got[autoscalingv2.AbleToScale] == "True SucceededGetScale" &&
			got[autoscalingv2.ScalingActive] == "False FailedGetResourceMetric" && hpa.Status.CurrentReplicas == 1
		return ok, fmt.Errorf("status %+v", hpa.Status)
	})
	h.MustRun("scale", "deployment", "web", "--replicas=0")
	// Well within the default period of 15s.
	kittest.WaitFor(t, "ScalingDisabled", 6*time.Second, func() (bool, error) {
		hpa, err := kube.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range hpa.Status.Conditions {
			if c.Type == autoscalingv2.ScalingActive && c.Reason == "ScalingDisabled" {
				return hpa.Status.CurrentReplicas == 0, nil
			}
		}
		return false, fmt.Errorf("status %+v", hpa.Status)
	})
}
