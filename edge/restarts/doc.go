// Package restarts decides what a node does next with the containers of a
// pod, as the kubelet does: which container to start, which to restart
// now, which waits out its crash-loop back-off, which sidecar to stop, and
// whether the pod's initialization failed for good. Both runtimes of the
// edge agent (edge/sim and edge/containerd) ask it, so that simulated and
// real pods follow one restart state machine.
//
// Vocabulary:
//
//   - A container has a Role: Regular (spec.containers), Init (an init
//     container that must complete) or Sidecar (an init container with
//     restartPolicy Always, which keeps running beside the regular ones).
//   - Container is what the runtime observed of one container: whether an
//     instance was created, runs, has started (its startup probe passed)
//     and how the last one exited.
//   - Decide turns the pod's restartPolicy, its containers in spec order
//     and the time into a Plan: one Step per container (Keep, Start,
//     Restart, BackOff or Stop) and whether the pod is done.
//   - Backoff is one container's crash-loop back-off: the first restart
//     after an exit is immediate, later ones wait 10s, then twice the
//     previous wait, up to 5 minutes; a container that ran for 10 minutes
//     starts over.
//
// The package does no I/O and reads no clock: the runtime passes the time
// and carries out the Plan.
package restarts
