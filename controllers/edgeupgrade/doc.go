// Package edgeupgrade is the rollout controller: it carries out the
// fleet.tether.io EdgeUpgrades (package fleetapi), asking the agents of
// the nodes each selects to run a version, a few nodes at a time, and
// following what they report. It has no upstream counterpart.
//
// It talks to agents only through their Node objects. To ask a node it
// sets the annotations fleetapi.AnnotationRelease (the Release of the
// version for the node's architecture and build: its
// fleet.tether.io/build label, "edge" when absent),
// fleetapi.AnnotationEdgeUpgrade, fleetapi.AnnotationAskedAt and
// fleetapi.AnnotationBandwidthLimit (spec.bandwidthLimit; removed when
// the rollout sets none), then
// nudges the agent with POST nodes/NAME/proxy/status/resend so that it
// reads its Node at once (an agent out of reach reads it at its next
// status write). The agent reports in the Node condition
// fleetapi.ConditionAgentUpgrade, and runs the version once its kubelet
// version ends in "+VERSION".
//
// Each sync of a rollout classifies its nodes (plan.go: classify, decide,
// pure functions of the rollout, its nodes, the Releases held and the
// clock):
//
//   - done: the node runs the version and, when asked, reports Upgraded
//     for the release; a node that ran the version before is never asked.
//   - upgrading: asked, not done, not failed.
//   - failing: the agent reported RolledBack or Refused for the release
//     since it was asked, or spec.nodeTimeout passed (TimedOut), or the
//     hub holds no Release for the node (NoRelease, without asking). The
//     controller withdraws its request (release and asked-at removed, so
//     the agent does not retry on its own), marks the node with
//     AnnotationFailed for the rollout's generation and records the
//     failure in status.failures (the latest 50).
//   - failed: marked in this generation; not asked again until the spec
//     changes. Every edit of the spec (a new generation) is a fresh
//     attempt: failure marks of earlier generations no longer count.
//   - blocked: another existing rollout's request on the node is open.
//   - pending: the rest; asked in name order when Ready, while fewer than
//     the batch size are upgrading and fewer than maxUnavailable of the
//     rollout's nodes are not Ready or upgrading, the rollout is not
//     paused and its window is open.
//
// A node selected by several rollouts belongs to the newest only (by
// creation time, then name), so that an older rollout never takes back a
// node a newer one moved on. Phases: Paused (spec.paused, more failures
// than spec.failureThreshold, or an invalid spec), Complete (no node left
// to ask or upgrading), Waiting (the window is shut), else Progressing.
// The controller looks again at timeouts and at the window's opening and
// closing (work queue delays on Config.Clock).
//
// One worker syncs every rollout, so two never decide on a node at once;
// a node the controller wrote is not decided on again until the node
// informer shows the write (or 30 s pass).
package edgeupgrade
