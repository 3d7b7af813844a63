package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Status batching. A pod that is still Pending (its sandbox or containers
// being created) has its status held back for up to pendingWindow: a pod
// that starts within the window goes from "no status" to Running and Ready
// in one write instead of two. Every other status (Running, a readiness
// change, a terminal phase, anything while terminating) is written at
// once, and flushes whatever was held back, so readiness reaches the hub
// as promptly as before.
const (
	pendingWindow     = 500 * time.Millisecond
	statusRetryMin    = time.Second
	statusRetryMax    = 30 * time.Second
	statusWriteStripe = 64
)

// statusManager writes pods' status, for every runtime. It remembers the
// status the hub last acknowledged for each pod and writes only when the
// new one differs, as a patch of the difference. Writes of one pod are
// serialised, so an older status never lands after a newer one.
type statusManager struct {
	pods    func(namespace string) podPatcher
	metrics *metrics
	window  time.Duration
	seed    maphash.Seed
	writing [statusWriteStripe]sync.Mutex // by hash of the pod's UID

	mu      sync.Mutex
	known   map[types.UID]knownStatus
	pending map[types.UID]*pendingStatus
}

// podPatcher patches the Pods of a namespace: the agent's kube client, or
// client-go's typed one.
type podPatcher interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error)
}

type knownStatus struct {
	status corev1.PodStatus
	rv     uint64 // resourceVersion of the object it came with
}

// pendingStatus is a status waiting to be written: held back in the
// batching window, or due now and written in the background.
type pendingStatus struct {
	ctx     context.Context
	pod     *corev1.Pod
	status  corev1.PodStatus
	timer   *time.Timer
	backoff time.Duration // after a failed write
	due     bool          // not to be held back: written as soon as it can be
}

// revision reads a resourceVersion as the hub's revision number; 0 when
// it is not one.
func revision(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}

func newStatusManager(pods func(namespace string) podPatcher, m *metrics) *statusManager {
	return &statusManager{
		pods: pods, metrics: m, window: pendingWindow, seed: maphash.MakeSeed(),
		known: map[types.UID]knownStatus{}, pending: map[types.UID]*pendingStatus{},
	}
}

// base returns the status the hub has for pod, as far as the agent knows,
// counting a status held back as written: the next status is computed
// from it.
func (m *statusManager) base(pod *corev1.Pod) corev1.PodStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.pending[pod.UID]; p != nil {
		return p.status
	}
	return m.acked(pod)
}

// acked returns the status the hub acknowledged for pod; m.mu is held.
func (m *statusManager) acked(pod *corev1.Pod) corev1.PodStatus {
	if k, ok := m.known[pod.UID]; ok && k.rv >= revision(pod.ResourceVersion) {
		return k.status
	}
	return pod.Status
}

// set makes the hub's status of pod st. pod is the agent's latest copy of
// the API object. An urgent status (a terminating pod's) is written before
// set returns. A Pending status is held back for the batching window; any
// other is written at once, in the background, with retries on a back-off:
// the pod's worker never waits on the hub, whose link may have died before
// the tunnel noticed, while its containers need restarting.
func (m *statusManager) set(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus, urgent bool) error {
	m.mu.Lock()
	p := m.pending[pod.UID]
	if p != nil {
		p.pod = pod // the newest object, for the UID and revision checks
	}
	var old corev1.PodStatus
	if p != nil {
		old = p.status
	} else {
		old = m.acked(pod)
	}
	if apiequality.Semantic.DeepEqual(old, st) {
		if p != nil && p.due && p.backoff > 0 && p.timer.Stop() {
			// Waiting out a back-off after failed writes: the pod's
			// worker looks again (the tunnel is back), so try now.
			p.timer.Reset(0)
		}
		m.mu.Unlock()
		return nil
	}
	if !urgent {
		hold := m.window > 0 && st.Phase == corev1.PodPending
		if p == nil {
			p = &pendingStatus{pod: pod}
			m.pending[pod.UID] = p
			uid := pod.UID
			wait := m.window
			if !hold {
				wait, p.due = 0, true
			}
			p.timer = time.AfterFunc(wait, func() { m.flush(uid, p) })
		} else if !hold && !p.due {
			// Held back until now: due at once. A timer that
			// already fired finds the new status when its write
			// ends.
			p.due = true
			if p.timer.Stop() {
				p.timer.Reset(0)
			}
		}
		p.ctx, p.status = ctx, st
		m.mu.Unlock()
		return nil
	}
	if p != nil {
		// Superseded: this write carries everything the held-back one had.
		p.timer.Stop()
		delete(m.pending, pod.UID)
	}
	m.mu.Unlock()
	return m.write(ctx, pod, st)
}

