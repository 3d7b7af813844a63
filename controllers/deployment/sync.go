package deployment

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// sync converges one Deployment.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name := kit.SplitKey(key)
	cached, err := c.dLister.Deployments(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read deployment: %w", err)
	}
	d := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() {
		c.recorder.Eventf(d, corev1.EventTypeWarning, "SelectingAll", "This deployment is selecting all pods. A non-empty selector is required.")
		if d.Status.ObservedGeneration < d.Generation {
			d.Status.ObservedGeneration = d.Generation
			return c.writeStatus(ctx, d)
		}
		return nil
	}
	rsList, err := c.claimReplicaSets(ctx, d, sel)
	if err != nil {
		return err
	}
	if d.DeletionTimestamp != nil {
		return c.syncStatusOnly(ctx, d, rsList)
	}
	if err := c.checkPaused(ctx, d); err != nil {
		return err
	}
	if d.Spec.Paused {
		return c.syncScaleOnly(ctx, d, rsList)
	}
	scaling, err := c.isScalingEvent(ctx, d, rsList)
	if err != nil {
		return err
	}
	if scaling {
		return c.syncScaleOnly(ctx, d, rsList)
	}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return c.rolloutRecreate(ctx, d, rsList)
	}
	return c.rolloutRolling(ctx, d, rsList)
}

