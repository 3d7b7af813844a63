package nodelifecycle

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TaintUnschedulable is the taint a cordoned node (spec.unschedulable)
// carries, as upstream's TaintNodesByCondition gives it.
const TaintUnschedulable = corev1.TaintNodeUnschedulable

// hasUnschedulableTaint says whether the node carries the unschedulable
// NoSchedule taint.
func hasUnschedulableTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == TaintUnschedulable && t.Effect == corev1.TaintEffectNoSchedule {
			return true
		}
	}
	return false
}

// unschedulableOutOfStep says whether the node's taint disagrees with its
// spec.unschedulable.
func unschedulableOutOfStep(n *corev1.Node) bool {
	return n.Spec.Unschedulable != hasUnschedulableTaint(n)
}

// unschedulableTaints returns the node's taints with the unschedulable
// taint present exactly when spec.unschedulable is set, and whether that
// changed them. A taint added is stamped with now, as upstream stamps the
// taints its node controller adds.
func unschedulableTaints(n *corev1.Node, now time.Time) ([]corev1.Taint, bool) {
	if !unschedulableOutOfStep(n) {
		return n.Spec.Taints, false
	}
	if n.Spec.Unschedulable {
		out := append([]corev1.Taint(nil), n.Spec.Taints...)
		return append(out, corev1.Taint{Key: TaintUnschedulable, Effect: corev1.TaintEffectNoSchedule, TimeAdded: ptrTime(now)}), true
	}
	var out []corev1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key == TaintUnschedulable && t.Effect == corev1.TaintEffectNoSchedule {
			continue
		}
		out = append(out, t)
	}
	return out, true
}

// syncUnschedulable adds or removes one node's unschedulable taint.
func (c *Controller) syncUnschedulable(ctx context.Context, name string) error {
	n, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	taints, changed := unschedulableTaints(n, c.cfg.Clock.Now())
	if !changed {
		return nil
	}
	u := n.DeepCopy()
	u.Spec.Taints = taints
	if _, err := c.cfg.Client.CoreV1().Nodes().Update(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update node taints: %w", err)
	}
	return nil
}
