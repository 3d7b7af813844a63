package edgeupgrade

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tether-edge/tether/internal/fleetapi"
)

var t0 = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

// fakeNode is a Ready amd64 node running version.
func fakeNode(name, version string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{
			NodeInfo:   corev1.NodeSystemInfo{Architecture: "amd64", KubeletVersion: "v1.37.2-tether+" + version},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
}

func asked(n *corev1.Node, up, release string, when time.Time) *corev1.Node {
	n.Annotations[fleetapi.AnnotationEdgeUpgrade] = up
	n.Annotations[fleetapi.AnnotationRelease] = release
	n.Annotations[fleetapi.AnnotationAskedAt] = when.Format(time.RFC3339)
	return n
}

func reports(n *corev1.Node, reason string, release string, when time.Time) *corev1.Node {
	st := corev1.ConditionFalse
	if reason == fleetapi.ReasonUpgraded {
		st = corev1.ConditionTrue
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: fleetapi.ConditionAgentUpgrade, Status: st,
		Reason: reason, Message: fleetapi.UpgradeMessage(release, "detail"), LastTransitionTime: metav1.NewTime(when)})
	return n
}

func rollout(name string, batch int32) *fleetapi.EdgeUpgrade {
	b := intstr.FromInt32(batch)
	return &fleetapi.EdgeUpgrade{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1},
		Spec: fleetapi.EdgeUpgradeSpec{Version: "v2", BatchSize: &b}}
}

func allReleases(string) bool               { return true }
func noOthers(string) *fleetapi.EdgeUpgrade { return nil }
func askedNames(p plan) (out []string)      { return namesOf(p, p.ask) }
func namesOf(p plan, idx []int) (out []string) {
	for _, i := range idx {
		out = append(out, p.nodes[i].node.Name)
	}
	return out
}

// TestDecideBatches: asks in name order up to the batch size, skipping
// nodes not Ready, which count against maxUnavailable.
func TestDecideBatches(t *testing.T) {
	up := rollout("r", 2)
	rel := "v2-edge-amd64"
	var nodes []*corev1.Node
	for i := range 6 {
		nodes = append(nodes, fakeNode(fmt.Sprintf("n%d", 5-i), "v1"))
	}
	p := decide(up, nodes, allReleases, noOthers, t0)
	if got := askedNames(p); !slices.Equal(got, []string{"n0", "n1"}) || p.phase != fleetapi.PhaseProgressing {
		t.Fatalf("first batch %v phase %s", got, p.phase)
	}
	// n0 upgrading, n1 done: one more starts.
	byName := map[string]*corev1.Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	asked(byName["n0"], "r", rel, t0)
	reports(asked(byName["n1"], "r", rel, t0), fleetapi.ReasonUpgraded, rel, t0.Add(time.Minute))
	byName["n1"].Status.NodeInfo.KubeletVersion = "v1.37.2-tether+v2"
	// n2 is not Ready: skipped, and unavailable.
	byName["n2"].Status.Conditions[0].Status = corev1.ConditionFalse
	p = decide(up, nodes, allReleases, noOthers, t0.Add(time.Minute))
	if p.upgraded != 1 || len(p.ask) != 0 {
		t.Fatalf("with n2 not Ready and maxUnavailable 2: asked %v, upgraded %d", askedNames(p), p.upgraded)
	}
	mu := intstr.FromString("50%")
	up.Spec.MaxUnavailable = &mu
	p = decide(up, nodes, allReleases, noOthers, t0.Add(time.Minute))
	if got := askedNames(p); !slices.Equal(got, []string{"n3"}) || p.upgrading != 2 {
		t.Fatalf("maxUnavailable 3: asked %v upgrading %d", got, p.upgrading)
	}
	if !p.wake.Equal(t0.Add(DefaultNodeTimeout)) {
		t.Fatalf("wake %v, want n0's timeout", p.wake)
	}
}

