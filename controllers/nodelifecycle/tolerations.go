package nodelifecycle

import (
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
)

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
			if !tol.ToleratesTaint(logr.Discard(), taint, false) {
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
