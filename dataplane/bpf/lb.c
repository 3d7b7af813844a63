// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * tether's Service load balancer.
 *
 * East-west traffic is balanced at the socket layer: cgroup hooks rewrite the
 * destination a socket asks for (a Service frontend) into a backend before
 * any packet exists, so established flows carry no NAT and no conntrack
 * state. getpeername and recvmsg translate the backend back into the
 * frontend so that applications see the address they dialled.
 *
 * North-south traffic (NodePort, externalIPs) arrives as packets on the
 * node's uplink and is translated per packet by two tc programs with a small
 * LRU connection table of their own.
 *
 * Map layouts live in lb.h; the Go reconciler in ../ owns their contents.
 */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "lb.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#ifndef offsetof
#define offsetof(t, m) __builtin_offsetof(t, m)
#endif
#ifndef ECONNREFUSED
#define ECONNREFUSED 111
#endif
#ifndef EADDRINUSE
#define EADDRINUSE 98
#endif

/* Set by the loader before the programs are verified. The verifier prunes
 * branches that these constants make dead, so calls the kernel does not
 * offer may sit in them: one object serves kernels with and without
 * bpf_set_retval. */
volatile const __u8 have_set_retval = 0;
/* Cookie of the node's own network namespace: NodePorts are protected from
 * bind() there only; pods may bind any port in their own namespaces. Its
 * loopback addresses are the node's only there too: connects to them are
 * translated from that namespace alone. 0 when the loader could not learn
 * it (Linux < 5.14): loopback is then never translated. */
volatile const __u64 host_netns_cookie = 0;
/* LB_LAYOUT, which the programs do not use: the loader reads it from the
 * object and stamps it in lb_config. */
volatile const __u32 lb_layout = LB_LAYOUT;
/* Sizes of the tables indexed by the programs themselves: the fast
 * frontend table has 1 << fe_fast_bits lines, lb_sk_rev sk_rev_mask + 1
 * entries. */
volatile const __u32 fe_fast_bits = 10;
volatile const __u32 sk_rev_mask = 1023;
/* The first entries of lb_sk_rev that a socket tries before its entry in
 * the whole table: its hot entry among the first page (sockets that close
 * soon reuse those while they are still in the CPU caches), then its warm
 * entry among the first few hundred (see struct sk_rev). */
volatile const __u32 sk_rev_hot_mask = 63;
volatile const __u32 sk_rev_warm_mask = 255;
/* Set on CPUs that keep loads in order with loads and stores with stores
 * (x86): the lock-free tables then need no fences, only a compiler that
 * keeps the order (barrier()); elsewhere their counts are read and written
 * with atomic operations, which are full fences. */
volatile const __u8 strong_order = 0;

#define barrier() asm volatile("" ::: "memory")

/* Sizes are defaults; the loader resizes maps from its configuration. All
 * maps are pinned by name so that a restarted agent adopts them. */
/* Preallocated: a lookup on the connect path then touches one element of
 * a contiguous table instead of an allocation somewhere in the slab. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct fe_key);
	__type(value, struct fe_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_frontends SEC(".maps");

/* The fast frontend table (see lb.h). Mmapable for page-aligned lines:
 * each is one cache line. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct fe_fast);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_fe_fast SEC(".maps");

/* Generation of the fast table's layout: odd while the agent moves keys
 * between lines (see fe_find). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_fe_gen SEC(".maps");

/* Mmapable for page-aligned entries: 32-byte slots that never straddle a
 * cache line. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct slot);
	__uint(max_entries, 524288);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_backends SEC(".maps");

/* Mmapable for page-aligned entries: one cache line each. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct sk_rev);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_sk_rev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__type(key, int);
	__type(value, struct sk_rnat);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_sk_rnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sk_rnat_key);
	__type(value, struct sk_rnat_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_sock_rnat SEC(".maps");

/* Node addresses on which NodePorts answer (value unused). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_addr);
	__type(value, __u32);
	__uint(max_entries, 64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_node_ips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct ct4_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_ct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct4_key);
	__type(value, struct rct4_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_rct4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_cfg);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_stats SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&lb_stats, &which);

	if (v)
		*v += 1;
}

static __always_inline void addr_from_v4(struct lb_addr *a, __u32 ip4)
{
	a->w[0] = 0;
	a->w[1] = 0;
	a->w[2] = bpf_htonl(0x0000ffff);
	a->w[3] = ip4;
}

/* A cheap integer mix (murmur3 finaliser) so that cookies, which grow by
 * one per socket, spread evenly over the slots. */
static __always_inline __u32 mix32(__u64 v)
{
	__u32 h = (__u32)v ^ (__u32)(v >> 32);

	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* An address in 127.0.0.0/8 (IPv4-mapped) or ::1. The last word is tested
 * first: two comparisons of it are all that any other address costs. */
static __always_inline int is_loopback(const struct lb_addr *a)
{
	if ((a->w[3] & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000))
		return (a->w[0] | a->w[1]) == 0 && a->w[2] == bpf_htonl(0x0000ffff);
	if (a->w[3] == bpf_htonl(1))
		return (a->w[0] | a->w[1] | a->w[2]) == 0;
	return 0;
}

/* 127.0.0.1 or ::1: the loopback addresses NodePorts and host ports answer
 * on (see sock_xlate). */
static __always_inline int is_loopback1(const struct lb_addr *a)
{
	return is_loopback(a) && (a->w[3] == bpf_htonl(0x7f000001) || a->w[3] == bpf_htonl(1));
}

static __always_inline int key_eq(const struct fe_key *a, const struct fe_key *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4])) == 0;
}

/* Reads sequence count *p, ordered before (begin) or after (end) the
 * reads it guards. */
static __always_inline __u32 seq_read(__u32 *p)
{
	__u32 v;

	if (!strong_order)
		return __sync_fetch_and_add(p, 0);
	barrier();
	v = *(volatile __u32 *)p;
	barrier();
	return v;
}

/* Line idx of the fast table. */
static __always_inline struct fe_fast *fast_line(__u32 idx)
{
	return bpf_map_lookup_elem(&lb_fe_fast, &idx);
}

/* Line of choice n (< FAST_CHOICES) of a key whose first line is idx. */
static __always_inline __u32 fast_choice(__u32 idx, __u32 n)
{
	if (n == 0)
		return idx;
	return (idx + (1u << (fe_fast_bits - n))) & ((1u << fe_fast_bits) - 1);
}

enum {
	PROBE_HIT,	/* the key's line: value (and backend) copied */
	PROBE_NEXT,	/* another key, but FAST_SPILL: look further */
	PROBE_NONE,	/* another key and no FAST_SPILL: no Service */
	PROBE_TORN,	/* rewritten while read, or no line: ask lb_frontends */
};

/* Inline backend i of fast line f: its address from the two halves. */
static __always_inline __u32 fast_be_ip(const struct fe_fast *f, __u32 i)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return (__u32)f->be_hi | (__u32)f->be_lo[i] << 16;
#else
	return (__u32)f->be_hi << 16 | (__u32)f->be_lo[i];
#endif
}

