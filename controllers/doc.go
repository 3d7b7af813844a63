// Package controllers runs the hub's built-in controllers. Its [Manager]
// discovers the served resources, starts the shared informers and runs the
// controllers selected with kube-controller-manager's --controllers syntax:
// the two generic ones of this package, and those of the sub-packages
// (replicaset, deployment, statefulset, daemonset, batch, endpoints,
// nodelifecycle, podgc, disruption, volume, serviceaccount).
//
// The generic ones are the garbage collector, which deletes dependents
// whose owners are gone and carries out foreground and orphan propagation,
// and the namespace controller, which empties a terminating namespace and
// then releases it. They find every served resource through discovery and
// watch each with a shared metadata informer, so a kind added to the hub
// needs no code here.
//
// The controllers talk to the hub only through the Kubernetes API with
// client-go. Work is level-based: events put keys on rate-limited work
// queues, and each worker reads the current state before acting.
//
// Every controller here and below uses one work queue, kit.Queue, and
// writes events one way, kit.Recorder over client-go's record
// broadcaster; the package kit describes both.
package controllers
