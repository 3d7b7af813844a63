package nodelifecycle

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// tolerates says whether a toleration matches a taint: same key (or an
// empty key with Exists, which matches every key), same effect (or none),
// and for Equal the same value.
func tolerates(tol *corev1.Toleration, taint *corev1.Taint) bool {
	if tol.Effect != "" && tol.Effect != taint.Effect {
		return false
	}
	if tol.Key != taint.Key && !(tol.Key == "" && tol.Operator == corev1.TolerationOpExists) {
		return false
	}
	switch tol.Operator {
	case corev1.TolerationOpExists:
		return true
	case "", corev1.TolerationOpEqual:
		return tol.Value == taint.Value
	}
	return false
}

// Eviction is when a pod must leave a node because of its NoExecute taints.
type Eviction struct {
	// Now says the pod does not tolerate some NoExecute taint: it is
	// deleted at once.
	Now bool
	// At, when not zero, is when the shortest tolerationSeconds of the
	// tolerations in use runs out. Zero (with Now false) means the pod
	// tolerates every taint for ever.
	At time.Time
}

// EvictionFor decides when a pod with tolerations must leave a node with
// taints. since returns when a taint was added. Tolerations without
// tolerationSeconds tolerate for ever; a negative tolerationSeconds counts
// as zero.
func EvictionFor(taints []corev1.Taint, tolerations []corev1.Toleration, since func(corev1.Taint) time.Time) Eviction {
	var at time.Time
	for i := range taints {
		taint := &taints[i]
		if taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		matched := false
		var secs *int64
		for j := range tolerations {
			tol := &tolerations[j]
			if !tolerates(tol, taint) {
				continue
			}
			matched = true
			if tol.TolerationSeconds == nil {
				continue
			}
			if secs == nil || *tol.TolerationSeconds < *secs {
				s := max(*tol.TolerationSeconds, 0)
				secs = &s
			}
		}
		if !matched {
			return Eviction{Now: true}
		}
		if secs == nil {
			continue
		}
		t := since(*taint).Add(time.Duration(*secs) * time.Second)
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return Eviction{At: at}
}
