// Package dataplane load-balances Kubernetes Services on an edge node with
// eBPF, without iptables or nftables rules.
//
// # What is balanced where
//
// Connections that start on the node (its processes and pods) are balanced
// at the socket layer: programs on the cgroup v2 hooks of Config.CgroupPath
// rewrite the address that connect or sendmsg asks for into a backend, and
// getpeername and recvmsg show the Service address again. This serves
// ClusterIPs, externalIPs and load-balancer IPs, and NodePorts dialled on
// one of Config.NodeIPs, or on 127.0.0.1 or ::1 in the node's own network
// namespace (the programs compare the socket's namespace cookie with the
// node's; a pod's loopback stays its own); post_bind keeps host processes
// off NodePorts.
// Traffic that arrives on Config.Uplinks for a NodePort or an externalIP
// is translated per packet by tc programs (DNAT, and SNAT when the backend
// runs on another node under externalTrafficPolicy Cluster). The same
// programs masquerade the connections the node's pods open beyond the
// node (Config.Masquerade): TCP, UDP and ICMP echoes take a node address
// and port, and replies and ICMP errors about them go back to the pod. Headless and
// ExternalName Services are answered by dataplane/dns; Services labelled
// service.kubernetes.io/service-proxy-name belong to another proxy. Pods'
// host ports (SetHostPorts) are frontends like NodePorts with the pod as
// their only, local backend (hostports.go).
//
// # Maps
//
// The layouts are in bpf/lb.h. lb_frontends is the authoritative frontend
// table, keyed by address, port, protocol and scope (socket hooks or tc);
// its value names a range of lb_slots, one slot per backend. lb_fe_fast
// holds copies of the socket-scope frontends, with up to ten backends
// inline, in an array the socket hooks read first. lb_backends and
// lb_affinity serve ClientIP session affinity. lb_sk_rev, lb_sk_rnat and
// lb_sock_rnat hold the reverse translations of sockets, lb_ct4 and
// lb_rct4 the flows of the tc programs. lb_node_ips, lb_config and
// lb_stats hold the node's addresses, settings and counters.
//
// # Changes
//
// The agent calls UpsertService, UpsertEndpointSlice and the deletes from
// its informers. Before the first Sync they only record the desired state;
// Sync writes all of it and removes pinned state nobody wants. After it
// every call is in the kernel when it returns. Changes are
// make-before-break: a changed backend set is written to a free range of
// slots, the frontend is switched to it with one map update, and the old
// range is reused only after the commit after next.
//
// The socket hooks read lb_fe_fast without locks, under a sequence count
// per line. Its lines are written by fast_write, an XDP program that the
// agent runs with BPF_PROG_TEST_RUN, because a map update from user space
// copies a line, count included, in no particular order, which the count
// cannot guard. Writing through a shared mapping instead costs a mapping
// of the table per change (the benchmark's change p99 went from about
// 0.1 ms to 10 ms) or the whole table in the agent's memory.
//
// # Restarts and upgrades
//
// Maps and links are pinned under Config.BPFFSPath. Closing a Dataplane
// leaves the programs attached and the maps filled, so Services keep
// working while the agent is down; New adopts the pins and the first Sync
// reconciles them. Uninstall removes everything. The map layouts carry
// one version, LB_LAYOUT in bpf/lb.h, stamped in lb_config. A build of
// another version replaces every map but those of open connections, which
// it keeps while their sizes match; a changed MapSizes replaces the maps
// it resizes (lb_sk_rev keeps its size). Replacement is make-before-break
// too: the attached
// programs keep serving from the old maps until the first Sync has filled
// the new ones, then the pinned links move to the new programs.
//
// README.md has a diagram and the vocabulary; gen.go says how the
// committed BPF object is regenerated.
package dataplane