// TestDecideFailures: rolled back, refused before the request (ignored),
// timed out, no release; failures over the threshold pause; a new
// generation forgets failure marks.
func TestDecideFailures(t *testing.T) {
	up := rollout("r", 3)
	rel := "v2-edge-amd64"
	back := reports(asked(fakeNode("a", "v1"), "r", rel, t0), fleetapi.ReasonRolledBack, rel, t0.Add(time.Minute))
	old := reports(asked(fakeNode("b", "v1"), "r", rel, t0), fleetapi.ReasonRefused, rel, t0.Add(-time.Minute))
	slow := asked(fakeNode("c", "v1"), "r", rel, t0)
	arm := fakeNode("d", "v1")
	arm.Status.NodeInfo.Architecture = "arm64"
	has := func(n string) bool { return n == rel }
	now := t0.Add(10 * time.Minute)
	p := decide(up, []*corev1.Node{back, old, slow, arm}, has, noOthers, now)
	want := map[string]string{"a": fleetapi.ReasonRolledBack, "d": fleetapi.ReasonNoRelease}
	for _, np := range p.nodes {
		if np.state == failing && want[np.node.Name] != np.failure.Reason || np.state != failing && want[np.node.Name] != "" {
			t.Errorf("node %s: state %d failure %+v", np.node.Name, np.state, np.failure)
		}
	}
	if p.phase != fleetapi.PhasePaused || p.pausedReason != ReasonFailureThreshold || p.failed != 2 || p.upgrading != 2 {
		t.Fatalf("phase %s (%s), failed %d upgrading %d", p.phase, p.pausedReason, p.failed, p.upgrading)
	}
	up.Spec.FailureThreshold = 2
	p = decide(up, []*corev1.Node{back, old, slow, arm}, has, noOthers, t0.Add(DefaultNodeTimeout))
	// b and c time out; b's refusal predates its request.
	if p.failed != 4 || p.phase != fleetapi.PhasePaused || p.nodes[1].failure.Reason != fleetapi.ReasonTimedOut {
		t.Fatalf("after the timeout: failed %d phase %s", p.failed, p.phase)
	}
	// Marked failed in this generation: not asked; in the next: asked.
	m := fakeNode("e", "v1")
	m.Annotations[AnnotationFailed] = failedMark(up)
	up.Spec.FailureThreshold = 5
	if p = decide(up, []*corev1.Node{m}, has, noOthers, now); p.failed != 1 || len(p.ask) != 0 || p.phase != fleetapi.PhaseComplete {
		t.Fatalf("marked node: failed %d asked %v phase %s", p.failed, askedNames(p), p.phase)
	}
	up.Generation++
	if p = decide(up, []*corev1.Node{m}, has, noOthers, now); p.failed != 0 || len(p.ask) != 1 {
		t.Fatalf("new generation: failed %d asked %v", p.failed, askedNames(p))
	}
}