/* Reads fast line f for key. On a hit the value goes to *out and, when the
 * line holds the frontend's backends, the one that hash picks to *be with
 * *inl set. */
static __always_inline int fast_probe(struct fe_fast *f, const struct fe_key *key, __u32 hash,
				      struct fe_val *out, struct slot *be, int *inl)
{
	__u32 seq, i, ip = 0;
	__u16 port = 0;
	__u8 state;
	int hit, in = 0;

	if (!f)
		return PROBE_TORN;
	seq = seq_read(&f->seq);
	state = f->val.state;
	hit = (state & FAST_USED) && key_eq(&f->key, key);
	if (hit) {
		*out = f->val;
		if (out->flags & FE_INLINE) {
			/* hash scaled to [0, count) */
			i = (__u32)(((__u64)hash * out->count) >> 32);
			if (i < FAST_INLINE) {
				ip = fast_be_ip(f, i);
				port = f->be_port;
				in = 1;
			}
		}
	}
	if ((seq & 1) || seq_read(&f->seq) != seq)
		return PROBE_TORN;
	if (!hit)
		return (state & FAST_SPILL) ? PROBE_NEXT : PROBE_NONE;
	if (in) {
		addr_from_v4(&be->ip, ip);
		be->port = port;
	}
	*inl = in;
	return PROBE_HIT;
}

/*
 * Looks up a frontend of the socket hooks: in its fast lines first (see
 * lb.h), in lb_frontends when they hold other keys and the last says that
 * keys spilled, or when a line was being rewritten. Returns 1 and the value
 * in *out for a frontend, 0 for an address that is no Service. When the
 * line holds the frontend's backends, the one that hash picks is copied to
 * *be and *inl is set: the caller needs nothing else. "No Service" is only
 * believed when no key moved between lines meanwhile (lb_fe_gen): a key
 * that moved may have left a line that said "look further" before the
 * line it moved to was written.
 */
static __always_inline int fe_find(const struct fe_key *key, __u32 hash, struct fe_val *out, struct slot *be,
				   int *inl)
{
	__u32 idx = fe_fast_index(key, fe_fast_bits), zero = 0, gen = 1, n;
	__u32 *g = bpf_map_lookup_elem(&lb_fe_gen, &zero);
	struct fe_val *fep;
	int r = PROBE_TORN;

	*inl = 0;
	if (g)
		gen = seq_read(g);
#pragma unroll
	for (n = 0; n < FAST_CHOICES; n++) {
		r = fast_probe(fast_line(fast_choice(idx, n)), key, hash, out, be, inl);
		if (r != PROBE_NEXT)
			break;
	}
	if (r == PROBE_HIT)
		return 1;
	if (r == PROBE_NONE && !(gen & 1) && g && seq_read(g) == gen)
		return 0;
	*inl = 0;
	fep = bpf_map_lookup_elem(&lb_frontends, key);
	if (!fep)
		return 0;
	*out = *fep;
	out->flags &= ~FE_INLINE;
	return 1;
}

/*
 * Picks a backend of frontend fe for a client. Affinity, when the frontend
 * asks for it, wins as long as its entry is fresh and its backend still
 * belongs to the frontend (backend ids are per frontend, so a removed
 * endpoint no longer resolves). Otherwise hash selects a slot. The result
 * is copied to *out: a slot may be rewritten once no frontend refers to it.
 */
static __always_inline int pick_backend(const struct fe_val *fe, struct aff_key *ak, __u32 hash,
					struct slot *out)
{
	struct backend *be;
	struct aff_val *av;
	struct slot *s;
	__u32 idx;
	__u64 now;

	if (fe->flags & FE_AFFINITY) {
		ak->id = fe->id;
		av = bpf_map_lookup_elem(&lb_affinity, ak);
		now = bpf_ktime_get_ns();
		if (av && now - av->last_ns <= (__u64)fe->affinity_timeout * 1000000000ULL) {
			be = bpf_map_lookup_elem(&lb_backends, &av->backend_id);
			if (be) {
				out->ip = be->ip;
				out->port = be->port;
				out->flags = be->flags;
				out->backend_id = av->backend_id;
				av->last_ns = now;
				return 1;
			}
		}
	}

	/* hash scaled to [0, count): a multiply instead of a division */
	idx = fe->base + (__u32)(((__u64)hash * fe->count) >> 32);
	s = bpf_map_lookup_elem(&lb_slots, &idx);
	if (!s)
		return 0;
	*out = *s;
	if (out->fe_id != fe->id)
		return 0;

	if (fe->flags & FE_AFFINITY) {
		struct aff_val nv = { .last_ns = bpf_ktime_get_ns(), .backend_id = out->backend_id };

		bpf_map_update_elem(&lb_affinity, ak, &nv, BPF_ANY);
	}
	return 1;
}

/* Refuses a connect() or sendmsg() to a Service without usable backends:
 * the caller sees ECONNREFUSED at once, like a closed port, instead of
 * waiting for a timeout. Kernels without bpf_set_retval report EPERM. */
static __always_inline int sock_refuse(struct bpf_sock_addr *ctx)
{
	count(STAT_SOCK_REFUSED);
	if (have_set_retval)
		bpf_set_retval(-ECONNREFUSED);
	return 0;
}

/* Reads the owner of reverse translation e, ordered before (and after)
 * the reads of the translation. */
static __always_inline __u64 rev_owner(struct sk_rev *e)
{
	__u64 v;

	if (!strong_order)
		return __sync_fetch_and_add(&e->cookie, 0);
	barrier();
	v = *(volatile __u64 *)&e->cookie;
	barrier();
	return v;
}

/* Claims lb_sk_rev entry idx for the socket with cookie and writes the
 * translation to it: a free entry, or one the socket holds already (it
 * connected again). Returns 0 when another socket holds it, 2 when it
 * claimed a free entry, 1 when it held the entry already. */
static __always_inline int rev_claim(__u32 idx, __u64 cookie, const struct lb_addr *fe_ip, __u16 fe_port,
				     const struct slot *be)
{
	struct sk_rev *e = bpf_map_lookup_elem(&lb_sk_rev, &idx);
	__u64 cur;

	if (!e)
		return 0;
	cur = *(volatile __u64 *)&e->cookie;
	if ((cur != 0 && cur != cookie) ||
	    __sync_val_compare_and_swap(&e->cookie, cur, cookie | SK_REV_BUSY) != cur)
		return 0;
	e->fe_ip = *fe_ip;
	e->fe_port = fe_port;
	e->be_ip = be->ip;
	e->be_port = be->port;
	if (strong_order) {
		barrier();
		*(volatile __u64 *)&e->cookie = cookie;
	} else {
		__sync_lock_test_and_set(&e->cookie, cookie);
	}
	return cur == 0 ? 2 : 1;
}

/* Records the reverse translation of a connected socket: in its hot entry
 * of lb_sk_rev, else in its warm entry, else in its entry of the whole
 * table (those two counted in the hot entry), else (all held by live
 * sockets) in socket-local storage. */
