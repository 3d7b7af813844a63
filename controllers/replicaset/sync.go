package replicaset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// sync converges one ReplicaSet.
func (c *Controller) sync(ctx context.Context, key string) error {
	cached, ok := c.owners.cached(key)
	if !ok {
		c.exp.Forget(key)
		c.statusMu.Lock()
		delete(c.statusWritten, key)
		c.statusMu.Unlock()
		return nil
	}
	rs := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	if err != nil {
		return nil // invalid selectors are refused by the hub; nothing to do
	}
	needsSync := c.exp.Satisfied(key) && rs.DeletionTimestamp == nil

	pods, err := c.claimPods(ctx, rs, sel)
	if err != nil {
		return err
	}
	active := notLost(kit.FilterActive(pods))

	var manageErr error
	if needsSync {
		manageErr = c.manage(ctx, key, rs, active)
	}
	now := c.now()
	status := computeStatus(rs, pods, active, manageErr, now)
	if c.owners.trimStatus != nil {
		c.owners.trimStatus(&status)
	}
	if wait := c.statusDue(key, rs, status, now); wait > 0 {
		c.queue.AddAfter(key, wait)
	} else if err := c.updateStatus(ctx, rs, status); err != nil {
		return errors.Join(manageErr, err)
	}
	// Come back when ready pods become available.
	if manageErr == nil && rs.Spec.MinReadySeconds > 0 && status.ReadyReplicas != status.AvailableReplicas {
		var next time.Duration
		for _, p := range active {
			if d := kit.AvailableIn(p, rs.Spec.MinReadySeconds, now); d > 0 && (next == 0 || d < next) {
				next = d
			}
		}
		if next > 0 {
			c.queue.AddAfter(key, next+100*time.Millisecond)
		}
	}
	return manageErr
}

// notLost leaves out the pods marked Lost: their node has been silent for
// their disconnect policy's lost-after, so they count as gone (a
// replacement is started) yet are never picked for deletion; the node
// lifecycle controller settles which pod stays when the node is heard
// again.
func notLost(pods []*corev1.Pod) []*corev1.Pod {
	out := pods[:0:0]
	for _, p := range pods {
		if !kit.IsPodLost(p) {
			out = append(out, p)
		}
	}
	return out
}

