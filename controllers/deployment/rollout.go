package deployment

import (
	"context"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// rolloutRolling takes one step of a rolling update: grow the new
// ReplicaSet within maxSurge, else shrink old ones within maxUnavailable
// (unhealthy pods first), and trim history once complete.
func (c *Controller) rolloutRolling(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.newAndOld(ctx, d, rsList, true)
	if err != nil {
		return err
	}
	all := append(slices.Clone(old), newRS)

	scaledUp, err := c.reconcileNewRS(ctx, d, all, newRS)
	if err != nil {
		return err
	}
	if scaledUp {
		return c.syncRolloutStatus(ctx, d, all, newRS)
	}
	scaledDown, err := c.reconcileOldRSs(ctx, d, all, activeRSs(old), newRS)
	if err != nil {
		return err
	}
	if scaledDown {
		return c.syncRolloutStatus(ctx, d, all, newRS)
	}
	if complete(d, c.calculateStatus(d, all)) {
		if err := c.cleanup(ctx, d, old); err != nil {
			return err
		}
	}
	return c.syncRolloutStatus(ctx, d, all, newRS)
}

func (c *Controller) reconcileNewRS(ctx context.Context, d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) (bool, error) {
	want := replicas(d.Spec.Replicas)
	cur := replicas(newRS.Spec.Replicas)
	switch {
	case cur == want:
		return false, nil
	case cur > want:
		return c.scaleRS(ctx, newRS, want, d)
	}
	return c.scaleRS(ctx, newRS, newRSReplicas(d, all, newRS), d)
}

// reconcileOldRSs shrinks old ReplicaSets as far as maxUnavailable allows.
func (c *Controller) reconcileOldRSs(ctx context.Context, d *appsv1.Deployment, all, old []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) (bool, error) {
	if sumSpec(old) == 0 {
		return false, nil
	}
	budget := scaleDownBudget(d, all, newRS)
	if budget <= 0 {
		return false, nil
	}
	// Unhealthy old pods go first, whatever the availability: they are
	// not serving, and waiting for them would stall the rollout.
	slices.SortFunc(old, byCreation)
	var cleaned int32
	for _, rs := range old {
		if cleaned >= budget {
			break
		}
		cur := replicas(rs.Spec.Replicas)
		if cur == 0 || cur == rs.Status.AvailableReplicas {
			continue
		}
		n := min(budget-cleaned, cur-rs.Status.AvailableReplicas)
		if _, err := c.scaleRS(ctx, rs, cur-n, d); err != nil {
			return false, err
		}
		cleaned += n
	}
	// Then available ones, down to spec.replicas - maxUnavailable.
	all = append(slices.Clone(old), newRS)
	minAvailable := replicas(d.Spec.Replicas) - MaxUnavailable(d)
	available := sumAvailable(all)
	var scaled int32
	if available > minAvailable {
		total := available - minAvailable
		for _, rs := range old {
			if scaled >= total {
				break
			}
			cur := replicas(rs.Spec.Replicas)
			if cur == 0 {
				continue
			}
			n := min(cur, total-scaled)
			if _, err := c.scaleRS(ctx, rs, cur-n, d); err != nil {
				return false, err
			}
			scaled += n
		}
	}
	return cleaned+scaled > 0, nil
}

// rolloutRecreate scales every old ReplicaSet to zero, waits until their
// pods are gone, then creates and grows the new one.
func (c *Controller) rolloutRecreate(ctx context.Context, d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) error {
	newRS, old, err := c.newAndOld(ctx, d, rsList, false)
	if err != nil {
		return err
	}
	all := append(slices.Clone(old), newRS)
	scaledDown := false
	for _, rs := range activeRSs(old) {
		changed, err := c.scaleRS(ctx, rs, 0, d)
		if err != nil {
			return err
		}
		scaledDown = scaledDown || changed
	}
	if scaledDown || c.oldPodsRunning(newRS, old) {
		return c.syncRolloutStatus(ctx, d, all, newRS)
	}
	if newRS == nil {
		newRS, old, err = c.newAndOld(ctx, d, rsList, true)
		if err != nil {
			return err
		}
		all = append(slices.Clone(old), newRS)
	}
	if replicas(newRS.Spec.Replicas) != replicas(d.Spec.Replicas) {
		if _, err := c.scaleRS(ctx, newRS, replicas(d.Spec.Replicas), d); err != nil {
			return err
		}
	}
	if complete(d, c.calculateStatus(d, all)) {
		if err := c.cleanup(ctx, d, old); err != nil {
			return err
		}
	}
	return c.syncRolloutStatus(ctx, d, all, newRS)
}

// oldPodsRunning reports whether any pod of an old ReplicaSet still exists
// and has not finished, including pods being deleted.
func (c *Controller) oldPodsRunning(newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) bool {
	if sumStatus(old) > 0 {
		return true
	}
	for _, rs := range old {
		if newRS != nil && rs.UID == newRS.UID {
			continue
		}
		for _, p := range kit.ByIndex[*corev1.Pod](c.podIndex, string(rs.UID)) {
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				return true
			}
		}
	}
	return false
}
