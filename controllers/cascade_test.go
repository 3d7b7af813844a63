package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// TestCascadeOnNodes deletes Deployments whose pods hollow nodes run, with
// kubectl, in the three propagation modes, and then their namespace: pods
// are deleted gracefully, so each cascade waits for the nodes' agents to
// stop them.
func TestCascadeOnNodes(t *testing.T) {
	e := kittest.Start(t, hubArgs, 2)
	m, err := New(Config{RestConfig: e.Rest, Logger: e.Log, Workers: 2, DiscoveryPeriod: 2 * time.Second, Controllers: underTest})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("controllers did not stop within 20s")
		}
	})
	ns := "cascade"
	e.Kubectl(t, "create", "namespace", ns)
	for _, d := range []string{"bg", "fg", "orphan"} {
		e.Kubectl(t, "-n", ns, "create", "deployment", d, "--image=app:1", "--replicas=2")
	}
	for _, d := range []string{"bg", "fg", "orphan"} {
		e.Kubectl(t, "-n", ns, "rollout", "status", "deployment/"+d, "--timeout=60s")
	}
	// left lists what remains of app's ReplicaSets and pods, being deleted
	// or not.
	left := func(app string) (rs, pods int) {
		t.Helper()
		rsl, err := e.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			t.Fatal(err)
		}
		pl, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			t.Fatal(err)
		}
		return len(rsl.Items), len(pl.Items)
	}

	// Background: the Deployment goes at once, then its ReplicaSet, then
	// the pods once their agents stopped them.
	e.Kubectl(t, "-n", ns, "delete", "deployment", "bg", "--cascade=background")
	kittest.WaitFor(t, "background cascade", 60*time.Second, func() (bool, error) {
		rs, pods := left("bg")
		return rs == 0 && pods == 0, fmt.Errorf("%d replicasets, %d pods left", rs, pods)
	})

	// Foreground: kubectl waits for the Deployment to go, which is after
	// its ReplicaSet and their pods.
	e.Kubectl(t, "-n", ns, "delete", "deployment", "fg", "--cascade=foreground", "--timeout=90s")
	if rs, pods := left("fg"); rs != 0 || pods != 0 {
		t.Errorf("foreground delete returned with %d replicasets and %d pods left", rs, pods)
	}

	// Orphan: the ReplicaSet stays, without its owner, and keeps its pods
	// running.
	e.Kubectl(t, "-n", ns, "delete", "deployment", "orphan", "--cascade=orphan")
	time.Sleep(2 * time.Second) // time for a wrong cascade to start
	rsl, err := e.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orphan"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rsl.Items) != 1 || len(rsl.Items[0].OwnerReferences) != 0 || rsl.Items[0].DeletionTimestamp != nil {
		t.Fatalf("orphaned replicasets %+v", rsl.Items)
	}
	pl, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=orphan"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pl.Items {
		if p.DeletionTimestamp != nil || !kit.IsPodReady(&p) || !metav1.IsControlledBy(&p, &rsl.Items[0]) {
			t.Errorf("pod %s of the orphaned replicaset: deleting %v ready %v owners %v", p.Name, p.DeletionTimestamp != nil, kit.IsPodReady(&p), p.OwnerReferences)
		}
	}
	if len(pl.Items) != 2 {
		t.Errorf("%d pods of the orphaned replicaset, want 2", len(pl.Items))
	}

	// The namespace goes with everything in it, running pods included;
	// kubectl waits until it is gone.
	start := time.Now()
	e.Kubectl(t, "delete", "namespace", ns, "--timeout=90s")
	t.Logf("namespace with 2 running pods deleted in %v", time.Since(start).Round(time.Millisecond))
	_, err = e.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if ok, err := gone(err); !ok {
		t.Errorf("namespace after kubectl delete returned: %v", err)
	}
	out, err := e.Hub.Run("get", "pods", "-A", "-o", "name")
	if err != nil || strings.Contains(out, ns+"/") {
		t.Errorf("pods after the namespace went: %v %s", err, out)
	}
	kittest.WaitFor(t, "the agents to drop the pods", 30*time.Second, func() (bool, error) {
		n := e.AgentPods()
		return n == 0, fmt.Errorf("agents still run %d pods", n)
	})
}
