// Package scheduler places pending pods on nodes, with the semantics of
// kube-scheduler's default profile.
//
// The package has two halves. The decision half (Snapshot, Decider,
// Preempt) is a pure computation over an in-memory view of the cluster: it
// does no I/O, starts no goroutines and never reads the clock, so the
// scenario files in testdata/ and the property tests can drive it directly.
// The loop half (Scheduler) keeps that view current from client-go
// informers, orders pending pods in a back-off queue, asks the decision half
// where each pod goes, and writes the outcome back through the API: the
// pods/binding subresource, PodScheduled conditions, nominated nodes,
// victim deletions and Events. The pod informer holds every pod of the
// cluster, so it keeps each as a slim copy with only what the scheduler
// reads (slimPod), about half the heap of the whole object.
//
// One goroutine owns the Snapshot and the queue. Informer callbacks and
// bind workers only post messages to it, so the decision half reads a
// consistent view without locks or copies, and a pod that was assumed onto
// a node counts against that node from the moment it was chosen until the
// binding fails or the informer reports the pod gone.
//
// README.md has the pipeline diagram and the vocabulary.
package scheduler
