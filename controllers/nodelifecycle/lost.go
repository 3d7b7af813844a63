package nodelifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/internal/disconnect"
)

// DeletionCostAnnotation is the pod-deletion-cost annotation the
// ReplicaSet controller ranks pods by on scale-down; LoserDeletionCost
// makes a pod the first to go.
const (
	DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"
	LoserDeletionCost      = math.MinInt32
)

const (
	reasonNodeLost       = "NodeLost"
	reasonNodeHeard      = "NodeHeardAgain"
	eventReasonMarkLost  = "MarkedLost"
	eventReasonReconcile = "DisconnectReconciled"
)

// takesLostPath says whether a pod whose toleration of an unreachable
// node runs out is marked Lost rather than deleted: its disconnect policy
// replaces it and keeps the original for reconciliation (keepOriginal,
// longestRunning), and a ReplicaSet or ReplicationController owns it, whose
// controller knows Lost pods. Other pods with such a policy are evicted
// as keepReplacement asks: there is no one to start their replacement
// while the original is kept.
func takesLostPath(pod *corev1.Pod) bool {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return false
	}
	switch {
	case gv.Group == "apps" && ref.Kind == "ReplicaSet":
	case gv.Group == "" && ref.Kind == "ReplicationController":
	default:
		return false
	}
	p, errs := disconnect.Parse(pod.Annotations, field.NewPath("metadata", "annotations"))
	return len(errs) == 0 && p.Replace && (p.Reconcile == disconnect.KeepOriginal || p.Reconcile == disconnect.LongestRunning)
}

// lostCondition returns the pod's Lost condition, or nil.
func lostCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == ConditionLost {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// markLost sets Lost=True and Ready=False on a pod: its owner stops
// counting it and starts a replacement, and Services stop sending it
// traffic, while the pod itself is kept for when its node is heard again.
func (c *Controller) markLost(ctx context.Context, pod *corev1.Pod, node *corev1.Node) error {
	c.log.Info("marking pod lost", "pod", pod.Namespace+"/"+pod.Name, "node", node.Name)
	c.events.Eventf(pod, corev1.EventTypeNormal, eventReasonMarkLost,
		"Marking Pod %s/%s lost: node %s has not been heard for its lost-after; a replacement is started and the two are reconciled when the node is heard again", pod.Namespace, pod.Name, node.Name)
	now := metav1.NewTime(c.cfg.Clock.Now())
	u := pod.DeepCopy()
	lost := corev1.PodCondition{
		Type: ConditionLost, Status: corev1.ConditionTrue, Reason: reasonNodeLost, LastTransitionTime: now,
		Message: fmt.Sprintf("Node %s has not been heard for the pod's lost-after.", node.Name),
	}
	if cond := lostCondition(u); cond != nil {
		*cond = lost
	} else {
		u.Status.Conditions = append(u.Status.Conditions, lost)
	}
	for i := range u.Status.Conditions {
		if cnd := &u.Status.Conditions[i]; cnd.Type == corev1.PodReady && cnd.Status != corev1.ConditionFalse {
			cnd.Status, cnd.Reason, cnd.LastTransitionTime = corev1.ConditionFalse, reasonNodeLost, now
		}
	}
	if _, err := c.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); ignoreNotFound(err) != nil {
		return fmt.Errorf("mark pod lost: %w", err)
	}
	return nil
}

