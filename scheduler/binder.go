package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

type bindJob struct {
	e *queuedPod
	// pod is the pod as it was scheduled. The bind workers read it rather
	// than its PodInfo, whose object the loop replaces when the informer
	// reports the binding, perhaps before a worker is done with it.
	pod     *corev1.Pod
	node    string
	volumes []VolumeChoice
}

// bindWorker writes bindings. Several run at once so that the scheduler's
// throughput is not one API round trip per pod.
func (s *Scheduler) bindWorker(ctx context.Context) {
	for j := range s.binds {
		err := s.bind(ctx, j)
		if err == nil {
			s.count(func(st *Stats) { st.Scheduled++ })
			s.events.Event(j.pod, corev1.EventTypeNormal, "Scheduled",
				fmt.Sprintf("Successfully assigned %s/%s to %s", j.pod.Namespace, j.pod.Name, j.node))
			s.post(func() {
				if p := s.snap.Pod(j.pod.UID); p != nil && p.assumed {
					p.boundAt = time.Now()
				}
			})
			continue
		}
		s.count(func(st *Stats) { st.BindErrors++ })
		s.log.Info("binding failed", "pod", j.pod.Namespace+"/"+j.pod.Name, "node", j.node, "err", err)
		gone := apierrors.IsNotFound(err) || apierrors.IsConflict(err)
		s.post(func() {
			// Only an unconfirmed assumption is undone; if the informer
			// already reports the pod on a node, that is the truth.
			if p := s.snap.Pod(j.pod.UID); p != nil && p.assumed {
				s.snap.RemovePod(j.pod.UID)
				s.q.event(evPodDelete, time.Now())
			}
			if !gone {
				s.q.retry(j.e, time.Now())
			} else if s.q.pods[j.pod.UID] == j.e {
				// A conflict means deleted or bound elsewhere; the
				// informer will say which.
				s.q.remove(j.pod.UID)
			}
		})
	}
}

// bind prepares unbound volumes for the node and posts the Binding.
func (s *Scheduler) bind(ctx context.Context, j bindJob) error {
	for _, v := range j.volumes {
		if err := s.prepareVolume(ctx, v, j.node); err != nil {
			return err
		}
	}
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: j.pod.Namespace, Name: j.pod.Name, UID: j.pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: j.node},
	}
	if err := s.cs.CoreV1().Pods(j.pod.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind pod %s to %s: %w", j.pod.Namespace+"/"+j.pod.Name, j.node, err)
	}
	return nil
}

// prepareVolume reserves a static volume for the claim (claimRef) or
// tells the provisioner which node the claim's volume must reach
// (selected-node annotation), as upstream's volume binder does before
// binding.
func (s *Scheduler) prepareVolume(ctx context.Context, v VolumeChoice, node string) error {
	if v.PV != "" {
		ref := map[string]any{"spec": map[string]any{"claimRef": map[string]any{
			"kind": "PersistentVolumeClaim", "apiVersion": "v1",
			"namespace": v.PVC.Namespace, "name": v.PVC.Name, "uid": v.PVC.UID,
		}}}
		body, _ := json.Marshal(ref)
		if _, err := s.cs.CoreV1().PersistentVolumes().Patch(ctx, v.PV, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("reserve volume %s for claim %s/%s: %w", v.PV, v.PVC.Namespace, v.PVC.Name, err)
		}
		return nil
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annSelectedNode: node}}})
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(v.PVC.Namespace).Patch(ctx, v.PVC.Name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("select node for claim %s/%s: %w", v.PVC.Namespace, v.PVC.Name, err)
	}
	return nil
}

// writeAsync queues an API write that must not be lost; it blocks only if
// the writers are far behind.
func (s *Scheduler) writeAsync(ctx context.Context, fn func(context.Context)) {
	select {
	case s.writes <- fn:
	case <-ctx.Done():
	}
}

func (s *Scheduler) writeWorker(ctx context.Context) {
	for fn := range s.writes {
		if ctx.Err() != nil {
			continue
		}
		fn(ctx)
	}
}

// reportUnschedulable records the failure on the pod: a FailedScheduling
// event and the PodScheduled=False condition (with the nominated node
// preemption chose, if any).
func (s *Scheduler) reportUnschedulable(ctx context.Context, pod *corev1.Pod, msg, nominate string, clearNomination bool) {
	s.events.Event(pod, corev1.EventTypeWarning, "FailedScheduling", msg)
	var cur *corev1.PodCondition
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodScheduled {
			cur = &pod.Status.Conditions[i]
		}
	}
	same := cur != nil && cur.Status == corev1.ConditionFalse && cur.Reason == corev1.PodReasonUnschedulable && cur.Message == msg
	if same && nominate == "" && !clearNomination {
		return
	}
	cond := map[string]any{
		"type": corev1.PodScheduled, "status": corev1.ConditionFalse,
		"reason": corev1.PodReasonUnschedulable, "message": msg, "lastProbeTime": nil,
	}
	if cur == nil || cur.Status != corev1.ConditionFalse {
		cond["lastTransitionTime"] = metav1.Now().Rfc3339Copy()
	}
	status := map[string]any{"conditions": []any{cond}}
	if nominate != "" {
		status["nominatedNodeName"] = nominate
	} else if clearNomination {
		status["nominatedNodeName"] = nil
	}
	s.patchStatus(ctx, pod, status)
}

func (s *Scheduler) setNominated(ctx context.Context, pod *corev1.Pod, node string) {
	var v any
	if node != "" {
		v = node
	}
	s.patchStatus(ctx, pod, map[string]any{"nominatedNodeName": v})
}

func (s *Scheduler) patchStatus(ctx context.Context, pod *corev1.Pod, status map[string]any) {
	body, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   status,
	})
	_, err := s.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		s.log.Info("cannot update pod status", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}

// preemptAsync evicts the victims: each is marked with a DisruptionTarget
// condition, deleted with its own grace period, and told why by an event.
func (s *Scheduler) preemptAsync(ctx context.Context, preemptor *PodInfo, pr Preemption) {
	for _, v := range pr.Victims {
		victim := v.Pod
		s.writeAsync(ctx, func(ctx context.Context) {
			s.patchStatus(ctx, victim, map[string]any{"conditions": []any{map[string]any{
				"type": corev1.DisruptionTarget, "status": corev1.ConditionTrue,
				"reason":             corev1.PodReasonPreemptionByScheduler,
				"message":            fmt.Sprintf("%s: preempting to accommodate a higher priority pod", s.name),
				"lastTransitionTime": metav1.Now().Rfc3339Copy(),
			}}})
			uid := victim.UID
			err := s.cs.CoreV1().Pods(victim.Namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil && !apierrors.IsNotFound(err) {
				s.log.Info("cannot delete preemption victim", "pod", victim.Namespace+"/"+victim.Name, "err", err)
				return
			}
			s.events.Event(victim, corev1.EventTypeNormal, "Preempted",
				fmt.Sprintf("Preempted by pod %s on node %s", preemptor.UID, pr.Node))
		})
	}
	s.log.Info("preempting", "pod", preemptor.Key(), "node", pr.Node, "victims", len(pr.Victims), "pdbViolations", pr.PDBViolations)
}
