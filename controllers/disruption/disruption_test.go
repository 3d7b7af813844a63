package disruption

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/edge/sim"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-disruption"}

// TestBudgetsAgainstHub keeps the status of budgets over pods that hollow
// nodes run, made and disrupted with kubectl and the eviction API: bare
// pods with a numeric minAvailable, a ReplicaSet's pods with
// maxUnavailable measured against its scale, a percentage that cannot be
// computed, and a kubectl drain that waits on the budget.
func TestBudgetsAgainstHub(t *testing.T) {
	e := kittest.Start(t, hubArgs, 2)
	f := e.Factory()
	c, err := New(Config{Client: e.ControllerClient(t, "disruption"), Informers: f, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)
	ctx := context.Background()
	ns := "default"
	kube := e.Client

	status := func(name string, want policyv1.PodDisruptionBudgetStatus, cond metav1.ConditionStatus) {
		t.Helper()
		kittest.WaitFor(t, "status of "+name, 30*time.Second, func() (bool, error) {
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
	podsReady := func(selector string, want int) {
		t.Helper()
		kittest.WaitFor(t, fmt.Sprintf("%d ready pods %s", want, selector), 60*time.Second, func() (bool, error) {
			l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, err
			}
			ready := 0
			for _, p := range l.Items {
				if kit.IsPodReady(&p) {
					ready++
				}
			}
			return ready == want, fmt.Errorf("%d ready", ready)
		})
	}

	// Pods with no controller, one of them never ready: minAvailable as
	// a number needs no scale.
	for i := range 3 {
		e.Kubectl(t, "run", fmt.Sprintf("bare-%d", i), "--image=app:1", "--labels=app=bare")
	}
	e.Kubectl(t, "run", "bare-3", "--image=app:1", "--labels=app=bare", "--annotations="+sim.NotReady+"=true")
	podsReady("app=bare", 3)
	e.Kubectl(t, "create", "pdb", "bare", "--selector=app=bare", "--min-available=2")
	status("bare", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 4, DesiredHealthy: 2, CurrentHealthy: 3, DisruptionsAllowed: 1}, metav1.ConditionTrue)
	out := e.Kubectl(t, "get", "pdb", "bare", "--no-headers")
	if f := strings.Fields(out); len(f) < 4 || f[1] != "2" || f[3] != "1" {
		t.Errorf("kubectl get pdb: %s", out)
	}

	// One eviction is allowed; it uses the budget up, and the next one is
	// refused.
	evict := func(name string) error {
		return kube.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})
	}
	if err := evict("bare-0"); err != nil {
		t.Fatalf("eviction the budget allows: %v", err)
	}
	status("bare", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 3, DesiredHealthy: 2, CurrentHealthy: 2, DisruptionsAllowed: 0}, metav1.ConditionFalse)
	if err := evict("bare-1"); !apierrors.IsTooManyRequests(err) {
		t.Errorf("eviction past the budget: %v, want 429 Too Many Requests", err)
	}
	kittest.WaitFor(t, "evicted pod gone", 30*time.Second, func() (bool, error) {
		_, err := kube.CoreV1().Pods(ns).Get(ctx, "bare-0", metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if _, err := kube.CoreV1().Pods(ns).Get(ctx, "bare-1", metav1.GetOptions{}); err != nil {
		t.Errorf("pod whose eviction was refused: %v", err)
	}

	// maxUnavailable on a ReplicaSet's pods uses the ReplicaSet's scale:
	// 3 wanted, each needs 3 of a node's 4 CPUs, so 2 run and are ready.
	e.Apply(t, `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: c, image: app:1, resources: {requests: {cpu: "3"}}}
`)
	podsReady("app=web", 2)
	e.Kubectl(t, "create", "pdb", "web", "--selector=app=web", "--max-unavailable=1")
	status("web", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 3, DesiredHealthy: 2, CurrentHealthy: 2, DisruptionsAllowed: 0}, metav1.ConditionFalse)
	e.Kubectl(t, "scale", "replicaset", "web", "--replicas=2")
	status("web", policyv1.PodDisruptionBudgetStatus{ExpectedPods: 2, DesiredHealthy: 1, CurrentHealthy: 2, DisruptionsAllowed: 1}, metav1.ConditionTrue)

	// minAvailable as a percentage of unmanaged pods cannot be computed.
	e.Kubectl(t, "create", "pdb", "pct", "--selector=app=bare", "--min-available=50%")
	kittest.WaitFor(t, "pct budget computed", 30*time.Second, func() (bool, error) {
		p, err := kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "pct", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := p.Status
		return s.ObservedGeneration == p.Generation && s.ExpectedPods == 0 && s.DisruptionsAllowed == 0, fmt.Errorf("%+v", s)
	})

	t.Run("Drain", func(t *testing.T) { drain(t, e) })
}

// drain empties a node with kubectl drain while a budget asks for 3 of a
// Deployment's 4 pods: the drain evicts, is refused while the budget
// allows nothing, and ends with every pod on the other node and never
// fewer than 3 ready.
func drain(t *testing.T, e *kittest.Env) {
	ctx := context.Background()
	e.Kubectl(t, "create", "deployment", "drained", "--image=app:1", "--replicas=4")
	e.Kubectl(t, "rollout", "status", "deployment/drained", "--timeout=60s")
	e.Kubectl(t, "create", "pdb", "drained", "--selector=app=drained", "--min-available=3")
	kittest.WaitFor(t, "the budget allows one disruption", 30*time.Second, func() (bool, error) {
		p, err := e.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "drained", metav1.GetOptions{})
		return err == nil && p.Status.DisruptionsAllowed == 1 && p.Status.CurrentHealthy == 4, err
	})

	// The node with the most of its pods is drained.
	list, err := e.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=drained"})
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]int{}
	for _, p := range list.Items {
		on[p.Spec.NodeName]++
	}
	node, most := "", 0
	for n, c := range on {
		if c > most {
			node, most = n, c
		}
	}
	if len(on) < 2 {
		// All on one node: the other gets nothing until this one drains.
		t.Logf("all 4 pods on %s", node)
	}

	// Readiness, as the informer sees every change; the handler may
	// hear of the pods listed above after its cache synced.
	var mu sync.Mutex
	ready := map[string]bool{}
	for _, p := range list.Items {
		ready[p.Name] = kit.IsPodReady(&p)
	}
	minReady, armed := 4, false
	f := e.Factory()
	update := func(obj any) {
		p, ok := kit.Tombstone(obj).(*corev1.Pod)
		if !ok || p.Labels["app"] != "drained" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		_, deleted := obj.(cache.DeletedFinalStateUnknown)
		ready[p.Name] = !deleted && p.DeletionTimestamp == nil && kit.IsPodReady(p)
		n := 0
		for _, r := range ready {
			if r {
				n++
			}
		}
		if armed {
			minReady = min(minReady, n)
		}
	}
	_, _ = f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, cur any) { update(cur) },
		DeleteFunc: func(obj any) {
			if p, ok := kit.Tombstone(obj).(*corev1.Pod); ok {
				mu.Lock()
				ready[p.Name] = false
				mu.Unlock()
			}
		},
	})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f.Start(wctx.Done())
	f.WaitForCacheSync(wctx.Done())
	mu.Lock()
	armed = true
	mu.Unlock()

	out, err := e.Hub.Run("drain", node, "--pod-selector=app=drained", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
	if err != nil {
		t.Fatalf("kubectl drain: %v\n%s", err, out)
	}
	t.Logf("kubectl drain %s:\n%s", node, out)
	if strings.Count(out, "evicted") < most {
		t.Errorf("drain evicted fewer than the %d pods on %s:\n%s", most, node, out)
	}
	// kubectl tries again when an eviction is refused: with two pods to
	// evict and one disruption allowed, one must have been.
	retried := false
	for _, p := range list.Items {
		retried = retried || strings.Count(out, "evicting pod default/"+p.Name+"\n") > 1
	}
	if most > 1 && !retried {
		t.Errorf("no eviction was refused while %d pods left %s under a budget allowing 1:\n%s", most, node, out)
	}
	kittest.WaitFor(t, "all 4 pods ready elsewhere", 60*time.Second, func() (bool, error) {
		l, err := e.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=drained"})
		if err != nil {
			return false, err
		}
		n := 0
		for _, p := range l.Items {
			if p.Spec.NodeName == node {
				return false, fmt.Errorf("pod %s still on %s", p.Name, node)
			}
			if kit.IsPodReady(&p) {
				n++
			}
		}
		return n == 4, errors.New("not all ready")
	})
	mu.Lock()
	m := minReady
	mu.Unlock()
	if m < 3 {
		t.Errorf("ready pods fell to %d during the drain; the budget asks for 3", m)
	}
	if s := e.Kubectl(t, "get", "node", node, "-o", "jsonpath={.spec.unschedulable}"); s != "true" {
		t.Errorf("drained node is not cordoned: %q", s)
	}
}
