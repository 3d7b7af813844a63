// Package dataplane load-balances Kubernetes Services on an edge node with
// eBPF, without iptables or nftables rules.
//
// # What is balanced where
//
// Connections that start on the node are balanced at the socket layer.
// Programs on the cgroup v2 hooks of Config.CgroupPath (connect4/6,
// sendmsg4/6, recvmsg4/6, getpeername4/6) rewrite the address a socket asks
// for into a backend before the first packet exists, so every process and
// pod of the node is covered, established flows pay no per-packet NAT and
// leave no conntrack entry, and applications still see the Service address
// as their peer. This scope serves ClusterIPs (with the
// internalTrafficPolicy's backends), externalIPs and load-balancer ingress
// IPs dialled from inside the node (with all of the Service's backends, as
// kube-proxy), and NodePorts dialled on one of the node's own addresses
// (Config.NodeIPs, with the externalTrafficPolicy's backends: under Local
// this node's only, refused at once when there is none). post_bind4/6
// keep host processes from binding a port a NodePort owns.
//
// Traffic that arrives on the node's uplinks (Config.Uplinks) for a
// NodePort or an externalIP is translated per packet by tc programs
// (TCX links where the kernel has them, a clsact qdisc with cls_bpf
// otherwise): DNAT to a backend, SNAT when the backend runs on another node
// under externalTrafficPolicy Cluster, the client address kept under Local.
// These flows are IPv4 and tracked in LRU maps.
//
// Headless and ExternalName Services get nothing here (dataplane/dns
// answers for them), nor do Services labelled
// service.kubernetes.io/service-proxy-name for another proxy.
//
// # Restarts and upgrades
//
// All maps and links are pinned under Config.BPFFSPath (maps/ and links/).
// Closing a Dataplane leaves the programs attached and the maps filled, so
// Services keep working while the agent restarts or is stopped; New adopts
// what it finds and the first Sync reconciles it against the desired state.
// Uninstall removes everything. A build whose layout version (LB_LAYOUT in
// bpf/lb.h, stamped in lb_config) differs from the pinned one replaces the
// maps: the attached
// programs keep serving from the old maps until the first Sync has filled
// the new ones, then the pinned links move to the new programs.
//
// # Changes
//
// The agent feeds the Dataplane from its Service and EndpointSlice
// informers (UpsertService, UpsertEndpointSlice and the deletes). Before
// the first Sync those calls only record the desired state; Sync applies
// all of it with batch map updates and removes pinned state that is no
// longer wanted. After it every call is applied synchronously, so a change
// is in the kernel when the call returns. Observers (the DNS server) get
// the same calls.
//
// Backend-set changes are make-before-break: a frontend's backends are a
// range of consecutive slots, a changed set is written to a free range
// first, the frontend is switched to it with one map update, and the old
// range is handed out again only after the commit after next. A reader never sees a half-written
// set; one that races a reuse notices the slot's owner id and looks again.
//
// # Reading the maps
//
// The layouts are in bpf/lb.h, one struct per map; addresses are stored
// IPv4-mapped in 16 bytes and ports in network byte order. lb_frontends
// (fe_key → fe_val) is the authoritative frontend table: a key is address,
// port, protocol and scope (0 for the socket hooks, 1 for tc; a NodePort
// on the uplinks has the all-zero address). Its value's base and count name
// the frontend's range in lb_slots, where each slot is a backend. Counters
// are in lb_stats, read by [Dataplane.Stats]. `bpftool map dump pinned
// /sys/fs/bpf/tether/maps/lb_frontends` shows one table; the fast
// frontend table, the socket reverse-translation tables and the writer that
// keeps them consistent are described in README.md.
//
// The BPF sources are in bpf/; gen.go says how the committed object is
// regenerated.
package dataplane
