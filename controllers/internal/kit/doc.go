// Package kit holds what tether's workload controllers (ReplicaSet,
// Deployment, StatefulSet, DaemonSet, Job) share: the pieces every one of
// them needs to turn a desired count into pods without racing its own
// informer cache.
//
//   - [Expectations] remembers the creates and deletes a controller has
//     sent for a key and not yet seen in its informer, so a sync does not
//     act twice on a stale cache. Expectations expire after a timeout, so a
//     lost event never wedges a controller.
//   - [PodControl] creates pods from a template with a controller owner
//     reference and deletes pods, recording SuccessfulCreate, FailedCreate,
//     SuccessfulDelete and FailedDelete events.
//   - [Recorder] writes core/v1 Events from a bounded buffer, folding
//     repeats into a count and rate-limiting each object's events so a large
//     scale-up does not flood the hub.
//   - [Queue] is a rate-limited work queue of namespace/name keys with a
//     fixed number of workers.
//   - [Claim] adopts matching orphans and releases objects whose labels no
//     longer match, with the checks that keep adoption safe.
//   - [IsPodReady], [IsPodAvailable] and friends read pod status.
//   - [HashObject] and the ControllerRevision functions name and order
//     template revisions for StatefulSets and DaemonSets.
//
// Nothing here talks to the hub except through the kubernetes.Interface it
// is given. Every function is safe for concurrent use unless its doc says
// otherwise; objects passed in are never mutated.
package kit
