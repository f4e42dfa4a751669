// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * Policy on the fast path (docs/POLICY.md): a frame of a governed network
 * passes only as a flow vnetd's engine allowed (`flows`), checked against
 * the programs' coarse clock (`clock`, a BPF timer) through a per-CPU cache
 * of recent flows (`flow_cache`).
 */
#ifndef VNET_LIB_FLOWS_H
#define VNET_LIB_FLOWS_H

#include "maps.h"

/* A MAC as a native word (its 6 bytes, then zeros), for ordering. */
static __always_inline __u64 mac_word(const __u8 *m)
{
	__u64 w = 0;
	__builtin_memcpy(&w, m, 6);
	return w;
}

/* A flow's key in the order vnetd writes it (kernel::flows::canonical):
 * its lower end (address, then port, then MAC; as native words) first,
 * so both directions of a flow find one entry with one lookup. The MACs
 * go with their ends. Returns the packet's way in that order (0: from
 * the key's `src` end, 1: back), as flow_val counts it. */
static __always_inline int canonical(struct flow_key *k)
{
	__u64 a0, a1, b0, b1;
	__builtin_memcpy(&a0, k->src, 8);
	__builtin_memcpy(&a1, k->src + 8, 8);
	__builtin_memcpy(&b0, k->dst, 8);
	__builtin_memcpy(&b1, k->dst + 8, 8);
	__u64 sm = mac_word(k->smac), dm = mac_word(k->dmac);
	int swap = a0 != b0	      ? a0 > b0
		   : a1 != b1	      ? a1 > b1
		   : k->sport != k->dport ? k->sport > k->dport
					  : sm > dm;
	if (!swap)
		return 0;
	__builtin_memcpy(k->src, &b0, 8);
	__builtin_memcpy(k->src + 8, &b1, 8);
	__builtin_memcpy(k->dst, &a0, 8);
	__builtin_memcpy(k->dst + 8, &a1, 8);
	__builtin_memcpy(k->smac, &dm, 6);
	__builtin_memcpy(k->dmac, &sm, 6);
	__u16 p = k->sport;
	k->sport = k->dport;
	k->dport = p;
	return 1;
}

/* The coarse monotonic clock as the programs read it for a flow's idle
 * time: a load, not a helper call on every packet of a governed network
 * (bpf_ktime_get_coarse_ns cost the kernel path about 50 ns a packet
 * here, a third of what a policy cost it; kernel.bpf_stats_enabled,
 * docs/POLICY.md). A BPF timer rewrites it every CLOCK_TICK_MS, armed by
 * the first packet that reads it. Where the timer cannot be armed, every
 * read asks the kernel's clock (`ticking` 2). */
#define CLOCK_MONOTONIC 1
#define CLOCK_TICK_NS (CLOCK_TICK_MS * 1000000ULL)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct clock_val);
} clock SEC(".maps");

static int clock_tick(void *map, __u32 *key, struct clock_val *v)
{
	v->now = bpf_ktime_get_coarse_ns();
	bpf_timer_start(&v->timer, CLOCK_TICK_NS, 0);
	return 0;
}

static __noinline __u64 clock_arm(struct clock_val *v)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	v->now = now;
	long e = bpf_timer_init(&v->timer, &clock, CLOCK_MONOTONIC);
	/* -EBUSY: another CPU armed it first. */
	if (e == 0) {
		if (bpf_timer_set_callback(&v->timer, clock_tick) || bpf_timer_start(&v->timer, CLOCK_TICK_NS, 0))
			e = -1;
	}
	v->ticking = e == 0 || e == -16 ? 1 : 2;
	return now;
}

/* The time for idle checks: at most a tick behind the kernel's coarse
 * clock (which is itself a tick behind the one vnetd writes `last` with). */
static __always_inline __u64 coarse_now(void)
{
	__u32 zero = 0;
	struct clock_val *v = bpf_map_lookup_elem(&clock, &zero);
	if (!v)
		return bpf_ktime_get_coarse_ns();
	if (v->ticking == 1)
		return v->now;
	if (v->ticking == 2)
		return bpf_ktime_get_coarse_ns();
	return clock_arm(v);
}