// claimReplicaSets returns the ReplicaSets d controls, adopting and
// releasing by its selector.
func (c *Controller) claimReplicaSets(ctx context.Context, d *appsv1.Deployment, sel labels.Selector) ([]*appsv1.ReplicaSet, error) {
	cands := kit.ByIndex[*appsv1.ReplicaSet](c.rsIndex, string(d.UID))
	cands = append(cands, kit.ByIndex[*appsv1.ReplicaSet](c.rsIndex, kit.OrphanIndexKey(d.Namespace))...)
	claimer := &kit.Claimer{
		Owner: d, OwnerGVK: controllerKind, Selector: sel,
		Fresh: func(ctx context.Context) (metav1.Object, error) {
			return c.client.AppsV1().Deployments(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
		},
	}
	rss, err := kit.Claim(ctx, claimer, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.client.AppsV1().ReplicaSets(d.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim replicasets: %w", err)
	}
	// Work on copies: the sync changes sizes and annotations in place.
	out := make([]*appsv1.ReplicaSet, len(rss))
	for i, rs := range rss {
		out[i] = rs.DeepCopy()
	}
	return out, nil
}

// newAndOld splits rsList into the new ReplicaSet (nil if none yet) and
// the old ones, and brings the new one's revision up to date. With create
// set, it creates the new ReplicaSet when missing.
func (c *Controller) newAndOld(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet, create bool) (*appsv1.ReplicaSet, []*appsv1.ReplicaSet, error) {
	existing := findNewRS(d, rsList)
	var old []*appsv1.ReplicaSet
	for _, rs := range rsList {
		if existing == nil || rs.UID != existing.UID {
			old = append(old, rs)
		}
	}
	newRevision := maxRevision(old) + 1

	if existing != nil {
		changed := setNewRSAnnotations(d, existing, newRevision, true)
		if existing.Spec.MinReadySeconds != d.Spec.MinReadySeconds {
			existing.Spec.MinReadySeconds = d.Spec.MinReadySeconds
			changed = true
		}
		if changed {
			updated, err := c.client.AppsV1().ReplicaSets(existing.Namespace).Update(ctx, existing, metav1.UpdateOptions{})
			if err != nil {
				return nil, nil, fmt.Errorf("update new replicaset revision: %w", err)
			}
			*existing = *updated // rsList holds this pointer: keep it current
		}
		needStatus := setDeploymentRevision(d, existing.Annotations[RevisionAnnotation])
		if hasProgressDeadline(d) && progressingCondition(d.Status) == nil {
			setCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, ReasonFoundNewRS,
				fmt.Sprintf("Found new replica set %q", existing.Name), c.now()))
			needStatus = true
		}
		if needStatus {
			if err := c.writeStatus(ctx, d); err != nil {
				return nil, nil, err
			}
		}
		return existing, old, nil
	}
	if !create {
		return nil, old, nil
	}

	hash := kit.TemplateHash(&d.Spec.Template, d.Status.CollisionCount)
	tmpl := d.Spec.Template.DeepCopy()
	tmpl.Labels = labelsWith(tmpl.Labels, appsv1.DefaultDeploymentUniqueLabelKey, hash)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name:            d.Name + "-" + hash,
			Namespace:       d.Namespace,
			OwnerReferences: []metav1.OwnerReference{kit.ControllerRef(d, controllerKind)},
			Labels:          tmpl.Labels,
		},
		Spec: appsv1.ReplicaSetSpec{
			Replicas:        ptr.To[int32](0),
			MinReadySeconds: d.Spec.MinReadySeconds,
			Selector:        selectorWith(d.Spec.Selector, appsv1.DefaultDeploymentUniqueLabelKey, hash),
			Template:        *tmpl,
		},
	}
	size := newRSReplicas(d, append(slices.Clone(old), rs), rs)
	rs.Spec.Replicas = ptr.To(size)
	setNewRSAnnotations(d, rs, newRevision, false)

	created, err := c.client.AppsV1().ReplicaSets(d.Namespace).Create(ctx, rs, metav1.CreateOptions{})
	alreadyExisted := false
	switch {
	case apierrors.IsAlreadyExists(err):
		alreadyExisted = true
		got, gerr := c.client.AppsV1().ReplicaSets(d.Namespace).Get(ctx, rs.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, nil, fmt.Errorf("read existing replicaset: %w", gerr)
		}
		if metav1.IsControlledBy(got, d) && equalIgnoreHash(&got.Spec.Template, &d.Spec.Template) {
			// Ours, made by an earlier sync our cache does not show yet.
			created = got
			break
		}
		// A hash collision: another template hashes the same. Salt the
		// hash with a bumped collision count and try again.
		d.Status.CollisionCount = ptr.To(ptr.Deref(d.Status.CollisionCount, 0) + 1)
		if werr := c.writeStatus(ctx, d); werr != nil {
			return nil, nil, werr
		}
		c.log.Debug("replicaset name collision", "deployment", d.Name, "collision_count", *d.Status.CollisionCount)
		return nil, nil, fmt.Errorf("create replicaset %s: hash collision", rs.Name)
	case err != nil:
		msg := fmt.Sprintf("Failed to create new replica set %q: %v", rs.Name, err)
		if hasProgressDeadline(d) {
			setCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionFalse, ReasonFailedRSCreate, msg, c.now()))
			_ = c.writeStatus(ctx, d) // the create error is the one to retry on
		}
		c.recorder.Eventf(d, corev1.EventTypeWarning, "FailedCreate", "%s", msg)
		return nil, nil, fmt.Errorf("create replicaset: %w", err)
	}
	if !alreadyExisted && size > 0 {
		c.recorder.Eventf(d, corev1.EventTypeNormal, "ScalingReplicaSet", "Scaled up replica set %s from 0 to %d", created.Name, size)
	}
	needStatus := setDeploymentRevision(d, strconv.FormatInt(newRevision, 10))
	if !alreadyExisted && hasProgressDeadline(d) {
		setCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, ReasonNewRSCreated,
			fmt.Sprintf("Created new replica set %q", created.Name), c.now()))
		needStatus = true
	}
	if needStatus {
		if err := c.writeStatus(ctx, d); err != nil {
			return nil, nil, err
		}
	}
	return created.DeepCopy(), old, nil
}

func setDeploymentRevision(d *appsv1.Deployment, rev string) bool {
	if d.Annotations[RevisionAnnotation] == rev {
		return false
	}
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	d.Annotations[RevisionAnnotation] = rev
	return true
}

// isScalingEvent reports whether spec.replicas changed since the
// ReplicaSets were sized (their desired-replicas annotation), which is
// handled by scaling alone, without progressing the rollout.
func (c *Controller) isScalingEvent(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) (bool, error) {
	newRS, old, err := c.newAndOld(ctx, d, rsList, false)
	if err != nil {
		return false, err
	}
	for _, rs := range activeRSs(append(old, newRS)) {
		desired, ok := intAnnotation(rs, DesiredReplicasAnnotation)
		if ok && desired != replicas(d.Spec.Replicas) {
			return true, nil
		}
	}
	return false, nil
}

