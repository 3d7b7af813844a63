package containerd

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

func ephemeral(st *edge.PodStatus, name string) *edge.ContainerStatus {
	for i := range st.EphemeralContainers {
		if st.EphemeralContainers[i].Name == name {
			return &st.EphemeralContainers[i]
		}
	}
	return nil
}

// TestEphemeralContainers adds ephemeral containers to a running pod: one
// targeting the app container sees its process, one without a target
// has a process namespace of its own; neither is restarted, by the sync
// after an exit or by a restarted runtime, which adopts them as
// ephemeral containers.
func TestEphemeralContainers(t *testing.T) {
	e := newTestRuntime(t, "10.231.11.0/24")
	pod := testPod("app", corev1.Container{Name: "c", Image: images.Sleeper})
	e.syncUntil(t, pod, 30*time.Second, "c running", running("c"))

	pod = pod.DeepCopy()
	ec := func(name, target string, cmd ...string) corev1.EphemeralContainer {
		return corev1.EphemeralContainer{TargetContainerName: target, EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: name, Image: images.Sleeper, ImagePullPolicy: corev1.PullNever, Command: cmd, Stdin: true,
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile}}
	}
	pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{ec("ps", "c", "ps"), ec("own", "", "sleep", "3600")}
	st := e.syncUntil(t, pod, 30*time.Second, "ps exited and own running", func(st *edge.PodStatus) bool {
		ps, own := ephemeral(st, "ps"), ephemeral(st, "own")
		return ps != nil && ps.State == edge.ContainerExited && own != nil && own.State == edge.ContainerRunning
	})
	if len(st.Containers) != 1 || st.Containers[0].Name != "c" || st.Containers[0].RestartCount != 0 {
		t.Fatalf("app containers: %+v", st.Containers)
	}
	psID, ownID := ephemeral(st, "ps").ID, ephemeral(st, "own").ID
	if ps := ephemeral(st, "ps"); ps.ExitCode != 0 {
		t.Fatalf("ps: %+v", ps)
	}
	var logs bytes.Buffer
	if err := e.rt.ContainerLogs(context.Background(), pod.UID, "ps", edge.LogOptions{TailLines: -1}, &logs); err != nil ||
		!strings.Contains(logs.String(), "/testapp sleep") {
		t.Errorf("ps in the container targeting c: %v\n%s", err, logs.String())
	}
	var out bytes.Buffer
	if code, err := e.rt.Exec(context.Background(), pod.UID, "own", []string{"ps"}, edge.Streams{Stdout: &out}); err != nil || code != 0 ||
		strings.Contains(out.String(), "/testapp sleep") || !strings.Contains(out.String(), "sleep 3600") {
		t.Errorf("ps in the container without a target (code %d, %v) shows other processes or not its own:\n%s", code, err, out.String())
	}

	// Later syncs, and a restarted runtime, leave them as they are.
	for i := 0; i < 3; i++ {
		if err := e.rt.SyncPod(context.Background(), pod, e.net); err != nil {
			t.Fatal(err)
		}
	}
	e.rt.Close()
	e.rt = e.start(t)
	st = e.syncUntil(t, pod, 30*time.Second, "adopted", running("c"))
	ps, own := ephemeral(st, "ps"), ephemeral(st, "own")
	if ps == nil || ps.ID != psID || ps.State != edge.ContainerExited || ps.RestartCount != 0 {
		t.Errorf("ps after the restart: %+v (was %s)", ps, psID)
	}
	if own == nil || own.ID != ownID || own.State != edge.ContainerRunning {
		t.Errorf("own after the restart: %+v (was %s)", own, ownID)
	}
	if len(st.Containers) != 1 {
		t.Errorf("app containers after the restart: %+v", st.Containers)
	}
}
