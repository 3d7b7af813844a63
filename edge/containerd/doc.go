// Package containerd is the edge agent's container runtime: it runs pods
// with containerd through its Go client (not CRI), in the containerd
// namespace "tether". Each pod gets a network namespace set up through CNI
// (libcni with the standard bridge, host-local, loopback and, where the
// agent's eBPF dataplane does not serve host ports, portmap plugins), its volumes under the agent's data directory (claims mount
// their PersistentVolume's host directory; tether's local-path volumes live
// under the local-path root), and one containerd container per container
// instance. Logs are written in the CRI
// log format with size-based rotation. What to start, restart or stop
// when, and the crash-loop back-off, edge/restarts decides.
//
// Everything the runtime needs to find its pods again lives in containerd
// (container labels) and in the data directory, so a restarted agent
// adopts the containers still running instead of restarting them.
package containerd
