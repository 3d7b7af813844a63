package deployment

import (
	"context"
	"fmt"
	"math"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func hasProgressDeadline(d *appsv1.Deployment) bool {
	return d.Spec.ProgressDeadlineSeconds != nil && *d.Spec.ProgressDeadlineSeconds != math.MaxInt32
}

func getCondition(st appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			return &st.Conditions[i]
		}
	}
	return nil
}

func progressingCondition(st appsv1.DeploymentStatus) *appsv1.DeploymentCondition {
	return getCondition(st, appsv1.DeploymentProgressing)
}

func newCondition(t appsv1.DeploymentConditionType, s corev1.ConditionStatus, reason, msg string, now time.Time) appsv1.DeploymentCondition {
	n := metav1.NewTime(now)
	return appsv1.DeploymentCondition{Type: t, Status: s, Reason: reason, Message: msg, LastUpdateTime: n, LastTransitionTime: n}
}

// setCondition sets a condition unless one with the same status and
// reason is there; a condition keeping its status keeps its transition
// time.
func setCondition(st *appsv1.DeploymentStatus, cond appsv1.DeploymentCondition) {
	cur := getCondition(*st, cond.Type)
	if cur != nil && cur.Status == cond.Status && cur.Reason == cond.Reason {
		return
	}
	if cur != nil && cur.Status == cond.Status {
		cond.LastTransitionTime = cur.LastTransitionTime
	}
	removeCondition(st, cond.Type)
	st.Conditions = append(st.Conditions, cond)
}

func removeCondition(st *appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) {
	out := st.Conditions[:0:0]
	for _, c := range st.Conditions {
		if c.Type != t {
			out = append(out, c)
		}
	}
	st.Conditions = out
}

// calculateStatus derives the Deployment's counts from its ReplicaSets and
// sets the Available condition.
func (c *Controller) calculateStatus(d *appsv1.Deployment, all []*appsv1.ReplicaSet) appsv1.DeploymentStatus {
	var newRS *appsv1.ReplicaSet
	if n := len(all); n > 0 {
		newRS = all[n-1] // callers pass old ones first, then the new one (maybe nil)
	}
	available := sumAvailable(all)
	st := appsv1.DeploymentStatus{
		ObservedGeneration:  d.Generation,
		Replicas:            sumStatus(all),
		UpdatedReplicas:     sumStatus([]*appsv1.ReplicaSet{newRS}),
		ReadyReplicas:       sumReady(all),
		AvailableReplicas:   available,
		UnavailableReplicas: max(sumSpec(all)-available, 0),
		CollisionCount:      d.Status.CollisionCount,
	}
	var terminating int32
	haveTerminating := false
	for _, rs := range all {
		if rs != nil && rs.Status.TerminatingReplicas != nil {
			haveTerminating = true
			terminating += *rs.Status.TerminatingReplicas
		}
	}
	if haveTerminating {
		st.TerminatingReplicas = &terminating
	}
	st.Conditions = append(st.Conditions, d.Status.Conditions...)
	now := c.now()
	if available >= replicas(d.Spec.Replicas)-MaxUnavailable(d) {
		setCondition(&st, newCondition(appsv1.DeploymentAvailable, corev1.ConditionTrue, ReasonMinimumAvailable, "Deployment has minimum availability.", now))
	} else {
		setCondition(&st, newCondition(appsv1.DeploymentAvailable, corev1.ConditionFalse, ReasonMinimumUnavailable, "Deployment does not have minimum availability.", now))
	}
	return st
}

// complete reports whether every replica is updated and available and the
// status reflects the current spec.
func complete(d *appsv1.Deployment, st appsv1.DeploymentStatus) bool {
	want := replicas(d.Spec.Replicas)
	return st.UpdatedReplicas == want && st.Replicas == want && st.AvailableReplicas == want && st.ObservedGeneration >= d.Generation
}

// progressing reports whether st shows progress over d's last status.
func progressing(d *appsv1.Deployment, st appsv1.DeploymentStatus) bool {
	old := d.Status
	return st.UpdatedReplicas > old.UpdatedReplicas ||
		st.Replicas-st.UpdatedReplicas < old.Replicas-old.UpdatedReplicas ||
		st.ReadyReplicas > old.ReadyReplicas ||
		st.AvailableReplicas > old.AvailableReplicas
}

// timedOut reports whether the rollout has made no progress for
// progressDeadlineSeconds since the Progressing condition last changed.
func timedOut(d *appsv1.Deployment, st appsv1.DeploymentStatus, now time.Time) bool {
	if !hasProgressDeadline(d) {
		return false
	}
	cond := progressingCondition(st)
	if cond == nil || cond.Reason == ReasonNewRSAvailable {
		return false
	}
	if cond.Reason == ReasonTimedOut {
		return true
	}
	deadline := cond.LastUpdateTime.Add(time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second)
	return deadline.Before(now)
}

