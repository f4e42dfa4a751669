// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * The IP source guard (`guard`): a guarded interface's frames come from the
 * addresses it owns.
 */
#ifndef VNET_LIB_GUARD_H
#define VNET_LIB_GUARD_H

#include "maps.h"

/* Neighbour and router discovery from a guarded interface (ICMPv6 right
 * behind the IPv6 header; `k` holds its source, `any`: the source is not
 * ::), as vnet_wire::guard reads it: a router advertisement or a redirect
 * never passes; a neighbour advertisement passes when its source and its
 * target are the port's; a solicitation from :: (duplicate address
 * detection) when its target is. 0: pass; -1: drop; 1: vnetd's; 2: the
 * rest, judged by its source. Only ICMPv6 types 133-137 cost more than
 * reading the type: one more `guard` lookup, for the target. */
static __always_inline int nd_guard(struct __sk_buff *skb, struct guard_key *k, __u8 any)
{
	__u8 *m = head(skb, ETH_HLEN + 41);
	if (!m)
		return 1;
	__u8 type = m[ETH_HLEN + 40];
	if (type == 134 || type == 137)
		return -1;
	if (type == 136 || (type == 135 && !any)) {
		m = head(skb, ETH_HLEN + 64);
		if (!m)
			return 1;
		if (type == 136 && !bpf_map_lookup_elem(&guard, k))
			return -1;
		__builtin_memcpy(k->addr, m + ETH_HLEN + 48, 16);
		return bpf_map_lookup_elem(&guard, k) ? 0 : -1;
	}
	/* From ::, nothing else in ICMPv6. */
	return any ? 2 : -1;
}

/* Whether a frame from a guarded interface (`port`, its `ports` entry
 * `pv`) comes from an address it owns, as vnet_wire::guard reads it: its
 * IPv4 or IPv6 source, or its ARP sender (an IPv4 ARP), is in `guard`;
 * or it is a DHCP client's broadcast (0.0.0.0 to 255.255.255.255 at the
 * broadcast MAC, UDP 68 to 67: from 0.0.0.0 to one host, it would reach
 * that host past the guard), an ARP probe
 * (sender 0.0.0.0) for a target in `guard`, or from :: an MLD report
 * behind a hop-by-hop header; neighbour and router discovery as
 * `nd_guard` says; an IPv6 packet with hop limit 255 behind an extension
 * header (neighbour discovery hidden from `nd_guard`) never. 0: it may go
 * on; -1: drop it; 1: vnetd's (a VLAN tag, a header the programs do not
 * read whole, a port whose addresses the map could not hold), which
 * guards it the same way. Other EtherTypes carry no address: 0. */
static __always_inline int source_guard(struct __sk_buff *skb, __u32 port, struct port_val *pv)
{
	if (pv->guarded == GUARD_USER || skb->vlan_present)
		return 1;
	struct ethhdr *e = head(skb, ETH_HLEN);
	if (!e)
		return 1;
	__u16 proto = e->h_proto;
	struct guard_key k = {.port = port};
	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 *m = head(skb, ETH_HLEN + 20);
		if (!m)
			return 1;
		__u8 *ip = m + ETH_HLEN;
		if ((ip[0] >> 4) != 4 || (ip[0] & 0x0f) < 5)
			return 1;
		__u32 src, dst;
		__builtin_memcpy(&src, ip + 12, 4);
		if (src == 0) {
			/* A DHCP client's request: UDP 68 -> 67, a first fragment,
			 * broadcast (255.255.255.255 at the broadcast MAC). */
			__u8 p[4], all = 0xff;
#pragma clang loop unroll(full)
			for (int i = 0; i < 6; i++)
				all &= m[i];
			__builtin_memcpy(&dst, ip + 16, 4);
			if (all != 0xff || dst != 0xffffffff || ip[9] != IPPROTO_UDP || (ip[6] & 0x1f) || ip[7] ||
			    bpf_skb_load_bytes(skb, ETH_HLEN + (ip[0] & 0x0f) * 4, p, 4) < 0)
				return -1;
			return p[0] == 0 && p[1] == 68 && p[2] == 0 && p[3] == 67 ? 0 : -1;
		}
		k.addr[10] = k.addr[11] = 0xff;
		__builtin_memcpy(&k.addr[12], &src, 4);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		__u8 *ip = head(skb, ETH_HLEN + 40);
		if (!ip)
			return 1;
		ip += ETH_HLEN;
		if ((ip[0] >> 4) != 6)
			return 1;
		__u8 nh = ip[6], hl = ip[7];
		__builtin_memcpy(k.addr, ip + 8, 16);
		__u8 any = 0;
#pragma clang loop unroll(full)
		for (int i = 0; i < 16; i++)
			any |= k.addr[i];
		if (nh == 58) {
			int g = nd_guard(skb, &k, any);
			if (g != 2)
				return g;
		} else if (hl == 255 && (nh == 0 || nh == 43 || nh == 44 || nh == 60)) {
			return -1;
		} else if (!any) {
			/* From ::, an MLD report behind a hop-by-hop header only. */
			__u8 h[2], t;
			if (nh != 0 || bpf_skb_load_bytes(skb, ETH_HLEN + 40, h, 2) < 0 || h[0] != 58 ||
			    bpf_skb_load_bytes(skb, ETH_HLEN + 40 + 8 + 8 * (__u32)h[1], &t, 1) < 0)
				return -1;
			return t == 131 || t == 143 ? 0 : -1;
		}
	} else if (proto == bpf_htons(ETH_P_ARP)) {
		__u8 *a = head(skb, ETH_HLEN + 28);
		if (!a)
			return 1;
		a += ETH_HLEN;
		if (a[2] != 8 || a[3] != 0 || a[4] != 6 || a[5] != 4)
			return 0; /* not IPv4's */
		__u32 spa;
		__builtin_memcpy(&spa, a + 14, 4);
		if (spa == 0) /* a probe (RFC 5227): for an address it owns */
			__builtin_memcpy(&spa, a + 24, 4);
		k.addr[10] = k.addr[11] = 0xff;
		__builtin_memcpy(&k.addr[12], &spa, 4);
	} else {
		return proto == bpf_htons(0x8100) || proto == bpf_htons(0x88a8) ? 1 : 0;
	}
	return bpf_map_lookup_elem(&guard, &k) ? 0 : -1;
}

#endif /* VNET_LIB_GUARD_H */
