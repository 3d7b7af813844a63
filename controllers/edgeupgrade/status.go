package edgeupgrade

import (
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Condition types of an EdgeUpgrade.
const (
	ConditionProgressing = "Progressing"
	ConditionPaused      = "Paused"
	ConditionComplete    = "Complete"
)

// Reasons of the Progressing and Complete conditions.
const (
	ReasonUpgrading     = "NodesUpgrading"
	ReasonWindowClosed  = "WindowClosed"
	ReasonNotPaused     = "NotPaused"
	ReasonNodesLeft     = "NodesLeft"
	ReasonAllUpgraded   = "AllUpgraded"
	ReasonSomeFailed    = "UpgradedWithFailures"
	ReasonPausedRollout = "Paused"
	ReasonCompleted     = "Complete"
)

// status is up's status after p, with recorded appended to its failures
// (the latest maxFailures kept); times are now.
func status(up *fleetapi.EdgeUpgrade, p plan, recorded []fleetapi.NodeFailure, now time.Time) fleetapi.EdgeUpgradeStatus {
	old := up.Status
	s := fleetapi.EdgeUpgradeStatus{
		ObservedGeneration: up.Generation,
		Phase:              p.phase,
		Nodes:              int32(len(p.nodes)),
		Upgraded:           int32(p.upgraded),
		Upgrading:          int32(p.upgrading),
		Failed:             int32(p.failed),
		Failures:           slices.Clone(old.Failures),
		Conditions:         slices.Clone(old.Conditions),
	}
	s.Failures = append(s.Failures, recorded...)
	if n := len(s.Failures); n > maxFailures {
		s.Failures = slices.Clone(s.Failures[n-maxFailures:])
	}
	at := metav1.NewTime(now.Truncate(time.Second))
	set := func(typ string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		// SetStatusCondition keeps the transition time unless the status
		// changes; the clone keeps the old status's slice untouched.
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg,
			ObservedGeneration: up.Generation, LastTransitionTime: at})
	}
	counts := fmt.Sprintf("%d of %d nodes run %s, %d upgrading, %d failed", p.upgraded, len(p.nodes), up.Spec.Version, p.upgrading, p.failed)
	switch p.phase {
	case fleetapi.PhaseProgressing:
		set(ConditionProgressing, true, ReasonUpgrading, counts)
	case fleetapi.PhaseWaiting:
		set(ConditionProgressing, false, ReasonWindowClosed, "the maintenance window is closed; "+counts)
	case fleetapi.PhasePaused:
		set(ConditionProgressing, false, ReasonPausedRollout, counts)
	case fleetapi.PhaseComplete:
		set(ConditionProgressing, false, ReasonCompleted, counts)
	}
	if p.phase == fleetapi.PhasePaused {
		set(ConditionPaused, true, p.pausedReason, p.pausedMessage)
	} else {
		set(ConditionPaused, false, ReasonNotPaused, "nodes start as the batch size, maxUnavailable and the window allow")
	}
	switch {
	case p.phase != fleetapi.PhaseComplete:
		set(ConditionComplete, false, ReasonNodesLeft, counts)
	case p.failed > 0:
		set(ConditionComplete, true, ReasonSomeFailed, counts)
	default:
		set(ConditionComplete, true, ReasonAllUpgraded, counts)
	}
	return s
}
