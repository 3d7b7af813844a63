// Package edge is tether's node agent. An [Agent] joins a hub once with a
// join token, then identifies itself with the node certificate it obtained;
// it keeps one tunnel connection to the hub and talks to the hub's
// Kubernetes API only through it. Over that API it registers its Node,
// reports the Node's status, watches the pods bound to it and the objects
// they reference, runs those pods through a [Runtime] and reports their
// status as the kubelet does. The hub reaches the agent's node server
// (health, metrics, the pod list, container logs) through streams it opens
// on the same tunnel, so nothing listens on the node's network.
//
// The agent is a library so that one process can run many of them (hollow
// nodes in testbench/hollow); everything an agent owns hangs off its
// [Agent] value, and agents share nothing.
//
// The agent keeps what its node runs (pods, the ConfigMaps, Secrets and
// PersistentVolumeClaims they reference and the volumes bound to those,
// static pods, Services and EndpointSlices, the node's pod ranges) and the
// resourceVersion of each watch in a local SQLite file (edge/state),
// written before it acts on any change. It starts the node's pods from it
// without waiting for the hub, and resumes its watches from it when the hub
// answers again.
//
// With Config.Ingress the agent also runs the built-in ingress controller
// (edge/ingress, ingresses.go), fed from kept watches of Ingresses,
// IngressClasses and their TLS Secrets and from the Service watches.
//
// Static pods come from manifest files on the node (edge/staticpods,
// staticpods.go); the hub sees each through a mirror pod the agent keeps
// (mirror.go).
//
// Runtimes live in sub-packages: edge/sim runs pods without containers.
// The agent composes the other sub-packages: edge/identity keeps the
// node's key and certificate; edge/streaming is the node server;
// edge/staticpods reads the static pod manifests; edge/localstate holds
// the kept informers, which load from, write to and resume from the local
// state file (edge/state).
package edge
