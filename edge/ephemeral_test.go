package edge_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// TestKubectlDebugOnSim runs `kubectl debug -i` against a pod of a sim
// edge: the hub stores the ephemeral container, the agent starts it and
// reports it in ephemeralContainerStatuses, and kubectl, which waits for
// that status, falls back from attach (the sim runtime has none) to the
// container's log, as it does upstream.
func TestKubectlDebugOnSim(t *testing.T) {
	e := startHub(t)
	startAgent(t, edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-dbg"})
	waitNodeReady(t, e, "edge-dbg")
	pods := e.client.CoreV1().Pods("default")
	if _, err := pods.Create(context.Background(), newPod("web", "edge-dbg", nil, corev1.RestartPolicyAlways), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "web", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	out, err := e.hub.RunInput(context.Background(), "", nil, "debug", "-i", "web", "--image=registry.example/tools:1",
		"--target=app", "--container=dbg", "--", "ps")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "dbg") {
		t.Errorf("kubectl debug printed no log of the debug container:\n%s", out)
	}
	p := waitPod(t, e, "web", "with its ephemeral container running", func(p *corev1.Pod) bool {
		s := p.Status.EphemeralContainerStatuses
		return len(s) == 1 && s[0].Name == "dbg" && s[0].State.Running != nil
	})
	if ec := p.Spec.EphemeralContainers; len(ec) != 1 || ec[0].TargetContainerName != "app" || !ec[0].Stdin {
		t.Errorf("pod spec's ephemeral containers: %+v", ec)
	}
	if s := p.Status.EphemeralContainerStatuses[0]; s.Ready || s.Started != nil || !strings.HasPrefix(s.ContainerID, "sim://") {
		t.Errorf("ephemeral container status: %+v", s)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
		t.Errorf("the debug container changed the pod's status: %s", p.Status.String())
	}
}
