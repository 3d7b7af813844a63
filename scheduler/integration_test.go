package scheduler

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// hubArgs are passed to every hub the tests start: the hub's own
// scheduler stays off so the one under test is the only one binding, and
// the node lifecycle controller stays off because the test's nodes have no
// agents renewing their Leases.
var hubArgs = []string{"--disable-scheduler", "--controllers=*,-nodelifecycle"}

type testHub struct {
	h  *hubtest.Hub
	rc *rest.Config
	cs kubernetes.Interface
}

func startHub(t testing.TB) *testHub {
	t.Helper()
	h := hubtest.Start(t, hubArgs...)
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &testHub{h: h, rc: rc, cs: cs}
}

// runScheduler starts a Scheduler against the hub until the test ends.
func (th *testHub) runScheduler(t testing.TB) *Scheduler {
	t.Helper()
	s, err := New(Config{RestConfig: th.rc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
	return s
}

func testNode(name, cpu, mem string, labels map[string]string) *corev1.Node {
	if labels == nil {
		labels = map[string]string{}
	}
	labels[corev1.LabelHostname] = name
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem),
		corev1.ResourcePods: resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
}

// createNode creates a node and makes sure its status stuck (through
// nodes/status if the create dropped it).
func (th *testHub) createNode(t testing.TB, n *corev1.Node) {
	t.Helper()
	ctx := context.Background()
	got, err := th.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.Name, err)
	}
	if len(got.Status.Allocatable) == 0 {
		got.Status = n.Status
		if _, err := th.cs.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("set node %s status: %v", n.Name, err)
		}
	}
}

func testPod(name, cpu string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "test"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}},
		},
	}
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (th *testHub) podNode(t testing.TB, name string) string {
	p, err := th.cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Spec.NodeName
}

func (th *testHub) waitBound(t testing.TB, name string) string {
	t.Helper()
	var node string
	waitFor(t, "pod "+name+" bound", 30*time.Second, func() (bool, error) {
		node = th.podNode(t, name)
		return node != "", nil
	})
	return node
}

func (th *testHub) events(t testing.TB, pod, reason string) []corev1.Event {
	l, err := th.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String()})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// TestLoopAgainstHub runs the scheduler against a real hub: binding,
// events, the PodScheduled condition, waking up when a fitting node
// appears, and preemption.
func TestLoopAgainstHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process; skipped in -short")
	}
	th := startHub(t)
	ctx := context.Background()
	th.createNode(t, testNode("node-a", "2", "4Gi", nil))
	th.createNode(t, testNode("node-b", "2", "4Gi", nil))
	unreachable := testNode("node-gone", "64", "64Gi", nil)
	unreachable.Status.Conditions[0].Status = corev1.ConditionUnknown
	th.createNode(t, unreachable)
	th.runScheduler(t)

	t.Run("binds and reports", func(t *testing.T) {
		if _, err := th.cs.CoreV1().Pods("default").Create(ctx, testPod("fits", "500m"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		node := th.waitBound(t, "fits")
		if node != "node-a" && node != "node-b" {
			t.Fatalf("bound to %s", node)
		}
		want := fmt.Sprintf("Successfully assigned default/fits to %s", node)
		waitFor(t, "Scheduled event", 10*time.Second, func() (bool, error) {
			evs := th.events(t, "fits", "Scheduled")
			return len(evs) == 1 && evs[0].Message == want && evs[0].Source.Component == "default-scheduler", nil
		})
	})

	t.Run("unschedulable, then a node appears", func(t *testing.T) {
		if _, err := th.cs.CoreV1().Pods("default").Create(ctx, testPod("big", "3"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := "0/3 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }, 2 Insufficient cpu. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
		waitFor(t, "FailedScheduling event", 15*time.Second, func() (bool, error) {
			evs := th.events(t, "big", "FailedScheduling")
			if len(evs) == 0 {
				return false, nil
			}
			e := evs[0]
			if e.Type != corev1.EventTypeWarning || e.Source.Component != "default-scheduler" || e.ReportingController != "default-scheduler" {
				return false, fmt.Errorf("event %+v", e)
			}
			if e.Message != want {
				return false, fmt.Errorf("message %q, want %q", e.Message, want)
			}
			return true, nil
		})
		waitFor(t, "PodScheduled=False", 10*time.Second, func() (bool, error) {
			p, err := th.cs.CoreV1().Pods("default").Get(ctx, "big", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == "Unschedulable" && c.Message == want {
					return true, nil
				}
			}
			return false, nil
		})
		th.createNode(t, testNode("node-c", "4", "8Gi", nil))
		if node := th.waitBound(t, "big"); node != "node-c" {
			t.Fatalf("big bound to %s, want node-c", node)
		}
	})

	t.Run("preemption", func(t *testing.T) {
		for _, pc := range []*schedulingv1.PriorityClass{
			{ObjectMeta: metav1.ObjectMeta{Name: "it-low"}, Value: 10},
			{ObjectMeta: metav1.ObjectMeta{Name: "it-high"}, Value: 1000},
		} {
			if _, err := th.cs.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		// The pods of the earlier subtests have priority 0, below it-low:
		// remove them so that the low pods fill the nodes exactly (2+2+4
		// cpu) without preempting anything themselves.
		for _, n := range []string{"fits", "big"} {
			if err := th.cs.CoreV1().Pods("default").Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		// Fill every schedulable node with low-priority pods.
		var low []string
		for i := range 8 {
			p := testPod(fmt.Sprintf("low-%d", i), "1")
			p.Spec.PriorityClassName = "it-low"
			if _, err := th.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			low = append(low, p.Name)
		}
		for _, n := range low {
			th.waitBound(t, n)
		}
		hi := testPod("urgent", "1500m")
		hi.Spec.PriorityClassName = "it-high"
		if _, err := th.cs.CoreV1().Pods("default").Create(ctx, hi, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		node := th.waitBound(t, "urgent")
		waitFor(t, "Preempted event", 10*time.Second, func() (bool, error) {
			for _, n := range low {
				for _, e := range th.events(t, n, "Preempted") {
					if strings.HasSuffix(e.Message, "on node "+node) {
						return true, nil
					}
				}
			}
			return false, nil
		})
		// Some low pods are gone, and the node is not over-committed.
		left := 0
		for _, n := range low {
			p, err := th.cs.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Spec.NodeName == node {
				left++
			}
		}
		// urgent needs 1.5 cpu: two 1-cpu pods make way on any node.
		alloc := map[string]int{"node-a": 0, "node-b": 0, "node-c": 2}[node]
		if left > alloc {
			t.Fatalf("%d low pods still on %s next to urgent", left, node)
		}
	})
}