// TestDecideGates: paused, window shut, another rollout's open request,
// a node already running the version, ownership by the newest rollout.
func TestDecideGates(t *testing.T) {
	up := rollout("r", 1)
	up.Spec.Paused = true
	nodes := []*corev1.Node{fakeNode("a", "v1"), fakeNode("b", "v2")}
	if p := decide(up, nodes, allReleases, noOthers, t0); p.phase != fleetapi.PhasePaused || p.pausedReason != ReasonSpecPaused || len(p.ask) != 0 || p.upgraded != 1 {
		t.Fatalf("paused: %+v", p)
	}
	up.Spec.Paused = false
	up.Spec.Window = &fleetapi.MaintenanceWindow{Start: "13:00", Duration: metav1.Duration{Duration: time.Hour}}
	p := decide(up, nodes, allReleases, noOthers, t0)
	if p.phase != fleetapi.PhaseWaiting || len(p.ask) != 0 || !p.wake.Equal(t0.Add(time.Hour)) {
		t.Fatalf("window shut: phase %s asked %v wake %v", p.phase, askedNames(p), p.wake)
	}
	// Open: wakes at the asked node's timeout, before the window shuts.
	if p = decide(up, nodes, allReleases, noOthers, t0.Add(90*time.Minute)); len(p.ask) != 1 || !p.wake.Equal(t0.Add(90*time.Minute+DefaultNodeTimeout)) {
		t.Fatalf("window open: asked %v wake %v", askedNames(p), p.wake)
	}
	up.Spec.Window = nil

	other := rollout("o", 1)
	other.Spec.Version = "v9"
	busy := asked(fakeNode("a", "v1"), "o", "v9-edge-amd64", t0)
	others := func(n string) *fleetapi.EdgeUpgrade {
		if n == "o" {
			return other
		}
		return nil
	}
	p = decide(up, []*corev1.Node{busy}, allReleases, others, t0.Add(time.Minute))
	if len(p.ask) != 0 || p.nodes[0].state != blocked || !p.wake.Equal(t0.Add(DefaultNodeTimeout)) {
		t.Fatalf("other's open request: %+v", p)
	}
	// Once the other's request timed out, or the other is gone: asked.
	if p = decide(up, []*corev1.Node{busy}, allReleases, others, t0.Add(DefaultNodeTimeout)); len(p.ask) != 1 {
		t.Fatalf("other's request timed out: asked %v", askedNames(p))
	}
	if p = decide(up, []*corev1.Node{busy}, allReleases, noOthers, t0); len(p.ask) != 1 {
		t.Fatalf("other gone: asked %v", askedNames(p))
	}

	older, newer := rollout("z-old", 1), rollout("a-new", 1)
	older.CreationTimestamp = metav1.NewTime(t0)
	newer.CreationTimestamp = metav1.NewTime(t0.Add(time.Second))
	newer.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"site": "x"}}
	n := fakeNode("a", "v1")
	if o := owner(n, candidates([]*fleetapi.EdgeUpgrade{older, newer})); o != older {
		t.Fatalf("owner of an unlabelled node: %v", o.Name)
	}
	n.Labels["site"] = "x"
	if o := owner(n, candidates([]*fleetapi.EdgeUpgrade{older, newer})); o != newer {
		t.Fatalf("owner of a node both select: %v", o.Name)
	}
}

// TestStatus: failures capped to the latest 50, conditions by phase, a
// condition's transition time kept while its status stays.
func TestStatus(t *testing.T) {
	up := rollout("r", 1)
	for i := range 49 {
		up.Status.Failures = append(up.Status.Failures, fleetapi.NodeFailure{Node: fmt.Sprint("old-", i), Reason: fleetapi.ReasonTimedOut})
	}
	p := plan{phase: fleetapi.PhasePaused, pausedReason: ReasonFailureThreshold, pausedMessage: "too many", failed: 51,
		nodes: make([]nodePlan, 60)}
	s := status(up, p, []fleetapi.NodeFailure{{Node: "new-1"}, {Node: "new-2"}}, t0)
	if len(s.Failures) != maxFailures || s.Failures[0].Node != "old-1" || s.Failures[49].Node != "new-2" || len(up.Status.Failures) != 49 {
		t.Fatalf("failures %d: first %s last %s", len(s.Failures), s.Failures[0].Node, s.Failures[len(s.Failures)-1].Node)
	}
	want := map[string]string{ConditionProgressing: "False " + ReasonPausedRollout, ConditionPaused: "True " + ReasonFailureThreshold,
		ConditionComplete: "False " + ReasonNodesLeft}
	for _, c := range s.Conditions {
		if want[c.Type] != string(c.Status)+" "+c.Reason || !c.LastTransitionTime.Time.Equal(t0) || c.ObservedGeneration != 1 {
			t.Errorf("condition %+v", c)
		}
	}
	if s.Nodes != 60 || s.Failed != 51 || s.Phase != fleetapi.PhasePaused || s.ObservedGeneration != 1 {
		t.Fatalf("status %+v", s)
	}
	up.Status = s
	p = plan{phase: fleetapi.PhaseComplete, upgraded: 2, nodes: make([]nodePlan, 2)}
	s = status(up, p, nil, t0.Add(time.Hour))
	for _, c := range s.Conditions {
		moved := !c.LastTransitionTime.Time.Equal(t0)
		if moved != (c.Type != ConditionProgressing) {
			t.Errorf("condition %s: transition moved %v", c.Type, moved)
		}
	}
	if c := meta.FindStatusCondition(s.Conditions, ConditionComplete); c.Reason != ReasonAllUpgraded {
		t.Errorf("Complete %+v", c)
	}
}
