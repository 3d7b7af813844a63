package nodelifecycle

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// syncPod deletes a pod whose node has a NoExecute taint it does not
// tolerate, or tolerates for a time that has run out; otherwise it looks
// again when that time comes.
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
	ev := EvictionFor(node.Spec.Taints, pod.Spec.Tolerations, func(t corev1.Taint) time.Time {
		return c.taintSince(node.Name, t)
	})
	now := c.cfg.Clock.Now()
	switch {
	case ev.Now:
	case ev.At.IsZero():
		return nil
	case now.Before(ev.At):
		c.evictQueue.AddAfter(key, ev.At.Sub(now))
		return nil
	}
	return c.evict(ctx, pod, node)
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
