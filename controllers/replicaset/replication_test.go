package replicaset_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// nginxRC is the ReplicationController of the Kubernetes concept page.
const nginxRC = `apiVersion: v1
kind: ReplicationController
metadata: {name: nginx, namespace: default}
spec:
  replicas: 3
  selector: {app: nginx}
  template:
    metadata:
      name: nginx
      labels: {app: nginx}
    spec:
      containers:
      - name: nginx
        image: nginx
        ports: [{containerPort: 80}]
`

// TestReplicationController runs the concept page's ReplicationController
// on the hub's own controller manager (--controllers name
// "replicationcontroller"): its pods come up owned by it, kubectl scale
// moves them both ways, a deleted pod is replaced, kubectl expose makes a
// Service with its selector, and kubectl delete orphans or removes its pods
// as --cascade says (orphan, background, foreground).
func TestReplicationController(t *testing.T) {
	e := kittest.Start(t, nil, 2)
	ctx := context.Background()
	ns := "default"
	rcAPI := e.Client.CoreV1().ReplicationControllers(ns)

	e.Apply(t, nginxRC)
	rc, err := rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitReady := func(n int32) {
		t.Helper()
		kittest.WaitFor(t, fmt.Sprintf("%d ready replicas", n), 60*time.Second, func() (bool, error) {
			cur, err := rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			s := cur.Status
			return s.Replicas == n && s.FullyLabeledReplicas == n && s.ReadyReplicas == n && s.AvailableReplicas == n &&
				s.ObservedGeneration == cur.Generation && len(ownedPods(t, e, ns, rc.UID)) == int(n), fmt.Errorf("status %+v", s)
		})
	}
	waitReady(3)
	for _, p := range ownedPods(t, e, ns, rc.UID) {
		ref := metav1.GetControllerOf(&p)
		if ref.Kind != "ReplicationController" || ref.APIVersion != "v1" || ref.Name != "nginx" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Errorf("pod %s: owner reference %+v", p.Name, ref)
		}
		if p.GenerateName != "nginx-" || p.Labels["app"] != "nginx" {
			t.Errorf("pod %s: generateName %q, labels %v", p.Name, p.GenerateName, p.Labels)
		}
	}
	out := e.Kubectl(t, "describe", "replicationcontrollers/nginx")
	for _, want := range []string{"Selector:     app=nginx", "3 current / 3 desired", "3 Running", "SuccessfulCreate", "Created pod: nginx-"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe rc lacks %q:\n%s", want, out)
		}
	}
	out = e.Kubectl(t, "get", "pods", "--selector=app=nginx", "--output=jsonpath={.items..metadata.name}")
	if n := len(strings.Fields(out)); n != 3 {
		t.Errorf("pods by selector: %q", out)
	}

	// kubectl scale, both ways.
	e.Kubectl(t, "scale", "rc", "nginx", "--replicas=5")
	waitReady(5)
	e.Kubectl(t, "scale", "rc/nginx", "--replicas=2")
	waitReady(2)

	// A deleted pod is replaced.
	victim := ownedPods(t, e, ns, rc.UID)[0]
	e.Kubectl(t, "delete", "pod", victim.Name, "--wait=false")
	kittest.WaitFor(t, "deleted pod replaced", 60*time.Second, func() (bool, error) {
		pods := ownedPods(t, e, ns, rc.UID)
		for _, p := range pods {
			if p.UID == victim.UID {
				return false, nil
			}
		}
		return len(pods) == 2, nil
	})
	waitReady(2)

	// kubectl expose reads the selector off the ReplicationController.
	e.Kubectl(t, "expose", "rc", "nginx", "--port=80", "--target-port=8000")
	svc, err := e.Client.CoreV1().Services(ns).Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Selector) != 1 || svc.Spec.Selector["app"] != "nginx" || len(svc.Spec.Ports) != 1 ||
		svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntValue() != 8000 {
		t.Errorf("exposed service: selector %v, ports %+v", svc.Spec.Selector, svc.Spec.Ports)
	}

	// --cascade=orphan keeps the pods, without their owner reference.
	before := ownedPods(t, e, ns, rc.UID)
	e.Kubectl(t, "delete", "rc", "nginx", "--cascade=orphan")
	kittest.WaitFor(t, "replicationcontroller gone", 30*time.Second, func() (bool, error) {
		_, err := rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	for _, p := range before {
		cur, err := e.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("orphaned pod %s: %v", p.Name, err)
		}
		if cur.DeletionTimestamp != nil || len(cur.OwnerReferences) != 0 {
			t.Errorf("orphaned pod %s: deletion %v, owners %v", p.Name, cur.DeletionTimestamp, cur.OwnerReferences)
		}
	}

	// A new ReplicationController adopts the orphans; deleting it with
	// the default (background) cascade removes them.
	e.Apply(t, nginxRC)
	rc, err = rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(3)
	adopted := 0
	for _, p := range ownedPods(t, e, ns, rc.UID) {
		for _, b := range before {
			if p.UID == b.UID {
				adopted++
			}
		}
	}
	if adopted != len(before) {
		t.Errorf("%d of %d orphans adopted", adopted, len(before))
	}
	e.Kubectl(t, "delete", "rc", "nginx")
	kittest.WaitFor(t, "pods of the deleted replicationcontroller gone", 60*time.Second, func() (bool, error) {
		list, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=nginx"})
		if err != nil {
			return false, err
		}
		live := 0
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				live++
			}
		}
		return live == 0, fmt.Errorf("%d pods left", live)
	})

	// The foreground policy keeps the ReplicationController, being
	// deleted, until its pods are gone.
	e.Apply(t, nginxRC)
	waitGone := func() (bool, error) {
		_, err := rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		list, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=nginx"})
		return err == nil && len(list.Items) == 0, err
	}
	kittest.WaitFor(t, "3 replicas", 60*time.Second, func() (bool, error) {
		cur, err := rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
		return err == nil && cur.Status.Replicas == 3, err
	})
	e.Kubectl(t, "delete", "rc", "nginx", "--cascade=foreground", "--wait=false")
	cur, err := rcAPI.Get(ctx, "nginx", metav1.GetOptions{})
	if err == nil && (cur.DeletionTimestamp == nil || !slices.Contains(cur.Finalizers, metav1.FinalizerDeleteDependents)) {
		t.Errorf("replicationcontroller being deleted in the foreground: deletion %v, finalizers %v", cur.DeletionTimestamp, cur.Finalizers)
	}
	kittest.WaitFor(t, "replicationcontroller and its pods gone", 60*time.Second, waitGone)
}
