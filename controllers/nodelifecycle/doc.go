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
// behaviour. The dead taint is not rate-limited.
//
// What happens to a node is decided by Decide, a pure function of the
// evidence about it: the heartbeat age, the reported Ready condition,
// whether its whole site is silent, and what its site peers say of it
// through site gossip. Silent nodes are told apart:
//
//   - Partitioned: its peers see it alive. Its link to the hub is down,
//     not the node: it only gets the unreachable NoSchedule taint, and its
//     pods are neither evicted nor taken out of their Services.
//   - Dead: its peers agree it is gone, and the hub has not heard it for
//     DeadGrace (10s, well inside the grace period). It gets the
//     node.tether.io/dead NoExecute taint at once, past the zone rate
//     limits, and its pods are replaced whatever their tolerations of
//     unreachable say.
//   - SiteDark: no node of its site is heard and no peer says anything:
//     the site's uplink, most likely. Unreachable NoSchedule only, pods
//     stay ready; only pods whose toleration of the unreachable NoExecute
//     taint has tolerationSeconds (a disconnect policy with replace=true)
//     leave after it, counted from the NoSchedule taint. When every site
//     is dark, nothing leaves: that points at the hub's own link.
//   - Unreachable: the hub hears nothing and nothing else is known: as
//     upstream.
//
// The Ready condition's message says which of these the node is in.
//
// A pod's disconnect policy (package internal/disconnect) may keep the
// original for reconciliation (reconcile keepOriginal or longestRunning,
// with replace=true). When such a pod's toleration runs out on an
// unreachable or dark node it is not deleted but marked with the
// tether.io/Lost=True condition and Ready=False: the ReplicaSet controller
// does not count it, so it starts a replacement, and never picks it for
// deletion. When the node is heard again the controller settles the pair:
// with keepOriginal the replacement loses, with longestRunning the pod
// that started running last. A losing original is deleted; a losing
// replacement gets the lowest pod-deletion-cost, once the original reads
// ready, before the Lost mark is cleared, so the ReplicaSet removes
// exactly it. Only pods of ReplicaSets and ReplicationControllers take
// this path; others are evicted as keepReplacement asks.
package nodelifecycle
