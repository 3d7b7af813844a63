package replicaset

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// computeStatus derives rs's status from its pods. manageErr, when set,
// raises the ReplicaFailure condition (e.g. a quota refusing pods); a
// clean sync clears it.
func computeStatus(rs *appsv1.ReplicaSet, pods, active []*corev1.Pod, manageErr error, now time.Time) appsv1.ReplicaSetStatus {
	st := rs.Status.DeepCopy()
	tmpl := labels.Set(rs.Spec.Template.Labels)
	var fully, ready, available, terminating int32
	for _, p := range active {
		if labels.SelectorFromSet(tmpl).Matches(labels.Set(p.Labels)) {
			fully++
		}
		if kit.IsPodReady(p) {
			ready++
			if kit.IsPodAvailable(p, rs.Spec.MinReadySeconds, now) {
				available++
			}
		}
	}
	for _, p := range pods {
		if kit.IsPodTerminating(p) {
			terminating++
		}
	}
	st.Replicas = int32(len(active))
	st.FullyLabeledReplicas = fully
	st.ReadyReplicas = ready
	st.AvailableReplicas = available
	st.TerminatingReplicas = ptr.To(terminating)
	st.ObservedGeneration = rs.Generation

	i := conditionIndex(st.Conditions, appsv1.ReplicaSetReplicaFailure)
	switch {
	case manageErr != nil && i < 0:
		reason := "FailedCreate"
		if int(ptrOr(rs.Spec.Replicas, 1)) < len(active) {
			reason = "FailedDelete"
		}
		st.Conditions = append(st.Conditions, appsv1.ReplicaSetCondition{
			Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(now), Reason: reason, Message: manageErr.Error(),
		})
	case manageErr == nil && i >= 0:
		st.Conditions = append(st.Conditions[:i], st.Conditions[i+1:]...)
	}
	return *st
}

func conditionIndex(conds []appsv1.ReplicaSetCondition, t appsv1.ReplicaSetConditionType) int {
	for i := range conds {
		if conds[i].Type == t {
			return i
		}
	}
	return -1
}

// updateStatus writes status when it differs from what rs has, so a
// steady ReplicaSet costs no writes.
func (c *Controller) updateStatus(ctx context.Context, rs *appsv1.ReplicaSet, status appsv1.ReplicaSetStatus) error {
	if apiequality.Semantic.DeepEqual(rs.Status, status) {
		return nil
	}
	cur := rs
	for attempt := 0; ; attempt++ {
		cur.Status = status
		err := c.owners.updateStatus(ctx, cur)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 1 {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("update %s status: %w", c.owners.name, err)
		}
		// Our cache is behind: retry once on the fresh object.
		fresh, gerr := c.owners.get(ctx, rs.Namespace, rs.Name)
		if gerr != nil {
			return fmt.Errorf("read %s for status: %w", c.owners.name, gerr)
		}
		if fresh.UID != rs.UID {
			return nil
		}
		status.ObservedGeneration = min(status.ObservedGeneration, fresh.Generation)
		cur = fresh
	}
}
