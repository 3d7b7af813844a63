package edgeupgrade

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// AnnotationFailed on a Node marks it failed in one generation of one
// EdgeUpgrade: its value is failedMark of that rollout. The controller
// sets it when it gives up on the node, and removes it when it asks the
// node again; while it names the rollout's current generation the node
// is not asked again. Removing it by hand retries the node.
const AnnotationFailed = fleetapi.Group + "/failed"

// DefaultNodeTimeout is a node's time to run the version once asked when
// spec.nodeTimeout is absent.
const DefaultNodeTimeout = 15 * time.Minute

// maxFailures is how many failure records status.failures keeps.
const maxFailures = 50

// state is what a rollout makes of one of its nodes.
type state int

const (
	// pending: not asked yet (or asked by an earlier spec for another
	// release); askable when Ready.
	pending state = iota
	// blocked: another rollout's request is open on the node.
	blocked
	upgrading
	done
	// failed: failed earlier in this generation.
	failed
	// failing: fails now; the controller records it and withdraws its
	// request.
	failing
)

// nodePlan is one node of a rollout and what to do with it.
type nodePlan struct {
	node    *corev1.Node
	release string // the target Release; "" when the node names no architecture
	state   state
	ready   bool
	// asked: the node carries this rollout's request for release.
	asked bool
	// deadline: upgrading, when it times out; blocked, when the other
	// rollout's request on it does.
	deadline time.Time
	// failure: failing, its record.
	failure fleetapi.NodeFailure
}

// plan is what one sync of a rollout decides.
type plan struct {
	nodes []nodePlan
	// ask are the indexes in nodes of the nodes to ask now.
	ask []int
	// upgraded, upgrading and failed count nodes after the asks.
	upgraded, upgrading, failed int
	phase                       string
	// pausedReason is why phase is Paused; pausedMessage says more.
	pausedReason, pausedMessage string
	// windowClosed: nodes are left and the window is shut.
	windowClosed bool
	// wake is when the rollout must be looked at again, if no event
	// comes first: a timeout, the window opening or closing. Zero: none.
	wake time.Time
}

// Reasons of the Paused condition and of the controller's events.
const (
	ReasonSpecPaused       = "SpecPaused"
	ReasonFailureThreshold = "FailureThreshold"
	ReasonInvalidSpec      = "InvalidSpec"
)

// Runs reports whether node runs version: its kubelet version ends in
// "+" and the version ("v1.37.2-tether+v1.4.0").
func Runs(node *corev1.Node, version string) bool {
	return version != "" && strings.HasSuffix(node.Status.NodeInfo.KubeletVersion, "+"+version)
}

// Ready reports whether node's Ready condition is True.
func Ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Build is the build of tether node's agent runs, from its label;
// fleetapi.BuildEdge when unlabelled.
func Build(node *corev1.Node) string {
	if b := node.Labels[fleetapi.LabelBuild]; b != "" {
		return b
	}
	return fleetapi.BuildEdge
}

// TargetRelease is the Release node is to run for version: of its
// architecture and build; "" when the node reports no architecture yet.
func TargetRelease(node *corev1.Node, version string) string {
	arch := node.Status.NodeInfo.Architecture
	if arch == "" {
		return ""
	}
	return fleetapi.ReleaseName(version, Build(node), arch)
}

