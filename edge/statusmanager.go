package edge

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// statusManager writes pods' status, for every runtime. It remembers the
// status the hub last acknowledged for each pod and writes only when the
// new one differs, as a patch of the difference.
type statusManager struct {
	pods    func(namespace string) corev1client.PodInterface
	metrics *metrics

	mu    sync.Mutex
	known map[types.UID]knownStatus
}

type knownStatus struct {
	status corev1.PodStatus
	rv     uint64 // resourceVersion of the object it came with
}

// revision reads a resourceVersion as the hub's revision number; 0 when
// it is not one.
func revision(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}

func newStatusManager(pods func(string) corev1client.PodInterface, m *metrics) *statusManager {
	return &statusManager{pods: pods, metrics: m, known: map[types.UID]knownStatus{}}
}

// base returns the status the hub has for pod, as far as the agent knows.
func (m *statusManager) base(pod *corev1.Pod) corev1.PodStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.known[pod.UID]; ok && k.rv >= revision(pod.ResourceVersion) {
		return k.status
	}
	return pod.Status
}

// set makes the hub's status of pod st. pod is the agent's latest copy of
// the API object.
func (m *statusManager) set(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) error {
	old := m.base(pod)
	if apiequality.Semantic.DeepEqual(old, st) {
		return nil
	}
	patch, err := statusPatch(
		corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: pod.UID}, Status: old},
		corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: pod.UID}, Status: st},
		corev1.Pod{})
	if err != nil {
		return err
	}
	if emptyPatch(patch) {
		return nil
	}
	// The pod's UID goes along: the patch must not land on a pod that
	// replaced this one under the same name.
	patch = withUID(patch, pod.UID)
	out, err := m.pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if out.UID != pod.UID {
		return fmt.Errorf("patch status of pod %s/%s: the hub's pod is another one (uid %s)", pod.Namespace, pod.Name, out.UID)
	}
	m.mu.Lock()
	m.known[pod.UID] = knownStatus{status: out.Status, rv: revision(out.ResourceVersion)}
	m.mu.Unlock()
	m.metrics.podStatusWrites.Add(1)
	return nil
}

func (m *statusManager) forget(uid types.UID) {
	m.mu.Lock()
	delete(m.known, uid)
	m.mu.Unlock()
}

// withUID adds "metadata":{"uid":...} to a JSON object patch.
func withUID(patch []byte, uid types.UID) []byte {
	prefix := fmt.Sprintf(`{"metadata":{"uid":%q},`, uid)
	if len(patch) > 2 && patch[0] == '{' {
		return append([]byte(prefix), patch[1:]...)
	}
	return patch
}
