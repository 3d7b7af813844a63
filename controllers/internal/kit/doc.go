// Package kit holds what tether's controllers share: the one work queue
// and the one event writer they all use, and the pieces the workload
// controllers (ReplicaSet, Deployment, StatefulSet, DaemonSet, Job) need
// to turn a desired count into pods without racing their informer cache.
//
//   - [Queue] is the work queue of every controller: a rate-limited,
//     deduplicating queue of namespace/name keys that [Queue.Run] hands to
//     a fixed number of workers, never one key to two at once. What a sync
//     returns decides the key's fate: nil forgets it, [RequeueAfter] syncs
//     it again after a delay without counting a failure (a CronJob's next
//     start time, a namespace whose content is still going away), any
//     other error retries it after a back-off that grows with each failure
//     in a row. The back-off is upstream's default (5ms doubling to 1000s,
//     under 10 qps overall) unless [WithBackoff] sets a controller's own;
//     [WithClock] runs delays on a test clock while back-off stays in real
//     time. [TypedQueue] is the same queue for keys of another type, such
//     as the garbage collector's.
//
//   - [Recorder] writes core/v1 Events through client-go's record
//     broadcaster, as upstream controllers do: its EventCorrelator counts
//     repeats, combines similar events and rate-limits each object, and a
//     full queue drops events rather than block a sync.
//
//   - [Expectations] remembers the creates and deletes a controller has
//     sent for a key and not yet seen in its informer, so a sync does not
//     act twice on a stale cache. Expectations expire after a timeout, so a
//     lost event never wedges a controller.
//
//   - [PodControl] creates pods from a template with a controller owner
//     reference and deletes pods, recording SuccessfulCreate, FailedCreate,
//     SuccessfulDelete and FailedDelete events.
//
//   - [Claim] adopts matching orphans and releases objects whose labels no
//     longer match, with the checks that keep adoption safe.
//
//   - [IsPodReady], [IsPodAvailable] and friends read pod status.
//
//   - [HashObject] and the ControllerRevision functions name and order
//     template revisions for StatefulSets and DaemonSets.
//
// Nothing here talks to the hub except through the kubernetes.Interface it
// is given. Every function is safe for concurrent use unless its doc says
// otherwise; objects passed in are never mutated.
package kit
