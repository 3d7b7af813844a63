package imagestaging

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Reasons of the Staged condition.
const (
	ReasonAllStaged   = "AllNodesStaged"
	ReasonStaging     = "Staging"
	ReasonWindowShut  = "WindowClosed"
	ReasonBadSelector = "InvalidSelector"
	ReasonBadImage    = "InvalidImage"
)

// selects reports whether s selects node; an invalid selector selects
// nothing.
func selects(sel labels.Selector, n *corev1.Node) bool {
	return sel != nil && sel.Matches(labels.Set(n.Labels))
}

// imageNames returns the names a Node reports holding.
func imageNames(n *corev1.Node) []string {
	var out []string
	for _, im := range n.Status.Images {
		out = append(out, im.Names...)
	}
	return out
}

// Aggregate computes the status of st from the Nodes of the cluster at
// now: which nodes it selects, which hold which image. old supplies the
// transition time of an unchanged condition.
func Aggregate(st *fleetapi.ImageStaging, nodes []*corev1.Node, now time.Time) fleetapi.ImageStagingStatus {
	out := fleetapi.ImageStagingStatus{ObservedGeneration: st.Generation}
	out.Conditions = append([]metav1.Condition(nil), st.Status.Conditions...)
	setCond := func(status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&out.Conditions, metav1.Condition{
			Type: fleetapi.ConditionStaged, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: st.Generation, LastTransitionTime: metav1.NewTime(now),
		})
	}
	sel := labels.Everything()
	if st.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(st.Spec.NodeSelector)
		if err != nil {
			out.Phase = fleetapi.StagingPending
			setCond(metav1.ConditionFalse, ReasonBadSelector, err.Error())
			return out
		}
		sel = s
	}
	refs := make([]string, len(st.Spec.Images))
	for i, im := range st.Spec.Images {
		r, err := fleetapi.NormalizeImage(im)
		if err != nil {
			out.Phase = fleetapi.StagingPending
			setCond(metav1.ConditionFalse, ReasonBadImage, err.Error())
			return out
		}
		refs[i] = r
	}
	counts := make([]int32, len(refs))
	for _, n := range nodes {
		if !selects(sel, n) {
			continue
		}
		out.Nodes++
		names := imageNames(n)
		all := true
		for i, r := range refs {
			if fleetapi.HoldsImage(names, r) {
				counts[i]++
			} else {
				all = false
			}
		}
		if all {
			out.Staged++
		}
	}
	for i, im := range st.Spec.Images {
		out.Images = append(out.Images, fleetapi.ImageCount{Image: im, Nodes: counts[i]})
	}
	open, werr := fleetapi.WindowOpen(st.Spec.Window, now)
	switch {
	case out.Staged == out.Nodes:
		out.Phase = fleetapi.StagingStaged
		setCond(metav1.ConditionTrue, ReasonAllStaged, "every selected node holds every image")
	case werr != nil:
		out.Phase = fleetapi.StagingWaiting
		setCond(metav1.ConditionFalse, ReasonWindowShut, werr.Error())
	case !open:
		out.Phase = fleetapi.StagingWaiting
		setCond(metav1.ConditionFalse, ReasonWindowShut, "nodes wait for the window to open")
	default:
		out.Phase = fleetapi.StagingPending
		setCond(metav1.ConditionFalse, ReasonStaging, "nodes are pulling images")
	}
	return out
}
