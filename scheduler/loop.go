package scheduler

import (
	"context"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// assumedTTL bounds how long a pod whose binding succeeded is counted
// without the informer confirming it; the pod was most likely deleted
// and the deletion seen out of order.
const assumedTTL = 2 * time.Minute

// loop is the scheduler's one goroutine that owns the snapshot and queue.
func (s *Scheduler) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	housekeeping := time.NewTicker(30 * time.Second)
	defer housekeeping.Stop()
	for {
		s.drain()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		next := s.q.flushBackoff(now)
		if e := s.q.pop(); e != nil {
			s.scheduleOne(ctx, e, now)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(now), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		case t := <-housekeeping.C:
			s.q.flushLeftovers(t)
			s.expireAssumed(t)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// scheduleOne decides for one pod and acts on the decision.
func (s *Scheduler) scheduleOne(ctx context.Context, e *queuedPod, now time.Time) {
	pi := e.pi
	dec := s.dec.Decide(s.snap, pi)
	if dec.Err == nil {
		// Assume: the pod counts on its node from now on, so the next
		// decision already sees the room it takes.
		s.snap.ClearNominated(pi.UID)
		s.snap.AddPod(pi, dec.Node, true)
		s.q.assumed(e)
		select {
		case s.binds <- bindJob{e: e, pod: pi.Pod, node: dec.Node, volumes: dec.Volumes}:
		case <-ctx.Done():
		}
		return
	}

	fe := dec.Err
	pr := s.dec.Preempt(s.snap, pi, fe)
	nominate, clearNomination := "", false
	helps := fe.Helps
	if pr.Node != "" {
		s.count(func(st *Stats) { st.Preemptions++ })
		nominate = pr.Node
		pi.nominatedNode = pr.Node
		s.snap.SetNominated(pi)
		for _, q := range pr.LosingNomination {
			s.snap.ClearNominated(q.UID)
			q.nominatedNode = ""
			s.writeAsync(ctx, func(ctx context.Context) { s.setNominated(ctx, q.Pod, "") })
		}
		s.preemptAsync(ctx, pi, pr)
		// The victims' deletion is what lets the pod in.
		helps |= evPodDelete
	} else {
		fe.PostFilterMsg = pr.Msg
		if pi.nominatedNode != "" {
			// A promise preemption cannot keep is withdrawn, as upstream.
			s.snap.ClearNominated(pi.UID)
			pi.nominatedNode = ""
			clearNomination = true
		}
	}
	s.count(func(st *Stats) { st.Failed++ })
	s.q.failed(e, helps, now)
	msg := fe.Error()
	s.log.Debug("pod unschedulable", "pod", pi.Key(), "reason", msg)
	pod := pi.Pod
	s.writeAsync(ctx, func(ctx context.Context) { s.reportUnschedulable(ctx, pod, msg, nominate, clearNomination) })
}

// expireAssumed stops counting pods whose successful binding the
// informer never confirmed.
func (s *Scheduler) expireAssumed(now time.Time) {
	for uid, p := range s.snap.pods {
		if p.assumed && !p.boundAt.IsZero() && now.Sub(p.boundAt) > assumedTTL {
			s.snap.RemovePod(uid)
			s.q.event(evPodDelete, now)
		}
	}
}

// responsible tells whether pod is this scheduler's to place.
func (s *Scheduler) responsible(pod *corev1.Pod) bool {
	return pod.Spec.SchedulerName == s.name || (pod.Spec.SchedulerName == "" && s.name == DefaultSchedulerName)
}

func terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// onPod applies an informer add (old nil) or update.
func (s *Scheduler) onPod(old, pod *corev1.Pod) {
	now := time.Now()
	if pod.Spec.NodeName != "" {
		s.q.remove(pod.UID)
		s.snap.ClearNominated(pod.UID)
		if terminal(pod) {
			if s.snap.RemovePod(pod.UID) != nil {
				s.q.event(evPodDelete, now)
			}
			return
		}
		prev := s.snap.Pod(pod.UID)
		// Confirming our own binding changes nothing the queue cares
		// about: the pod was counted since it was assumed.
		var ev eventMask
		switch {
		case prev == nil:
			ev = evPodAdd
		case prev.node.Name != pod.Spec.NodeName:
			ev = evPodAdd | evPodDelete
		case !maps.Equal(prev.Pod.Labels, pod.Labels):
			ev = evPodLabel
		case !prev.terminating && pod.DeletionTimestamp != nil:
			ev = evPodDelete
		}
		if err := s.snap.ConfirmPod(pod, func() (*PodInfo, error) { return NewPodInfo(pod, s.prio.Resolve) }); err != nil {
			s.log.Warn("cannot count bound pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			return
		}
		s.q.event(ev, now)
		return
	}

	if !s.responsible(pod) || pod.DeletionTimestamp != nil || terminal(pod) || len(pod.Spec.SchedulingGates) > 0 {
		s.q.remove(pod.UID)
		s.snap.ClearNominated(pod.UID)
		return
	}
	if s.snap.Pod(pod.UID) != nil {
		return // assumed; its binding is in flight
	}
	e := s.q.pods[pod.UID]
	if e != nil && old != nil && !schedulingChanged(old, pod) {
		// Status-only updates (our own condition writes among them) do
		// not change where the pod can go.
		e.pi.Pod = pod
		return
	}
	pi, err := NewPodInfo(pod, s.prio.Resolve)
	if err != nil {
		s.log.Warn("cannot schedule pod with invalid constraints", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		return
	}
	if e != nil {
		pi.nominatedNode = e.pi.nominatedNode
		if pod.Status.NominatedNodeName != "" {
			pi.nominatedNode = pod.Status.NominatedNodeName
		}
	}
	if pi.nominatedNode != "" {
		s.snap.SetNominated(pi)
	}
	s.q.add(pi, now, true)
}

// schedulingChanged tells whether an update to a pending pod touched
// anything placement depends on.
func schedulingChanged(old, pod *corev1.Pod) bool {
	return !maps.Equal(old.Labels, pod.Labels) ||
		old.Status.NominatedNodeName != pod.Status.NominatedNodeName ||
		!apiequality.Semantic.DeepEqual(old.Spec, pod.Spec)
}

func (s *Scheduler) onPodDelete(pod *corev1.Pod) {
	s.q.remove(pod.UID)
	s.snap.ClearNominated(pod.UID)
	if s.snap.RemovePod(pod.UID) != nil {
		s.q.event(evPodDelete, time.Now())
	}
}

func (s *Scheduler) onNode(n *corev1.Node) {
	if m := s.snap.SetNode(n); m != 0 {
		s.q.event(m, time.Now())
	}
}