// syncRolloutStatus writes the status of a rollout step, with the
// Progressing condition and any ReplicaFailure of the ReplicaSets.
func (c *Controller) syncRolloutStatus(ctx context.Context, d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) error {
	st := c.calculateStatus(d, all)
	now := c.now()
	if !hasProgressDeadline(d) {
		removeCondition(&st, appsv1.DeploymentProgressing)
	}
	cur := progressingCondition(d.Status)
	done := st.Replicas == st.UpdatedReplicas && cur != nil && cur.Reason == ReasonNewRSAvailable
	if hasProgressDeadline(d) && !done {
		subject := fmt.Sprintf("Deployment %q", d.Name)
		if newRS != nil {
			subject = fmt.Sprintf("ReplicaSet %q", newRS.Name)
		}
		switch {
		case complete(d, st):
			setCondition(&st, newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, ReasonNewRSAvailable, subject+" has successfully progressed.", now))
		case progressing(d, st):
			cond := newCondition(appsv1.DeploymentProgressing, corev1.ConditionTrue, ReasonRSUpdated, subject+" is progressing.", now)
			// Progress refreshes lastUpdateTime even with the same
			// reason: the deadline counts from the last progress.
			if cur != nil {
				if cur.Status == corev1.ConditionTrue {
					cond.LastTransitionTime = cur.LastTransitionTime
				}
				removeCondition(&st, appsv1.DeploymentProgressing)
			}
			setCondition(&st, cond)
		case timedOut(d, st, now):
			setCondition(&st, newCondition(appsv1.DeploymentProgressing, corev1.ConditionFalse, ReasonTimedOut, subject+" has timed out progressing.", now))
		}
	}
	if f := replicaFailure(all, newRS); f != nil {
		setCondition(&st, *f)
	} else {
		removeCondition(&st, appsv1.DeploymentReplicaFailure)
	}
	if apiequality.Semantic.DeepEqual(d.Status, st) {
		c.requeueStuck(d, st, now)
		return nil
	}
	d.Status = st
	return c.writeStatus(ctx, d)
}

// requeueStuck schedules a look at a rollout when its progress deadline
// would pass, since nothing else would wake the controller then.
func (c *Controller) requeueStuck(d *appsv1.Deployment, st appsv1.DeploymentStatus, now time.Time) {
	cur := progressingCondition(d.Status)
	if !hasProgressDeadline(d) || cur == nil || complete(d, st) || cur.Reason == ReasonTimedOut {
		return
	}
	key := d.Namespace + "/" + d.Name
	after := cur.LastUpdateTime.Add(time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second).Sub(now)
	if after < time.Second {
		c.queue.AddRateLimited(key)
		return
	}
	c.queue.AddAfter(key, after+time.Second)
}

// replicaFailure lifts a ReplicaFailure condition of the new ReplicaSet
// (or else of any) to the Deployment.
func replicaFailure(all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) *appsv1.DeploymentCondition {
	conv := func(rs *appsv1.ReplicaSet) *appsv1.DeploymentCondition {
		if rs == nil {
			return nil
		}
		for _, rc := range rs.Status.Conditions {
			if rc.Type == appsv1.ReplicaSetReplicaFailure {
				return &appsv1.DeploymentCondition{
					Type: appsv1.DeploymentReplicaFailure, Status: rc.Status, Reason: rc.Reason, Message: rc.Message,
					LastUpdateTime: rc.LastTransitionTime, LastTransitionTime: rc.LastTransitionTime,
				}
			}
		}
		return nil
	}
	if f := conv(newRS); f != nil {
		return f
	}
	for _, rs := range all {
		if rs != newRS {
			if f := conv(rs); f != nil {
				return f
			}
		}
	}
	return nil
}

// syncStatusOnly writes the counts without touching the rollout.
func (c *Controller) syncStatusOnly(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.newAndOld(ctx, d, rsList, false)
	if err != nil {
		return err
	}
	return c.syncCounts(ctx, d, append(old, newRS))
}

// syncCounts writes the status computed from all (old ReplicaSets, then
// the new one or nil) when it changed.
func (c *Controller) syncCounts(ctx context.Context, d *appsv1.Deployment, all []*appsv1.ReplicaSet) error {
	st := c.calculateStatus(d, all)
	if apiequality.Semantic.DeepEqual(d.Status, st) {
		return nil
	}
	d.Status = st
	return c.writeStatus(ctx, d)
}

// checkPaused keeps the Progressing condition in step with spec.paused
// (Unknown with DeploymentPaused or DeploymentResumed), unless the
// rollout already timed out.
func (c *Controller) checkPaused(ctx context.Context, d *appsv1.Deployment) error {
	if !hasProgressDeadline(d) {
		return nil
	}
	cur := progressingCondition(d.Status)
	if cur != nil && cur.Reason == ReasonTimedOut {
		return nil
	}
	paused := cur != nil && cur.Reason == ReasonPaused
	switch {
	case d.Spec.Paused && !paused:
		setCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionUnknown, ReasonPaused, "Deployment is paused", c.now()))
	case !d.Spec.Paused && paused:
		setCondition(&d.Status, newCondition(appsv1.DeploymentProgressing, corev1.ConditionUnknown, ReasonResumed, "Deployment is resumed", c.now()))
	default:
		return nil
	}
	return c.writeStatus(ctx, d)
}

// writeStatus writes d's status and annotations through /status (which,
// unlike a write to the Deployment, does not bump its generation) and
// refreshes d with what the hub stored.
func (c *Controller) writeStatus(ctx context.Context, d *appsv1.Deployment) error {
	updated, err := c.client.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update deployment status: %w", err)
	}
	*d = *updated
	return nil
}
