package nodes

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/hub/apiserver"
)

// A node's agent gossips with the other nodes of its site (its
// topology.kubernetes.io/zone label): it may list and watch the Nodes of
// its own site, with a label selector that requires exactly its zone, to
// learn their gossip addresses (and read its site's gossip key Secret,
// see siteKey).

// siteZone returns node's zone label, "" when it has none or is unknown:
// from Zones when it knows the node, else from the store (a Node
// registered a moment ago may not have reached Zones yet).
func (a *Authorizer) siteZone(node string) string {
	if a.Zones != nil {
		if zone, known := a.Zones.Zone(node); known {
			return zone
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := a.cfg.Storage.Get(ctx, nodesKind, "", node)
	if err != nil {
		return ""
	}
	return n.(*corev1.Node).Labels[corev1.LabelTopologyZone]
}

// siteNodes reports whether a list or watch of Nodes selects only node's
// site.
func (a *Authorizer) siteNodes(node string, at apiserver.Attributes) bool {
	sel, err := labels.Parse(at.LabelSelector)
	if err != nil {
		return false
	}
	zone, ok := sel.RequiresExactMatch(corev1.LabelTopologyZone)
	return ok && zone != "" && zone == a.siteZone(node)
}
