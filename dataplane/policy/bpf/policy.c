// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * tether's NetworkPolicy enforcement.
 *
 * Two cgroup_skb programs sit on the cgroup that parents every pod: they
 * see each packet a pod's socket sends (egress) or receives (ingress),
 * whatever network namespace the pod lives in. The local pod is the
 * packet's address on the pod's side; the peer's identity comes from
 * pol_ids. A decision costs a fixed number of hash and trie lookups,
 * whatever the number of policies.
 *
 * TCP is judged at the opening of a connection only (a SYN without ACK):
 * established connections keep working across policy changes, and replies
 * need no state. Other protocols are judged per flow, and an allowed flow
 * is remembered in pol_ct so that its replies pass.
 */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "policy.h"

char __license[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pol_ep);
	__type(value, __u32);
	__uint(max_entries, 16384);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_isolated SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pol_id_key);
	__type(value, struct pol_ports);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_allow_id SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct pol_cidr_key);
	__type(value, struct pol_ports);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_allow_cidr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct pol_ct_key);
	__type(value, __u64);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_ct SEC(".maps");

/* Packets dropped per local pod and direction (entries made by the agent
 * when it isolates a pod). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, struct pol_ep);
	__type(value, __u64);
	__uint(max_entries, 16384);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, POL_STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pol_stats SEC(".maps");

static __always_inline void stat(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&pol_stats, &i);
	if (v)
		*v += 1;
}

static __always_inline int ports_allow(const struct pol_ports *p, __u8 proto, __u16 port)
{
	if (!p)
		return 0;
	__u32 n = p->n;
	for (int i = 0; i < POL_MAX_RANGES; i++) {
		if (i >= n)
			break;
		const struct pol_range *r = &p->r[i];
		if ((r->proto == 0 || r->proto == proto) && port >= r->lo && port <= r->hi)
			return 1;
	}
	return 0;
}

/* allowed tells whether local may exchange a packet of proto to or from
 * port (the local pod's port on ingress, the peer's on egress) with peer. */
static __always_inline int allowed(__u32 local, __u32 peer, __u8 dir, __u8 proto, __u16 port)
{
	__u32 *idp = bpf_map_lookup_elem(&pol_ids, &peer);
	__u32 id = idp ? *idp : POL_ID_WORLD;
	if (id == POL_ID_HOST && dir == POL_INGRESS)
		return 1; /* the node itself: kubelet probes, as upstream plugins allow */
	struct pol_id_key k = {.ip = local, .peer = id, .dir = dir};
	if (id != POL_ID_WORLD && ports_allow(bpf_map_lookup_elem(&pol_allow_id, &k), proto, port))
		return 1;
	k.peer = POL_ID_ANY;
	if (ports_allow(bpf_map_lookup_elem(&pol_allow_id, &k), proto, port))
		return 1;
	struct pol_cidr_key c = {.prefixlen = 96, .ip = local, .dir = dir};
	__builtin_memcpy(c.peer, &peer, 4);
	return ports_allow(bpf_map_lookup_elem(&pol_allow_cidr, &c), proto, port);
}

static __always_inline int judge(struct __sk_buff *skb, __u8 dir)
{
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 1;
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
		return 1;
	if (ip.saddr == ip.daddr)
		return 1; /* a pod can always reach itself */
	__u32 local = dir == POL_INGRESS ? ip.daddr : ip.saddr;
	__u32 peer = dir == POL_INGRESS ? ip.saddr : ip.daddr;
	struct pol_ep ep = {.ip = local, .dir = dir};
	if (!bpf_map_lookup_elem(&pol_isolated, &ep))
		return 1;

	__u16 sport = 0, dport = 0;
	__u32 l4 = ip.ihl * 4;
	__u8 proto = ip.protocol;
	if (ip.frag_off & bpf_htons(0x1fff))
		return 1; /* later fragments: the first one was judged */
	if (proto == IPPROTO_TCP) {
		struct tcphdr th;
		if (bpf_skb_load_bytes(skb, l4, &th, sizeof(th)) < 0)
			return 1;
		if (!th.syn || th.ack)
			return 1; /* only openings are judged */
		sport = bpf_ntohs(th.source);
		dport = bpf_ntohs(th.dest);
	} else if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP) {
		__u16 pp[2];
		if (bpf_skb_load_bytes(skb, l4, pp, sizeof(pp)) < 0)
			return 1;
		sport = bpf_ntohs(pp[0]);
		dport = bpf_ntohs(pp[1]);
	}
	__u16 lport = dir == POL_INGRESS ? dport : sport;
	__u16 rport = dir == POL_INGRESS ? sport : dport;
	struct pol_ct_key ct = {.local = local, .remote = peer, .lport = lport, .rport = rport, .proto = proto};
	if (proto != IPPROTO_TCP && bpf_map_lookup_elem(&pol_ct, &ct)) {
		stat(POL_STAT_CT_HIT);
		return 1;
	}
	stat(POL_STAT_JUDGED);
	/* The port a rule names is the receiving side's. */
	if (allowed(local, peer, dir, proto, dport)) {
		stat(POL_STAT_ALLOWED);
		if (proto != IPPROTO_TCP) {
			__u64 now = bpf_ktime_get_ns();
			bpf_map_update_elem(&pol_ct, &ct, &now, BPF_ANY);
		}
		return 1;
	}
	stat(POL_STAT_DROPPED);
	__u64 *d = bpf_map_lookup_elem(&pol_drops, &ep);
	if (d)
		*d += 1;
	return 0;
}

SEC("cgroup_skb/ingress")
int policy_ingress(struct __sk_buff *skb)
{
	return judge(skb, POL_INGRESS);
}

SEC("cgroup_skb/egress")
int policy_egress(struct __sk_buff *skb)
{
	return judge(skb, POL_EGRESS);
}
