package replicaset

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// runOnFake runs the ReplicaSet controller on a fake clientset holding
// objs, whose writes move resourceVersions and whose creates fill in
// generated names and UIDs, as the hub's would.
func runOnFake(t *testing.T, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	client := fake.NewSimpleClientset(objs...)
	var rv, seq atomic.Int64
	rv.Store(100)
	client.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		// Create and update actions both carry the object to store.
		oa, ok := a.(interface{ GetObject() runtime.Object })
		if !ok || (a.GetVerb() != "create" && a.GetVerb() != "update") {
			return false, nil, nil
		}
		obj := oa.GetObject()
		m, ok := obj.(metav1.Object)
		if !ok {
			return false, nil, nil
		}
		if a.GetVerb() == "create" {
			if m.GetName() == "" {
				m.SetName(m.GetGenerateName() + strconv.FormatInt(seq.Add(1), 10))
			}
			m.SetUID(types.UID(fmt.Sprintf("new-%d", seq.Add(1))))
			m.SetCreationTimestamp(metav1.Now())
		}
		m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		return false, nil, nil
	})
	f := informers.NewSharedInformerFactory(client, 0)
	c, err := New(Config{Client: client, Informers: f, Workers: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	f.Start(ctx.Done())
	wg.Go(func() { _ = c.Run(ctx) })
	return client
}

func lostTestRS(replicas int32) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "rs-uid"},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "web:1"}}},
			},
		},
	}
}

// lostTestPod is a running pod of rs on node, ready or not, Lost or not.
func lostTestPod(rs *appsv1.ReplicaSet, name, node string, ready, lost bool, age time.Duration) *corev1.Pod {
	created := metav1.NewTime(time.Now().Add(-age))
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), Labels: map[string]string{"app": "web"},
			CreationTimestamp: created, ResourceVersion: "1",
			OwnerReferences: []metav1.OwnerReference{kit.ControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "web:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: status, LastTransitionTime: created}}},
	}
	if lost {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: kit.PodConditionLost, Status: corev1.ConditionTrue})
	}
	return p
}

func waitPods(t *testing.T, client *fake.Clientset, what string, cond func([]corev1.Pod) bool) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l, err := client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pods = l.Items; cond(pods) {
			return pods
		}
		time.Sleep(5 * time.Millisecond)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	t.Fatalf("timed out waiting for %s; pods %v", what, names)
	return nil
}

// TestLostPodReplaced: a Lost pod does not count, so the ReplicaSet
// starts a replacement, and the Lost pod is left alone; the status counts
// only the replacement.
func TestLostPodReplaced(t *testing.T) {
	rs := lostTestRS(1)
	client := runOnFake(t, rs, lostTestPod(rs, "orig", "b1", false, true, time.Hour))
	waitPods(t, client, "a replacement", func(p []corev1.Pod) bool { return len(p) == 2 })
	time.Sleep(100 * time.Millisecond)
	pods := waitPods(t, client, "two pods", func(p []corev1.Pod) bool { return len(p) == 2 })
	for _, p := range pods {
		if p.Name != "orig" && kit.IsPodLost(&p) {
			t.Errorf("replacement %s is Lost", p.Name)
		}
	}
	// Status writes of moving counts are spaced by a second.
	var replicas int32
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := client.AppsV1().ReplicaSets("default").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if replicas = got.Status.Replicas; replicas == 1 {
			return
		}
	}
	t.Errorf("status.replicas %d, want 1: the Lost pod does not count", replicas)
}

// TestLostPodNeverDeleted: scaling down never picks a Lost pod, however
// cheap it would be to lose (unready, on a crowded node).
func TestLostPodNeverDeleted(t *testing.T) {
	rs := lostTestRS(1)
	client := runOnFake(t, rs,
		lostTestPod(rs, "lost", "b1", false, true, time.Minute),
		lostTestPod(rs, "a", "b1", true, false, time.Hour),
		lostTestPod(rs, "b", "b2", true, false, 2*time.Hour),
	)
	waitPods(t, client, "one of the two live pods deleted", func(p []corev1.Pod) bool { return len(p) == 2 })
	time.Sleep(100 * time.Millisecond)
	pods := waitPods(t, client, "two pods", func(p []corev1.Pod) bool { return len(p) == 2 })
	lost := false
	for _, p := range pods {
		lost = lost || p.Name == "lost"
	}
	if !lost {
		t.Errorf("the Lost pod was deleted")
	}
}

func TestNotLost(t *testing.T) {
	rs := lostTestRS(1)
	a := lostTestPod(rs, "a", "n", true, false, 0)
	b := lostTestPod(rs, "b", "n", true, true, 0)
	c := lostTestPod(rs, "c", "n", true, true, 0)
	c.Status.Conditions[1].Status = corev1.ConditionFalse // Lost cleared
	got := notLost([]*corev1.Pod{a, b, c})
	if len(got) != 2 || got[0] != a || got[1] != c {
		t.Errorf("notLost kept %v", got)
	}
}
