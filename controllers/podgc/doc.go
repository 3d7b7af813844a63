// Package podgc is tether's pod garbage collector, which deletes pods
// nothing else will, as upstream's podgc controller does:
//
//   - pods bound to a node that no longer exists. A node missing from the
//     informer is quarantined first (40s by default) and then looked up on
//     the hub, so a node that is only briefly absent from a cache, or being
//     recreated, keeps its pods. An orphaned pod gets the DisruptionTarget
//     condition with reason DeletionByPodGC and, unless it already
//     finished, phase Failed, and is then deleted with no grace period;
//   - terminating pods that were never scheduled, which no kubelet will
//     ever finish deleting, and terminating pods of a node that is not
//     ready and carries the node.kubernetes.io/out-of-service taint; both
//     get phase Failed first, unless they finished;
//   - finished (Succeeded or Failed) pods beyond the terminated-pod
//     threshold (12500 by default), oldest first.
//
// Every pass runs on a period (20s by default); a node deletion seen by
// the informer also starts its quarantine at once, so a deleted node's
// pods go about one quarantine after it.
package podgc
