package scheduler

import (
	corev1 "k8s.io/api/core/v1"
)

// Taint keys the node lifecycle controller puts on nodes that are not
// Ready. The snapshot adds the NoSchedule form itself when a node reports
// it is not Ready but carries no such taint yet, so a node that just
// dropped off is avoided without waiting for the controller.
const (
	taintNotReady      = "node.kubernetes.io/not-ready"
	taintUnreachable   = "node.kubernetes.io/unreachable"
	taintUnschedulable = "node.kubernetes.io/unschedulable"
)

// NodeInfo is a node and the pods the scheduler counts on it: bound pods
// the informer reported and pods assumed by a binding still in flight.
type NodeInfo struct {
	Node   *corev1.Node
	Name   string
	Labels map[string]string

	// idx is the node's position in Snapshot.nodes; -1 for a node that is
	// gone (or not seen yet) but still holds pods.
	idx int

	Allocatable Resources
	Requested   Resources
	// NonZeroRequested counts unrequested cpu and memory at the scoring
	// defaults.
	NonZeroRequested Resources

	Pods  []*PodInfo
	ports []hostPort

	taints        []corev1.Taint
	unschedulable bool
	// images maps each normalized image name on the node to its size.
	images map[string]int64

	// nominated are pending pods that preemption promised this node.
	nominated []*PodInfo

	numAffinityPods int
}

func newNodeInfo(name string) *NodeInfo {
	return &NodeInfo{Name: name, idx: -1, Labels: map[string]string{}}
}

// setNode updates the node object and everything derived from it.
func (n *NodeInfo) setNode(node *corev1.Node) {
	n.Node = node
	n.Labels = node.Labels
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	alloc := fromList(node.Status.Allocatable)
	n.Allocatable = alloc
	n.unschedulable = node.Spec.Unschedulable
	n.taints = effectiveTaints(node)
	n.images = nil
	for _, img := range node.Status.Images {
		for _, name := range img.Names {
			if n.images == nil {
				n.images = make(map[string]int64, len(node.Status.Images))
			}
			n.images[name] = img.SizeBytes
		}
	}
}

// effectiveTaints are the node's taints plus a not-ready or unreachable
// NoSchedule taint when its Ready condition says so and the node
// lifecycle controller has not tainted it yet. A node with no Ready
// condition at all has never reported and counts as unreachable.
func effectiveTaints(node *corev1.Node) []corev1.Taint {
	status := corev1.ConditionUnknown
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			status = node.Status.Conditions[i].Status
			break
		}
	}
	var key string
	switch status {
	case corev1.ConditionTrue:
		return node.Spec.Taints
	case corev1.ConditionFalse:
		key = taintNotReady
	default:
		key = taintUnreachable
	}
	for _, t := range node.Spec.Taints {
		if t.Key == key {
			return node.Spec.Taints
		}
	}
	out := make([]corev1.Taint, 0, len(node.Spec.Taints)+1)
	out = append(out, node.Spec.Taints...)
	return append(out, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
}

func (n *NodeInfo) addPod(p *PodInfo) {
	p.node = n
	p.nodePos = len(n.Pods)
	n.Pods = append(n.Pods, p)
	n.Requested.add(&p.Req)
	n.NonZeroRequested.MilliCPU += p.NonZero.MilliCPU
	n.NonZeroRequested.Memory += p.NonZero.Memory
	n.ports = append(n.ports, p.Ports...)
	if p.hasAffinity() {
		n.numAffinityPods++
	}
}

func (n *NodeInfo) removePod(p *PodInfo) {
	last := len(n.Pods) - 1
	if p.nodePos < 0 || p.nodePos > last || n.Pods[p.nodePos] != p {
		return
	}
	n.Pods[p.nodePos] = n.Pods[last]
	n.Pods[p.nodePos].nodePos = p.nodePos
	n.Pods[last] = nil
	n.Pods = n.Pods[:last]
	p.nodePos = -1
	n.Requested.sub(&p.Req)
	n.NonZeroRequested.MilliCPU -= p.NonZero.MilliCPU
	n.NonZeroRequested.Memory -= p.NonZero.Memory
	for _, hp := range p.Ports {
		for i, q := range n.ports {
			if q == hp {
				n.ports = append(n.ports[:i], n.ports[i+1:]...)
				break
			}
		}
	}
	if p.hasAffinity() {
		n.numAffinityPods--
	}
}

func (n *NodeInfo) addNominated(p *PodInfo) {
	n.nominated = append(n.nominated, p)
}

func (n *NodeInfo) removeNominated(p *PodInfo) {
	for i, q := range n.nominated {
		if q == p {
			n.nominated = append(n.nominated[:i], n.nominated[i+1:]...)
			return
		}
	}
}