// flush writes a pending status once it is due. A failed
// write is retried on a back-off, unless a newer status replaced it.
func (m *statusManager) flush(uid types.UID, p *pendingStatus) {
	lock := m.lock(uid)
	lock.Lock()
	defer lock.Unlock()
	m.mu.Lock()
	if m.pending[uid] != p {
		m.mu.Unlock()
		return // written or replaced meanwhile
	}
	ctx, pod, st := p.ctx, p.pod, p.status
	m.mu.Unlock()
	if ctx.Err() != nil {
		m.drop(uid, p)
		return
	}
	err := m.writeLocked(ctx, pod, st)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.pending[uid] != p:
		// Superseded by a write of a newer status.
	case apierrors.IsNotFound(err) || ctx.Err() != nil:
		delete(m.pending, uid)
	case err == nil && apiequality.Semantic.DeepEqual(p.status, st):
		delete(m.pending, uid)
	case err == nil:
		// A newer status came while writing: it is due at once, or
		// gets its own window if it is Pending.
		p.backoff = 0
		wait := m.window
		if p.due {
			wait = 0
		}
		p.timer = time.AfterFunc(wait, func() { m.flush(uid, p) })
	default:
		p.backoff = min(max(2*p.backoff, statusRetryMin), statusRetryMax)
		p.timer = time.AfterFunc(p.backoff, func() { m.flush(uid, p) })
	}
}

func (m *statusManager) drop(uid types.UID, p *pendingStatus) {
	m.mu.Lock()
	if m.pending[uid] == p {
		delete(m.pending, uid)
	}
	m.mu.Unlock()
}

// lock returns the mutex serialising the writes of the pod uid.
func (m *statusManager) lock(uid types.UID) *sync.Mutex {
	return &m.writing[maphash.String(m.seed, string(uid))%statusWriteStripe]
}

// write patches the hub's status of pod from what it acknowledged last to
// st.
func (m *statusManager) write(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) error {
	lock := m.lock(pod.UID)
	lock.Lock()
	defer lock.Unlock()
	return m.writeLocked(ctx, pod, st)
}

func (m *statusManager) writeLocked(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) error {
	m.mu.Lock()
	old := m.acked(pod)
	m.mu.Unlock()
	// The agent writes only the conditions it owns: st was built from
	// the agent's copy of the pod, which may predate a condition others
	// set since (the node lifecycle's Lost, DisruptionTarget, readiness
	// gates), and a patch from the acknowledged status to st would
	// delete it, or put back one they removed.
	old, st = ownConditions(old), ownConditions(st)
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
	if noopPatch(patch) {
		// Equal but for the order of a merged list (the hub keeps its
		// own order of conditions): nothing to write. Remember st so
		// the next comparison is cheap.
		m.mu.Lock()
		if k, ok := m.known[pod.UID]; !ok || k.rv <= revision(pod.ResourceVersion) {
			m.known[pod.UID] = knownStatus{status: st, rv: max(k.rv, revision(pod.ResourceVersion))}
		}
		m.mu.Unlock()
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
	if p := m.pending[uid]; p != nil {
		p.timer.Stop()
		delete(m.pending, uid)
	}
	delete(m.known, uid)
	m.mu.Unlock()
}

// noopPatch reports whether a patch changes nothing: an object whose
// values are all empty objects, such as {"status":{}}.
func noopPatch(patch []byte) bool {
	if emptyPatch(patch) {
		return true
	}
	var v map[string]any
	if json.Unmarshal(patch, &v) != nil {
		return false
	}
	return emptyObject(v)
}

func emptyObject(v map[string]any) bool {
	for _, x := range v {
		o, ok := x.(map[string]any)
		if !ok || !emptyObject(o) {
			return false
		}
	}
	return true
}

// withUID adds "metadata":{"uid":...} to a JSON object patch.
func withUID(patch []byte, uid types.UID) []byte {
	prefix := fmt.Sprintf(`{"metadata":{"uid":%q},`, uid)
	if len(patch) > 2 && patch[0] == '{' {
		return append([]byte(prefix), patch[1:]...)
	}
	return patch
}

// ownConditions returns st with only the conditions the agent writes: the
// four it computes, and PodScheduled, which it sets on a pod bound at
// creation.
func ownConditions(st corev1.PodStatus) corev1.PodStatus {
	out := st
	out.Conditions = nil
	for _, c := range st.Conditions {
		switch c.Type {
		case corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady, corev1.PodScheduled:
			out.Conditions = append(out.Conditions, c)
		}
	}
	return out
}