static __always_inline void rev_store(struct bpf_sock_addr *ctx, __u64 cookie, const struct lb_addr *fe_ip,
				      __u16 fe_port, const struct slot *be)
{
	__u32 hot = (__u32)cookie & sk_rev_hot_mask, warm = (__u32)cookie & sk_rev_warm_mask;
	__u32 whole = (__u32)cookie & sk_rev_mask;
	struct sk_rnat *rn;
	struct sk_rev *h;
	int r = 0;

	if (rev_claim(hot, cookie, fe_ip, fe_port, be))
		return;
	/* A socket's entries coincide when its cookie is below the smaller
	 * size in the larger range: it tries each once. */
	if (warm != hot)
		r = rev_claim(warm, cookie, fe_ip, fe_port, be);
	if (!r && whole != warm)
		r = rev_claim(whole, cookie, fe_ip, fe_port, be);
	if (r == 2) {
		h = bpf_map_lookup_elem(&lb_sk_rev, &hot);
		if (h)
			__sync_fetch_and_add(&h->spilled, 1);
	}
	if (r)
		return;
	count(STAT_SOCK_REV_LOCAL);
	rn = bpf_sk_storage_get(&lb_sk_rnat, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (rn) {
		rn->fe_ip = *fe_ip;
		rn->fe_port = fe_port;
		rn->be_ip = be->ip;
		rn->be_port = be->port;
	}
}

/*
 * Forward translation shared by connect and sendmsg of both families.
 * Returns the verdict of the hook (1 allow, 0 reject) and the backend in
 * *dst / *port when the destination is a Service frontend. connect records
 * the translation per socket (rev_store), sendmsg (unconnected UDP, one
 * socket to many frontends) in the LRU map keyed by socket and backend.
 */
static __always_inline int sock_xlate(struct bpf_sock_addr *ctx, struct lb_addr *dst, __u16 *port,
				      int *rewrite, int connect)
{
	struct fe_key key = {};
	struct aff_key ak = {};
	struct slot be = {};
	struct fe_val fe = {};
	__u32 hash;
	__u64 cookie = 0;
	int tries, inl = 0, ok = 0;

	*rewrite = 0;
	key.ip = *dst;
	key.port = *port;
	key.proto = ctx->protocol;
	key.scope = SCOPE_INTERNAL;

	/* Loopback is the node's own only in the node's namespace: there
	 * 127.0.0.1 and ::1 reach NodePorts and host ports, as the node's
	 * addresses do (kube-proxy's iptables rules with route_localnet). A
	 * pod that dials its own loopback reaches its own listeners,
	 * whatever frontend has that port. */
	if (is_loopback(dst) &&
	    (!host_netns_cookie || bpf_get_netns_cookie(ctx) != host_netns_cookie))
		return 1;

	/* One pick per socket, from its cookie: a TCP connection is a new
	 * socket, and a UDP client's datagrams keep reaching the same
	 * backend. mix32 spreads consecutive cookies evenly, and connect
	 * needs the cookie for the reverse translation anyway (cheaper than
	 * a call for a random number on top of it). */
	cookie = bpf_get_socket_cookie(ctx);
	hash = mix32(cookie);

	/* Two attempts: a reader that raced with a backend-set switch may
	 * find its old slot range already reused; the second lookup sees the
	 * new frontend value. */
	for (tries = 0; tries < 2; tries++) {
		if (!fe_find(&key, hash, &fe, &be, &inl))
			return 1;	/* not a Service: leave the socket alone */
		if (fe.count == 0)
			return sock_refuse(ctx);
		if (inl) {
			ok = 1;
			break;
		}
		if (fe.flags & FE_AFFINITY) {
			__u64 nc = bpf_get_netns_cookie(ctx);

			ak.client.w[0] = (__u32)nc;
			ak.client.w[1] = (__u32)(nc >> 32);
		}
		ok = pick_backend(&fe, &ak, hash, &be);
		if (ok)
			break;
		count(STAT_SOCK_RETRY);
	}
	if (!ok)
		return sock_refuse(ctx);

	if (connect) {
		rev_store(ctx, cookie, dst, *port, &be);
	} else {
		struct sk_rnat_key rk = { .cookie = cookie, .ip = be.ip, .port = be.port };
		struct sk_rnat_val rv = { .ip = *dst, .port = *port, .id = fe.id };

		bpf_map_update_elem(&lb_sock_rnat, &rk, &rv, BPF_ANY);
	}
	*dst = be.ip;
	*port = be.port;
	*rewrite = 1;
	count(STAT_SOCK_XLATE);
	return 1;
}

static __always_inline int addr_eq(const struct lb_addr *a, const struct lb_addr *b)
{
	return ((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2]) | (a->w[3] ^ b->w[3])) == 0;
}

/* Looks for the socket with cookie in lb_sk_rev entry idx and, when it is
 * there and was translated to src:port, replaces them with the frontend. */
static __always_inline int rev_find(__u32 idx, __u64 cookie, struct lb_addr *src, __u16 *port)
{
	struct sk_rev *e = bpf_map_lookup_elem(&lb_sk_rev, &idx);
	struct lb_addr fe_ip;
	__u16 fe_port;
	int hit;

	if (!e || rev_owner(e) != cookie)
		return 0;
	hit = e->be_port == *port && addr_eq(&e->be_ip, src);
	fe_ip = e->fe_ip;
	fe_port = e->fe_port;
	/* Still ours and not being rewritten by a second connect. */
	if (!hit || rev_owner(e) != cookie)
		return 0;
	*src = fe_ip;
	*port = fe_port;
	return 1;
}

/* Reverse translation for getpeername and recvmsg: if this socket was
 * translated to the backend it now reports, show the frontend instead. */
static __always_inline int sock_rev(struct bpf_sock_addr *ctx, struct lb_addr *src, __u16 *port, int udp)
{
	struct sk_rnat_key rk = {};
	struct sk_rnat_val *rv;
	struct sk_rnat *rn;
	__u64 cookie = bpf_get_socket_cookie(ctx);

	if (rev_find((__u32)cookie & sk_rev_hot_mask, cookie, src, port) ||
	    rev_find((__u32)cookie & sk_rev_warm_mask, cookie, src, port) ||
	    rev_find((__u32)cookie & sk_rev_mask, cookie, src, port))
		return 1;
	/* Sockets whose entry was taken, and sockets connected by programs
	 * that predate lb_sk_rev. */
	rn = bpf_sk_storage_get(&lb_sk_rnat, ctx->sk, 0, 0);
	if (rn && rn->be_port == *port && addr_eq(&rn->be_ip, src)) {
		*src = rn->fe_ip;
		*port = rn->fe_port;
		return 1;
	}
	if (!udp)
		return 0;
	rk.cookie = cookie;
	rk.ip = *src;
	rk.port = *port;
	rv = bpf_map_lookup_elem(&lb_sock_rnat, &rk);
	if (!rv)
		return 0;
	*src = rv->ip;
	*port = rv->port;
	return 1;
}

static __always_inline int sock4_fwd(struct bpf_sock_addr *ctx, int connect)
{
	struct lb_addr dst;
	__u16 port = (__u16)ctx->user_port;
	int rewrite, verdict;

	addr_from_v4(&dst, ctx->user_ip4);
	verdict = sock_xlate(ctx, &dst, &port, &rewrite, connect);
	if (rewrite) {
		ctx->user_ip4 = dst.w[3];
		ctx->user_port = port;
	}
	return verdict;
}