/* The flows a CPU found in `flows` within the last FLOW_CACHE_NS, a few
 * per CPU (by their ports' and addresses' last bytes): a further packet
 * of one is known without the hash lookup of its 64-byte key, the largest
 * part of what a policy cost the kernel path (about 70 ns a packet here,
 * kernel.bpf_stats_enabled). What that leaves out for at most
 * FLOW_CACHE_NS: the flow's `last` (rewritten once a second anyway) and
 * the LRU's note that it was used. A flow leaves `flows` only by its idle
 * time (minutes: a cached one was seen under a second ago) or to make
 * room (its packets would be allowed again by the engine, whose flow it
 * is); a new policy generation is another key. A cached key is compared
 * whole (same_flow: generation, addresses, MACs, ports, protocol). */
#define FLOW_CACHE_NS 1000000000ULL

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct flow_cached);
} flow_cache SEC(".maps");

static __always_inline int same_flow(const struct flow_key *a, const struct flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	_Static_assert(sizeof(struct flow_key) == 64, "same_flow compares eight words");
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4] && x[5] == y[5] &&
	       x[6] == y[6] && x[7] == y[7];
}

/* Adds what a CPU's cache entry counted to flow value `v` (its flow's),
 * and zeroes it there. */
static __always_inline void flow_flush(struct flow_cached *c, struct flow_val *v)
{
	if (c->packets[0] | c->packets[1]) {
		__sync_fetch_and_add(&v->packets[0], c->packets[0]);
		__sync_fetch_and_add(&v->packets[1], c->packets[1]);
		__sync_fetch_and_add(&v->bytes[0], c->bytes[0]);
		__sync_fetch_and_add(&v->bytes[1], c->bytes[1]);
	}
	c->packets[0] = c->packets[1] = c->bytes[0] = c->bytes[1] = 0;
}

/* Whether `k` (either direction) is a flow the engine allowed, seen within
 * its idle time; seen now if so, and the packet (`len` bytes of frame)
 * counted in the CPU's cache entry of the flow. `now` is coarse_now(),
 * behind the clock vnetd writes `last` with (a `last` ahead of it is
 * fresh): idle times are minutes, `last` is rewritten once a second. A
 * cache entry that goes (to another flow, or past FLOW_CACHE_NS) first
 * adds its counts to its flow's value: one more lookup when it was
 * another flow's, none when it is this one's. */
static __always_inline int flow_fresh(struct flow_key *k, __u64 now, __u32 len)
{
	__u64 idle = (k->proto == IPPROTO_TCP ? FLOW_TCP_IDLE_S : FLOW_IDLE_S) * 1000000000ULL;
	int dir = canonical(k) & 1;
	__u32 slot = (k->sport ^ k->dport ^ k->src[15] ^ k->dst[15]) & (FLOW_CACHE_SLOTS - 1);
	struct flow_cached *c = bpf_map_lookup_elem(&flow_cache, &slot);
	if (c && now - c->at <= FLOW_CACHE_NS && same_flow(&c->k, k)) {
		c->packets[dir] += 1;
		c->bytes[dir] += len;
		return 1;
	}
	struct flow_val *v = bpf_map_lookup_elem(&flows, k);
	if (!v)
		return 0;
	__u64 last = v->last;
	if (now > last) {
		if (now - last > idle)
			return 0;
		if (now - last > 1000000000ULL)
			v->last = now;
	}
	if (c) {
		if (same_flow(&c->k, k)) {
			flow_flush(c, v);
		} else if (c->packets[0] | c->packets[1]) {
			struct flow_val *old = bpf_map_lookup_elem(&flows, &c->k);
			if (old)
				flow_flush(c, old);
		}
		__builtin_memcpy(&c->k, k, sizeof(*k));
		c->at = now;
		c->packets[0] = c->packets[1] = c->bytes[0] = c->bytes[1] = 0;
		c->packets[dir] = 1;
		c->bytes[dir] = len;
	} else {
		__sync_fetch_and_add(&v->packets[dir], 1);
		__sync_fetch_and_add(&v->bytes[dir], len);
	}
	return 1;
}

/* The destination and source MACs of the Ethernet header at `eth`. */
static __always_inline void frame_macs(struct flow_key *k, const void *eth)
{
	__builtin_memcpy(k->dmac, eth, 6);
	__builtin_memcpy(k->smac, eth + 6, 6);
}

