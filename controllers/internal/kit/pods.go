package kit

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// PodReadyCondition returns the pod's Ready condition, or nil.
func PodReadyCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// IsPodReady reports whether the pod's Ready condition is True.
func IsPodReady(p *corev1.Pod) bool {
	c := PodReadyCondition(p)
	return c != nil && c.Status == corev1.ConditionTrue
}

// IsPodAvailable reports whether the pod has been ready for at least
// minReadySeconds at now. With minReadySeconds 0 a ready pod is available
// at once.
func IsPodAvailable(p *corev1.Pod, minReadySeconds int32, now time.Time) bool {
	c := PodReadyCondition(p)
	if c == nil || c.Status != corev1.ConditionTrue {
		return false
	}
	if minReadySeconds == 0 {
		return true
	}
	min := time.Duration(minReadySeconds) * time.Second
	return !c.LastTransitionTime.IsZero() && !c.LastTransitionTime.Add(min).After(now)
}

// AvailableIn returns how long until a ready pod becomes available, or 0
// when it already is or is not ready at all: the delay after which a
// controller should look at its owner again.
func AvailableIn(p *corev1.Pod, minReadySeconds int32, now time.Time) time.Duration {
	c := PodReadyCondition(p)
	if minReadySeconds == 0 || c == nil || c.Status != corev1.ConditionTrue || c.LastTransitionTime.IsZero() {
		return 0
	}
	d := c.LastTransitionTime.Add(time.Duration(minReadySeconds) * time.Second).Sub(now)
	return max(d, 0)
}

// IsPodActive reports whether the pod counts towards a controller's
// replicas: not finished and not being deleted.
func IsPodActive(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil
}

// PodConditionLost is the pod condition the node lifecycle controller sets
// on a pod whose node has been silent for the pod's lost-after while its
// disconnect policy keeps the original for reconciliation: the pod may
// still run, but its owner starts a replacement.
const PodConditionLost corev1.PodConditionType = "tether.io/Lost"

// IsPodLost reports whether the pod carries PodConditionLost=True.
func IsPodLost(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == PodConditionLost {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// IsPodTerminating reports whether the pod is being deleted but not yet
// finished.
func IsPodTerminating(p *corev1.Pod) bool {
	return p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// FilterActive returns the active pods of pods, in order.
func FilterActive(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if IsPodActive(p) {
			out = append(out, p)
		}
	}
	return out
}
