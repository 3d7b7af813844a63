package edge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/state"
)

// Pods with PersistentVolumeClaims. Before the runtime first sees such a
// pod, the agent checks its claims the way the kubelet's volume manager
// does: each must be Bound, and the agent must know the claim and the
// PersistentVolume bound to it (the reference manager watches both and
// keeps them in the local state, so that the pod starts offline too).
// Until then the pod stays in ContainerCreating, a FailedMount event says
// why, and a change of the claim or the volume wakes it.
//
// Local-path volumes (tether.io/local-path) are directories on the node.
// The agent records each one its pods use in the local state, before the
// runtime creates the directory. A recorded volume that no pod of the node
// uses is looked up on the hub from time to time: once the hub answers
// that it no longer exists, and the volume's reclaim policy was Delete,
// the runtime removes the directory (never anything outside its
// local-path root); with any other policy the data stays.

// mountEventInterval spaces out FailedMount events of a pod whose volumes
// keep failing the same way, as the kubelet's two-minute mount timeout
// does: the events of a pod share a rate limit.
const mountEventInterval = 2 * time.Minute

// keptLocalVolumes is the local state's kind of local-path volume records.
const keptLocalVolumes = "localvolumes"

// errVolumesNotReady says which volumes of a pod are not ready and why.
type errVolumesNotReady struct {
	volumes []string
	reasons []string
	// unknown is true when every reason is a claim or volume the agent
	// does not know yet: its watch just started.
	unknown bool
}

func (e *errVolumesNotReady) Error() string {
	v := strings.Join(e.volumes, " ")
	return fmt.Sprintf("unmounted volumes=[%s], unattached volumes=[%s], failed to process volumes=[%s]: %s", v, v, v, strings.Join(e.reasons, "; "))
}

func (e *errVolumesNotReady) Is(target error) bool { return target == ErrVolumeNotReady }

// checkVolumes resolves the pod's claims. It records the local-path
// volumes among them, and returns an error wrapping ErrVolumeNotReady
// when the pod must wait. A pod that runs already is not held back: its
// volumes were set up when it started.
func (m *podManager) checkVolumes(ctx context.Context, pod *corev1.Pod) error {
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return ClaimName(pod, &v) != "" }) {
		return nil
	}
	src := agentSources{a: m.a}
	started := true
	if _, err := m.a.cfg.Runtime.PodStatus(ctx, pod.UID); errors.Is(err, ErrPodNotFound) {
		started = false
	}
	nerr := &errVolumesNotReady{unknown: true}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if ClaimName(pod, v) == "" {
			continue
		}
		pvc, pv, err := ClaimedVolume(src, pod, v)
		if err == nil && pvc.DeletionTimestamp != nil && !started {
			err = fmt.Errorf("can't start pod because PVC %s/%s is being deleted", pvc.Namespace, pvc.Name)
		}
		if err != nil {
			nerr.volumes = append(nerr.volumes, v.Name)
			nerr.reasons = append(nerr.reasons, err.Error())
			nerr.unknown = nerr.unknown && errors.Is(err, ErrSourceNotReady)
			continue
		}
		if IsLocalPath(pv) {
			m.a.local.recordLocalVolume(pv)
		}
	}
	if len(nerr.volumes) == 0 || started {
		return nil
	}
	return nerr
}

// mountFailed reports a pod waiting for its volumes with a FailedMount
// event, at most every mountEventInterval for the same message.
func (m *podManager) mountFailed(w *podWorker, pod *corev1.Pod, err error) {
	if e, ok := err.(*errVolumesNotReady); ok && e.unknown {
		return // the watches are about to tell
	}
	msg := "Unable to attach or mount volumes: " + err.Error()
	w.mu.Lock()
	due := msg != w.mountMsg || time.Since(w.mountAt) >= mountEventInterval
	if due {
		w.mountMsg, w.mountAt = msg, time.Now()
	}
	w.mu.Unlock()
	if due {
		m.a.recordEvent(PodEvent{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Warning: true, Reason: "FailedMount", Message: msg})
	}
}

// localVolumes tracks the local-path volume records of the local state.
type localVolumes struct {
	mu       sync.Mutex
	recorded map[string]string // volume name → resourceVersion recorded
}

// recordLocalVolume writes pv's record to the local state when it is new
// or changed. It returns once the record is durable.
func (l *localState) recordLocalVolume(pv *corev1.PersistentVolume) {
	if l == nil {
		return
	}
	l.volumes.mu.Lock()
	defer l.volumes.mu.Unlock()
	if l.volumes.recorded == nil {
		_ = l.loadLocalVolumesLocked()
		if l.volumes.recorded == nil {
			l.volumes.recorded = map[string]string{}
		}
	}
	if rv, ok := l.volumes.recorded[pv.Name]; ok && rv == pv.ResourceVersion {
		return
	}
	rec := pv.DeepCopy()
	rec.ManagedFields = nil
	b, err := rec.Marshal()
	if err != nil {
		return
	}
	var ops []state.Op
	if rows, err := l.DB().List(keptLocalVolumes, "", pv.Name); err == nil {
		for _, r := range rows {
			if r.UID != string(pv.UID) {
				ops = append(ops, state.Op{Key: r.Key, Delete: true})
			}
		}
	}
	ops = append(ops, state.Op{Key: state.Key{Kind: keptLocalVolumes, Name: pv.Name, UID: string(pv.UID)}, Value: b})
	if err := l.DB().Commit(ops, nil); err != nil {
		l.log.Warn("record local-path volume", "volume", pv.Name, "err", err)
		return
	}
	l.volumes.recorded[pv.Name] = pv.ResourceVersion
}

