// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * ARP requests and neighbour solicitations answered in place (`neigh`).
 */
#ifndef VNET_LIB_NEIGH_H
#define VNET_LIB_NEIGH_H

#include "stats.h"
#include "drops.h"

/* The length of a neighbour solicitation with one source link-layer
 * address option, and of its answer (vnet_wire::neigh::ND_FRAME). */
#define ND_FRAME (ETH_HLEN + 40 + 24 + 8)

/* The ICMPv6 checksum of the advertisement in `f` (an ND_FRAME), over
 * the pseudo-header (RFC 8200 8.1) and the message. */
static __always_inline __u16 nd_csum(const __u8 *f)
{
	__u32 sum = 32 + 58; /* the payload's length, next header ICMPv6 */
#pragma clang loop unroll(full)
	for (int i = ETH_HLEN + 8; i < ND_FRAME; i += 2)
		sum += ((__u32)f[i] << 8) | f[i + 1];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* A neighbour solicitation (`f`, ND_FRAME bytes) as vnet_wire::neigh
 * answers one, for an address of `neigh6` in network `net`: rewritten in
 * `f` into the owner's advertisement; 0, or -1 when it is not one to
 * answer (extension headers, other options, a hop limit other than 255,
 * duplicate address detection, a multicast target, the owner asking). */
static __always_inline int answer_nd(__u8 *f, __u32 net)
{
	__u8 *ip = f + ETH_HLEN, *icmp = ip + 40;
	if ((ip[0] >> 4) != 6 || ip[4] != 0 || ip[5] != 32 || ip[6] != 58 || ip[7] != 255 ||
	    icmp[0] != 135 || icmp[1] != 0 || icmp[24] != 1 || icmp[25] != 1 || icmp[8] == 0xff)
		return -1;
	__u8 any = 0;
#pragma clang loop unroll(full)
	for (int i = 8; i < 24; i++)
		any |= ip[i];
	if (!any)
		return -1; /* duplicate address detection: from :: */
	struct neigh6_key k = {.net = net};
	__builtin_memcpy(k.ip, icmp + 8, 16);
	struct neigh_val *n = bpf_map_lookup_elem(&neigh6, &k);
	if (!n || same_mac_bytes(n->mac, f + 6))
		return -1;
	__builtin_memcpy(f, f + 6, 6);         /* to the asker */
	__builtin_memcpy(f + 6, n->mac, 6);    /* from the owner */
	__builtin_memcpy(ip + 24, ip + 8, 16); /* to the asker's address */
	__builtin_memcpy(ip + 8, k.ip, 16);    /* from the target */
	icmp[0] = 136;
	icmp[2] = icmp[3] = 0;
	icmp[4] = 0x60; /* Solicited, Override */
	icmp[5] = icmp[6] = icmp[7] = 0;
	icmp[24] = 2;   /* the target link-layer address */
	__builtin_memcpy(icmp + 26, n->mac, 6);
	__u16 c = nd_csum(f);
	icmp[2] = c >> 8;
	icmp[3] = c & 0xff;
	return 0;
}

/* An ARP request or a neighbour solicitation from a local interface for
 * an address of `neigh4` or `neigh6` in the interface's network, as
 * vnetd's engine answers it (vnet_wire::neigh): rewritten into the
 * owner's answer and sent back out of the interface. Left to vnetd (-1):
 * anything else, a probe (sender 0.0.0.0), a gratuitous request, the
 * owner asking about its own address, a source the port is not locked
 * to, a solicitation the engine would not answer either. */
static __always_inline int answer_neigh(struct __sk_buff *skb)
{
	/* Only a broadcast or multicast ARP or IPv6 frame is looked at past
	 * its Ethernet header (and pulled for it): every other frame costs
	 * two compares here. */
	int arp = skb->protocol == bpf_htons(ETH_P_ARP);
	if ((!arp && skb->protocol != bpf_htons(ETH_P_IPV6)) || skb->vlan_present ||
	    (skb->pkt_type != PACKET_BROADCAST && skb->pkt_type != PACKET_MULTICAST))
		return -1;
	if (!arp && skb->len != ND_FRAME)
		return -1;
	__u32 port = skb->ifindex;
	struct port_val *pv = bpf_map_lookup_elem(&ports, &port);
	if (!pv)
		return -1;
	__u8 r[ND_FRAME];
	__u32 len;
	if (arp) {
		__u8 *d = head(skb, ETH_HLEN + 28);
		if (!d)
			return -1;
		struct ethhdr *e = (struct ethhdr *)d;
		if (e->h_proto != bpf_htons(ETH_P_ARP) || !(e->h_dest[0] & 1))
			return -1;
		if (pv->locked && !same_mac(pv->lock, e->h_source))
			return -1;
		__u8 *a = d + ETH_HLEN;
		if (a[0] != 0 || a[1] != 1 || a[2] != 8 || a[3] != 0 || a[4] != 6 || a[5] != 4 ||
		    a[6] != 0 || a[7] != 1)
			return -1;
		__u32 spa, tpa;
		__builtin_memcpy(&spa, a + 14, 4);
		__builtin_memcpy(&tpa, a + 24, 4);
		if (spa == 0 || spa == tpa)
			return -1;
		struct neigh_key k = {.net = pv->net};
		__builtin_memcpy(k.ip, &tpa, 4);
		struct neigh_val *n = bpf_map_lookup_elem(&neigh4, &k);
		if (!n || same_mac(n->mac, e->h_source))
			return -1;
		__builtin_memcpy(r, e->h_source, 6);      /* to the asker */
		__builtin_memcpy(r + 6, n->mac, 6);       /* from the owner */
		r[12] = 0x08;
		r[13] = 0x06;
		__builtin_memcpy(r + 14, a, 6);           /* Ethernet, IPv4, 6, 4 */
		r[20] = 0;
		r[21] = 2;                                /* a reply */
		__builtin_memcpy(r + 22, n->mac, 6);      /* the owner's MAC ... */
		__builtin_memcpy(r + 28, &tpa, 4);        /* ... has the address asked */
		__builtin_memcpy(r + 32, e->h_source, 6); /* to the asker */
		__builtin_memcpy(r + 38, &spa, 4);
		len = ETH_HLEN + 28;
	} else {
		if (bpf_skb_load_bytes(skb, 0, r, ND_FRAME) < 0)
			return -1;
		if (r[12] != 0x86 || r[13] != 0xdd || !(r[0] & 1))
			return -1;
		if (pv->locked && !same_mac_bytes(pv->lock, r + 6))
			return -1;
		if (answer_nd(r, pv->net) < 0)
			return -1;
		len = ND_FRAME;
	}
	if (bpf_skb_store_bytes(skb, 0, r, len, 0) < 0)
		return dropped(skb, S_ERRORS);
	count(S_NEIGH, 1);
	port_count(pv->slot, 0, skb->len);
	port_count(pv->slot, 1, skb->len);
	return bpf_redirect(port, 0);
}

#endif /* VNET_LIB_NEIGH_H */