static __always_inline int sock6_fwd(struct bpf_sock_addr *ctx, int connect)
{
	struct lb_addr dst;
	__u16 port = (__u16)ctx->user_port;
	int rewrite, verdict;

	dst.w[0] = ctx->user_ip6[0];
	dst.w[1] = ctx->user_ip6[1];
	dst.w[2] = ctx->user_ip6[2];
	dst.w[3] = ctx->user_ip6[3];
	verdict = sock_xlate(ctx, &dst, &port, &rewrite, connect);
	if (rewrite) {
		ctx->user_ip6[0] = dst.w[0];
		ctx->user_ip6[1] = dst.w[1];
		ctx->user_ip6[2] = dst.w[2];
		ctx->user_ip6[3] = dst.w[3];
		ctx->user_port = port;
	}
	return verdict;
}

static __always_inline int sock4_rev(struct bpf_sock_addr *ctx, int udp)
{
	struct lb_addr src;
	__u16 port = (__u16)ctx->user_port;

	addr_from_v4(&src, ctx->user_ip4);
	if (sock_rev(ctx, &src, &port, udp)) {
		ctx->user_ip4 = src.w[3];
		ctx->user_port = port;
	}
	return 1;
}

static __always_inline int sock6_rev(struct bpf_sock_addr *ctx, int udp)
{
	struct lb_addr src;
	__u16 port = (__u16)ctx->user_port;

	src.w[0] = ctx->user_ip6[0];
	src.w[1] = ctx->user_ip6[1];
	src.w[2] = ctx->user_ip6[2];
	src.w[3] = ctx->user_ip6[3];
	if (sock_rev(ctx, &src, &port, udp)) {
		ctx->user_ip6[0] = src.w[0];
		ctx->user_ip6[1] = src.w[1];
		ctx->user_ip6[2] = src.w[2];
		ctx->user_ip6[3] = src.w[3];
		ctx->user_port = port;
	}
	return 1;
}

SEC("cgroup/connect4")
int sock4_connect(struct bpf_sock_addr *ctx)
{
	return sock4_fwd(ctx, 1);
}

SEC("cgroup/connect6")
int sock6_connect(struct bpf_sock_addr *ctx)
{
	return sock6_fwd(ctx, 1);
}

/* Unconnected UDP (a resolver's sendto to the DNS ClusterIP) is translated
 * per datagram. */
SEC("cgroup/sendmsg4")
int sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock4_fwd(ctx, 0);
}

SEC("cgroup/sendmsg6")
int sock6_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock6_fwd(ctx, 0);
}

SEC("cgroup/recvmsg4")
int sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	return sock4_rev(ctx, 1);
}

SEC("cgroup/recvmsg6")
int sock6_recvmsg(struct bpf_sock_addr *ctx)
{
	return sock6_rev(ctx, 1);
}

SEC("cgroup/getpeername4")
int sock4_getpeername(struct bpf_sock_addr *ctx)
{
	return sock4_rev(ctx, 0);
}

SEC("cgroup/getpeername6")
int sock6_getpeername(struct bpf_sock_addr *ctx)
{
	return sock6_rev(ctx, 0);
}

/* Frees lb_sk_rev entry idx, beyond the hot entry h, if the socket with
 * cookie holds it, and takes the claim off the count of h. */
static __always_inline void rev_release(struct sk_rev *h, __u32 idx, __u64 cookie)
{
	struct sk_rev *e = bpf_map_lookup_elem(&lb_sk_rev, &idx);

	if (!e || *(volatile __u64 *)&e->cookie != cookie)
		return;
	__sync_fetch_and_sub(&h->spilled, 1);
	if (strong_order) {
		barrier();
		*(volatile __u64 *)&e->cookie = 0;
	} else {
		__sync_lock_test_and_set(&e->cookie, 0);
	}
}

/* Frees the socket's lb_sk_rev entries when the application closes it:
 * from then on nobody can ask for its peer. Only the owner frees an entry,
 * and nobody else writes an entry that is not free, so plain stores will
 * do. A socket that connected more than once may hold several of its
 * entries. Its warm entry and its entry of the whole table are only looked
 * at while the hot entry counts claims beyond it: most sockets, translated
 * or not, read one cache line here. */
SEC("cgroup/sock_release")
int sock_release(struct bpf_sock *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__u32 hot = (__u32)cookie & sk_rev_hot_mask, warm = (__u32)cookie & sk_rev_warm_mask;
	__u32 whole = (__u32)cookie & sk_rev_mask;
	struct sk_rev *h = bpf_map_lookup_elem(&lb_sk_rev, &hot);

	if (!h)
		return 1;
	if (*(volatile __u64 *)&h->cookie == cookie)
		*(volatile __u64 *)&h->cookie = 0;
	if (!*(volatile __u32 *)&h->spilled)
		return 1;
	if (warm != hot)
		rev_release(h, warm, cookie);
	if (whole != warm)
		rev_release(h, whole, cookie);
	return 1;
}

/* Rewrites fast line f to v under its sequence count, unless it holds v
 * already (most lines when an agent restarts): readers of an unchanged
 * line are left alone. A count left odd by a write that never finished
 * stays odd until this one completes. */
static __always_inline void fast_put(struct fe_fast *f, const struct fe_fast *v)
{
	const __u32 *src = (const __u32 *)v;
	__u32 *dst = (__u32 *)f;
	__u32 diff = f->seq & 1, seq, i;

	for (i = 1; i < sizeof(*f) / 4; i++)
		diff |= dst[i] ^ src[i];
	if (!diff)
		return;
	seq = f->seq | 1;
	/* An exchange is a full fence: the count is odd before any byte of
	 * the line changes. */
	__sync_lock_test_and_set(&f->seq, seq);
	for (i = 1; i < sizeof(*f) / 4; i++)
		dst[i] = src[i];
	if (strong_order) {
		barrier();
		*(volatile __u32 *)&f->seq = seq + 1;
	} else {
		__sync_lock_test_and_set(&f->seq, seq + 1);
	}
}

/*
 * The agent's writer of the fast table, run with BPF_PROG_TEST_RUN: the
 * "packet" is a run of struct fast_rec. A map update from user space would
 * copy a line in no particular order, which the sequence count cannot
 * guard; a program writes with the same atomic operations and fences as the
 * readers read, on every architecture, and the table needs no mapping in
 * the agent's memory. Returns XDP_PASS
 * when every record was written, XDP_ABORTED at a line out of range.
 */
SEC("xdp")
int fast_write(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 i, zero = 0, *g;
	struct fe_fast *f;
	struct fast_rec *r;

	for (i = 0; i < FAST_RECS; i++) {
		r = data + i * sizeof(*r);
		if ((void *)(r + 1) > end)
			break;
		if (r->line == FAST_GEN_BEGIN || r->line == FAST_GEN_END) {
			g = bpf_map_lookup_elem(&lb_fe_gen, &zero);
			if (!g)
				return XDP_ABORTED;
			/* Odd from the begin record on (also when a writer
			 * that died left it odd), even again at the end. An
			 * exchange is a full fence. */
			if (r->line == FAST_GEN_BEGIN)
				__sync_lock_test_and_set(g, *g | 1);
			else
				__sync_lock_test_and_set(g, (*g | 1) + 1);
			continue;
		}
		f = fast_line(r->line);
		if (!f)
			return XDP_ABORTED;
		fast_put(f, &r->v);
	}
	return XDP_PASS;
}

