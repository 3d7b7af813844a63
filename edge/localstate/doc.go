// Package localstate holds the edge agent's kept informers: informers whose
// objects live in the node's local state file (edge/state) as well as in
// memory, so that the agent runs what its node must run without the hub
// and picks its watches up where they stopped.
//
// Vocabulary:
//
//   - local state — the SQLite file of edge/state in the agent's data
//     directory: objects per kind and UID, and the resourceVersion of each
//     watch by the watch's name. A [State] is an agent's handle on it.
//   - kept informer — a cache.Controller and its store made by
//     [NewInformer]: at construction it loads its objects from the local
//     state into the store, so that sources and the data plane have them
//     before any request to the hub; when it runs it hands them to its
//     handlers first.
//   - keep spec — a [Spec]: which State a kept informer writes to, the kind
//     its objects are stored under, the name its watch's resourceVersion is
//     stored under, the one object it is restricted to (if any), whether
//     deleted objects leave tombstones, and what to call at load.
//   - persisted before acted on — every event is written to the local
//     state, with the watch's new resourceVersion, in one transaction before
//     the store and the handlers see it. A crash in between is harmless:
//     the next start acts on what was written. Bookmarks only move the
//     stored resourceVersion, lazily, and so do updates that the Spec's
//     Changed says changed nothing that must outlive a restart (a site
//     peer's Node whose conditions moved, say): on a node's flash storage
//     such updates would each cost a synchronous write.
//   - resume — the watch starts from the stored resourceVersion, so a
//     reconnect, a hub restart or an agent restart lists nothing while the
//     hub's change log still covers the gap.
//   - relist on 410 Gone — only a watch the hub can no longer serve makes
//     the informer list; the list replaces what the local state holds:
//     objects gone from the hub are deleted (or left as tombstones) and the
//     handlers hear of it; unchanged objects are not touched.
//   - tombstone — the record a deleted object leaves when its Spec asks for
//     tombstones (the pod watch), until the agent forgets it; tombstones
//     found at load are handed to Spec.OnTombstone.
//   - reconnected — [State.Reconnected]: the tunnel is up again, so kept
//     informers waiting out a retry delay try again at once.
//   - forget — [State.Forget]: drops a watch of one object and its object
//     once nothing needs them.
//
// The agent (package edge) composes this package: it opens the State,
// builds a Spec per kept watch and gives the informers its handlers. Its
// own records in the same file (the node's pod ranges, static pods,
// local-path volumes, the removal of tombstones) stay in edge.
// [State]'s Options carry AfterPersist, which the agent's tests use to stop
// an agent between a write and the action on it.
package localstate
