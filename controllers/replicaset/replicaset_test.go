package replicaset_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/controllers/replicaset"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-replicaset"}

func startRS(t *testing.T, nodes int) *kittest.Env {
	t.Helper()
	e := kittest.Start(t, hubArgs, nodes)
	f := e.Factory()
	c, err := replicaset.New(replicaset.Config{Client: e.ControllerClient(t, "replicaset"), Informers: f, Workers: 2, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)
	return e
}

// ownedPods lists the pods of ns that uid controls and are not being deleted.
func ownedPods(t *testing.T, e *kittest.Env, ns string, uid types.UID) []corev1.Pod {
	t.Helper()
	list, err := e.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == uid && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// TestReplicaSet covers creation with owner references and events,
// adoption of matching orphans created before and after the ReplicaSet,
// release of a relabelled pod, scaling, and status.
func TestReplicaSet(t *testing.T) {
	e := startRS(t, 2)
	ctx := context.Background()
	ns := "default"
	rsAPI := e.Client.AppsV1().ReplicaSets(ns)

	// Two bare pods exist before the ReplicaSet: it adopts them and
	// creates only one more.
	for i := range 2 {
		e.Kubectl(t, "run", fmt.Sprintf("pod%d", i+1), "--image=hello:1", "--labels=tier=frontend")
	}
	e.Apply(t, `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: frontend, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {tier: frontend}}
  template:
    metadata: {labels: {tier: frontend}}
    spec:
      containers: [{name: php, image: php-redis:1}]
`)
	rs, err := rsAPI.Get(ctx, "frontend", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kittest.WaitFor(t, "3 ready replicas", 60*time.Second, func() (bool, error) {
		cur, err := rsAPI.Get(ctx, "frontend", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cur.Status.ReadyReplicas == 3 && cur.Status.AvailableReplicas == 3 && cur.Status.Replicas == 3 &&
			cur.Status.FullyLabeledReplicas == 3 && cur.Status.ObservedGeneration == cur.Generation, nil
	})
	pods := ownedPods(t, e, ns, rs.UID)
	if len(pods) != 3 {
		t.Fatalf("%d pods owned, want 3", len(pods))
	}
	adopted := 0
	for _, p := range pods {
		ref := metav1.GetControllerOf(&p)
		if ref.Kind != "ReplicaSet" || ref.APIVersion != "apps/v1" || ref.Name != "frontend" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Errorf("pod %s: owner reference %+v", p.Name, ref)
		}
		if p.Name == "pod1" || p.Name == "pod2" {
			adopted++
		} else if p.GenerateName != "frontend-" {
			t.Errorf("pod %s: generateName %q, want frontend-", p.Name, p.GenerateName)
		}
	}
	if adopted != 2 {
		t.Errorf("%d bare pods adopted, want 2", adopted)
	}

	// A matching bare pod created now is adopted and, being surplus (and
	// the cheapest to lose: not yet running), deleted.
	e.Kubectl(t, "run", "pod3", "--image=hello:1", "--labels=tier=frontend")
	kittest.WaitFor(t, "surplus pod deleted", 30*time.Second, func() (bool, error) {
		p, err := e.Client.CoreV1().Pods(ns).Get(ctx, "pod3", metav1.GetOptions{})
		gone := apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		return gone && len(ownedPods(t, e, ns, rs.UID)) == 3, nil
	})

	// Relabelling a pod releases it and a replacement is made.
	victim := ownedPods(t, e, ns, rs.UID)[0]
	e.Kubectl(t, "label", "pod", victim.Name, "tier=debug", "--overwrite")
	kittest.WaitFor(t, "relabelled pod released and replaced", 30*time.Second, func() (bool, error) {
		p, err := e.Client.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return metav1.GetControllerOf(p) == nil && len(ownedPods(t, e, ns, rs.UID)) == 3, nil
	})

	// kubectl scale, both ways.
	e.Kubectl(t, "scale", "rs/frontend", "--replicas=5")
	kittest.WaitFor(t, "5 replicas", 60*time.Second, func() (bool, error) {
		cur, err := rsAPI.Get(ctx, "frontend", metav1.GetOptions{})
		return err == nil && cur.Status.ReadyReplicas == 5 && len(ownedPods(t, e, ns, rs.UID)) == 5, err
	})
	e.Kubectl(t, "scale", "rs/frontend", "--replicas=1")
	kittest.WaitFor(t, "1 replica", 60*time.Second, func() (bool, error) {
		cur, err := rsAPI.Get(ctx, "frontend", metav1.GetOptions{})
		return err == nil && cur.Status.Replicas == 1 && len(ownedPods(t, e, ns, rs.UID)) == 1, err
	})

	// Events as kubectl describe shows them.
	out := e.Kubectl(t, "describe", "rs/frontend")
	for _, want := range []string{"SuccessfulCreate", "Created pod: frontend-", "SuccessfulDelete"} {
		if !contains(out, want) {
			t.Errorf("describe rs lacks %q:\n%s", want, out)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestReplicaSetQuotaAndLimits runs a ReplicaSet, made with kubectl, in a
// namespace whose quota admits fewer pods than it wants: the refused pod
// shows as a FailedCreate event and the ReplicaFailure condition, the pods
// that were admitted carry the LimitRange's defaults, and raising the
// quota lets the ReplicaSet finish and clears the condition.
func TestReplicaSetQuotaAndLimits(t *testing.T) {
	e := startRS(t, 2)
	ctx := context.Background()
	ns := "quota"
	e.Kubectl(t, "create", "namespace", ns)
	e.Apply(t, `apiVersion: v1
kind: LimitRange
metadata: {name: limits, namespace: quota}
spec:
  limits:
  - type: Container
    default: {cpu: 200m, memory: 128Mi}
    defaultRequest: {cpu: 100m, memory: 64Mi}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: pods, namespace: quota}
spec: {hard: {pods: "2"}}
`)
	e.Apply(t, `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: frontend, namespace: quota}
spec:
  replicas: 3
  selector: {matchLabels: {tier: frontend}}
  template:
    metadata: {labels: {tier: frontend}}
    spec:
      containers: [{name: php, image: php-redis:1}]
`)
	rsAPI := e.Client.AppsV1().ReplicaSets(ns)
	failure := func(rs *appsv1.ReplicaSet) *appsv1.ReplicaSetCondition {
		for i := range rs.Status.Conditions {
			if rs.Status.Conditions[i].Type == appsv1.ReplicaSetReplicaFailure {
				return &rs.Status.Conditions[i]
			}
		}
		return nil
	}
	kittest.WaitFor(t, "2 ready replicas and a ReplicaFailure condition", 60*time.Second, func() (bool, error) {
		rs, err := rsAPI.Get(ctx, "frontend", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := failure(rs)
		return rs.Status.ReadyReplicas == 2 && rs.Status.Replicas == 2 && c != nil && c.Status == corev1.ConditionTrue &&
			c.Reason == "FailedCreate" && strings.Contains(c.Message, "exceeded quota: pods"), fmt.Errorf("status %+v", rs.Status)
	})
	out := e.Kubectl(t, "-n", ns, "describe", "rs/frontend")
	for _, want := range []string{"FailedCreate", "exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2", "ReplicaFailure"} {
		if !contains(out, want) {
			t.Errorf("describe rs lacks %q:\n%s", want, out)
		}
	}
	pods, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "tier=frontend"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		r := p.Spec.Containers[0].Resources
		if r.Requests.Cpu().String() != "100m" || r.Limits.Cpu().String() != "200m" || r.Limits.Memory().String() != "128Mi" {
			t.Errorf("pod %s: resources %+v, want the LimitRange's defaults", p.Name, r)
		}
	}

	e.Kubectl(t, "-n", ns, "patch", "resourcequota", "pods", "--type=merge", "-p", `{"spec":{"hard":{"pods":"3"}}}`)
	kittest.WaitFor(t, "3 ready replicas and no ReplicaFailure condition", 60*time.Second, func() (bool, error) {
		rs, err := rsAPI.Get(ctx, "frontend", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return rs.Status.ReadyReplicas == 3 && failure(rs) == nil, fmt.Errorf("status %+v", rs.Status)
	})
}
