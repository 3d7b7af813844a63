package daemonset

import (
	"slices"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// daemonTolerations are added to every daemon pod: a daemon keeps running
// on a node that is not ready, unreachable, under pressure or cordoned,
// and (for host-network daemons such as network plugins) on a node whose
// network is not yet up.
func daemonTolerations(hostNetwork bool) []corev1.Toleration {
	t := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
	if hostNetwork {
		t = append(t, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return t
}

// withTolerations returns tols plus the daemon tolerations it lacks.
func withTolerations(tols []corev1.Toleration, hostNetwork bool) []corev1.Toleration {
	out := slices.Clone(tols)
	for _, d := range daemonTolerations(hostNetwork) {
		if !slices.ContainsFunc(out, func(t corev1.Toleration) bool {
			return t.Key == d.Key && t.Effect == d.Effect && t.Operator == d.Operator && t.TolerationSeconds == nil
		}) {
			out = append(out, d)
		}
	}
	return out
}

// pinAffinity returns affinity with its required node terms replaced by
// one term selecting the node by name, so the scheduler places the pod
// there (and checks resources) while preferred terms still apply.
func pinAffinity(aff *corev1.Affinity, node string) *corev1.Affinity {
	out := aff.DeepCopy()
	if out == nil {
		out = &corev1.Affinity{}
	}
	if out.NodeAffinity == nil {
		out.NodeAffinity = &corev1.NodeAffinity{}
	}
	out.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node},
			}},
		}},
	}
	return out
}

// ShouldRun decides a DaemonSet's pod on node: run reports whether a pod
// should be created there; keep whether an existing pod may stay. A pod
// may stay despite an untolerated NoSchedule taint, but not a NoExecute
// one, and not when the node no longer matches the nodeSelector or
// required node affinity.
func ShouldRun(ds *appsv1.DaemonSet, node *corev1.Node) (run, keep bool) {
	spec := &ds.Spec.Template.Spec
	if spec.NodeName != "" && spec.NodeName != node.Name {
		return false, false
	}
	if !matchesNode(spec, node) {
		return false, false
	}
	tols := withTolerations(spec.Tolerations, spec.HostNetwork)
	run, keep = true, true
	for _, taint := range node.Spec.Taints {
		if taint.Effect != corev1.TaintEffectNoSchedule && taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if slices.ContainsFunc(tols, func(t corev1.Toleration) bool { return t.ToleratesTaint(logr.Discard(), &taint, false) }) {
			continue
		}
		run = false
		if taint.Effect == corev1.TaintEffectNoExecute {
			keep = false
		}
	}
	return run, keep
}

// matchesNode checks the pod's nodeSelector and required node affinity.
func matchesNode(spec *corev1.PodSpec, node *corev1.Node) bool {
	if len(spec.NodeSelector) > 0 && !labels.SelectorFromSet(spec.NodeSelector).Matches(labels.Set(node.Labels)) {
		return false
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for _, term := range terms {
		if termMatches(term, node) {
			return true
		}
	}
	return false
}

// termMatches reports whether a node selector term (ANDed expressions
// over labels and fields) matches node. An empty term matches nothing.
func termMatches(term corev1.NodeSelectorTerm, node *corev1.Node) bool {
	if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
		return false
	}
	for _, r := range term.MatchExpressions {
		if !requirementMatches(r, labels.Set(node.Labels)) {
			return false
		}
	}
	for _, r := range term.MatchFields {
		if r.Key != "metadata.name" {
			return false
		}
		// Node names may be longer than label values: compare directly.
		switch r.Operator {
		case corev1.NodeSelectorOpIn:
			if !slices.Contains(r.Values, node.Name) {
				return false
			}
		case corev1.NodeSelectorOpNotIn:
			if slices.Contains(r.Values, node.Name) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func requirementMatches(r corev1.NodeSelectorRequirement, set labels.Labels) bool {
	var op selection.Operator
	switch r.Operator {
	case corev1.NodeSelectorOpIn:
		op = selection.In
	case corev1.NodeSelectorOpNotIn:
		op = selection.NotIn
	case corev1.NodeSelectorOpExists:
		op = selection.Exists
	case corev1.NodeSelectorOpDoesNotExist:
		op = selection.DoesNotExist
	case corev1.NodeSelectorOpGt:
		op = selection.GreaterThan
	case corev1.NodeSelectorOpLt:
		op = selection.LessThan
	default:
		return false
	}
	req, err := labels.NewRequirement(r.Key, op, r.Values)
	if err != nil {
		return false
	}
	return req.Matches(set)
}

// targetNode returns the node a daemon pod is for: its nodeName, or the
// node its pinning affinity names.
func targetNode(pod *corev1.Pod) string {
	if pod.Spec.NodeName != "" {
		return pod.Spec.NodeName
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}