/* Keeps host processes from binding a port that a NodePort owns: the bind
 * would succeed but never see a packet, which is worse than failing. The
 * NodePort key of an IPv4 Service is the mapped any-address ::ffff:0.0.0.0,
 * that of an IPv6 Service the all-zero address. */
static __always_inline int nodeport_taken(struct bpf_sock *ctx, int v6)
{
	struct fe_key key = {};

	if (!v6)
		addr_from_v4(&key.ip, 0);
	key.port = bpf_htons((__u16)ctx->src_port);
	key.proto = ctx->protocol;
	key.scope = SCOPE_EXTERNAL;
	return bpf_map_lookup_elem(&lb_frontends, &key) != NULL;
}

static __always_inline int post_bind(struct bpf_sock *ctx, struct lb_addr *ip, int check4, int check6)
{
	if (host_netns_cookie && bpf_get_netns_cookie(ctx) != host_netns_cookie)
		return 1;
	if (!(check4 && nodeport_taken(ctx, 0)) && !(check6 && nodeport_taken(ctx, 1)))
		return 1;
	/* Binding to a specific address that is not a node address is fine.
	 * 127.0.0.1 and ::1 count as node addresses while connects to them
	 * are translated (a known host namespace). */
	if ((ip->w[0] | ip->w[1] | ip->w[3]) != 0 && !(host_netns_cookie && is_loopback1(ip)) &&
	    !bpf_map_lookup_elem(&lb_node_ips, ip))
		return 1;
	if (have_set_retval)
		bpf_set_retval(-EADDRINUSE);
	return 0;
}

SEC("cgroup/post_bind4")
int sock4_post_bind(struct bpf_sock *ctx)
{
	struct lb_addr ip;

	addr_from_v4(&ip, ctx->src_ip4);
	return post_bind(ctx, &ip, 1, 0);
}

SEC("cgroup/post_bind6")
int sock6_post_bind(struct bpf_sock *ctx)
{
	struct lb_addr ip;

	ip.w[0] = ctx->src_ip6[0];
	ip.w[1] = ctx->src_ip6[1];
	ip.w[2] = ctx->src_ip6[2];
	ip.w[3] = ctx->src_ip6[3];
	/* A dual-stack socket bound to :: also receives IPv4; one bound to a
	 * mapped address is an IPv4 socket in disguise. */
	if ((ip.w[0] | ip.w[1] | ip.w[2] | ip.w[3]) == 0)
		return post_bind(ctx, &ip, 1, 1);
	if ((ip.w[0] | ip.w[1]) == 0 && ip.w[2] == bpf_htonl(0x0000ffff))
		return post_bind(ctx, &ip, 1, 0);
	return post_bind(ctx, &ip, 0, 1);
}

/* ---------------------------------------------------------------------- */
/* North-south: per-packet NAT on the uplink.                              */
/* ---------------------------------------------------------------------- */

/* Only option-less IPv4 headers are translated; the fixed offsets keep the
 * verifier's job small and options are vanishingly rare on service traffic. */
#define IP_OFF ETH_HLEN
#define IP_CSUM_OFF (IP_OFF + offsetof(struct iphdr, check))
#define IP_SRC_OFF (IP_OFF + offsetof(struct iphdr, saddr))
#define IP_DST_OFF (IP_OFF + offsetof(struct iphdr, daddr))
#define L4_OFF (IP_OFF + sizeof(struct iphdr))
#define L4_SPORT_OFF L4_OFF
#define L4_DPORT_OFF (L4_OFF + 2)
#define TCP_CSUM_OFF (L4_OFF + offsetof(struct tcphdr, check))
#define UDP_CSUM_OFF (L4_OFF + offsetof(struct udphdr, check))
/* linux/icmp.h pulls in libc headers: the little of it used here. */
#define ICMP_ECHOREPLY 0
#define ICMP_DEST_UNREACH 3
#define ICMP_ECHO 8
#define ICMP_TIME_EXCEEDED 11
struct icmphdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	union {
		struct {
			__u16 id;
			__u16 sequence;
		} echo;
		__u32 gateway;
	} un;
};
#define ICMP_CSUM_OFF (L4_OFF + offsetof(struct icmphdr, checksum))
#define ICMP_ID_OFF (L4_OFF + offsetof(struct icmphdr, un.echo.id))
/* An ICMP error quotes the IP header and first 8 bytes of the packet it
 * is about. */
#define INNER_IP_OFF (L4_OFF + sizeof(struct icmphdr))
#define INNER_IP_CSUM_OFF (INNER_IP_OFF + offsetof(struct iphdr, check))
#define INNER_IP_SRC_OFF (INNER_IP_OFF + offsetof(struct iphdr, saddr))
#define INNER_L4_OFF (INNER_IP_OFF + sizeof(struct iphdr))

struct pkt4 {
	struct ct4_key t;	/* the packet's own tuple */
	__u8 tcp_flags;
};

#define TCPF_FIN 0x01
#define TCPF_SYN 0x02
#define TCPF_RST 0x04
#define TCPF_ACK 0x10

/* Parses an Ethernet/IPv4/TCP-or-UDP packet. Returns 0 when the packet is
 * something the translator leaves alone. */
static __always_inline int parse4(struct __sk_buff *skb, struct pkt4 *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + IP_OFF;
	__u16 *ports = data + L4_OFF;

	if ((void *)(ports + 2) > end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->version != 4)
		return 0;
	/* Fragments other than the first carry no ports. */
	if (ip->frag_off & bpf_htons(0x1fff))
		return 0;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return 0;
	p->t.src = ip->saddr;
	p->t.dst = ip->daddr;
	p->t.sport = ports[0];
	p->t.dport = ports[1];
	p->t.proto = ip->protocol;
	p->tcp_flags = 0;
	if (ip->protocol == IPPROTO_TCP) {
		__u8 *fl = data + L4_OFF + 13;

		if ((void *)(fl + 1) > end)
			return 0;
		p->tcp_flags = *fl;
	}
	return 1;
}

/* Rewrites one address and one port, fixing the IP and L4 checksums
 * incrementally. UDP datagrams without a checksum keep none. For ICMP
 * echoes the port is the echo id (port_off ICMP_ID_OFF), and the ICMP
 * checksum covers no pseudo-header. */
