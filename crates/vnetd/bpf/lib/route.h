// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * The forwarding decision for a unicast frame: the destination entry or
 * the (port, destination, source) entry, port security (a port locked to
 * a MAC), no reflection, and from an interface the size checks against
 * the link's MTU and GSO.
 */
#ifndef VNET_LIB_ROUTE_H
#define VNET_LIB_ROUTE_H

#include "maps.h"
#include "encap.h"

static __always_inline struct route_val *pair_lookup(struct cfg *c, struct route_key *k)
{
	if (c->active)
		return bpf_map_lookup_elem(&routes_1, k);
	return bpf_map_lookup_elem(&routes_0, k);
}

/* The decision for a unicast frame `dst` <- `src` entering `port`: its
 * destination entry when it has one and it applies (the port's network,
 * its source lock, not back out of the port it came in by), else its
 * (port, destination, source) entry; the ingress port's counter slot in
 * `in_slot`. NULL: the frame is vnetd's. */
static __always_inline struct route_val *lookup(struct cfg *c, __u32 port, __u8 *dst, __u8 *src,
						__u32 *in_slot, struct port_val *known)
{
	/* The port's entry, unless the caller looked it up already. */
	struct port_val *pv = known ? known : bpf_map_lookup_elem(&ports, &port);
	if (pv && (!pv->locked || same_mac(pv->lock, src))) {
		struct dest_key dk = {.net = pv->net};
		__builtin_memcpy(dk.dst, dst, 6);
		struct route_val *r = bpf_map_lookup_elem(&dests, &dk);
		if (r && !(r->action != ACT_LINK && r->target == port)) {
			*in_slot = pv->slot;
			return r;
		}
	}
	struct route_key k = {.port = port};
	__builtin_memcpy(k.dst, dst, 6);
	__builtin_memcpy(k.src, src, 6);
	struct route_val *r = pair_lookup(c, &k);
	if (r)
		*in_slot = r->in_slot;
	return r;
}

/* The frames the fast path takes: IPv4 and IPv6 (ARP and the rest are
 * rare and go to vnetd, which keeps one code path for them). */
static __always_inline int fast_proto(__u16 proto)
{
	return proto == bpf_htons(ETH_P_IP) || proto == bpf_htons(ETH_P_IPV6);
}

/* The headers each segment of a GSO frame repeats (Ethernet, IP, TCP or
 * UDP), or 0 when they cannot be told (the frame is then vnetd's). */
static __always_inline __u32 seg_hdr_len(struct __sk_buff *skb, __u16 proto)
{
	__u8 l4;
	__u32 ip_len;

	if (proto == bpf_htons(ETH_P_IP)) {
		__u8 b[10];
		if (bpf_skb_load_bytes(skb, ETH_HLEN, b, sizeof(b)) < 0)
			return 0;
		ip_len = (b[0] & 0x0f) * 4;
		l4 = b[9];
	} else {
		__u8 b[7];
		if (bpf_skb_load_bytes(skb, ETH_HLEN, b, sizeof(b)) < 0)
			return 0;
		ip_len = 40;
		l4 = b[6];
	}
	if (ip_len < 20 || ip_len > 60)
		return 0;
	if (l4 == IPPROTO_UDP)
		return ETH_HLEN + ip_len + 8;
	if (l4 != IPPROTO_TCP)
		return 0;
	__u8 doff;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + ip_len + 12, &doff, 1) < 0)
		return 0;
	return ETH_HLEN + ip_len + (doff >> 4) * 4;
}

/* The decision for a frame from a local interface: the route, or NULL when
 * the frame is vnetd's; its Ethernet header in `eth` (the inner header, if
 * the frame is encapsulated). */
static __always_inline struct route_val *vm_decision(struct __sk_buff *skb, struct cfg *c,
						    struct ethhdr *eth, struct link_val **lk, __u32 *in_slot,
						    struct port_val *pv)
{
	struct ethhdr *e = head(skb, ETH_HLEN);
	if (!e)
		return NULL;
	__builtin_memcpy(eth, e, sizeof(*eth));
	/* A VLAN tag the device took out of the frame (skb metadata) would
	 * not survive the encapsulation: such frames are vnetd's. */
	if (skb->vlan_present)
		return NULL;
	if (eth->h_dest[0] & 1 || !fast_proto(eth->h_proto))
		return NULL;
	struct route_val *r = lookup(c, skb->ifindex, eth->h_dest, eth->h_source, in_slot, pv);
	if (!r)
		return NULL;
	if (r->action == ACT_LINK) {
		struct link_val *l = &r->link;
		__u32 over = outer_len(l) + format_len(l->format);
		/* A frame too big for the underlay is vnetd's: it fragments
		 * `vnet` frames itself. A GSO frame stays whole through the
		 * encapsulation (tunnel GSO), but wherever it is segmented each
		 * segment must fit too: a guest on MTU 1500 over a 1500-byte
		 * underlay sends segments the kernel could only drop (a frame
		 * of one segment is segmented at once, on the underlay device,
		 * and dropped there for its size). */
		__u32 seg = skb->len;
		/* A GSO frame that the encapsulation takes to the kernel's
		 * 64 KB GSO limit is segmented in software on the underlay,
		 * into segments the underlay then drops for their size (a
		 * QEMU guest's TSO frames reach 65535 bytes): vnetd's. */
		if (skb->len + over >= GSO_LIMIT)
			return NULL;
		if (skb->gso_size) {
			__u32 hl = seg_hdr_len(skb, eth->h_proto);
			if (!hl)
				return NULL;
			seg = hl + skb->gso_size;
		}
		/* The outer IP packet: the encapsulation and the whole inner
		 * frame, Ethernet header included. */
		if (seg + over > l->mtu)
			return NULL;
		*lk = l;
	}
	return r;
}

#endif /* VNET_LIB_ROUTE_H */
