package fleet

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Rollout is an EdgeUpgrade as the page shows it.
type Rollout struct {
	Name, Version, Phase string
	Nodes, Upgraded      int32
	Upgrading, Failed    int32
	// LastFailure says which node failed last and why; "" when none did.
	LastFailure string
	Created     time.Time
}

// Done says the rollout needs no look: every node it selects runs its
// version.
func (r Rollout) Done() bool { return r.Phase == fleetapi.PhaseComplete && r.Failed == 0 }

// shownDone bounds the finished rollouts the page lists, the latest.
const shownDone = 5

// Rollouts lists the EdgeUpgrades, those under way or in need of a look
// first (paused ones before the others), then the latest finished ones.
func Rollouts(ups []*fleetapi.EdgeUpgrade) []Rollout {
	var open, done []Rollout
	for _, u := range ups {
		r := Rollout{Name: u.Name, Version: u.Spec.Version, Phase: cmp.Or(u.Status.Phase, "Pending"),
			Nodes: u.Status.Nodes, Upgraded: u.Status.Upgraded, Upgrading: u.Status.Upgrading, Failed: u.Status.Failed,
			Created: u.CreationTimestamp.Time}
		if n := len(u.Status.Failures); n > 0 {
			f := u.Status.Failures[n-1]
			r.LastFailure = f.Node + ": " + f.Reason
			if f.Message != "" {
				r.LastFailure += ": " + f.Message
			}
		}
		if r.Done() {
			done = append(done, r)
		} else {
			open = append(open, r)
		}
	}
	slices.SortFunc(open, func(a, b Rollout) int {
		return cmp.Or(cmp.Compare(phaseRank(a.Phase), phaseRank(b.Phase)), b.Created.Compare(a.Created), cmp.Compare(a.Name, b.Name))
	})
	slices.SortFunc(done, func(a, b Rollout) int { return cmp.Or(b.Created.Compare(a.Created), cmp.Compare(a.Name, b.Name)) })
	return append(open, done[:min(len(done), shownDone)]...)
}

func phaseRank(p string) int {
	switch p {
	case fleetapi.PhasePaused:
		return 0
	case fleetapi.PhaseProgressing:
		return 1
	case fleetapi.PhaseWaiting:
		return 2
	}
	return 3
}

// upgradeOf is what a node's AgentUpgrade condition says while an upgrade
// is under way or failed ("" once upgraded, or without one).
func upgradeOf(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == fleetapi.ConditionAgentUpgrade && c.Reason != fleetapi.ReasonUpgraded {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// edgeUpgradeOf reads an EdgeUpgrade the dynamic informer holds; objects
// it cannot read are left out.
func edgeUpgradeOf(o any) (*fleetapi.EdgeUpgrade, bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	var up fleetapi.EdgeUpgrade
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &up); err != nil {
		return nil, false
	}
	return &up, true
}
