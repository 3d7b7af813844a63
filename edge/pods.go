package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/staticpods"
)

// podManager watches the pods bound to the node and runs one worker per
// pod (by UID, as a pod deleted and created again under the same name is
// another pod). Workers are woken by watch events and by the runtime.
type podManager struct {
	a     *Agent
	store cache.Store
	ctrl  atomic.Pointer[cache.Controller]

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	ctx     context.Context
	// mirrors are the mirror pods of the node by namespace/name
	// (mirror.go); they are not run.
	mirrors map[string]*corev1.Pod

	staticReady atomic.Bool // the static pod manifests were read once
	// janitorRunning and janitorDirty drive the collection of mirror
	// pods of no static pod (pokeJanitor); mu guards them.
	janitorRunning, janitorDirty bool
}

func newPodManager(a *Agent) *podManager {
	return &podManager{a: a, workers: map[types.UID]*podWorker{}, mirrors: map[string]*corev1.Pod{}}
}

// informer returns the controller that watches the node's pods.
func (m *podManager) informer() cache.Controller {
	sel := fields.OneTermEqualSelector("spec.nodeName", m.a.name).String()
	lw := &listWatch{
		keep: m.keep(), // local state: offline.go
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return m.a.client.Pods(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return m.a.client.Pods(metav1.NamespaceAll).Watch(ctx, o)
		},
	}
	store, ctrl := newInformer(lw, &corev1.Pod{}, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.update(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { m.update(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				m.gone(p)
			}
		},
	})
	m.store = store
	m.ctrl.Store(&ctrl)
	return ctrl
}

// resourceVersion is the last resourceVersion the pod watch saw.
func (m *podManager) resourceVersion() string {
	if c := m.ctrl.Load(); c != nil {
		return (*c).LastSyncResourceVersion()
	}
	return ""
}

// podWorker serialises everything done for one pod.
type podWorker struct {
	uid  types.UID
	wake chan struct{}

	mu      sync.Mutex
	pod     *corev1.Pod // latest API object, or the static pod
	static  bool        // a static pod (staticpods.go)
	gone    bool        // deleted from the API, or its manifest went
	syncErr error
	killed  bool // killed for deletion
	deleted bool // the agent deleted it from the API
	retry   *time.Timer
	backoff time.Duration
	// mountMsg and mountAt are the last FailedMount event's message
	// and time.
	mountMsg string
	mountAt  time.Time
	// cancelSync ends the runtime's SyncPod under way, if any: a
	// deletion must not wait for a postStart hook that never returns.
	cancelSync context.CancelFunc
}

// interrupt cancels the sync under way, once the pod is to be killed.
func (w *podWorker) interrupt() {
	w.mu.Lock()
	if w.cancelSync != nil {
		w.cancelSync()
	}
	w.mu.Unlock()
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (m *podManager) start(ctx context.Context) {
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()
}

func (m *podManager) worker(uid types.UID, create bool) *podWorker {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.workers[uid]
	if w == nil && create && m.ctx != nil {
		w = &podWorker{uid: uid, wake: make(chan struct{}, 1)}
		m.workers[uid] = w
		go m.run(m.ctx, w)
	}
	return w
}

func (m *podManager) update(p *corev1.Pod) {
	if staticpods.IsMirror(p) {
		m.setMirror(p)
		return
	}
	w := m.worker(p.UID, true)
	if w == nil {
		return
	}
	w.mu.Lock()
	w.pod = p
	w.mu.Unlock()
	if p.DeletionTimestamp != nil {
		w.interrupt()
	}
	w.poke()
}

func (m *podManager) gone(p *corev1.Pod) {
	if staticpods.IsMirror(p) {
		m.mirrorGone(p)
		return
	}
	w := m.worker(p.UID, false)
	if w == nil {
		return
	}
	w.mu.Lock()
	w.gone = true
	w.mu.Unlock()
	w.interrupt()
	w.poke()
}

// runtimeChanged is the runtime's notification.
func (m *podManager) runtimeChanged(uid types.UID) {
	if w := m.worker(uid, false); w != nil {
		w.poke()
	}
}

func (m *podManager) wakeAll() {
	m.mu.Lock()
	for _, w := range m.workers {
		w.poke()
	}
	m.mu.Unlock()
	m.pokeJanitor()
}

// pods returns the API objects of the pods the agent runs.
func (m *podManager) pods() []*corev1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(m.workers))
	for _, w := range m.workers {
		w.mu.Lock()
		if w.pod != nil && !w.gone {
			out = append(out, w.pod)
		}
		w.mu.Unlock()
	}
	return out
}

func (m *podManager) run(ctx context.Context, w *podWorker) {
	defer func() {
		w.mu.Lock()
		if w.retry != nil {
			w.retry.Stop()
		}
		w.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		done, err := m.sync(ctx, w)
		if done {
			m.mu.Lock()
			delete(m.workers, w.uid)
			m.mu.Unlock()
			return
		}
		w.mu.Lock()
		if err != nil {
			// Retry on the back-off; the next event retries sooner.
			w.backoff = min(max(2*w.backoff, time.Second), time.Minute)
			if w.retry != nil {
				w.retry.Stop()
			}
			w.retry = time.AfterFunc(w.backoff, w.poke)
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, ErrVolumeNotReady):
				m.a.log.Info("pod waits for its volumes", "uid", w.uid, "err", err, "retry in", w.backoff)
			default:
				m.a.log.Warn("sync pod", "uid", w.uid, "err", err, "retry in", w.backoff)
			}
		} else {
			w.backoff = 0
		}
		w.mu.Unlock()
	}
}