/* Whether the IP packet at `l3` (a constant: one inlined copy per place
 * and encapsulation, so the reads are direct) in a frame with EtherType
 * `proto` of governed network `net` is a further packet or a reply of a
 * flow the engine allowed. Only what the engine reads the same way and
 * passes by the same flow is looked at (vnet_wire::classify,
 * vnet_core::policy::flow_key): IPv4 without options and unfragmented,
 * IPv6 without extension headers; TCP, UDP, ICMP echo; the transport
 * header long enough to be read (16 bytes of TCP, 8 of UDP or ICMP,
 * inside the IP length). Anything else is the engine's (0). The flow is
 * keyed with the frame's MACs (the untagged Ethernet header just before
 * `l3`), so only its own two ends' frames are in it. The Ethernet and IP
 * headers and the transport header's first 8 bytes are read from the
 * frame's linear part (pulled there when they are not: a frame shorter
 * than them is the engine's anyway); each bpf_skb_load_bytes was a
 * helper call on every packet of a governed network. */
static __always_inline int flow_known(struct __sk_buff *skb, __u32 l3, __u16 proto, __u32 net, __u32 gen)
{
	struct flow_key k = {.net = net, .gen = gen};
	if (skb->len <= l3)
		return 0;
	__u32 hl, plen, len = skb->len - l3;
	__u8 h[8];
	int v6 = 0;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		void *d = head(skb, l3 + sizeof(ip) + sizeof(h));
		if (!d)
			return 0;
		__builtin_memcpy(&ip, d + l3, sizeof(ip));
		__builtin_memcpy(h, d + l3 + sizeof(ip), sizeof(h));
		if (ip.version != 4 || ip.ihl != 5 || (ip.frag_off & bpf_htons(0x3fff)))
			return 0;
		frame_macs(&k, d + l3 - ETH_HLEN);
		k.src[10] = k.src[11] = k.dst[10] = k.dst[11] = 0xff;
		__builtin_memcpy(&k.src[12], &ip.saddr, 4);
		__builtin_memcpy(&k.dst[12], &ip.daddr, 4);
		k.proto = ip.protocol;
		hl = sizeof(ip);
		plen = bpf_ntohs(ip.tot_len);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip;
		void *d = head(skb, l3 + sizeof(ip) + sizeof(h));
		if (!d)
			return 0;
		__builtin_memcpy(&ip, d + l3, sizeof(ip));
		__builtin_memcpy(h, d + l3 + sizeof(ip), sizeof(h));
		if (ip.version != 6)
			return 0;
		frame_macs(&k, d + l3 - ETH_HLEN);
		__builtin_memcpy(k.src, &ip.saddr, 16);
		__builtin_memcpy(k.dst, &ip.daddr, 16);
		k.proto = ip.nexthdr;
		hl = sizeof(ip);
		plen = bpf_ntohs(ip.payload_len) + sizeof(ip);
		v6 = 1;
	} else {
		return 0;
	}
	/* The packet ends at its IP length or the frame's end, the nearer. */
	if (plen > len)
		plen = len;
	__u32 need = k.proto == IPPROTO_TCP ? 16 : 8;
	if (plen < hl + need)
		return 0;
	if (k.proto == IPPROTO_TCP || k.proto == IPPROTO_UDP) {
		__builtin_memcpy(&k.sport, h, 2);
		__builtin_memcpy(&k.dport, h + 2, 2);
	} else if (k.proto == (v6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP)) {
		__u8 request = v6 ? 128 : 8, reply = v6 ? 129 : 0;
		if (h[0] == request)
			__builtin_memcpy(&k.sport, h + 4, 2);
		else if (h[0] == reply)
			__builtin_memcpy(&k.dport, h + 4, 2);
		else
			return 0; /* errors (related to a flow) and the rest */
	} else {
		return 0;
	}
	/* The frame's length: from its Ethernet header (just before `l3`) to
	 * the end, as the engine counts a frame. */
	return flow_fresh(&k, coarse_now(), skb->len - l3 + ETH_HLEN);
}

#endif /* VNET_LIB_FLOWS_H */