// claimPods returns the pods rs controls after adoption and release.
func (c *Controller) claimPods(ctx context.Context, rs *appsv1.ReplicaSet, sel labels.Selector) ([]*corev1.Pod, error) {
	cands := kit.ByIndex[*corev1.Pod](c.podIndex, string(rs.UID))
	cands = append(cands, kit.ByIndex[*corev1.Pod](c.podIndex, kit.OrphanIndexKey(rs.Namespace))...)
	claimer := &kit.Claimer{
		Owner: rs, OwnerGVK: c.owners.gvk, Selector: sel,
		Fresh: func(ctx context.Context) (metav1.Object, error) {
			return c.owners.get(ctx, rs.Namespace, rs.Name)
		},
	}
	pods, err := kit.Claim(ctx, claimer, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.client.CoreV1().Pods(rs.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim pods: %w", err)
	}
	return pods, nil
}

// manage creates or deletes pods so that active has spec.replicas pods.
func (c *Controller) manage(ctx context.Context, key string, rs *appsv1.ReplicaSet, active []*corev1.Pod) error {
	want := int(ptrOr(rs.Spec.Replicas, 1))
	diff := len(active) - want
	switch {
	case diff < 0:
		n := min(-diff, c.burst)
		c.exp.ExpectCreations(key, n)
		c.log.Debug("creating pods", "owner", key, "need", want, "have", len(active), "creating", n)
		created, err := SlowStart(n, c.firstBatch(key), func() error {
			pod := kit.PodFromTemplate(&rs.Spec.Template, rs, c.owners.gvk)
			_, err := c.control.CreatePod(ctx, rs, pod)
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil // the namespace is going away: not an error
			}
			return err
		})
		// Creates that failed or were skipped will never be observed.
		for range n - created {
			c.exp.CreationObserved(key)
		}
		c.noteBatch(key, n, err == nil)
		return err
	case diff > 0:
		n := min(diff, c.burst)
		victims := PodsToDelete(active, c.relatedPods(rs), n, c.now())
		uids := make([]types.UID, len(victims))
		for i, p := range victims {
			uids[i] = p.UID
		}
		c.exp.ExpectDeletions(key, uids)
		c.log.Debug("deleting pods", "owner", key, "need", want, "have", len(active), "deleting", n)
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		sem := make(chan struct{}, 50) // bound concurrent deletes
		for _, p := range victims {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if err := c.control.DeletePod(ctx, rs, p); err != nil {
					c.exp.DeletionObserved(key, p.UID)
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	return nil
}

// firstBatch is the size of the first batch of creates for the
// ReplicaSet key: 1, unless its previous sync, less than batchCarryOver
// ago, created all of BurstReplicas pods without a failure, in which case
// the slow start goes on where it ended. A ReplicaSet scaled up by
// thousands needs several syncs of BurstReplicas pods; restarting each
// from one pod would wait out a dozen round trips per sync. A sync with a
// failure, or one that finished the scale-up, makes the next start from
// one again.
func (c *Controller) firstBatch(key string) int {
	c.batchMu.Lock()
	defer c.batchMu.Unlock()
	b, ok := c.batches[key]
	if !ok || c.now().Sub(b.at) > batchCarryOver {
		return 1
	}
	return b.size
}

// noteBatch records the outcome of a sync that tried to create n pods.
func (c *Controller) noteBatch(key string, n int, ok bool) {
	c.batchMu.Lock()
	defer c.batchMu.Unlock()
	if !ok || n < c.burst {
		delete(c.batches, key)
		return
	}
	c.batches[key] = carriedBatch{size: c.burst, at: c.now()}
}

// relatedPods returns the active pods of rs and of every other ReplicaSet
// with the same controller (a Deployment's old and new ReplicaSets), which
// scale-down spreads across nodes.
func (c *Controller) relatedPods(rs *appsv1.ReplicaSet) []*corev1.Pod {
	owners := []types.UID{rs.UID}
	if ref := metav1.GetControllerOfNoCopy(rs); ref != nil {
		for _, sib := range c.owners.controlledBy(string(ref.UID)) {
			if sib.UID != rs.UID {
				owners = append(owners, sib.UID)
			}
		}
	}
	var pods []*corev1.Pod
	for _, uid := range owners {
		pods = append(pods, kit.ByIndex[*corev1.Pod](c.podIndex, string(uid))...)
	}
	return pods
}

// SlowStart calls fn count times, in batches of initial, 2·initial, 4·…
// run in parallel, stopping after the first batch with an error. It
// returns how many calls succeeded and the errors of the failed batch.
// A template that cannot be created thus costs a handful of failed calls.
func SlowStart(count, initial int, fn func() error) (int, error) {
	done := 0
	for batch := min(count, initial); batch > 0; batch = min(2*batch, count-done) {
		errs := make(chan error, batch)
		var wg sync.WaitGroup
		for range batch {
			wg.Go(func() {
				if err := fn(); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		var failed []error
		for err := range errs {
			failed = append(failed, err)
		}
		done += batch - len(failed)
		if len(failed) > 0 {
			return done, errors.Join(failed...)
		}
	}
	return done, nil
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// statusDue returns how long to hold back a status that differs from the
// stored one only in its counts, while they have not reached the settled
// state (every replica created, ready and available), so such statuses are
// written at most once per countsInterval; zero means write it now. The
// held-back status is written when the key comes back.
func (c *Controller) statusDue(key string, rs *appsv1.ReplicaSet, status appsv1.ReplicaSetStatus, now time.Time) time.Duration {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	want := ptrOr(rs.Spec.Replicas, 1)
	settled := status.Replicas == want && status.ReadyReplicas == want && status.AvailableReplicas == want
	countsOnly := status.ObservedGeneration == rs.Status.ObservedGeneration &&
		apiequality.Semantic.DeepEqual(status.Conditions, rs.Status.Conditions)
	if !settled && countsOnly {
		if wait := c.statusWritten[key].Add(countsInterval).Sub(now); wait > 0 {
			return wait
		}
	}
	if !apiequality.Semantic.DeepEqual(rs.Status, status) {
		c.statusWritten[key] = now
	}
	return 0
}
