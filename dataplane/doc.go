// Package dataplane load-balances Kubernetes Services on an edge node with
// eBPF, without iptables or nftables rules.
//
// East-west traffic (pods and host processes dialling a ClusterIP) is
// balanced at the socket layer: programs on the cgroup v2 hooks connect4/6,
// sendmsg4/6, recvmsg4/6 and getpeername4/6 rewrite the address a socket asks
// for into a backend before the first packet exists, so established flows pay
// no per-packet NAT and leave no conntrack entry, and applications still see
// the ClusterIP as their peer. The same hooks answer NodePorts that the node's
// own processes and pods dial on a node address (Config.NodeIPs): each
// NodePort has a socket-scope frontend per node address with the backends of
// its externalTrafficPolicy (Local: this node's only, refused at once when
// there is none): those connections never cross the uplink, where the tc
// programs are. post_bind4/6 keep host processes off NodePorts.
//
// North-south traffic (NodePort, externalIPs) is translated per packet by tc
// programs on the node's uplinks (TCX links where the kernel has them, a
// clsact qdisc with cls_bpf otherwise): DNAT to a backend, SNAT when the
// backend runs on another node under externalTrafficPolicy Cluster, the
// client address kept under Local.
//
// All maps and links are pinned in bpffs. Closing a Dataplane leaves the
// programs attached and the maps filled, so traffic keeps flowing while the
// agent restarts; New adopts what it finds and the first Sync reconciles it
// against the desired state. Backend-set changes are make-before-break: the
// new backend set is written to a free range of the slot array first, then
// the frontend is switched to it with one atomic map update, and the old
// range is reused only commits later.
//
// The connect path touches few cache lines and allocates nothing. The
// frontend is looked up in lb_fe_fast, an array of lines indexed by a hash
// of address, port and protocol (a key may take any of three lines), whose
// 64-byte entries, one cache line each, also hold the backends of Services
// with up to ten IPv4 backends on one port and one /16; other sets are one
// array access into lb_slots away. The
// reverse translation goes to the socket's entry in lb_sk_rev, a
// preallocated table indexed by socket cookie that a sock_release program
// empties: its hot entry in the table's first page, else its warm entry
// among the first 256, else its entry of the whole table. sock_release
// reads only the closed socket's hot entry unless sockets of that entry
// went further; a socket whose entries live older sockets hold uses
// socket-local storage instead. Neither table has locks: the agent rewrites fast lines in
// place under a sequence count that readers check (through fast_write, a
// program it runs with BPF_PROG_TEST_RUN), and sockets claim lb_sk_rev
// entries with a compare-and-exchange. The backend follows from the socket
// cookie, so a connect calls no helper for a random number. lb_frontends, a
// hash map, stays the authoritative frontend table: tc and bind checks read
// it, and the socket hooks fall back to it for keys whose lines other keys
// hold.
// Unconnected UDP, where one socket may talk to several Services, keeps its
// reverse translations in an LRU map keyed by socket and backend.
//
// An upgrade whose map layouts differ from the pinned ones replaces those
// maps (the frontend, fast, slot, backend and affinity maps refer to each
// other and are replaced together): the programs already attached keep
// serving from the old maps until the first Sync has filled the new ones,
// then the pinned links are moved to the new programs.
//
// The agent feeds the Dataplane from Service and EndpointSlice informers
// (UpsertService, UpsertEndpointSlice and the deletes). Before the first
// Sync those calls only record the desired state; Sync applies all of it
// (with batch map updates) and removes whatever pinned state is no longer
// wanted. After that every call is applied synchronously, so a change is in
// the kernel when the call returns. Observers (the DNS server in
// dataplane/dns) receive the same calls.
//
// The BPF sources are in bpf/; see gen.go for how the committed object is
// regenerated.
package dataplane
