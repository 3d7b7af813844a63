package podgc

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-pod-garbage-collector"}

func pod(name string, sel map[string]string, finalizers ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: finalizers},
		Spec: corev1.PodSpec{
			NodeSelector: sel, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "app:1"}},
		},
	}
}

// TestPodGCAgainstHub runs the collector against a hub with hollow nodes:
// the pods of a node deleted with kubectl are marked DisruptionTarget and
// deleted after the quarantine, finished pods beyond the threshold are
// deleted oldest first, a terminating pod that was never scheduled is
// deleted again with no grace period, and so is a terminating pod of a
// node not ready and tainted out-of-service.
func TestPodGCAgainstHub(t *testing.T) {
	e := kittest.Start(t, hubArgs, 0)
	ctx := context.Background()
	kube := e.Client
	gone := e.JoinNodes(t, kittest.Nodes{Prefix: "gone-", N: 1})
	e.JoinNodes(t, kittest.Nodes{Prefix: "stay-", N: 1})
	oos := e.JoinNodes(t, kittest.Nodes{Prefix: "oos-", N: 1})

	f := e.Factory()
	c, err := New(Config{
		Client: kube, Informers: f, Logger: e.Log,
		TerminatedPodThreshold: 2, Quarantine: 2 * time.Second, Period: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)

	on := func(n string) map[string]string { return map[string]string{corev1.LabelHostname: n} }
	pods := kube.CoreV1().Pods("default")
	stuck := pod("stuck", on("oos-00000"))
	stuck.Spec.TerminationGracePeriodSeconds = new(int64(3600))
	for _, p := range []*corev1.Pod{pod("a", on("gone-00000")), pod("b", on("gone-00000")), pod("keep", on("stay-00000")), stuck} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kittest.WaitFor(t, "pods running", 60*time.Second, func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		running := 0
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 4, fmt.Errorf("%d of 4 running", running)
	})

	// Orphans: the node's machine goes off and the node is deleted.
	w, err := pods.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	gone.Stop()
	start := time.Now()
	e.Kubectl(t, "delete", "node", "gone-00000")
	kittest.WaitFor(t, "pods of the deleted node deleted", 60*time.Second, func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var names []string
		for _, p := range l.Items {
			names = append(names, p.Name)
		}
		return fmt.Sprint(names) == "[keep stuck]", fmt.Errorf("pods %v", names)
	})
	t.Logf("orphans deleted %v after the node", time.Since(start).Round(time.Millisecond))
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("orphans deleted after %v, before the quarantine", d)
	}
	marked := map[string]bool{}
	timeout := time.After(5 * time.Second)
drain:
	for {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Error {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.DisruptionTarget && cond.Reason == ReasonDeletionByPodGC && cond.Message == MessageNodeGone &&
					p.Status.Phase == corev1.PodFailed {
					marked[p.Name] = true
				}
			}
			if marked["a"] && marked["b"] {
				break drain
			}
		case <-timeout:
			break drain
		}
	}
	if !marked["a"] || !marked["b"] {
		t.Errorf("orphans marked Failed with DisruptionTarget/DeletionByPodGC: %v", marked)
	}

	// Finished pods beyond the threshold of 2: pending pods set to Failed.
	for i := range 4 {
		name := fmt.Sprintf("done-%d", i)
		if _, err := pods.Create(ctx, pod(name, on("nowhere")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The scheduler writes the pod's status too.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Status.Phase = corev1.PodFailed
			_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // creation timestamps are in seconds
	}
	kittest.WaitFor(t, "two oldest finished pods deleted", 10*time.Second, func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var names []string
		for _, p := range l.Items {
			names = append(names, p.Name)
		}
		return fmt.Sprint(names) == "[done-2 done-3 keep stuck]", fmt.Errorf("pods %v", names)
	})

	// A never-scheduled pod held by a finalizer while terminating.
	if _, err := pods.Create(ctx, pod("held", on("nowhere"), "example.com/hold"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e.WritesBy(t)["delete pods"]
	e.Kubectl(t, "delete", "pod", "held", "--wait=false")
	kittest.WaitFor(t, "unscheduled terminating pod deleted again", 10*time.Second, func() (bool, error) {
		n := e.WritesBy(t)["delete pods"]
		return n >= before+2, fmt.Errorf("%v pod deletes since", n-before)
	})
	e.Kubectl(t, "patch", "pod", "held", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)

	// A terminating pod of a node that went off for good: it stays until
	// the node is not ready and tainted out-of-service.
	oos.Stop()
	e.Kubectl(t, "delete", "pod", "stuck", "--wait=false")
	time.Sleep(1500 * time.Millisecond)
	if p, err := pods.Get(ctx, "stuck", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("terminating pod of a ready node: %v", err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, "oos-00000", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].Status = corev1.ConditionFalse
			}
		}
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.Kubectl(t, "taint", "node", "oos-00000", "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
	kittest.WaitFor(t, "terminating pod of the out-of-service node deleted", 10*time.Second, func() (bool, error) {
		_, err := pods.Get(ctx, "stuck", metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}
