// Package metrics serves the resource metrics API, metrics.k8s.io/v1beta1,
// from the usage samples the edge agents push over their tunnels: what
// metrics-server serves in a Kubernetes cluster, so that kubectl top and
// the HorizontalPodAutoscaler work unchanged.
//
// A [Store] decodes each tunnel's stream of internal/usage payloads with
// a decoder of its own and keeps, in memory only, the latest sample of
// each node: no store write, no scrape. A node whose tunnel closes is
// forgotten at once, and a sample older than three of its windows (at
// least a minute) is not served, so a node that is offline reports no
// metrics rather than stale ones.
//
// [Store.Serve] answers the NodeMetrics (nodes, cluster-scoped) and
// PodMetrics (pods, namespaced) kinds of [Kinds] with get and list, as
// metrics-server does: a NodeMetrics for each Node that has a sample,
// carrying the Node's labels; a PodMetrics for each Running pod whose
// node's sample holds it, carrying the pod's labels. Label selectors
// select by the Node's or Pod's labels, field selectors by metadata.name
// and metadata.namespace. CPU is in nanocores ("n"), memory in KiB ("Ki").
package metrics
