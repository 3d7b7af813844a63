// Package policy enforces Kubernetes NetworkPolicy (networking.k8s.io/v1)
// on an edge node in eBPF, from the node's own state, so that policies
// hold while the node is cut off from the hub or its agent is down.
//
// # Where
//
// Two cgroup_skb programs (bpf/policy.c) are attached once to the cgroup
// that parents every pod (Config.CgroupPath, the dataplane's). They see
// every packet a pod's socket sends or receives, in whatever network
// namespace the pod lives, after the socket load balancer has turned a
// Service address into a backend: policies see backends, as upstream.
//
// # How a packet is judged
//
// The local pod is the packet's address on the pod's side (the
// destination on ingress, the source on egress): tether's pods each have
// their own network namespace and address, and a container runtime places
// containers, not pods, in cgroups, so the address names the pod where a
// cgroup id would name one container. The peer's identity comes from
// pol_ids (address → identity; an identity is one namespace, label set and
// set of named ports, so that pods of one workload share entries). Then:
//
//   - pol_isolated: is the local pod isolated in this direction? If not,
//     the packet passes.
//   - pol_allow_id[(pod, peer identity, direction)] and [(pod, any peer,
//     direction)]: the port ranges allowed, per protocol.
//   - pol_allow_cidr, an LPM trie on (pod, direction, peer address): the
//     port ranges the ipBlocks allow. Excepts are longer prefixes whose
//     entries allow what the blocks not excepting them allow (Compile
//     computes each prefix's union), often nothing.
//
// That is at most three hash lookups and one trie lookup per judged
// packet, whatever the number of policies: entries are keyed by pod and
// peer, never scanned by rule.
//
// TCP is judged at the opening of a connection only (a SYN without ACK),
// so replies need no state and connections established before a policy
// change keep working, as with iptables-based plugins that accept
// ESTABLISHED traffic. Other protocols are judged per flow; an allowed
// flow goes into pol_ct (an LRU table) so that its replies pass. Traffic
// from the node's own addresses into its pods (kubelet probes) is always
// allowed; a pod may always reach itself.
//
// # Changes
//
// Compile is a pure function from pods, namespaces and policies to map
// contents (Rules). Enforcer.Apply writes the differences from what the
// maps hold, allows before isolation and removals last, so a change never
// opens more than the old or the new rules allow. Maps and links are
// pinned below Config.BPFFSPath/policy: a stopped agent leaves its last
// rules in force, and New adopts them (reading the maps back, so the first
// Apply writes only what changed).
//
// Not enforced: IPv6 traffic (it passes), and SCTP beyond its ports.
package policy