// upgradeCondition returns node's AgentUpgrade condition, or nil.
func upgradeCondition(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == fleetapi.ConditionAgentUpgrade {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// nodeTimeout is up's spec.nodeTimeout or its default.
func nodeTimeout(up *fleetapi.EdgeUpgrade) time.Duration {
	if t := up.Spec.NodeTimeout; t != nil && t.Duration > 0 {
		return t.Duration
	}
	return DefaultNodeTimeout
}

// failedMark is the value of AnnotationFailed for up's generation.
func failedMark(up *fleetapi.EdgeUpgrade) string {
	return fmt.Sprintf("%s/%d/%s", up.Name, up.Generation, up.UID)
}

// askedAt returns when node was asked for release by the rollout named
// upgrade, if it carries that request.
func askedAt(node *corev1.Node, upgrade, release string) (time.Time, bool) {
	a := node.Annotations
	if release == "" || a[fleetapi.AnnotationEdgeUpgrade] != upgrade || a[fleetapi.AnnotationRelease] != release {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, a[fleetapi.AnnotationAskedAt])
	return t, err == nil
}

// outcome is where node stands on a request for release made at asked,
// by a rollout of version with timeout: done, failing (with reason and
// message) or still upgrading until the returned deadline.
func outcome(node *corev1.Node, version, release string, asked time.Time, timeout time.Duration, now time.Time) (st state, reason, message string, deadline time.Time) {
	deadline = asked.Add(timeout)
	if c := upgradeCondition(node); c != nil && fleetapi.UpgradeRelease(c.Message) == release {
		switch {
		case c.Reason == fleetapi.ReasonUpgraded && c.Status == corev1.ConditionTrue && Runs(node, version):
			return done, "", "", deadline
		case fleetapi.Failed(c.Reason) && !c.LastTransitionTime.Time.Before(asked):
			return failing, c.Reason, c.Message, deadline
		}
	}
	if !now.Before(deadline) {
		return failing, fleetapi.ReasonTimedOut, fmt.Sprintf("%s: not running healthily %v after being asked", release, timeout), deadline
	}
	return upgrading, "", "", deadline
}

// classify says where node stands in rollout up at now. hasRelease
// reports whether a Release exists; other returns another existing
// rollout by name, or nil.
func classify(up *fleetapi.EdgeUpgrade, node *corev1.Node, hasRelease func(string) bool,
	other func(string) *fleetapi.EdgeUpgrade, now time.Time) nodePlan {
	version := up.Spec.Version
	p := nodePlan{node: node, release: TargetRelease(node, version), ready: Ready(node)}
	if at, ok := askedAt(node, up.Name, p.release); ok {
		p.asked = true
		st, reason, msg, deadline := outcome(node, version, p.release, at, nodeTimeout(up), now)
		p.state, p.deadline = st, deadline
		if st == failing {
			p.failure = fleetapi.NodeFailure{Node: node.Name, Release: p.release, Reason: reason, Message: msg}
		}
		return p
	}
	switch {
	case Runs(node, version):
		p.state = done
	case node.Annotations[AnnotationFailed] == failedMark(up):
		p.state = failed
	case p.release == "":
		p.state = pending
	case !hasRelease(p.release):
		p.state = failing
		p.failure = fleetapi.NodeFailure{Node: node.Name, Release: p.release, Reason: fleetapi.ReasonNoRelease,
			Message: fmt.Sprintf("the hub holds no release %s (version %s, build %s, arch %s)",
				p.release, version, Build(node), node.Status.NodeInfo.Architecture)}
	default:
		p.state = pending
		if d, open := openElsewhere(node, up.Name, other, now); open {
			p.state, p.deadline = blocked, d
		}
	}
	return p
}

// openElsewhere reports whether another existing rollout's request on
// node is still open, and until when at the latest.
func openElsewhere(node *corev1.Node, self string, other func(string) *fleetapi.EdgeUpgrade, now time.Time) (time.Time, bool) {
	name := node.Annotations[fleetapi.AnnotationEdgeUpgrade]
	release := node.Annotations[fleetapi.AnnotationRelease]
	if name == "" || name == self || release == "" {
		return time.Time{}, false
	}
	o := other(name)
	if o == nil {
		return time.Time{}, false
	}
	at, ok := askedAt(node, name, release)
	if !ok {
		return time.Time{}, false
	}
	st, _, _, deadline := outcome(node, o.Spec.Version, release, at, nodeTimeout(o), now)
	return deadline, st == upgrading
}

// candidate is a rollout that may own nodes, with its parsed selector.
type candidate struct {
	up  *fleetapi.EdgeUpgrade
	sel labels.Selector
}

// candidates are the rollouts of ups that may own nodes: not being
// deleted, with a valid selector.
func candidates(ups []*fleetapi.EdgeUpgrade) []candidate {
	var out []candidate
	for _, up := range ups {
		if up.DeletionTimestamp != nil {
			continue
		}
		if sel, err := selector(up); err == nil {
			out = append(out, candidate{up, sel})
		}
	}
	return out
}

// owner returns which of cands owns node: the newest (by creation, then
// name) whose selector selects it, or nil. A node belongs to one rollout
// only, so that an older rollout never takes back a node a newer one
// moved to another version.
func owner(node *corev1.Node, cands []candidate) *fleetapi.EdgeUpgrade {
	var best *fleetapi.EdgeUpgrade
	set := labels.Set(node.Labels)
	for _, c := range cands {
		if c.sel.Matches(set) && (best == nil || newer(c.up, best)) {
			best = c.up
		}
	}
	return best
}

func newer(a, b *fleetapi.EdgeUpgrade) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

func selector(up *fleetapi.EdgeUpgrade) (labels.Selector, error) {
	if up.Spec.NodeSelector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(up.Spec.NodeSelector)
}

// decide plans one sync of up over its nodes (those it owns, in any
// order) at now.
func decide(up *fleetapi.EdgeUpgrade, nodes []*corev1.Node, hasRelease func(string) bool,
	other func(string) *fleetapi.EdgeUpgrade, now time.Time) plan {
	var p plan
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	win, werr := parseWindow(up.Spec.Window)
	_, serr := selector(up)
	wake := func(t time.Time) {
		if !t.IsZero() && (p.wake.IsZero() || t.Before(p.wake)) {
			p.wake = t
		}
	}
	unavailable, left := 0, 0
	for _, n := range nodes {
		np := classify(up, n, hasRelease, other, now)
		p.nodes = append(p.nodes, np)
		switch np.state {
		case done:
			p.upgraded++
		case failed, failing:
			p.failed++
		case upgrading:
			p.upgrading++
			left++
			wake(np.deadline)
		case blocked:
			left++
			wake(np.deadline)
		case pending:
			left++
		}
		if !np.ready || np.state == upgrading {
			unavailable++
		}
	}
	threshold := int(up.Spec.FailureThreshold)
	switch {
	case werr != nil || serr != nil:
		p.phase, p.pausedReason = fleetapi.PhasePaused, ReasonInvalidSpec
		p.pausedMessage = fmt.Sprint(errorsOf(werr, serr))
		return p
	case p.failed > threshold:
		p.phase, p.pausedReason = fleetapi.PhasePaused, ReasonFailureThreshold
		p.pausedMessage = fmt.Sprintf("%d nodes failed, more than the failureThreshold of %d; edit the spec to try the failed nodes again", p.failed, threshold)
		return p
	case left == 0:
		p.phase = fleetapi.PhaseComplete
		return p
	case up.Spec.Paused:
		p.phase, p.pausedReason = fleetapi.PhasePaused, ReasonSpecPaused
		p.pausedMessage = "spec.paused is set: no node starts; those upgrading finish"
		return p
	}
	if open, closes := win.open(now); !open {
		p.phase, p.windowClosed = fleetapi.PhaseWaiting, true
		wake(win.next(now))
		return p
	} else if !closes.IsZero() {
		wake(closes)
	}
	p.phase = fleetapi.PhaseProgressing
	lim := limitsFor(up.Spec.BatchSize, up.Spec.MaxUnavailable, len(nodes))
	for i, np := range p.nodes {
		if p.upgrading >= lim.batch || unavailable >= lim.maxUnavailable {
			break
		}
		if np.state != pending || !np.ready || np.release == "" {
			continue
		}
		p.ask = append(p.ask, i)
		p.upgrading++
		unavailable++
		wake(now.Add(nodeTimeout(up)))
	}
	return p
}

// errorsOf joins the non-nil of errs.
func errorsOf(errs ...error) string {
	var s []string
	for _, err := range errs {
		if err != nil {
			s = append(s, err.Error())
		}
	}
	return strings.Join(s, "; ")
}