// sync does one round of work for a pod. It reports done when the pod is
// gone from both the hub and the runtime.
func (m *podManager) sync(ctx context.Context, w *podWorker) (done bool, err error) {
	w.mu.Lock()
	pod, gone, killed, deleted, static := w.pod, w.gone, w.killed, w.deleted, w.static
	w.mu.Unlock()
	rt := m.a.cfg.Runtime

	if gone {
		// Deleted from the hub (by the agent, or forcibly by someone
		// else), or a static pod whose manifest went: nothing may keep
		// running.
		grace := time.Duration(0)
		if static {
			grace = gracePeriod(pod)
		}
		if err := rt.KillPod(ctx, w.uid, grace); err != nil {
			return false, err
		}
		if err := rt.RemovePod(ctx, w.uid); err != nil {
			return false, err
		}
		m.a.hostPortsDown(w.uid, true)
		m.a.status.forget(w.uid)
		m.a.refs.release(w.uid)
		if static {
			m.a.local.staticRemoved(pod)
			m.deleteMirrorOf(ctx, pod)
		} else {
			m.a.local.podRemoved(pod) // its tombstone in the local state
		}
		m.a.log.Debug("pod removed", "pod", pod.Namespace+"/"+pod.Name)
		return true, nil
	}
	if static {
		return false, m.syncStatic(ctx, w, pod)
	}
	if deleted || !m.a.node.runnable() {
		return false, nil
	}
	m.a.refs.track(pod)

	if pod.DeletionTimestamp != nil {
		if !killed {
			grace := gracePeriod(pod)
			m.a.log.Debug("killing pod", "pod", pod.Namespace+"/"+pod.Name, "grace", grace)
			if err := rt.KillPod(ctx, w.uid, grace); err != nil {
				return false, err
			}
			m.a.hostPortsDown(w.uid, true)
			w.mu.Lock()
			w.killed = true
			w.mu.Unlock()
		}
		if err := m.writeStatus(ctx, w, pod, true); err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		// Stopped: the hub may now forget the pod. The UID
		// precondition keeps this from deleting a successor.
		zero := int64(0)
		err := m.a.client.Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return false, fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		w.mu.Lock()
		w.deleted = true
		w.mu.Unlock()
		return false, nil
	}

	if terminal(m.a.status.base(pod).Phase) {
		// A finished pod never runs again, even when the agent
		// restarted and its runtime forgot it.
		m.a.hostPortsDown(w.uid, true)
		return false, nil
	}
	if err := m.checkVolumes(ctx, pod); err != nil {
		// Not for the runtime yet: the pod waits in ContainerCreating.
		m.mountFailed(w, pod, err)
		w.mu.Lock()
		w.syncErr = nil
		w.mu.Unlock()
		if werr := m.writeStatus(ctx, w, pod, false); werr != nil {
			return false, werr
		}
		return false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.cancelSync = cancel
	w.mu.Unlock()
	syncErr := rt.SyncPod(sctx, pod, m.a.node.network())
	interrupted := sctx.Err() != nil && ctx.Err() == nil
	cancel()
	w.mu.Lock()
	w.cancelSync = nil
	if !interrupted {
		w.syncErr = syncErr
	}
	w.mu.Unlock()
	if interrupted {
		// To be killed: the next round does it.
		w.poke()
		return false, nil
	}
	m.a.hostPortsUp(ctx, pod)
	if m.a.tunnel != nil && !m.a.tunnel.Connected() {
		// Offline the status waits for the tunnel, which wakes every
		// worker when it is back. Writing now would hold the worker in
		// the tunnel's dial wait, deaf to the runtime's wake-ups: a
		// container that exits or whose back-off ends would wait too.
		return false, syncErr
	}
	if err := m.writeStatus(ctx, w, pod, false); err != nil {
		return false, err
	}
	if syncErr != nil {
		return false, syncErr
	}
	return false, nil
}

// writeStatus computes the pod's status from the runtime and writes it.
func (m *podManager) writeStatus(ctx context.Context, w *podWorker, pod *corev1.Pod, terminating bool) error {
	return m.writeStatusTo(ctx, w, pod, pod, terminating)
}

// writeStatusTo computes the status of pod from the runtime and writes it
// to target, the API object that shows it: the pod itself, or the mirror
// pod of a static pod.
func (m *podManager) writeStatusTo(ctx context.Context, w *podWorker, pod, target *corev1.Pod, terminating bool) error {
	rs, err := m.a.cfg.Runtime.PodStatus(ctx, w.uid)
	if err != nil && !errors.Is(err, ErrPodNotFound) {
		return fmt.Errorf("read runtime status: %w", err)
	}
	w.mu.Lock()
	syncErr := w.syncErr
	w.mu.Unlock()
	base := pod.DeepCopy()
	base.Status = m.a.status.base(target)
	st := computePodStatus(podStatusInput{
		pod: base, rt: rs, syncErr: syncErr, hostIPs: m.a.hostIPs(),
		terminating: terminating, now: time.Now(),
	})
	return m.a.status.set(ctx, target, st, terminating)
}

// gracePeriod is how long the pod's containers get to stop.
func gracePeriod(pod *corev1.Pod) time.Duration {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return corev1.DefaultTerminationGracePeriodSeconds * time.Second
}

func terminal(p corev1.PodPhase) bool {
	return p == corev1.PodSucceeded || p == corev1.PodFailed
}
