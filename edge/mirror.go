package edge

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/staticpods"
)

// Mirror pods. For every static pod the agent keeps a mirror pod on the
// hub, as the kubelet does: the same name, namespace, labels and spec, the
// annotation kubernetes.io/config.mirror with the static pod's hash, bound
// to the node and controlled by its Node object. The agent reports the
// static pod's status there, so kubectl shows it like any pod (logs and
// exec reach it by name). The mirror pod only mirrors: the agent never runs
// it, deleting it (kubectl delete) does not stop the static pod, and the
// agent creates it again; a mirror pod of an older manifest, or of no
// static pod at all once the manifest directory was read, is deleted.
// Mirror pods appear once the node is registered, after any time offline.

// updateStatic hands the pod manager a static pod, new or unchanged.
func (m *podManager) updateStatic(p *corev1.Pod) {
	w := m.worker(p.UID, true)
	if w == nil {
		return
	}
	w.mu.Lock()
	w.static, w.pod = true, p
	w.mu.Unlock()
	w.poke()
	m.pokeJanitor()
}

// staticGone stops a static pod whose manifest went.
func (m *podManager) staticGone(p *corev1.Pod) {
	w := m.worker(p.UID, true)
	if w == nil {
		return
	}
	w.mu.Lock()
	w.static, w.gone = true, true
	if w.pod == nil {
		w.pod = p
	}
	w.mu.Unlock()
	w.poke()
	m.pokeJanitor()
}

// staticSynced says the manifests were read once: mirror pods of no
// static pod may go from now on.
func (m *podManager) staticSynced() {
	m.staticReady.Store(true)
	m.pokeJanitor()
}

func mirrorKey(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// setMirror records a mirror pod the pod watch delivered.
func (m *podManager) setMirror(p *corev1.Pod) {
	m.mu.Lock()
	m.mirrors[mirrorKey(p)] = p
	m.mu.Unlock()
	m.pokeStatic(mirrorKey(p))
	m.pokeJanitor()
}

// mirrorGone forgets a deleted mirror pod.
func (m *podManager) mirrorGone(p *corev1.Pod) {
	m.mu.Lock()
	if cur := m.mirrors[mirrorKey(p)]; cur != nil && cur.UID == p.UID {
		delete(m.mirrors, mirrorKey(p))
	}
	m.mu.Unlock()
	m.a.status.forget(p.UID)
	m.a.local.podRemoved(p) // its tombstone
	m.pokeStatic(mirrorKey(p))
}

// pokeStatic wakes the live static pod named key.
func (m *podManager) pokeStatic(key string) {
	m.mu.Lock()
	var found []*podWorker
	for _, w := range m.workers {
		w.mu.Lock()
		if w.static && !w.gone && w.pod != nil && mirrorKey(w.pod) == key {
			found = append(found, w)
		}
		w.mu.Unlock()
	}
	m.mu.Unlock()
	for _, w := range found {
		w.poke()
	}
}

func (m *podManager) mirror(key string) *corev1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mirrors[key]
}

// mirrorsManaged tells whether the agent may write mirror pods: the node
// is registered and the pod watch knows the mirror pods there are.
func (m *podManager) mirrorsManaged() bool {
	c := m.ctrl.Load()
	return m.a.node.registered() && c != nil && (*c).HasSynced()
}