// syncScaleOnly scales the ReplicaSets to a new Deployment size (and, for
// a paused Deployment, trims history) without progressing a rollout.
func (c *Controller) syncScaleOnly(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.newAndOld(ctx, d, rsList, false)
	if err != nil {
		return err
	}
	if err := c.scale(ctx, d, newRS, old); err != nil {
		return err
	}
	if d.Spec.Paused {
		if err := c.cleanup(ctx, d, old); err != nil {
			return err
		}
	}
	return c.syncCounts(ctx, d, append(old, newRS))
}

// scale resizes the ReplicaSets to the Deployment's size.
func (c *Controller) scale(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) error {
	if rs := activeOrLatest(newRS, old); rs != nil {
		if replicas(rs.Spec.Replicas) == replicas(d.Spec.Replicas) {
			return nil
		}
		_, err := c.scaleRS(ctx, rs, replicas(d.Spec.Replicas), d)
		return err
	}
	if saturated(d, newRS) {
		for _, rs := range activeRSs(old) {
			if _, err := c.scaleRS(ctx, rs, 0, d); err != nil {
				return err
			}
		}
		return nil
	}
	if !isRolling(d) {
		return nil
	}
	active := activeRSs(append(slices.Clone(old), newRS))
	sizes, op := ProportionalSizes(d, active)
	for _, rs := range active {
		if _, err := c.scaleRSOp(ctx, rs, sizes[rs.Name], d, op); err != nil {
			return err
		}
	}
	return nil
}

// scaleRS sets rs's size (and replica annotations), recording a
// ScalingReplicaSet event when the size changes. It reports whether it
// changed the size; rs is updated in place to what the hub stored.
func (c *Controller) scaleRS(ctx context.Context, rs *appsv1.ReplicaSet, size int32, d *appsv1.Deployment) (bool, error) {
	op := "down"
	if replicas(rs.Spec.Replicas) < size {
		op = "up"
	}
	return c.scaleRSOp(ctx, rs, size, d, op)
}

func (c *Controller) scaleRSOp(ctx context.Context, rs *appsv1.ReplicaSet, size int32, d *appsv1.Deployment, op string) (bool, error) {
	from := replicas(rs.Spec.Replicas)
	sizeChanged := from != size
	cp := rs.DeepCopy()
	annChanged := setReplicasAnnotations(cp, replicas(d.Spec.Replicas), replicas(d.Spec.Replicas)+MaxSurge(d))
	if !sizeChanged && !annChanged {
		return false, nil
	}
	cp.Spec.Replicas = ptr.To(size)
	updated, err := c.client.AppsV1().ReplicaSets(rs.Namespace).Update(ctx, cp, metav1.UpdateOptions{})
	if err != nil {
		return false, fmt.Errorf("scale replicaset %s: %w", rs.Name, err)
	}
	*rs = *updated
	if sizeChanged {
		c.recorder.Eventf(d, corev1.EventTypeNormal, "ScalingReplicaSet", "Scaled %s replica set %s from %d to %d", op, rs.Name, from, size)
	}
	return sizeChanged, nil
}

// cleanup deletes the oldest old ReplicaSets beyond revisionHistoryLimit,
// skipping any that still have pods or whose status is behind.
func (c *Controller) cleanup(ctx context.Context, d *appsv1.Deployment, old []*appsv1.ReplicaSet) error {
	if d.Spec.RevisionHistoryLimit == nil {
		return nil
	}
	var alive []*appsv1.ReplicaSet
	for _, rs := range old {
		if rs != nil && rs.DeletionTimestamp == nil {
			alive = append(alive, rs)
		}
	}
	diff := len(alive) - int(*d.Spec.RevisionHistoryLimit)
	if diff <= 0 {
		return nil
	}
	slices.SortStableFunc(alive, func(a, b *appsv1.ReplicaSet) int {
		if ra, rb := revisionOf(a), revisionOf(b); ra != rb {
			return int(ra - rb)
		}
		return byCreation(a, b)
	})
	var errs []error
	for _, rs := range alive[:diff] {
		if rs.Status.Replicas != 0 || replicas(rs.Spec.Replicas) != 0 || rs.Generation > rs.Status.ObservedGeneration {
			continue
		}
		c.log.Debug("deleting old replicaset", "deployment", d.Name, "replicaset", rs.Name)
		err := c.client.AppsV1().ReplicaSets(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &rs.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("delete old replicaset %s: %w", rs.Name, err))
		}
	}
	return errors.Join(errs...)
}
