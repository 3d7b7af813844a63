// Package kube is the edge agent's client of the hub's Kubernetes API: a
// rest.RESTClient per API group over a scheme that holds only the kinds
// the agent reads and writes (core/v1, discovery/v1, networking/v1,
// node/v1 and the TokenRequest of authentication/v1).
//
// It exists for the size of the edge-only binary. client-go's typed
// clients decode through k8s.io/client-go/kubernetes/scheme, which
// registers every API group Kubernetes has, and carry the apply
// configurations of every kind; linking one of them costs the agent more
// than a dozen megabytes it never uses. The requests are the typed
// clients': the same verbs, paths, query parameters, content types (the
// config's, protobuf for the agent) and rate limits, so informers, watches
// and the hub's view of the node do not change.
//
// A [Resource] is the client of one kind, in one namespace, in all of them
// (namespace "") or cluster-scoped; its methods have the signatures of
// client-go's typed ones, so code written against those reads the same.
// [Client.Events] is a sink for client-go's event broadcaster
// (k8s.io/client-go/tools/record), which does not need the typed clients.
package kube
