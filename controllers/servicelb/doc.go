// Package servicelb gives LoadBalancer Services the addresses of the nodes,
// as k3s's ServiceLB does, without a pod per Service: the edge dataplane
// already serves a Service's status.loadBalancer.ingress IPs as frontends
// on every node, so the controller only has to say which addresses those
// are.
//
// For every Service of type LoadBalancer without spec.loadBalancerClass
// the controller sets status.loadBalancer.ingress, through the status
// subresource, to the addresses of the eligible nodes: each node's
// ExternalIPs if it has any, else its InternalIPs, sorted and without
// repeats. Eligible nodes are the Ready, schedulable ones not labelled
// node.kubernetes.io/exclude-from-external-load-balancers; when some node
// carries LabelLoadBalancer=true, only the nodes that do.
//
// All these Services share the node addresses, so a port and protocol can
// be served for one of them only: Services are admitted oldest first
// (creationTimestamp, then namespace and name), and a Service asking for a
// port an admitted one holds gets no ingress and a Warning event
// (ReasonPortConflict) until the holder goes or changes.
//
// A Service naming another loadBalancerClass is left alone. The ingress of
// a Service that is no longer a LoadBalancer is cleared only when the
// controller could have written it: every entry a bare IP that is an
// address of a Node. That of a LoadBalancer Service that has since been
// given a class is cleared on the same condition, and only if this
// controller wrote it (it remembers which Services it served while it
// runs). What another controller wrote stays.
package servicelb