// syncStatic does one round of work for a live static pod.
func (m *podManager) syncStatic(ctx context.Context, w *podWorker, pod *corev1.Pod) error {
	if !m.a.node.runnable() && !pod.Spec.HostNetwork {
		// No pod range yet: the node's registration wakes the pod.
		return nil
	}
	mirror := m.ensureMirror(ctx, pod)
	if mirror != nil && terminal(m.a.status.base(mirror).Phase) {
		return nil // finished before the agent restarted
	}
	syncErr := m.a.cfg.Runtime.SyncPod(ctx, pod, m.a.node.network())
	m.a.hostPortsUp(ctx, pod)
	w.mu.Lock()
	w.syncErr = syncErr
	w.mu.Unlock()
	if mirror != nil && mirror.DeletionTimestamp == nil {
		if err := m.writeStatusTo(ctx, w, pod, mirror, false); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return syncErr
}

// ensureMirror makes the hub's mirror of pod current and returns it; nil
// while there is none (offline, or the hub refused it).
func (m *podManager) ensureMirror(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	mirror := m.mirror(mirrorKey(pod))
	if !m.mirrorsManaged() {
		return mirror
	}
	if mirror != nil && (mirror.DeletionTimestamp != nil || mirror.Annotations[staticpods.AnnConfigMirror] != pod.Annotations[staticpods.AnnConfigHash]) {
		// Deleted by someone, or of an older manifest: replaced.
		if err := m.deleteMirror(ctx, mirror); err != nil {
			m.a.log.Warn("delete mirror pod", "pod", mirrorKey(pod), "err", err)
			return nil
		}
		mirror = nil
	}
	if mirror != nil {
		return mirror
	}
	created, err := m.createMirror(ctx, pod)
	if err != nil {
		if !apierrors.IsAlreadyExists(err) { // else the watch brings it
			m.a.log.Warn("create mirror pod", "pod", mirrorKey(pod), "err", err)
		}
		return nil
	}
	m.mu.Lock()
	if cur := m.mirrors[mirrorKey(pod)]; cur == nil || cur.UID != created.UID {
		m.mirrors[mirrorKey(pod)] = created
	}
	m.mu.Unlock()
	m.a.log.Info("created mirror pod", "pod", mirrorKey(pod))
	return created
}

func (m *podManager) createMirror(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	uid := m.a.node.uid()
	if uid == "" {
		return nil, fmt.Errorf("node %s not registered", m.a.name)
	}
	yes := true
	ann := maps.Clone(pod.Annotations)
	ann[staticpods.AnnConfigMirror] = pod.Annotations[staticpods.AnnConfigHash]
	mp := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, Labels: maps.Clone(pod.Labels), Annotations: ann,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: m.a.name, UID: uid, Controller: &yes}},
		},
		Spec: *pod.Spec.DeepCopy(),
	}
	return m.a.client.Pods(pod.Namespace).Create(ctx, mp, metav1.CreateOptions{})
}

// deleteMirror deletes a mirror pod at once (its static pod is not
// affected), and only that one (UID precondition).
func (m *podManager) deleteMirror(ctx context.Context, mirror *corev1.Pod) error {
	zero := int64(0)
	err := m.a.client.Pods(mirror.Namespace).Delete(ctx, mirror.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &mirror.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	m.mu.Lock()
	if cur := m.mirrors[mirrorKey(mirror)]; cur != nil && cur.UID == mirror.UID {
		delete(m.mirrors, mirrorKey(mirror))
	}
	m.mu.Unlock()
	return nil
}

// deleteMirrorOf deletes the mirror of a static pod that stopped, unless
// it mirrors another static pod of the same name (a new manifest). Left
// to the janitor when the hub is out of reach.
func (m *podManager) deleteMirrorOf(ctx context.Context, pod *corev1.Pod) {
	mirror := m.mirror(mirrorKey(pod))
	if mirror == nil || mirror.Annotations[staticpods.AnnConfigMirror] != pod.Annotations[staticpods.AnnConfigHash] || !m.mirrorsManaged() {
		return
	}
	if err := m.deleteMirror(ctx, mirror); err != nil {
		m.a.log.Debug("delete mirror pod", "pod", mirrorKey(pod), "err", err)
	}
}

// pokeJanitor has the mirror pods of no static pod deleted, once the
// manifests were read: by a goroutine that runs while there is work.
func (m *podManager) pokeJanitor() {
	m.mu.Lock()
	m.janitorDirty = true
	if m.janitorRunning || m.ctx == nil {
		m.mu.Unlock()
		return
	}
	m.janitorRunning = true
	ctx := m.ctx
	m.mu.Unlock()
	go func() {
		for {
			m.mu.Lock()
			if !m.janitorDirty || ctx.Err() != nil {
				m.janitorRunning = false
				m.mu.Unlock()
				return
			}
			m.janitorDirty = false
			m.mu.Unlock()
			m.collectMirrors(ctx)
		}
	}()
}

// collectMirrors deletes the mirror pods of no static pod.
func (m *podManager) collectMirrors(ctx context.Context) {
	if !m.staticReady.Load() || !m.mirrorsManaged() {
		return
	}
	live := map[string]bool{}
	m.mu.Lock()
	for _, w := range m.workers {
		w.mu.Lock()
		if w.static && !w.gone && w.pod != nil {
			live[mirrorKey(w.pod)] = true
		}
		w.mu.Unlock()
	}
	var orphans []*corev1.Pod
	for key, p := range m.mirrors {
		if !live[key] {
			orphans = append(orphans, p)
		}
	}
	m.mu.Unlock()
	for _, p := range orphans {
		if err := m.deleteMirror(ctx, p); err != nil {
			m.a.log.Debug("delete orphaned mirror pod", "pod", mirrorKey(p), "err", err)
			continue
		}
		m.a.log.Info("deleted mirror pod of no static pod", "pod", mirrorKey(p))
	}
}
