package disruption

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-disruption"}

func TestBudgetsAgainstHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h, _, kube := kittest.Hub(t, hubArgs)
	factory := informers.NewSharedInformerFactory(kube, 0)
	c, err := New(Config{Client: kube, Informers: factory, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		factory.Shutdown()
	}()
	ns := "default"
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// pod creates a pod bound to a node no agent runs, with the status a
	// kubelet would report.
	pod := func(name, app string, ready bool, owner *metav1.OwnerReference) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "app:1"}}},
		}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		p, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}
		if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	budget := func(name, app string, minAvail, maxUnavail *intstr.IntOrString) {
		t.Helper()
		_, err := kube.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: policyv1.PodDisruptionBudgetSpec{
				Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				MinAvailable: minAvail, MaxUnavailable: maxUnavail,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	status := func(name string, want policyv1.PodDisruptionBudgetStatus, cond metav1.ConditionStatus) {
		t.Helper()
		kittest.WaitFor(t, "status of "+name, 10*time.Second, func() (bool, error) {
			p, err := kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			s := p.Status
			ok := s.ExpectedPods == want.ExpectedPods && s.DesiredHealthy == want.DesiredHealthy &&
				s.CurrentHealthy == want.CurrentHealthy && s.DisruptionsAllowed == want.DisruptionsAllowed &&
				s.ObservedGeneration == p.Generation
			for _, c := range s.Conditions {
				if c.Type == policyv1.DisruptionAllowedCondition {
					ok = ok && c.Status == cond
				}
			}
			return ok, fmt.Errorf("status %+v", s)
		})
	}

	// Pods with no controller: minAvailable as a number needs no scale.
	for i, ready := range []bool{true, true, true, false} {
		pod(fmt.Sprintf("bare-%d", i), "bare", ready, nil)
	}
	budget("bare", "bare", new(intstr.FromInt32(2)), nil)
	status("bare", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 4, DesiredHealthy: 2, CurrentHealthy: 3, DisruptionsAllowed: 1}, metav1.ConditionTrue)
	out := h.MustRun("get", "pdb", "bare", "--no-headers")
	if f := strings.Fields(out); len(f) < 4 || f[1] != "2" || f[3] != "1" {
		t.Errorf("kubectl get pdb: %s", out)
	}

	// A pod goes unready: no disruption allowed any more.
	p, err := kube.CoreV1().Pods(ns).Get(ctx, "bare-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	status("bare", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 4, DesiredHealthy: 2, CurrentHealthy: 2, DisruptionsAllowed: 0}, metav1.ConditionFalse)

	// maxUnavailable on a ReplicaSet's pods uses the ReplicaSet's scale:
	// 3 wanted, 2 exist and are ready.
	rs, err := kube.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: new(int32(3)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{NodeSelector: map[string]string{"nowhere": "x"}, Containers: []corev1.Container{{Name: "c", Image: "app:1"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: new(true)}
	pod("web-a", "web", true, &ref)
	pod("web-b", "web", true, &ref)
	budget("web", "web", nil, new(intstr.FromInt32(1)))
	kittest.WaitFor(t, "web budget computed", 10*time.Second, func() (bool, error) {
		p, err := kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		// A running ReplicaSet controller may add the third pod; it stays
		// unready, as its node does not exist.
		s := p.Status
		return s.ExpectedPods == 3 && s.DesiredHealthy == 2 && s.CurrentHealthy == 2 && s.DisruptionsAllowed == 0, fmt.Errorf("%+v", s)
	})
	h.MustRun("scale", "replicaset", "web", "--replicas=2")
	status("web", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 2, DesiredHealthy: 1, CurrentHealthy: 2, DisruptionsAllowed: 1}, metav1.ConditionTrue)

	// minAvailable as a percentage of unmanaged pods cannot be computed.
	budget("pct", "bare", new(intstr.FromString("50%")), nil)
	kittest.WaitFor(t, "pct budget computed", 10*time.Second, func() (bool, error) {
		p, err := kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "pct", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := p.Status
		return s.ObservedGeneration == p.Generation && s.ExpectedPods == 0 && s.DisruptionsAllowed == 0, fmt.Errorf("%+v", s)
	})
}