static __always_inline void rewrite4(struct __sk_buff *skb, __u8 proto, int addr_off, __u32 old_ip,
				     __u32 new_ip, int port_off, __u16 old_port, __u16 new_port)
{
	int csum_off = proto == IPPROTO_TCP ? TCP_CSUM_OFF : UDP_CSUM_OFF;
	__u64 l4flags = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (proto == IPPROTO_ICMP) {
		csum_off = ICMP_CSUM_OFF;
		l4flags = 0;
	}
	if (old_ip != new_ip) {
		if (proto != IPPROTO_ICMP)
			bpf_l4_csum_replace(skb, csum_off, old_ip, new_ip, l4flags | BPF_F_PSEUDO_HDR | 4);
		bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, 4);
		bpf_skb_store_bytes(skb, addr_off, &new_ip, 4, 0);
	}
	if (old_port != new_port) {
		bpf_l4_csum_replace(skb, csum_off, old_port, new_port, l4flags | 2);
		bpf_skb_store_bytes(skb, port_off, &new_port, 2, 0);
	}
}

/* Parses an option-less IPv4 ICMP echo of type want (ICMP_ECHO or
 * ICMP_ECHOREPLY). The echo id stands for the pod's port: a request's
 * tuple carries it as sport, a reply's as dport, the other port 0, so
 * that a reply's tuple is its request's turned around. */
static __always_inline int parse_echo4(struct __sk_buff *skb, struct pkt4 *p, __u8 want)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + IP_OFF;
	struct icmphdr *ic = data + L4_OFF;

	if ((void *)(ic + 1) > end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->version != 4 ||
	    (ip->frag_off & bpf_htons(0x1fff)) || ip->protocol != IPPROTO_ICMP)
		return 0;
	if (ic->type != want || ic->code != 0)
		return 0;
	p->t.src = ip->saddr;
	p->t.dst = ip->daddr;
	p->t.proto = IPPROTO_ICMP;
	p->t.sport = want == ICMP_ECHO ? ic->un.echo.id : 0;
	p->t.dport = want == ICMP_ECHO ? 0 : ic->un.echo.id;
	p->tcp_flags = 0;
	return 1;
}

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/*
 * Answers a TCP segment for a frontend without backends with a reset, so a
 * NodePort client fails at once instead of retrying SYNs for minutes. The
 * segment is turned around in place and sent back out of the interface it
 * came in on.
 */
static __always_inline int reply_rst4(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + IP_OFF;
	struct tcphdr *th = data + L4_OFF;
	struct iphdr nip;
	struct tcphdr nth = {};
	__u8 mac[ETH_ALEN];
	__u32 payload;
	__s64 sum;

	if ((void *)(th + 1) > end)
		return TC_ACT_SHOT;
	if (th->rst)
		return TC_ACT_SHOT;
	payload = bpf_ntohs(ip->tot_len) - sizeof(*ip) - th->doff * 4;

	nth.source = th->dest;
	nth.dest = th->source;
	nth.doff = 5;
	nth.rst = 1;
	if (th->ack) {
		nth.seq = th->ack_seq;
	} else {
		nth.ack = 1;
		nth.ack_seq = bpf_htonl(bpf_ntohl(th->seq) + payload + th->syn + th->fin);
	}

	nip = *ip;
	nip.saddr = ip->daddr;
	nip.daddr = ip->saddr;
	nip.tot_len = bpf_htons(sizeof(nip) + sizeof(nth));
	nip.ttl = 64;
	nip.id = 0;
	nip.frag_off = bpf_htons(0x4000);	/* DF */
	nip.check = 0;
	nip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&nip, sizeof(nip), 0));

	struct {
		__u32 src, dst;
		__u8 zero, proto;
		__u16 len;
	} ph = { nip.saddr, nip.daddr, 0, IPPROTO_TCP, bpf_htons(sizeof(nth)) };
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&nth, sizeof(nth), sum);
	nth.check = csum_fold(sum);

	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);

	if (bpf_skb_store_bytes(skb, IP_OFF, &nip, sizeof(nip), 0) ||
	    bpf_skb_store_bytes(skb, L4_OFF, &nth, sizeof(nth), 0) ||
	    bpf_skb_change_tail(skb, L4_OFF + sizeof(nth), 0))
		return TC_ACT_SHOT;
	count(STAT_TC_REFUSED);
	return bpf_redirect(skb->ifindex, 0);
}

/* Sends a translated packet towards its new destination through the FIB,
 * filling in link-layer addresses (or letting the neighbour code do it). */
static __always_inline int fib_redirect4(struct __sk_buff *skb, __u32 src, __u32 dst)
{
	struct bpf_fib_lookup fib = {};
	void *data, *end;
	struct ethhdr *eth;
	long rc;

	fib.family = 2;	/* AF_INET */
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	fib.ipv4_src = src;
	fib.ipv4_dst = dst;
	fib.tot_len = skb->len - ETH_HLEN;

	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		eth = data;
		if ((void *)(eth + 1) > end)
			return TC_ACT_SHOT;
		__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = 2, .ipv4_nh = fib.ipv4_dst };

		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	/* No route or forwarding off: let the stack decide (and count it). */
	return TC_ACT_OK;
}

/* The SNAT port range: its first port in *lo, its size returned. */
static __always_inline __u32 snat_ports(const struct lb_cfg *cfg, __u16 *lo)
{
	__u16 hi = 65535;

	*lo = 61000;
	if (cfg && cfg->snat_port_min && cfg->snat_port_max >= cfg->snat_port_min) {
		*lo = cfg->snat_port_min;
		hi = cfg->snat_port_max;
	}
	return (__u32)hi - *lo + 1;
}

/* Reserves a source port for a new SNAT'd flow by claiming its reply tuple. */
static __always_inline int snat_claim(struct ct4_key *rkey, const struct rct4_val *rv)
{
	__u32 zero = 0, span, i;
	__u16 lo;

	span = snat_ports(bpf_map_lookup_elem(&lb_config, &zero), &lo);
	for (i = 0; i < 8; i++) {
		rkey->dport = bpf_htons(lo + bpf_get_prandom_u32() % span);
		if (bpf_map_update_elem(&lb_rct4, rkey, rv, BPF_NOEXIST) == 0)
			return 0;
	}
	return -1;
}

static __always_inline int is_node_ip4(__u32 ip)
{
	struct lb_addr a;

	addr_from_v4(&a, ip);
	return bpf_map_lookup_elem(&lb_node_ips, &a) != NULL;
}

/* An ICMP error (destination unreachable, fragmentation needed, time
 * exceeded) about a packet of a masqueraded pod connection goes to the pod,
 * with the quoted packet's source turned back into the pod's address and
 * port, so that its socket learns of the refusal or the path's MTU. The
 * quoted header's checksum is fixed with it, which leaves the ICMP
 * checksum to change only by the port. */
