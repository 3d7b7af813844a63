// Package fleetapi is what the hub, its rollout controller and the edge
// agents share about upgrading agents over the tunnel: the kinds of the
// fleet.tether.io API group (Release, EdgeUpgrade) as Go types and as the
// CustomResourceDefinitions the hub serves them through, the Node
// annotation and condition that carry an upgrade between the controller
// and an agent, the statement a hub signs for each release and its check,
// the format of binary deltas, and the paths releases are downloaded from.
//
// Its nouns:
//
//   - A release is one executable of tether (the full build or the edge
//     build, for one architecture) that the hub holds: its bytes in the
//     hub's release store and a Release object naming version,
//     architecture, build, digest and size, signed by the hub.
//   - The signer is a key of the hub's with a code-signing certificate
//     issued by the cluster's CA, which every agent holds since it joined;
//     an agent trusts a release whose statement that certificate signed.
//   - An EdgeUpgrade is a rollout: a version, the nodes it applies to, and
//     how fast and when it may go.
//   - The target of a node is the Release the controller set in its
//     AnnotationRelease; the agent reports its progress towards it in
//     the node's ConditionAgentUpgrade.
//   - A delta is a release's bytes compressed with zstd against an older
//     release as a raw dictionary: an agent that runs that older release
//     downloads the delta instead of the whole executable.
package fleetapi
