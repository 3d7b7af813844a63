// Package disruption keeps the status of every PodDisruptionBudget: how
// many of its pods are healthy, how many must stay healthy, how many pods
// its workloads want, and so how many may be disrupted now. The hub's
// pods/eviction subresource reads that status to allow or refuse an
// eviction; CanEvict holds the rule it applies, unhealthyPodEvictionPolicy
// included.
//
// minAvailable as a number needs only the matching pods. maxUnavailable,
// and minAvailable as a percentage, need the number of pods the pods'
// controllers want: the replicas of ReplicaSets (or of the Deployment that
// owns them) and StatefulSets, read from informers, and the /scale
// subresource of any other controller kind. Pods without a controller are
// then left out of the count, with a warning event.
package disruption

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DeletionTimeout is how long a pod the eviction API marked as disrupted is
// left out of the healthy count while waiting for its deletion, as
// upstream's.
const DeletionTimeout = 2 * time.Minute

// Counts are the numbers a budget's status is made of.
type Counts struct {
	Expected, DesiredHealthy, CurrentHealthy, DisruptionsAllowed int32
}

// Compute derives the budget's numbers. healthy is the number of its pods
// that are ready, not being deleted and not recently disrupted; matched
// the number of pods its selector matches; expected the number its
// controllers want (used only when the budget needs it).
func Compute(spec policyv1.PodDisruptionBudgetSpec, healthy, matched, expected int32) Counts {
	c := Counts{CurrentHealthy: healthy}
	switch {
	case spec.MaxUnavailable != nil:
		c.Expected = expected
		maxUnavail := scaled(*spec.MaxUnavailable, expected)
		c.DesiredHealthy = max(expected-maxUnavail, 0)
	case spec.MinAvailable != nil && spec.MinAvailable.Type == intstr.Int:
		c.Expected = matched
		c.DesiredHealthy = spec.MinAvailable.IntVal
	case spec.MinAvailable != nil:
		c.Expected = expected
		c.DesiredHealthy = scaled(*spec.MinAvailable, expected)
	default:
		c.Expected = matched
	}
	if allowed := c.CurrentHealthy - c.DesiredHealthy; c.Expected > 0 && allowed > 0 {
		c.DisruptionsAllowed = allowed
	}
	return c
}

// NeedsScale says whether a budget needs its controllers' scale.
func NeedsScale(spec policyv1.PodDisruptionBudgetSpec) bool {
	return spec.MaxUnavailable != nil || (spec.MinAvailable != nil && spec.MinAvailable.Type == intstr.String)
}

// scaled resolves an int or a percentage of total, rounding up, as
// upstream does for both minAvailable and maxUnavailable.
func scaled(v intstr.IntOrString, total int32) int32 {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, int(total), true)
	if err != nil {
		return 0
	}
	return int32(n)
}

// isHealthy says whether a pod counts as healthy for a budget.
func isHealthy(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Verdict is the eviction API's answer for one pod under one budget.
type Verdict struct {
	Allowed bool
	// Consume says the eviction uses one of the budget's allowed
	// disruptions (and records the pod in disruptedPods).
	Consume bool
	Reason  string
}

// CanEvict applies a budget to the eviction of one of its pods. A pod that
// ended is always evictable. A ready pod needs an allowed disruption. A
// pod not ready is evictable without using one when the policy is
// AlwaysAllow, or under the default IfHealthyBudget when the budget is
// met (currentHealthy ≥ desiredHealthy).
func CanEvict(pdb *policyv1.PodDisruptionBudget, pod *corev1.Pod) Verdict {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return Verdict{Allowed: true}
	}
	if pdb.Status.ObservedGeneration < pdb.Generation {
		return Verdict{Reason: "the disruption budget is still being processed by the server"}
	}
	if !isHealthy(pod) {
		policy := policyv1.IfHealthyBudget
		if pdb.Spec.UnhealthyPodEvictionPolicy != nil {
			policy = *pdb.Spec.UnhealthyPodEvictionPolicy
		}
		if policy == policyv1.AlwaysAllow || pdb.Status.CurrentHealthy >= pdb.Status.DesiredHealthy {
			return Verdict{Allowed: true}
		}
	}
	if pdb.Status.DisruptionsAllowed > 0 {
		return Verdict{Allowed: true, Consume: true}
	}
	return Verdict{Reason: "Cannot evict pod as it would violate the pod's disruption budget."}
}
