package replicaset

import (
	"math"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// DeletionCostAnnotation lets users say which pods of a ReplicaSet to
// delete first on scale-down: lower cost first (an int32, default 0).
const DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"

// rankedPod is a pod with the number of related pods on its node.
type rankedPod struct {
	pod  *corev1.Pod
	rank int
}

// PodsToDelete picks the n pods of pods to delete on scale-down, in the
// order kube-controller-manager would, the cheapest loss first:
//
//  1. unassigned before assigned;
//  2. Pending before Unknown before Running;
//  3. not ready before ready;
//  4. lower pod-deletion-cost first;
//  5. pods sharing their node with more related pods first (related are
//     the pods of every ReplicaSet of the same Deployment), to spread;
//  6. among ready pods, the more recently ready first;
//  7. higher container restart counts first;
//  8. newer first.
//
// Times in 6 and 8 are compared in powers-of-two buckets of their age at
// now, with ties broken by UID, so that scale-down does not always pick
// the very newest pods of an otherwise even spread (upstream's logarithmic
// scale-down).
func PodsToDelete(pods, related []*corev1.Pod, n int, now time.Time) []*corev1.Pod {
	if n >= len(pods) {
		return slices.Clone(pods)
	}
	onNode := map[string]int{}
	for _, p := range related {
		if kit.IsPodActive(p) {
			onNode[p.Spec.NodeName]++
		}
	}
	ranked := make([]rankedPod, len(pods))
	for i, p := range pods {
		ranked[i] = rankedPod{pod: p, rank: onNode[p.Spec.NodeName]}
	}
	slices.SortStableFunc(ranked, func(a, b rankedPod) int {
		if deleteFirst(a, b, now) {
			return -1
		}
		if deleteFirst(b, a, now) {
			return 1
		}
		return 0
	})
	out := make([]*corev1.Pod, n)
	for i := range n {
		out[i] = ranked[i].pod
	}
	return out
}

var phaseOrder = map[corev1.PodPhase]int{corev1.PodPending: 0, corev1.PodUnknown: 1, corev1.PodRunning: 2}

func phaseRank(p *corev1.Pod) int {
	if r, ok := phaseOrder[p.Status.Phase]; ok {
		return r
	}
	return 0 // an empty phase is a pod nothing has reported on yet
}

// deleteFirst reports whether a should be deleted before b.
func deleteFirst(a, b rankedPod, now time.Time) bool {
	pa, pb := a.pod, b.pod
	if (pa.Spec.NodeName == "") != (pb.Spec.NodeName == "") {
		return pa.Spec.NodeName == ""
	}
	if ra, rb := phaseRank(pa), phaseRank(pb); ra != rb {
		return ra < rb
	}
	readyA, readyB := kit.IsPodReady(pa), kit.IsPodReady(pb)
	if readyA != readyB {
		return !readyA
	}
	if ca, cb := deletionCost(pa), deletionCost(pb); ca != cb {
		return ca < cb
	}
	if a.rank != b.rank {
		return a.rank > b.rank
	}
	if readyA && readyB {
		ta, tb := readySince(pa), readySince(pb)
		if !ta.Equal(tb) {
			return newerFirst(ta, tb, now, pa, pb)
		}
	}
	if ra, rb := maxRestarts(pa), maxRestarts(pb); ra != rb {
		return ra > rb
	}
	ta, tb := pa.CreationTimestamp.Time, pb.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return newerFirst(ta, tb, now, pa, pb)
	}
	return false
}

// newerFirst reports whether time a (of pod pa) comes before b: the zero
// time first, then the newer, compared by log2 of the age at now.
func newerFirst(a, b, now time.Time, pa, pb *corev1.Pod) bool {
	if a.IsZero() || b.IsZero() || now.IsZero() {
		return a.IsZero() || (!b.IsZero() && a.After(b))
	}
	if d := ageBucket(a, now) - ageBucket(b, now); d != 0 {
		return d < 0
	}
	return pa.UID < pb.UID
}

func ageBucket(t, now time.Time) int64 {
	d := now.Sub(t)
	if d <= 0 {
		return -1
	}
	return int64(math.Floor(math.Log2(float64(d))))
}

func readySince(p *corev1.Pod) time.Time {
	if c := kit.PodReadyCondition(p); c != nil {
		return c.LastTransitionTime.Time
	}
	return time.Time{}
}

func deletionCost(p *corev1.Pod) int32 {
	v, ok := p.Annotations[DeletionCostAnnotation]
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0
	}
	return int32(n)
}

// maxRestarts is the highest restart count of the pod's regular
// containers, then of its init (sidecar) containers, as one comparable
// number.
func maxRestarts(p *corev1.Pod) int64 {
	var regular, init int32
	for _, s := range p.Status.ContainerStatuses {
		regular = max(regular, s.RestartCount)
	}
	for _, s := range p.Status.InitContainerStatuses {
		init = max(init, s.RestartCount)
	}
	return int64(regular)<<32 | int64(init)
}