static __always_inline int masq_icmp_error(struct __sk_buff *skb)
{
	struct iphdr ip, in;
	struct icmphdr ic;
	__u16 ports[2];
	struct ct4_key rk = {};
	struct rct4_val *rv, r;

	if (skb->protocol != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, IP_OFF, &ip, sizeof(ip)) || ip.version != 4 || ip.ihl != 5 ||
	    ip.protocol != IPPROTO_ICMP || (ip.frag_off & bpf_htons(0x1fff)))
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, L4_OFF, &ic, sizeof(ic)) ||
	    (ic.type != ICMP_DEST_UNREACH && ic.type != ICMP_TIME_EXCEEDED))
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, INNER_IP_OFF, &in, sizeof(in)) || in.ihl != 5 ||
	    (in.protocol != IPPROTO_TCP && in.protocol != IPPROTO_UDP) ||
	    bpf_skb_load_bytes(skb, INNER_L4_OFF, ports, sizeof(ports)))
		return TC_ACT_OK;
	/* The quoted packet left from the node; a reply to it would come
	 * from its destination. */
	rk.src = in.daddr;
	rk.dst = in.saddr;
	rk.sport = ports[1];
	rk.dport = ports[0];
	rk.proto = in.protocol;
	rv = bpf_map_lookup_elem(&lb_rct4, &rk);
	if (!rv || !(rv->flags & CT_MASQ) || ip.daddr != in.saddr)
		return TC_ACT_OK;
	r = *rv;
	bpf_l3_csum_replace(skb, INNER_IP_CSUM_OFF, in.saddr, r.client_ip, 4);
	bpf_skb_store_bytes(skb, INNER_IP_SRC_OFF, &r.client_ip, 4, 0);
	bpf_l4_csum_replace(skb, ICMP_CSUM_OFF, ports[0], r.client_port, 2);
	bpf_skb_store_bytes(skb, INNER_L4_OFF, &r.client_port, 2, 0);
	bpf_l3_csum_replace(skb, IP_CSUM_OFF, ip.daddr, r.client_ip, 4);
	bpf_skb_store_bytes(skb, IP_DST_OFF, &r.client_ip, 4, 0);
	count(STAT_TC_REVERSE);
	return fib_redirect4(skb, ip.saddr, r.client_ip);
}

/* Ingress on the uplink: new and continuing client→frontend flows are
 * translated to their backend; replies of SNAT'd flows are translated back. */
SEC("tc")
int nodeport_ingress(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	struct rct4_val *rv;
	struct ct4_val *ctp, ct = {};
	struct fe_key fk = {};
	struct fe_val *fep, fe;
	struct slot be;
	__u32 nat_ip;
	int ok;

	if (!parse4(skb, &p)) {
		if (!parse_echo4(skb, &p, ICMP_ECHOREPLY))
			return masq_icmp_error(skb);
	}

	/* A reply from a remote backend to one of our SNAT ports, or from a
	 * peer of a masqueraded pod connection? */
	rv = bpf_map_lookup_elem(&lb_rct4, &p.t);
	if (rv && (rv->flags & CT_SNAT)) {
		struct rct4_val r;

		if (rv->flags & CT_MASQ) {
			rv->seen = bpf_ktime_get_ns();
			rv->flags |= CT_REPLIED;
			if (p.tcp_flags & (TCPF_FIN | TCPF_RST))
				rv->flags |= CT_CLOSING;
		}
		r = *rv;

		rewrite4(skb, p.t.proto, IP_DST_OFF, p.t.dst, r.client_ip,
			 p.t.proto == IPPROTO_ICMP ? ICMP_ID_OFF : L4_DPORT_OFF, p.t.dport, r.client_port);
		rewrite4(skb, p.t.proto, IP_SRC_OFF, p.t.src, r.fe_ip, L4_SPORT_OFF, p.t.sport, r.fe_port);
		count(STAT_TC_REVERSE);
		return fib_redirect4(skb, r.fe_ip, r.client_ip);
	}

	if (p.t.proto == IPPROTO_ICMP)
		return TC_ACT_OK;
	ctp = bpf_map_lookup_elem(&lb_ct4, &p.t);
	if (ctp) {
		ct = *ctp;
		goto forward;
	}

	/* New flow: an externalIP / load-balancer address, else a NodePort. */
	addr_from_v4(&fk.ip, p.t.dst);
	fk.port = p.t.dport;
	fk.proto = p.t.proto;
	fk.scope = SCOPE_EXTERNAL;
	fep = bpf_map_lookup_elem(&lb_frontends, &fk);
	if (!fep && is_node_ip4(p.t.dst)) {
		addr_from_v4(&fk.ip, 0);
		fep = bpf_map_lookup_elem(&lb_frontends, &fk);
	}
	if (!fep)
		return TC_ACT_OK;
	fe = *fep;

	if (p.t.proto == IPPROTO_TCP && !(p.tcp_flags & TCPF_SYN)) {
		/* Mid-stream segment of a flow we never saw (or that aged out):
		 * not ours to start; let the stack reset it. */
		return TC_ACT_OK;
	}
	if (fe.count == 0) {
		if (fe.flags & FE_LOCAL_ONLY) {
			/* externalTrafficPolicy: Local without a local endpoint:
			 * drop so that the client's load balancer fails over. */
			count(STAT_TC_DROPPED);
			return TC_ACT_SHOT;
		}
		if (p.t.proto == IPPROTO_TCP)
			return reply_rst4(skb);
		count(STAT_TC_DROPPED);
		return TC_ACT_SHOT;
	}

	{
		struct aff_key ak = {};
		__u32 hash;

		addr_from_v4(&ak.client, p.t.src);
		hash = p.t.proto == IPPROTO_TCP ? bpf_get_prandom_u32()
						: mix32(((__u64)p.t.src << 32) | ((__u32)p.t.sport << 16 | p.t.dport));
		ok = pick_backend(&fe, &ak, hash, &be);
	}
	if (!ok) {
		count(STAT_TC_DROPPED);
		return TC_ACT_SHOT;
	}

	ct.be_ip = be.ip.w[3];
	ct.be_port = be.port;
	ct.fe_id = fe.id;
	if (!(be.flags & BE_LOCAL) && !(fe.flags & FE_LOCAL_ONLY)) {
		/* The backend is on another node: its reply must come back
		 * through us, so the client is hidden behind a node address. */
		struct ct4_key rk = { .src = ct.be_ip, .sport = ct.be_port, .proto = p.t.proto };
		struct rct4_val r = { .client_ip = p.t.src, .client_port = p.t.sport,
				      .fe_ip = p.t.dst, .fe_port = p.t.dport, .flags = CT_SNAT };
		__u32 zero = 0;
		struct lb_cfg *cfg;

		nat_ip = p.t.dst;
		if (!is_node_ip4(nat_ip)) {
			cfg = bpf_map_lookup_elem(&lb_config, &zero);
			nat_ip = cfg ? cfg->snat_ip4 : 0;
		}
		if (!nat_ip) {
			count(STAT_TC_DROPPED);
			return TC_ACT_SHOT;
		}
		rk.dst = nat_ip;
		if (snat_claim(&rk, &r) < 0) {
			count(STAT_TC_DROPPED);
			return TC_ACT_SHOT;
		}
		ct.flags = CT_SNAT;
		ct.nat_ip = nat_ip;
		ct.nat_port = rk.dport;
		count(STAT_TC_SNAT);
	} else {
		/* Local backend: the client address is kept and the reply
		 * leaves through nodeport_egress, which restores the frontend. */
		struct ct4_key rk = { .src = ct.be_ip, .dst = p.t.src, .sport = ct.be_port,
				      .dport = p.t.sport, .proto = p.t.proto };
		struct rct4_val r = { .client_ip = p.t.src, .client_port = p.t.sport,
				      .fe_ip = p.t.dst, .fe_port = p.t.dport };

		bpf_map_update_elem(&lb_rct4, &rk, &r, BPF_ANY);
	}
	bpf_map_update_elem(&lb_ct4, &p.t, &ct, BPF_ANY);
	count(STAT_TC_DNAT);

forward:
	rewrite4(skb, p.t.proto, IP_DST_OFF, p.t.dst, ct.be_ip, L4_DPORT_OFF, p.t.dport, ct.be_port);
	if (ct.flags & CT_SNAT) {
		rewrite4(skb, p.t.proto, IP_SRC_OFF, p.t.src, ct.nat_ip, L4_SPORT_OFF, p.t.sport,
			 ct.nat_port);
		return fib_redirect4(skb, ct.nat_ip, ct.be_ip);
	}
	/* Local backend: the stack routes it to the pod (or delivers it to a
	 * host-network backend). */
	return TC_ACT_OK;
}

