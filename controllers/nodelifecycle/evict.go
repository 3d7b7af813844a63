package nodelifecycle

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// syncPod deletes a pod whose node has a NoExecute taint it does not
// tolerate, or tolerates for a time that has run out; otherwise it looks
// again when that time comes. A pod whose disconnect policy keeps the
// original for reconciliation is marked Lost instead when its toleration
// of the unreachable taint runs out.
func (c *Controller) syncPod(ctx context.Context, key string) error {
	obj, ok, err := c.pods.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	pod := obj.(*corev1.Pod)
	if pod.DeletionTimestamp != nil || pod.Spec.NodeName == "" ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	node, err := c.nodes.Get(pod.Spec.NodeName)
	if err != nil {
		return nil // gone nodes' pods are the garbage collector's
	}
	since := func(t corev1.Taint) time.Time { return c.taintSince(node.Name, t) }
	var unreach, other []corev1.Taint
	for _, t := range node.Spec.Taints {
		switch {
		case t.Effect != corev1.TaintEffectNoExecute:
		case t.Key == TaintUnreachable:
			unreach = append(unreach, t)
		default:
			other = append(other, t)
		}
	}
	evict := EvictionFor(other, pod.Spec.Tolerations, since)
	lost := EvictionFor(unreach, pod.Spec.Tolerations, since)
	if len(unreach) == 0 {
		lost = c.policyEviction(node, pod)
	}
	if !takesLostPath(pod) {
		evict, lost = earliest(evict, lost), Eviction{}
	}
	now := c.cfg.Clock.Now()
	var wait time.Duration
	if d, due := lost.in(now); due {
		if !kit.IsPodLost(pod) {
			if err := c.markLost(ctx, pod, node); err != nil {
				return err
			}
		}
	} else {
		wait = d
	}
	d, due := evict.in(now)
	if due {
		return c.evict(ctx, pod, node)
	}
	if d > 0 && (wait == 0 || d < wait) {
		wait = d
	}
	if wait > 0 {
		c.evictQueue.AddAfter(key, wait)
	}
	return nil
}

// in returns whether the eviction is due at now, or else how long until
// it is (zero for never).
func (ev Eviction) in(now time.Time) (time.Duration, bool) {
	switch {
	case ev.Now:
		return 0, true
	case ev.At.IsZero():
		return 0, false
	case now.Before(ev.At):
		return ev.At.Sub(now), false
	}
	return 0, true
}

// earliest returns the eviction that comes first.
func earliest(a, b Eviction) Eviction {
	switch {
	case a.Now || b.At.IsZero():
		return a
	case b.Now || a.At.IsZero():
		return b
	case b.At.Before(a.At):
		return b
	}
	return a
}

// policyEviction is when a pod must leave a node whose pods leave by
// their disconnect policy without a NoExecute taint (a dark site): as if
// the node had the unreachable NoExecute taint since its unreachable
// NoSchedule taint, but only for pods whose toleration of it has
// tolerationSeconds. The others stay: the hub gives every pod such a
// toleration, so a pod without one asked for nothing.
func (c *Controller) policyEviction(node *corev1.Node, pod *corev1.Pod) Eviction {
	c.mu.Lock()
	on := c.policyEvict[node.Name]
	c.mu.Unlock()
	if !on {
		return Eviction{}
	}
	for _, t := range node.Spec.Taints {
		if t.Key != TaintUnreachable || t.Effect != corev1.TaintEffectNoSchedule {
			continue
		}
		virtual := []corev1.Taint{{Key: TaintUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: t.TimeAdded}}
		ev := EvictionFor(virtual, pod.Spec.Tolerations, func(corev1.Taint) time.Time { return c.taintSince(node.Name, t) })
		if ev.Now {
			return Eviction{}
		}
		return ev
	}
	return Eviction{}
}

// evict marks the pod as disrupted and deletes it.
func (c *Controller) evict(ctx context.Context, pod *corev1.Pod, node *corev1.Node) error {
	c.log.Info("evicting pod for a NoExecute taint", "pod", pod.Namespace+"/"+pod.Name, "node", node.Name)
	c.events.Eventf(pod, corev1.EventTypeNormal, eventReasonTaintEviction, "Marking for deletion Pod %s/%s", pod.Namespace, pod.Name)
	u := pod.DeepCopy()
	cond := corev1.PodCondition{
		Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: reasonDeletionByTaintMgr, Message: messageDeletionByTaintMgr,
		LastTransitionTime: metav1.NewTime(c.cfg.Clock.Now()),
	}
	replaced := false
	for i := range u.Status.Conditions {
		if u.Status.Conditions[i].Type == corev1.DisruptionTarget {
			u.Status.Conditions[i], replaced = cond, true
		}
	}
	if !replaced {
		u.Status.Conditions = append(u.Status.Conditions, cond)
	}
	// The condition is best effort: a conflict with the node's own status
	// write must not hold back the deletion.
	if _, err := c.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("add disruption condition: %w", err)
	}
	err := c.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod: %w", err)
	}
	return nil
}
