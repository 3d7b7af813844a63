package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// An ephemeral container added to a running pod starts at the next sync,
// is never ready, and stops, without a restart, when the pod is killed.
func TestEphemeralContainer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{StartDelay: time.Second})
		p := testPod("web", corev1.RestartPolicyAlways, nil)
		syncPod(t, r, p)
		time.Sleep(2 * time.Second)
		p = p.DeepCopy()
		p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox"}, TargetContainerName: "app"}}
		syncPod(t, r, p)
		if st := status(t, r, p.UID); len(st.EphemeralContainers) != 1 || st.EphemeralContainers[0].State != edge.ContainerWaiting {
			t.Fatalf("ephemeral container right after the sync: %+v", st.EphemeralContainers)
		}
		time.Sleep(2 * time.Second)
		syncPod(t, r, p)
		st := status(t, r, p.UID)
		if len(st.EphemeralContainers) != 1 || st.EphemeralContainers[0].State != edge.ContainerRunning || st.EphemeralContainers[0].Ready {
			t.Fatalf("ephemeral container once started: %+v", st.EphemeralContainers)
		}
		if len(st.Containers) != 1 {
			t.Fatalf("app containers: %+v", st.Containers)
		}
		if err := r.KillPod(context.Background(), p.UID, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		st = status(t, r, p.UID)
		if e := st.EphemeralContainers[0]; e.State != edge.ContainerExited || e.RestartCount != 0 {
			t.Fatalf("ephemeral container after the kill: %+v", e)
		}
	})
}
