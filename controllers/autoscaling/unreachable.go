package autoscaling

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// unreachable reports whether any live pod selector matches runs on a
// node the hub cannot reach, and the message saying so. Pods being
// deleted (evicted from a dead node, say) do not hold the scale: the
// algorithm ignores them anyway, and they may never go while their node
// is away.
func (c *Controller) unreachable(namespace string, selector labels.Selector, current int32) (bool, string) {
	pods, err := c.pods.Pods(namespace).List(selector)
	if err != nil {
		return false, ""
	}
	reachable := map[string]bool{}
	n, live := 0, 0
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		live++
		if p.Spec.NodeName == "" {
			continue
		}
		ok, seen := reachable[p.Spec.NodeName]
		if !seen {
			ok = c.nodeReachable(p.Spec.NodeName)
			reachable[p.Spec.NodeName] = ok
		}
		if !ok {
			n++
		}
	}
	if n == 0 {
		return false, ""
	}
	return true, fmt.Sprintf("%d of %d pods of the target are on nodes the hub cannot reach; holding the scale at %d replicas until they are reachable again", n, live, current)
}

// nodeReachable is false for a node whose Ready condition is not True or
// that carries the node.kubernetes.io/unreachable taint. A node the hub
// does not know is left to the pod garbage collector, not counted here.
func (c *Controller) nodeReachable(name string) bool {
	node, err := c.nodes.Get(name)
	if err != nil {
		return true
	}
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
