package scheduler

import (
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
)

// Built-in classes every cluster has, whether or not their objects exist.
var systemPriorities = map[string]int32{
	"system-cluster-critical": 2000000000,
	"system-node-critical":    2000001000,
}

// PriorityClasses resolves pod priorities from PriorityClass objects. The
// API server's admission normally copies a class's value into
// spec.priority, but the scheduler does not rely on it: a class named by
// the pod wins, then spec.priority, then the cluster's globalDefault
// class, then 0.
type PriorityClasses struct {
	byName map[string]*schedulingv1.PriorityClass
}

// NewPriorityClasses returns an empty set.
func NewPriorityClasses() *PriorityClasses {
	return &PriorityClasses{byName: map[string]*schedulingv1.PriorityClass{}}
}

// Set records a class.
func (c *PriorityClasses) Set(pc *schedulingv1.PriorityClass) { c.byName[pc.Name] = pc }

// Remove forgets a class.
func (c *PriorityClasses) Remove(name string) { delete(c.byName, name) }

// globalDefault returns the default class with the highest value, as
// admission picks when several claim to be the default.
func (c *PriorityClasses) globalDefault() *schedulingv1.PriorityClass {
	var best *schedulingv1.PriorityClass
	for _, pc := range c.byName {
		if pc.GlobalDefault && (best == nil || pc.Value > best.Value) {
			best = pc
		}
	}
	return best
}

// Resolve implements PriorityResolver.
func (c *PriorityClasses) Resolve(pod *corev1.Pod) (int32, bool) {
	never := func(pc *schedulingv1.PriorityClass) bool {
		if pod.Spec.PreemptionPolicy != nil {
			return *pod.Spec.PreemptionPolicy == corev1.PreemptNever
		}
		return pc != nil && pc.PreemptionPolicy != nil && *pc.PreemptionPolicy == corev1.PreemptNever
	}
	if name := pod.Spec.PriorityClassName; name != "" {
		if pc := c.byName[name]; pc != nil {
			return pc.Value, never(pc)
		}
		if v, ok := systemPriorities[name]; ok {
			return v, never(nil)
		}
	}
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority, never(nil)
	}
	if pod.Spec.PriorityClassName == "" {
		if pc := c.globalDefault(); pc != nil {
			return pc.Value, never(pc)
		}
	}
	return 0, never(nil)
}