/* How long a masqueraded connection's port stays taken after its last
 * packet: a closed TCP connection's briefly (its last ACKs), one that never
 * got a reply as long as conntrack waits for a SYN's answer, UDP as long
 * as conntrack keeps a stream, an open TCP connection a day. */
#define MASQ_CLOSING_NS (10ULL * 1000000000)
#define MASQ_UNREPLIED_NS (120ULL * 1000000000)
#define MASQ_UDP_NS (120ULL * 1000000000)
#define MASQ_TCP_NS (86400ULL * 1000000000)
#define MASQ_ICMP_NS (30ULL * 1000000000)

static __always_inline int masq_expired(const struct rct4_val *v, __u8 proto, __u64 now)
{
	__u64 idle = now - v->seen;

	if (!(v->flags & CT_MASQ))
		return 0;
	if (v->flags & CT_CLOSING)
		return idle > MASQ_CLOSING_NS;
	if (proto == IPPROTO_ICMP)
		return idle > MASQ_ICMP_NS;
	if (!(v->flags & CT_REPLIED))
		return idle > MASQ_UNREPLIED_NS;
	return idle > (proto == IPPROTO_UDP ? MASQ_UDP_NS : MASQ_TCP_NS);
}

/* Reserves a node port for a pod connection by claiming its reply tuple,
 * taking over the port of an expired connection to the same peer. */
static __always_inline int masq_claim(struct ct4_key *rkey, const struct rct4_val *rv, const struct lb_cfg *cfg,
				      __u64 now)
{
	__u32 span, i;
	__u16 lo;

	span = snat_ports(cfg, &lo);
	for (i = 0; i < 8; i++) {
		struct rct4_val *old;

		rkey->dport = bpf_htons(lo + bpf_get_prandom_u32() % span);
		if (bpf_map_update_elem(&lb_rct4, rkey, rv, BPF_NOEXIST) == 0)
			return 0;
		old = bpf_map_lookup_elem(&lb_rct4, rkey);
		if (old && masq_expired(old, rkey->proto, now)) {
			struct ct4_key fk = { .src = old->client_ip, .dst = old->fe_ip, .sport = old->client_port,
					      .dport = old->fe_port, .proto = rkey->proto };

			bpf_map_delete_elem(&lb_ct4, &fk);
			if (bpf_map_update_elem(&lb_rct4, rkey, rv, BPF_ANY) == 0)
				return 0;
		}
	}
	return -1;
}

/* A packet of one of the node's pods leaving on the uplink for an address
 * outside the node's pod range takes the node's address and a port of the
 * SNAT range, as the CNI bridge's ipMasq did with iptables; replies are
 * turned back by nodeport_ingress. Multicast is left alone. */
static __always_inline int masquerade(struct __sk_buff *skb, struct pkt4 *p)
{
	__u32 zero = 0;
	struct lb_cfg *cfg = bpf_map_lookup_elem(&lb_config, &zero);
	struct ct4_val *ctp, ct = {};
	struct rct4_val *rv;
	__u64 now;

	if (!cfg || !cfg->masq_mask4 || !cfg->snat_ip4)
		return TC_ACT_OK;
	if ((p->t.src & cfg->masq_mask4) != cfg->masq_net4 || (p->t.dst & cfg->masq_mask4) == cfg->masq_net4)
		return TC_ACT_OK;
	if ((p->t.dst & bpf_htonl(0xf0000000)) == bpf_htonl(0xe0000000))
		return TC_ACT_OK;
	now = bpf_ktime_get_ns();
	ctp = bpf_map_lookup_elem(&lb_ct4, &p->t);
	if (ctp && (ctp->flags & CT_MASQ)) {
		struct ct4_key rk = { .src = p->t.dst, .dst = ctp->nat_ip, .sport = p->t.dport,
				      .dport = ctp->nat_port, .proto = p->t.proto };

		ct = *ctp;
		rv = bpf_map_lookup_elem(&lb_rct4, &rk);
		if (rv && rv->client_ip == p->t.src && rv->client_port == p->t.sport) {
			rv->seen = now;
			if (p->tcp_flags & (TCPF_FIN | TCPF_RST))
				rv->flags |= CT_CLOSING;
			goto rewrite;
		}
		/* Its reply entry was taken over or evicted: claim again. */
	}
	{
		struct ct4_key rk = { .src = p->t.dst, .dst = cfg->snat_ip4, .sport = p->t.dport, .proto = p->t.proto };
		struct rct4_val r = { .client_ip = p->t.src, .client_port = p->t.sport, .fe_ip = p->t.dst,
				      .fe_port = p->t.dport, .flags = CT_SNAT | CT_MASQ, .seen = now };

		if (masq_claim(&rk, &r, cfg, now) < 0) {
			count(STAT_TC_MASQ_DROPPED);
			return TC_ACT_SHOT;
		}
		ct.nat_ip = rk.dst;
		ct.nat_port = rk.dport;
		ct.flags = CT_MASQ;
		bpf_map_update_elem(&lb_ct4, &p->t, &ct, BPF_ANY);
		count(STAT_TC_MASQ);
	}
rewrite:
	rewrite4(skb, p->t.proto, IP_SRC_OFF, p->t.src, ct.nat_ip, p->t.proto == IPPROTO_ICMP ? ICMP_ID_OFF : L4_SPORT_OFF,
		 p->t.sport, ct.nat_port);
	return TC_ACT_OK;
}

/* Egress on the uplink: replies of local backends leave with the frontend
 * as their source again; the node's pods' own connections are masqueraded. */
SEC("tc")
int nodeport_egress(struct __sk_buff *skb)
{
	struct pkt4 p = {};
	struct rct4_val *rv;

	if (!parse4(skb, &p))
		return parse_echo4(skb, &p, ICMP_ECHO) ? masquerade(skb, &p) : TC_ACT_OK;
	rv = bpf_map_lookup_elem(&lb_rct4, &p.t);
	if (!rv || (rv->flags & CT_SNAT))
		return masquerade(skb, &p);
	{
		struct rct4_val r = *rv;

		rewrite4(skb, p.t.proto, IP_SRC_OFF, p.t.src, r.fe_ip, L4_SPORT_OFF, p.t.sport, r.fe_port);
	}
	count(STAT_TC_REVERSE);
	return TC_ACT_OK;
}
