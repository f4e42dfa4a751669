// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * Encapsulation for a link: the outer IPv4 or IPv6 and UDP headers and the
 * `vnet` or VXLAN header, written in front of the frame.
 */
#ifndef VNET_LIB_ENCAP_H
#define VNET_LIB_ENCAP_H

#include "common.h"

/* The outer IP and UDP headers' length on a link's underlay. */
static __always_inline __u32 outer_len(struct link_val *l)
{
	return l->v6 ? OUTER6_LEN : OUTER_LEN;
}

/* What a link's format puts between the outer UDP header and the frame. */
static __always_inline __u32 format_len(__u8 format)
{
	if (format == FMT_VNET)
		return VNET_HDR_LEN;
	if (format == FMT_VXLAN)
		return VXLAN_HDR_LEN;
	return 0;
}

static __always_inline void ipv4_csum(struct iphdr *ip)
{
	__u16 *p = (__u16 *)ip;
	__u32 sum = 0;
#pragma clang loop unroll(full)
	for (int i = 0; i < (int)sizeof(*ip) / 2; i++)
		sum += p[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip->check = (__u16)~sum;
}

/* The outer headers of an encapsulated frame, as written in one go. */
struct outer {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
} __attribute__((packed));

struct outer6 {
	struct ethhdr eth;
	struct ipv6hdr ip;
	struct udphdr udp;
} __attribute__((packed));

/* Writes the `olen` bytes of outer headers `o`, the `vh` bytes of
 * encapsulation header `hdr` and the inner Ethernet header into the room
 * made for them: 0, or -1 when they cannot be reached. (Inlined with
 * constant lengths, one copy per underlay and format.) */
static __always_inline int write_encap(struct __sk_buff *skb, void *o, __u32 olen, __u32 vh, __u8 *hdr,
				       struct ethhdr *inner)
{
	void *d = head(skb, olen + vh + ETH_HLEN);
	if (!d)
		return -1;
	__builtin_memcpy(d, o, olen);
	__builtin_memcpy(d + olen, hdr, vh);
	__builtin_memcpy(d + olen + vh, inner, sizeof(*inner));
	return 0;
}

/* The outer headers and encapsulation header for link `l`, written:
 * IPv4 or IPv6 outside, `vnet` or VXLAN inside. */
static __always_inline int write_headers(struct __sk_buff *skb, struct link_val *l, struct udphdr *udp,
					 __u32 hash, __u32 outer, struct ethhdr *inner)
{
	__u8 x[VXLAN_HDR_LEN] = {VXLAN_FLAG_I, 0, 0, 0, (__u8)(l->network >> 16), (__u8)(l->network >> 8),
				 (__u8)l->network, 0};
	__u8 v[VNET_HDR_LEN] = {};
	v[0] = 1;            /* version */
	v[1] = VNET_WHOLE;   /* flags */
	v[3] = VNET_HDR_LEN; /* header length */
	__u32 net = bpf_htonl(l->network);
	__builtin_memcpy(&v[4], &net, 4);
	int vxlan = l->format == FMT_VXLAN;
	if (l->v6) {
		struct outer6 o = {.udp = *udp};
		o.eth.h_proto = bpf_htons(ETH_P_IPV6);
		o.ip.version = 6;
		/* The flow label from the inner flow's hash (RFC 6438). */
		o.ip.flow_lbl[0] = (hash >> 16) & 0x0f;
		o.ip.flow_lbl[1] = hash >> 8;
		o.ip.flow_lbl[2] = hash;
		o.ip.payload_len = udp->len;
		o.ip.nexthdr = IPPROTO_UDP;
		o.ip.hop_limit = 64;
		__builtin_memcpy(&o.ip.saddr, l->local_ip, 16);
		__builtin_memcpy(&o.ip.daddr, l->remote_ip, 16);
		if (vxlan)
			return write_encap(skb, &o, sizeof(o), VXLAN_HDR_LEN, x, inner);
		return write_encap(skb, &o, sizeof(o), VNET_HDR_LEN, v, inner);
	}
	struct iphdr ip = {};
	ip.version = 4;
	ip.ihl = 5;
	ip.ttl = 64;
	ip.protocol = IPPROTO_UDP;
	ip.frag_off = bpf_htons(0x4000); /* DF */
	/* GSO rewrites both lengths per segment; a 64 KB frame's own may not fit. */
	ip.tot_len = bpf_htons(outer > 0xffff ? 0xffff : outer);
	__builtin_memcpy(&ip.saddr, &l->local_ip[12], 4);
	__builtin_memcpy(&ip.daddr, &l->remote_ip[12], 4);
	ipv4_csum(&ip);
	struct outer o = {.ip = ip, .udp = *udp};
	o.eth.h_proto = bpf_htons(ETH_P_IP); /* the MACs: bpf_redirect_neigh's */
	if (vxlan)
		return write_encap(skb, &o, sizeof(o), VXLAN_HDR_LEN, x, inner);
	return write_encap(skb, &o, sizeof(o), VNET_HDR_LEN, v, inner);
}

/* Encapsulates the frame whose Ethernet header is `inner` for link `l`. */
static __always_inline int encap(struct __sk_buff *skb, struct link_val *l, struct ethhdr *inner)
{
	if (l->format != FMT_VNET && l->format != FMT_VXLAN)
		return -1; /* raw links are the user path's */
	__u32 vh = format_len(l->format);
	__u32 ol = outer_len(l);
	__u32 inner_len = skb->len;
	/* The flow hash before the headers change (the VM's socket set it;
	 * computed only when it did not). */
	__u32 hash = skb->hash;
	if (!hash)
		hash = bpf_get_hash_recalc(skb);
	/* Room after the (outer-to-be) Ethernet header for IP, UDP, the vnet
	 * header and the inner Ethernet header; the kernel records the inner
	 * headers so GSO segments the inner TCP and copies the outer headers. */
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		      BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	flags |= l->v6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV4;
	if (bpf_skb_adjust_room(skb, ol + vh + ETH_HLEN, BPF_ADJ_ROOM_MAC, flags) < 0)
		return -1;

	/* IPv4's total length: all but the outer Ethernet header. */
	__u32 outer = inner_len + ol + vh;
	struct udphdr udp = {};
	/* Source port from the inner flow's hash: entropy for RSS/ECMP (VXLAN:
	 * RFC 7348's 49152-65535). The UDP checksum stays 0: as Linux VTEPs
	 * send it over IPv4, and over IPv6 as RFC 6935 and 6936 allow for
	 * tunnels (a Linux VTEP takes it with `udp6zerocsumrx`, vnetd's
	 * sockets with UDP_NO_CHECK6_RX); the inner frame keeps its own
	 * checksums, and tunnel GSO could not compute the outer one per
	 * segment from here. */
	if (l->format == FMT_VXLAN)
		udp.source = bpf_htons(49152 + (hash % 16384));
	else
		udp.source = bpf_htons(32768 + (hash % 28232));
	udp.dest = l->remote_port;
	__u32 udp_len = inner_len + sizeof(struct udphdr) + vh;
	udp.len = bpf_htons(udp_len > 0xffff ? 0xffff : udp_len);
	return write_headers(skb, l, &udp, hash, outer, inner);
}

#endif /* VNET_LIB_ENCAP_H */
