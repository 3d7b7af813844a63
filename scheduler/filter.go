package scheduler

import (
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
)

// Result codes of a filter, as upstream: an Unschedulable node might take
// the pod if lower-priority pods left it (preemption may help), an
// Unresolvable one cannot.
const (
	codeFeasible      uint8 = 0
	codeUnschedulable uint8 = 1
	codeUnresolvable  uint8 = 2
)

// Upstream's reasons, kept word for word: users and tools grep for them.
const (
	reasonUnschedulable        = "node(s) were unschedulable"
	reasonNodeName             = "node(s) didn't match the requested node name"
	reasonNodeAffinity         = "node(s) didn't match Pod's node affinity/selector"
	reasonPorts                = "node(s) didn't have free ports for the requested pod ports"
	reasonTooManyPods          = "Too many pods"
	reasonVolumeAffinity       = "node(s) had volume node affinity conflict"
	reasonVolumeBind           = "node(s) didn't find available persistent volumes to bind"
	reasonPVMissing            = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
	reasonSpread               = "node(s) didn't match pod topology spread constraints"
	reasonSpreadLabel          = "node(s) didn't match pod topology spread constraints (missing required label)"
	reasonAffinity             = "node(s) didn't match pod affinity rules"
	reasonAntiAffinity         = "node(s) didn't match pod anti-affinity rules"
	reasonExistingAntiAffinity = "node(s) didn't satisfy existing pods anti-affinity rules"
)

var insufficient = map[corev1.ResourceName]string{
	corev1.ResourceCPU:              "Insufficient cpu",
	corev1.ResourceMemory:           "Insufficient memory",
	corev1.ResourceEphemeralStorage: "Insufficient ephemeral-storage",
}

// cycleState is what the filters and scores precompute for one pod.
type cycleState struct {
	pod      *PodInfo
	affinity *affinityState
	spread   *spreadState
	volumes  *volumeState
}

// verdict is the outcome of filtering one node. reasons is only filled
// when the caller asked for it.
type verdict struct {
	code    uint8
	plugin  plugin
	reasons []string
}

// filterNode runs the filters on n in upstream's order and stops at the
// first that rejects it. With explain, v.reasons gets the messages.
func (d *Decider) filterNode(s *Snapshot, st *cycleState, n *NodeInfo, explain bool, v *verdict) {
	p := st.pod
	v.code, v.plugin = codeFeasible, plugNone
	v.reasons = v.reasons[:0]
	fail := func(code uint8, pl plugin, reason string) {
		v.code, v.plugin = code, pl
		if explain {
			v.reasons = append(v.reasons, reason)
		}
	}

	if n.unschedulable && !tolerates(p.tolerations, &corev1.Taint{Key: taintUnschedulable, Effect: corev1.TaintEffectNoSchedule}) {
		fail(codeUnresolvable, plugUnschedulable, reasonUnschedulable)
		return
	}
	if p.Pod.Spec.NodeName != "" && p.Pod.Spec.NodeName != n.Name {
		fail(codeUnresolvable, plugNodeName, reasonNodeName)
		return
	}
	if t := untoleratedTaint(n.taints, p.tolerations); t != nil {
		v.code, v.plugin = codeUnresolvable, plugTaint
		if explain {
			v.reasons = append(v.reasons, fmt.Sprintf("node(s) had untolerated taint {%s: %s}", t.Key, t.Value))
		}
		return
	}
	if !p.matchesNodeSelectorAndAffinity(n) {
		fail(codeUnresolvable, plugNodeAffinity, reasonNodeAffinity)
		return
	}
	if len(p.Ports) > 0 && portsConflict(p, n) {
		fail(codeUnschedulable, plugPorts, reasonPorts)
		return
	}
	if code := fitResources(p, n, explain, &v.reasons); code != codeFeasible {
		v.code, v.plugin = code, plugFit
		return
	}
	if st.volumes != nil {
		if code, reason := st.volumes.filter(n); code != codeFeasible {
			fail(code, plugVolume, reason)
			return
		}
	}
	if st.spread != nil {
		if code, reason := st.spread.filter(p, n); code != codeFeasible {
			fail(code, plugSpread, reason)
			return
		}
	}
	if st.affinity != nil {
		if code, reason := st.affinity.filter(n); code != codeFeasible {
			fail(code, plugInterPod, reason)
			return
		}
	}
}

// tolerates tells whether any toleration tolerates t.
func tolerates(tols []corev1.Toleration, t *corev1.Taint) bool {
	for i := range tols {
		if tols[i].ToleratesTaint(logr.Discard(), t, false) {
			return true
		}
	}
	return false
}

// untoleratedTaint returns the first NoSchedule or NoExecute taint the
// pod does not tolerate.
func untoleratedTaint(taints []corev1.Taint, tols []corev1.Toleration) *corev1.Taint {
	for i := range taints {
		t := &taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !tolerates(tols, t) {
			return t
		}
	}
	return nil
}

func portsConflict(p *PodInfo, n *NodeInfo) bool {
	for _, want := range p.Ports {
		for _, used := range n.ports {
			if want.conflicts(used) {
				return true
			}
		}
		for _, np := range n.nominated {
			if np == p || np.Priority < p.Priority {
				continue
			}
			for _, used := range np.Ports {
				if want.conflicts(used) {
					return true
				}
			}
		}
	}
	return false
}

// fitResources is NodeResourcesFit. Pods preemption promised this node
// that are at least as important as p count as if they were there
// already, so that nobody takes the room preemption made for them.
// Missing room is Unresolvable when the node could not hold the pod even
// empty.
func fitResources(p *PodInfo, n *NodeInfo, explain bool, reasons *[]string) uint8 {
	req := &n.Requested
	podCount := int64(len(n.Pods))
	var withNominated Resources
	if len(n.nominated) > 0 {
		withNominated = n.Requested.clone()
		for _, np := range n.nominated {
			if np == p || np.UID == p.UID || np.Priority < p.Priority {
				continue
			}
			withNominated.add(&np.Req)
			podCount++
		}
		req = &withNominated
	}
	alloc := &n.Allocatable
	code := codeFeasible
	bad := func(reason string, unresolvable bool) {
		if code == codeFeasible {
			code = codeUnschedulable
		}
		if unresolvable {
			code = codeUnresolvable
		}
		if explain {
			*reasons = append(*reasons, reason)
		}
	}
	if podCount+1 > alloc.Pods {
		bad(reasonTooManyPods, false)
	}
	r := &p.Req
	if r.MilliCPU > 0 && r.MilliCPU > alloc.MilliCPU-req.MilliCPU {
		bad(insufficient[corev1.ResourceCPU], r.MilliCPU > alloc.MilliCPU)
	}
	if r.Memory > 0 && r.Memory > alloc.Memory-req.Memory {
		bad(insufficient[corev1.ResourceMemory], r.Memory > alloc.Memory)
	}
	if r.EphemeralStorage > 0 && r.EphemeralStorage > alloc.EphemeralStorage-req.EphemeralStorage {
		bad(insufficient[corev1.ResourceEphemeralStorage], r.EphemeralStorage > alloc.EphemeralStorage)
	}
	for name, q := range r.Scalar {
		if q == 0 {
			continue
		}
		if q > alloc.Scalar[name]-req.Scalar[name] {
			bad("Insufficient "+string(name), q > alloc.Scalar[name])
		}
	}
	return code
}
