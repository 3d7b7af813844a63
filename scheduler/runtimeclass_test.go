package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestRuntimeClassOverheadAgainstHub: the overhead the hub's RuntimeClass
// admission sets on a pod counts when the scheduler fits it, so a pod that
// would fit on its own does not fit with its class's overhead.
func TestRuntimeClassOverheadAgainstHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process; skipped in -short")
	}
	th := startHub(t)
	ctx := context.Background()
	th.createNode(t, testNode("small", "2", "4Gi", nil))
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "heavy"}, Handler: "heavy",
		Overhead: &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}
	if _, err := th.cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	th.runScheduler(t)

	heavy := testPod("heavy", "1500m")
	heavy.Spec.RuntimeClassName = ptr.To("heavy")
	got, err := th.cs.CoreV1().Pods("default").Create(ctx, heavy, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Overhead.Cpu().String() != "1" {
		t.Fatalf("overhead %v, want cpu 1 from the RuntimeClass", got.Spec.Overhead)
	}
	waitFor(t, "FailedScheduling event", 15*time.Second, func() (bool, error) {
		evs := th.events(t, "heavy", "FailedScheduling")
		return len(evs) > 0 && strings.Contains(evs[0].Message, "1 Insufficient cpu"), nil
	})
	if n := th.podNode(t, "heavy"); n != "" {
		t.Fatalf("pod with overhead bound to %s", n)
	}

	if _, err := th.cs.CoreV1().Pods("default").Create(ctx, testPod("light", "1500m"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := th.waitBound(t, "light"); n != "small" {
		t.Fatalf("pod without overhead bound to %q", n)
	}
}
