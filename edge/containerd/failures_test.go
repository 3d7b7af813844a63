package containerd

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

func TestRuntimeFailures(t *testing.T) {
	e := newTestRuntime(t, "10.231.2.0/24")

	t.Run("memory limit gives OOMKilled 137", func(t *testing.T) {
		pod := testPod("hog", corev1.Container{
			Name: "hog", Image: images.MemHog, Args: []string{"memhog", "128"},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}},
		})
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		st := e.syncUntil(t, pod, 30*time.Second, "hog exited", func(st *edge.PodStatus) bool {
			return len(st.Containers) == 1 && st.Containers[0].State == edge.ContainerExited
		})
		if c := st.Containers[0]; c.ExitCode != 137 || c.Reason != "OOMKilled" {
			t.Errorf("exit %d reason %q", c.ExitCode, c.Reason)
		}
	})

	t.Run("crash loop back-off", func(t *testing.T) {
		pod := testPod("crasher", corev1.Container{Name: "c", Image: images.Crasher})
		var starts []time.Time
		seen := map[int32]bool{}
		e.syncUntil(t, pod, 30*time.Second, "three restarts", func(st *edge.PodStatus) bool {
			c := st.Containers[0]
			if c.StartedAt.IsZero() || seen[c.RestartCount] {
				return c.RestartCount >= 3
			}
			seen[c.RestartCount] = true
			starts = append(starts, c.StartedAt)
			return c.RestartCount >= 3
		})
		st, _ := e.rt.PodStatus(context.Background(), pod.UID)
		c := st.Containers[0]
		if c.Last == nil || c.Last.ExitCode != 1 || c.Last.Reason != "Error" {
			t.Errorf("last termination %+v", c.Last)
		}
		// Restarts: at once, then after 1s, then 2s (base 1s in tests).
		if len(starts) >= 4 {
			if d := starts[3].Sub(starts[2]); d < 1500*time.Millisecond {
				t.Errorf("third restart after %v, want the back-off of 2s", d)
			}
		}
		var logs strings.Builder
		if err := e.rt.ContainerLogs(context.Background(), pod.UID, "c", edge.LogOptions{TailLines: -1, Previous: true}, &logs); err != nil || !strings.Contains(logs.String(), "crashing with 1") {
			t.Errorf("previous logs: %q %v", logs.String(), err)
		}
	})

	t.Run("preStop runs before SIGTERM", func(t *testing.T) {
		if !images.HasShell() {
			t.Skip("needs a static busybox for the hook's shell")
		}
		pod := testPod("stopper", corev1.Container{
			Name: "s", Image: images.Sleeper,
			Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
				Command: []string{"/bin/sh", "-c", "echo prestop-ran > /proc/1/fd/1"},
			}}},
		})
		e.syncUntil(t, pod, 30*time.Second, "running", running("s"))
		if err := e.rt.KillPod(context.Background(), pod.UID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		e.rt.ContainerLogs(context.Background(), pod.UID, "s", edge.LogOptions{TailLines: -1}, &logs)
		out := logs.String()
		i, j := strings.Index(out, "prestop-ran"), strings.Index(out, "got terminated")
		if i < 0 || j < 0 || i > j {
			t.Errorf("want the hook's line before the SIGTERM line:\n%s", out)
		}
	})
}
