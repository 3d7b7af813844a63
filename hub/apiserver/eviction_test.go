package apiserver

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestEviction(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	pods := h.cs.CoreV1().Pods("default")
	mk := func(name string, phase corev1.PodPhase) {
		p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "db"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "img"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("a", corev1.PodRunning)
	mk("b", corev1.PodRunning)
	mk("done", corev1.PodSucceeded)
	pdbs := h.cs.PolicyV1().PodDisruptionBudgets("default")
	pdb, err := pdbs.Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrIntStr(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	evict := func(name string) error {
		return h.cs.PolicyV1().Evictions("default").Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}})
	}
	// The budget has not been processed by its controller yet.
	if err := evict("a"); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evict before the budget is processed: %v, want 429", err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 1, CurrentHealthy: 2, DesiredHealthy: 1, ExpectedPods: 2}
	if _, err = pdbs.UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := evict("a"); err != nil {
		t.Fatalf("evict with one disruption allowed: %v", err)
	}
	if _, err := pods.Get(ctx, "a", metav1.GetOptions{}); err == nil {
		if p, _ := pods.Get(ctx, "a", metav1.GetOptions{}); p.DeletionTimestamp == nil {
			t.Fatal("evicted pod neither deleted nor terminating")
		}
	}
	got, _ := pdbs.Get(ctx, "db", metav1.GetOptions{})
	if got.Status.DisruptionsAllowed != 0 || got.Status.DisruptedPods["a"].Time.IsZero() {
		t.Fatalf("budget after eviction: %+v", got.Status)
	}
	err = evict("b")
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("second eviction: %v, want 429", err)
	}
	if se, ok := err.(apierrors.APIStatus); !ok || se.Status().Details == nil || len(se.Status().Details.Causes) == 0 ||
		se.Status().Details.Causes[0].Type != policyv1.DisruptionBudgetCause {
		t.Errorf("429 without the DisruptionBudget cause: %v", err)
	}
	// A finished pod goes regardless of the budget.
	if err := evict("done"); err != nil {
		t.Fatalf("evict a succeeded pod: %v", err)
	}
	if err := evict("nope"); !apierrors.IsNotFound(err) {
		t.Fatalf("evict a missing pod: %v", err)
	}
}

func ptrIntStr(v intstr.IntOrString) *intstr.IntOrString { return &v }
