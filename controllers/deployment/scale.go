package deployment

import (
	"slices"

	appsv1 "k8s.io/api/apps/v1"
)

// activeOrLatest returns the only active ReplicaSet, or the newest one when
// none is active, or nil when several are active.
func activeOrLatest(newRS *appsv1.ReplicaSet, oldRSs []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if newRS == nil && len(oldRSs) == 0 {
		return nil
	}
	all := activeRSs(append(slices.Clone(oldRSs), newRS))
	switch len(all) {
	case 0:
		if newRS != nil {
			return newRS
		}
		newest := slices.Clone(oldRSs)
		slices.SortFunc(newest, byCreation)
		return newest[len(newest)-1]
	case 1:
		return all[0]
	}
	return nil
}

// saturated reports whether rs alone runs the whole Deployment.
func saturated(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	if rs == nil {
		return false
	}
	desired, ok := intAnnotation(rs, DesiredReplicasAnnotation)
	want := replicas(d.Spec.Replicas)
	return ok && desired == want && replicas(rs.Spec.Replicas) == want && rs.Status.AvailableReplicas == want
}

// ProportionalSizes spreads a change of a rolling Deployment's size over
// its active ReplicaSets in proportion to their sizes, so a scale in the
// middle of a rollout keeps the rollout's balance (10 → 15 with 8 and 5
// gives 11 and 7 with maxSurge 3). Each ReplicaSet's share is its size
// times the new allowed total (replicas + maxSurge) over the total it was
// sized for (its max-replicas annotation), rounded; what rounding leaves
// over goes to the largest. Ties go to the newest when growing and the
// oldest when shrinking. It returns the new size by name and "up", "down"
// or "" for no change.
func ProportionalSizes(d *appsv1.Deployment, active []*appsv1.ReplicaSet) (map[string]int32, string) {
	rss := slices.Clone(active)
	allowed := int32(0)
	if replicas(d.Spec.Replicas) > 0 {
		allowed = replicas(d.Spec.Replicas) + MaxSurge(d)
	}
	toAdd := allowed - sumSpec(rss)
	op := ""
	switch {
	case toAdd > 0:
		op = "up"
		slices.SortStableFunc(rss, func(a, b *appsv1.ReplicaSet) int {
			if ra, rb := replicas(a.Spec.Replicas), replicas(b.Spec.Replicas); ra != rb {
				return int(rb - ra)
			}
			return -byCreation(a, b) // newer first
		})
	case toAdd < 0:
		op = "down"
		slices.SortStableFunc(rss, func(a, b *appsv1.ReplicaSet) int {
			if ra, rb := replicas(a.Spec.Replicas), replicas(b.Spec.Replicas); ra != rb {
				return int(rb - ra)
			}
			return byCreation(a, b) // older first
		})
	}
	sizes := make(map[string]int32, len(rss))
	var added int32
	for _, rs := range rss {
		cur := replicas(rs.Spec.Replicas)
		if toAdd == 0 {
			sizes[rs.Name] = cur
			continue
		}
		p := proportion(rs, d, toAdd, added)
		sizes[rs.Name] = cur + p
		added += p
	}
	if toAdd != 0 && len(rss) > 0 {
		first := rss[0].Name
		sizes[first] = max(sizes[first]+toAdd-added, 0)
	}
	return sizes, op
}

// proportion is rs's share of toAdd, bounded by what is left of it.
func proportion(rs *appsv1.ReplicaSet, d *appsv1.Deployment, toAdd, added int32) int32 {
	cur := replicas(rs.Spec.Replicas)
	if cur == 0 || toAdd == 0 || toAdd == added {
		return 0
	}
	var fraction int32
	if replicas(d.Spec.Replicas) == 0 {
		fraction = -cur
	} else {
		total := replicas(d.Spec.Replicas) + MaxSurge(d)
		sizedFor, ok := intAnnotation(rs, MaxReplicasAnnotation)
		if !ok || sizedFor == 0 {
			// Without the annotation the Deployment's current size is the
			// best guess; the bounds below keep the result within limits.
			sizedFor = d.Status.Replicas
		}
		if sizedFor == 0 {
			return 0
		}
		fraction = roundToInt32(float64(cur)*float64(total)/float64(sizedFor)) - cur
	}
	left := toAdd - added
	if toAdd > 0 {
		return min(fraction, left)
	}
	return max(fraction, left)
}

// newRSReplicas is the size the new ReplicaSet may grow to now: all of
// spec.replicas for Recreate; for a rolling update, up to the surge limit
// over every ReplicaSet's size.
func newRSReplicas(d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) int32 {
	want := replicas(d.Spec.Replicas)
	if !isRolling(d) {
		return want
	}
	cur := replicas(newRS.Spec.Replicas)
	total := sumSpec(all)
	maxTotal := want + MaxSurge(d)
	if total >= maxTotal {
		return cur
	}
	return cur + min(maxTotal-total, want-cur)
}

// scaleDownBudget is how many old pods a rolling update may remove now
// without going below spec.replicas - maxUnavailable, counting the new
// ReplicaSet's unavailable pods as already lost.
func scaleDownBudget(d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) int32 {
	minAvailable := replicas(d.Spec.Replicas) - MaxUnavailable(d)
	newUnavailable := replicas(newRS.Spec.Replicas) - newRS.Status.AvailableReplicas
	return sumSpec(all) - minAvailable - newUnavailable
}
