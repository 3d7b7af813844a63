// Package testbench builds a multi-site lab out of Linux network namespaces
// so that tether can be exercised over the links its users actually have:
// every site sits behind a NAT router whose uplink to the hub is thin, slow,
// lossy and sometimes cut.
//
// A lab is described by a Spec (a Go value or YAML). Up creates one network
// namespace per host: the hub, and for every site a router plus its nodes.
// Nodes hang off a bridge in their router's namespace; the router masquerades
// them with nftables, so nodes reach the hub but the hub cannot reach nodes.
//
// The kernel tether's CI runs on has no netem qdisc, so every site uplink is
// a pair of tun devices joined by a userspace impairment relay in the lab
// process. The relay carries any IP traffic (TCP, UDP, QUIC) and applies
// bandwidth, delay, jitter, loss, duplication, reordering and blackholing,
// all changeable while traffic flows.
//
// The kernel has no device-mapper either, so every node's tmpfs data dir is
// seen through a pass-through FUSE file system served by the lab process;
// SlowDisk and ShapeDisk add latency and a throughput cap to it at run time.
//
// Every object a lab creates is named with its id and recorded in a state
// file under /run/tether-lab/<id>/, so Sweep can remove what a crashed lab
// left behind without touching anything else.
//
// Addresses: the lab uses 10.213.0.0/16 only. The hub is 10.213.0.1, site
// number s (1..99) has the public address 10.213.s.2 and the LAN
// 10.213.(100+s).0/24 with its router at .1 and its nodes from .10.
package testbench