// loadLocalVolumesLocked reads which volumes the local state records; on
// an error recorded stays nil. l.volumes.mu must be held.
func (l *localState) loadLocalVolumesLocked() error {
	rows, err := l.DB().List(keptLocalVolumes, "", "")
	if err != nil {
		return err
	}
	l.volumes.recorded = map[string]string{}
	for _, r := range rows {
		v := &corev1.PersistentVolume{}
		if v.Unmarshal(r.Value) == nil {
			l.volumes.recorded[r.Name] = v.ResourceVersion
		}
	}
	return nil
}

// hasLocalVolumes tells whether the local state records a local-path
// volume, reading it only the first time: the periodic pass over the
// records then costs nothing on a node without any (an idle agent would
// otherwise keep the SQLite code of that query resident).
func (l *localState) hasLocalVolumes() bool {
	l.volumes.mu.Lock()
	defer l.volumes.mu.Unlock()
	if l.volumes.recorded == nil && l.loadLocalVolumesLocked() != nil {
		return true // unknown: let the pass read the records
	}
	return len(l.volumes.recorded) > 0
}

// localVolumeRecords returns the recorded local-path volumes.
func (l *localState) localVolumeRecords() ([]*corev1.PersistentVolume, error) {
	rows, err := l.DB().List(keptLocalVolumes, "", "")
	if err != nil {
		return nil, err
	}
	var out []*corev1.PersistentVolume
	for _, r := range rows {
		v := &corev1.PersistentVolume{}
		if err := v.Unmarshal(r.Value); err != nil {
			l.log.Warn("skip unreadable local-path volume record", "volume", r.Name, "err", err)
			continue
		}
		out = append(out, v)
	}
	return out, nil
}

// forgetLocalVolume drops the record of a volume whose data is dealt with.
func (l *localState) forgetLocalVolume(pv *corev1.PersistentVolume) error {
	k := state.Key{Kind: keptLocalVolumes, Name: pv.Name, UID: string(pv.UID)}
	if err := l.DB().Commit([]state.Op{{Key: k, Delete: true}}, nil); err != nil {
		return err
	}
	l.volumes.mu.Lock()
	delete(l.volumes.recorded, pv.Name)
	l.volumes.mu.Unlock()
	return nil
}

// localVolumeLoop removes the data of deleted local-path volumes, every
// LocalVolumeCheckInterval and when the tunnel connects.
func (a *Agent) localVolumeLoop(ctx context.Context, rm LocalVolumeRemover) {
	// Read the records now, with the rest of the local state at start-up.
	a.local.hasLocalVolumes()
	t := time.NewTicker(a.cfg.LocalVolumeCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.local.Connected():
			// Let the watches catch up first.
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
		if err := a.collectLocalVolumes(ctx, rm); err != nil && ctx.Err() == nil {
			a.log.Debug("collect local-path volumes", "err", err)
		}
	}
}

// volumesInUse returns the volumes bound to the claims of the node's pods,
// and false when a claim is not known (nothing may be removed then).
func (a *Agent) volumesInUse() (map[string]bool, bool) {
	src := agentSources{a: a}
	used := map[string]bool{}
	for _, pod := range a.pods.pods() {
		for i := range pod.Spec.Volumes {
			name := ClaimName(pod, &pod.Spec.Volumes[i])
			if name == "" {
				continue
			}
			pvc, err := src.PersistentVolumeClaim(pod.Namespace, name)
			if err != nil {
				if errors.Is(err, ErrSourceNotFound) {
					continue
				}
				return nil, false
			}
			if pvc.Spec.VolumeName != "" {
				used[pvc.Spec.VolumeName] = true
			}
		}
	}
	return used, true
}

// collectLocalVolumes makes one pass over the recorded local-path volumes.
func (a *Agent) collectLocalVolumes(ctx context.Context, rm LocalVolumeRemover) error {
	if !a.local.hasLocalVolumes() {
		return nil
	}
	recs, err := a.local.localVolumeRecords()
	if err != nil || len(recs) == 0 {
		return err
	}
	used, ok := a.volumesInUse()
	if !ok {
		return errors.New("the claims of the node's pods are not all known yet")
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name })
	var errs []error
	for _, rec := range recs {
		if used[rec.Name] {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cur, err := a.client.PersistentVolumes().Get(cctx, rec.Name, metav1.GetOptions{})
		cancel()
		switch {
		case err == nil && cur.UID == rec.UID:
			// Still there: keep its newest reclaim policy.
			if cur.ResourceVersion != rec.ResourceVersion && IsLocalPath(cur) {
				a.local.recordLocalVolume(cur)
			}
			continue
		case err == nil, apierrors.IsNotFound(err):
			// Gone from the hub (or replaced by another volume of the
			// same name).
		default:
			errs = append(errs, fmt.Errorf("look up volume %s: %w", rec.Name, err))
			continue
		}
		if rec.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete {
			if err := rm.RemoveLocalVolume(rec); err != nil {
				errs = append(errs, fmt.Errorf("remove data of deleted volume %s: %w", rec.Name, err))
				continue
			}
			a.log.Info("removed the data of a deleted local-path volume", "volume", rec.Name, "path", rec.Spec.HostPath.Path)
		} else {
			a.log.Info("local-path volume deleted; its data stays (reclaim policy "+string(rec.Spec.PersistentVolumeReclaimPolicy)+")",
				"volume", rec.Name, "path", rec.Spec.HostPath.Path)
		}
		if err := a.local.forgetLocalVolume(rec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
