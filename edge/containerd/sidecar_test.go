package containerd

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// TestSidecarsOnContainerd: init containers with restartPolicy Always run
// beside the regular containers; the next init container starts once the
// sidecar runs; a sidecar is restarted whatever the pod's restartPolicy,
// and stopped once the regular containers are done.
func TestSidecarsOnContainerd(t *testing.T) {
	e := newTestRuntime(t, "10.231.12.0/24")
	ctx := context.Background()
	always := corev1.ContainerRestartPolicyAlways
	find := func(list []edge.ContainerStatus, name string) *edge.ContainerStatus {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
		return nil
	}
	withInit := func(pod *corev1.Pod, inits ...corev1.Container) *corev1.Pod {
		for _, c := range inits {
			c.ImagePullPolicy, c.TerminationMessagePath = corev1.PullNever, "/dev/termination-log"
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
		}
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		one := int64(1)
		pod.Spec.TerminationGracePeriodSeconds = &one
		return pod
	}
	remove := func(pod *corev1.Pod) {
		if err := e.rt.KillPod(ctx, pod.UID, time.Second); err != nil {
			t.Error(err)
		}
		if err := e.rt.RemovePod(ctx, pod.UID); err != nil {
			t.Error(err)
		}
	}

	t.Run("stopped when the regular containers are done", func(t *testing.T) {
		pod := withInit(testPod("sidecar-done", corev1.Container{Name: "app", Image: images.Sleeper, Args: []string{"sleep", "3"}}),
			corev1.Container{Name: "proxy", Image: images.Sleeper, RestartPolicy: &always},
			corev1.Container{Name: "setup", Image: images.Crasher, Args: []string{"crash", "0"}})
		defer remove(pod)
		sawBoth := false
		st := e.syncUntil(t, pod, 60*time.Second, "app done and proxy stopped", func(st *edge.PodStatus) bool {
			proxy, app := find(st.InitContainers, "proxy"), find(st.Containers, "app")
			if proxy != nil && app != nil && proxy.State == edge.ContainerRunning && app.State == edge.ContainerRunning {
				sawBoth = true
			}
			return proxy != nil && app != nil && proxy.State == edge.ContainerExited && app.State == edge.ContainerExited
		})
		if !sawBoth {
			t.Error("never saw the app running beside its sidecar")
		}
		if s := find(st.InitContainers, "setup"); s == nil || s.State != edge.ContainerExited || s.ExitCode != 0 {
			t.Errorf("setup: %+v", s)
		}
		if a := find(st.Containers, "app"); a.ExitCode != 0 || a.RestartCount != 0 {
			t.Errorf("app: %+v", a)
		}
		if p := find(st.InitContainers, "proxy"); p.RestartCount != 0 {
			t.Errorf("the stopped sidecar was restarted: %+v", p)
		}
	})

	t.Run("restarted whatever the pod's restartPolicy", func(t *testing.T) {
		pod := withInit(testPod("sidecar-restarts", corev1.Container{Name: "app", Image: images.Sleeper}),
			corev1.Container{Name: "proxy", Image: images.Sleeper, Args: []string{"sleep", "1"}, RestartPolicy: &always})
		defer remove(pod)
		st := e.syncUntil(t, pod, 60*time.Second, "proxy restarted twice beside the app", func(st *edge.PodStatus) bool {
			proxy, app := find(st.InitContainers, "proxy"), find(st.Containers, "app")
			return proxy != nil && proxy.RestartCount >= 2 && app != nil && app.State == edge.ContainerRunning
		})
		if a := find(st.Containers, "app"); a.RestartCount != 0 {
			t.Errorf("app: %+v", a)
		}
	})
}
