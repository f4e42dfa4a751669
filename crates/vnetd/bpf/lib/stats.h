// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * The counters: the programs' (`stats`, indexed by vnet.h's S_* enum),
 * per port (`port_stats`), per MAC pair (`pairs`, `show matrix`) and per
 * governed network (`gov_stats`). The programs only add to them.
 */
#ifndef VNET_LIB_STATS_H
#define VNET_LIB_STATS_H

#include "maps.h"

static __always_inline void count(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

static __always_inline void port_count(__u32 slot, int tx, __u64 bytes)
{
	struct port_stats *p = bpf_map_lookup_elem(&port_stats, &slot);
	if (!p)
		return;
	if (tx) {
		p->tx_packets++;
		p->tx_bytes += bytes;
	} else {
		p->rx_packets++;
		p->rx_bytes += bytes;
	}
}

static __always_inline void pair_count(struct ethhdr *e, __u64 bytes)
{
	struct pair_key k;
	__builtin_memcpy(k.src, e->h_source, 6);
	__builtin_memcpy(k.dst, e->h_dest, 6);
	struct pair_val *v = bpf_map_lookup_elem(&pairs, &k);
	if (v) {
		v->frames++;
		v->bytes += bytes;
		return;
	}
	/* This CPU's value; the others start at zero. */
	struct pair_val n = {.frames = 1, .bytes = bytes};
	bpf_map_update_elem(&pairs, &k, &n, BPF_NOEXIST);
}

/* A frame forwarded by a known flow, counted for its network. */
static __always_inline void gov_count(__u32 slot, __u64 bytes)
{
	if (!slot)
		return;
	count(S_POLICY_FLOW, 1);
	struct gov_stats *g = bpf_map_lookup_elem(&gov_stats, &slot);
	if (g) {
		g->packets++;
		g->bytes += bytes;
	}
}

#endif /* VNET_LIB_STATS_H */
