// Package nodelifecycle watches node heartbeats and acts on nodes that
// stop sending them.
//
// A node whose Lease in kube-node-lease has not been renewed (and whose
// Ready condition's heartbeat has not moved) for the grace period gets its
// conditions set to Unknown, the node.kubernetes.io/unreachable NoSchedule
// and NoExecute taints, and its pods set to Ready=False; a node that
// reports Ready=False gets the node.kubernetes.io/not-ready taints. The
// taints go when the node is healthy again. A cordoned node
// (spec.unschedulable) gets the node.kubernetes.io/unschedulable
// NoSchedule taint, which goes when it is uncordoned, as upstream's
// TaintNodesByCondition does.
//
// Pods on a node with NoExecute taints are deleted as upstream's taint
// manager does: at once when they do not tolerate a taint, after the
// shortest tolerationSeconds of the tolerations they use otherwise, never
// when those tolerations have no tolerationSeconds. The 300s tolerations
// most pods carry come from the hub's admission, not from here.
//
// Adding NoExecute taints is rate-limited per zone (the
// topology.kubernetes.io/zone label, which is a tether site): EvictionRate
// nodes per second in a healthy zone, SecondaryEvictionRate in a partially
// disrupted large zone, none in a partially disrupted small one, and none
// when every zone is down, which points at the hub's own link. A zone whose
// every node is down is frozen by default, since a site going dark is
// almost always its uplink; EvictFullyDisruptedZones restores upstream's
// behaviour.
//
// What happens to a node is decided by Decide, a pure function of the
// evidence about it. Besides the heartbeat age and the reported Ready
// condition, the evidence says whether the node's site peers still see it
// alive: such a node is partitioned from the hub, not dead, and is only
// kept from new pods; its pods are neither evicted nor taken out of their
// Services.
package nodelifecycle
