// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Map layouts of tether's NetworkPolicy programs. The Go compiler in ../
 * (compile.go) produces their contents; sync.go writes them.
 *
 * Addresses are IPv4, in network byte order as in the packet. Ports in
 * pol_range are in host byte order.
 */
#ifndef TETHER_POLICY_H
#define TETHER_POLICY_H

#include <linux/types.h>

/* Directions, as in struct pol_ep. */
#define POL_INGRESS 0
#define POL_EGRESS 1

/* Reserved peer identities: unknown addresses (matched by ipBlock only),
 * the node's own addresses, and "every peer" (a rule without from/to). */
#define POL_ID_WORLD 0
#define POL_ID_HOST 1
#define POL_ID_ANY 0xffffffff

/* Most port ranges one allow entry holds. */
#define POL_MAX_RANGES 16

/* A local pod's address and one direction: the key of pol_isolated
 * (present: the pod is isolated in that direction) and of pol_drops. */
struct pol_ep {
	__u32 ip;
	__u8 dir;
	__u8 pad[3];
};

/* Allowed traffic between a local pod and a peer identity. */
struct pol_id_key {
	__u32 ip;    /* local pod */
	__u32 peer;  /* identity, or POL_ID_ANY */
	__u8 dir;
	__u8 pad[3];
};

/* Allowed traffic between a local pod and an address block: an LPM trie
 * key whose first 64 bits (pod and direction) always match. */
struct pol_cidr_key {
	__u32 prefixlen;
	__u32 ip;    /* local pod */
	__u8 dir;
	__u8 pad[3];
	__u8 peer[4];
};

/* One range of ports of one protocol; proto 0 is every protocol. */
struct pol_range {
	__u16 lo;
	__u16 hi;
	__u8 proto;
	__u8 pad[3];
};

/* What an allow entry allows: n ranges (0: nothing, an ipBlock except). */
struct pol_ports {
	__u32 n;
	__u32 pad;
	struct pol_range r[POL_MAX_RANGES];
};

/* A flow judged allowed, remembered so its replies pass (all protocols
 * but TCP, whose sockets carry the state). */
struct pol_ct_key {
	__u32 local;
	__u32 remote;
	__u16 lport;
	__u16 rport;
	__u8 proto;
	__u8 pad[3];
};

/* pol_stats indices. */
enum {
	POL_STAT_JUDGED = 0,
	POL_STAT_ALLOWED,
	POL_STAT_DROPPED,
	POL_STAT_CT_HIT,
	POL_STAT_MAX,
};

#endif