// resolveLost reconciles the Lost pods of a node that is heard again.
func (c *Controller) resolveLost(ctx context.Context, node string) error {
	objs, err := c.pods.ByIndex(podNodeIndex, node)
	if err != nil {
		return fmt.Errorf("list pods of node: %w", err)
	}
	var errs []error
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp == nil && kit.IsPodLost(p) {
			if err := c.reconcileLost(ctx, p); err != nil {
				errs = append(errs, fmt.Errorf("reconcile lost pod %s/%s: %w", p.Namespace, p.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// reconcileLost decides which of a Lost pod and its replacement stays,
// by the pod's disconnect policy. A losing original is deleted. A losing
// replacement gets the lowest deletion cost before the original's Lost
// mark is cleared, so that its owner, seeing one pod too many, removes
// exactly the replacement; that waits until the original reads ready
// again, since its owner removes unready pods before any deletion cost
// counts.
func (c *Controller) reconcileLost(ctx context.Context, pod *corev1.Pod) error {
	policy, _ := disconnect.Parse(pod.Annotations, field.NewPath("metadata", "annotations"))
	repl := c.replacementOf(pod)
	var loser *corev1.Pod
	if repl != nil {
		switch policy.Reconcile {
		case disconnect.KeepOriginal:
			loser = repl
		case disconnect.LongestRunning:
			loser = repl
			if runningSince(pod).After(runningSince(repl)) {
				loser = pod
			}
		default: // the policy changed to keepReplacement meanwhile
			loser = pod
		}
	}
	if loser != nil && loser != pod && !kit.IsPodReady(pod) {
		// The original must read ready first: its owner removes unready
		// pods before any deletion cost counts. At the next pass.
		return nil
	}
	c.log.Info("settling a lost pod whose node is heard again", "pod", pod.Namespace+"/"+pod.Name,
		"reconcile", policy.Reconcile, "replacement", podName(repl), "loser", podName(loser))
	pods := c.cfg.Client.CoreV1().Pods(pod.Namespace)
	switch {
	case loser == pod:
		c.events.Eventf(pod, corev1.EventTypeNormal, eventReasonReconcile,
			"Deleting Pod %s/%s: its node is heard again and its replacement %s stays (%s)", pod.Namespace, pod.Name, repl.Name, policy.Reconcile)
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete original pod: %w", err)
		}
		return nil
	case loser != nil:
		if repl.Annotations[DeletionCostAnnotation] != strconv.Itoa(LoserDeletionCost) {
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
				DeletionCostAnnotation: strconv.Itoa(LoserDeletionCost)}}})
			if err != nil {
				return fmt.Errorf("encode deletion cost patch: %w", err)
			}
			if _, err := pods.Patch(ctx, repl.Name, types.MergePatchType, patch, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
				return fmt.Errorf("set deletion cost of replacement: %w", err)
			}
		}
		c.events.Eventf(pod, corev1.EventTypeNormal, eventReasonReconcile,
			"Keeping Pod %s/%s: its node is heard again and its replacement %s goes (%s)", pod.Namespace, pod.Name, repl.Name, policy.Reconcile)
	}
	return c.clearLost(ctx, pod)
}

// clearLost sets Lost=False on the pod, so its owner counts it again.
func (c *Controller) clearLost(ctx context.Context, pod *corev1.Pod) error {
	u := pod.DeepCopy()
	cond := lostCondition(u)
	cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, reasonNodeHeard, "The pod's node is heard again."
	cond.LastTransitionTime = metav1.NewTime(c.cfg.Clock.Now())
	if _, err := c.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); ignoreNotFound(err) != nil {
		return fmt.Errorf("clear lost condition: %w", err)
	}
	return nil
}

// replacementOf returns the newest pod of the Lost pod's owner that was
// created since the pod was marked Lost and is itself live and not Lost:
// the pod the owner started in its place.
func (c *Controller) replacementOf(pod *corev1.Pod) *corev1.Pod {
	ref := metav1.GetControllerOfNoCopy(pod)
	cond := lostCondition(pod)
	if ref == nil || cond == nil {
		return nil
	}
	objs, err := c.pods.ByIndex(cache.NamespaceIndex, pod.Namespace)
	if err != nil {
		return nil
	}
	var best *corev1.Pod
	for _, o := range objs {
		s := o.(*corev1.Pod)
		sr := metav1.GetControllerOfNoCopy(s)
		if sr == nil || sr.UID != ref.UID || s.UID == pod.UID || !kit.IsPodActive(s) || kit.IsPodLost(s) ||
			s.CreationTimestamp.Before(&cond.LastTransitionTime) {
			continue
		}
		if best == nil || best.CreationTimestamp.Before(&s.CreationTimestamp) ||
			(best.CreationTimestamp.Equal(&s.CreationTimestamp) && best.Name < s.Name) {
			best = s
		}
	}
	return best
}

// runningSince is when a pod last started running: the latest start of
// its running containers (a node that rebooted during the cut restarted
// them), else its start time, else its creation.
func runningSince(p *corev1.Pod) time.Time {
	var t time.Time
	for _, s := range p.Status.ContainerStatuses {
		if r := s.State.Running; r != nil && r.StartedAt.After(t) {
			t = r.StartedAt.Time
		}
	}
	switch {
	case !t.IsZero():
		return t
	case p.Status.StartTime != nil:
		return p.Status.StartTime.Time
	}
	return p.CreationTimestamp.Time
}

func podName(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Name
}
