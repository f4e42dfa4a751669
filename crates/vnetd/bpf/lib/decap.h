// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * Reading a datagram from the wire: its outer headers and encapsulation
 * header, before the wire program decapsulates it.
 */
#ifndef VNET_LIB_DECAP_H
#define VNET_LIB_DECAP_H

#include "common.h"

/* A datagram's encapsulation header, its first 8 bytes (all of VXLAN's),
 * and the inner Ethernet header after its `vh` bytes, behind `olen` bytes
 * of outer IP and UDP: 0, or -1 when the datagram is shorter. (Inlined
 * with constant lengths, one copy per underlay and format.) */
static __always_inline int read_encap(struct __sk_buff *skb, __u32 olen, __u32 vh, __u8 *x,
				      struct ethhdr *inner)
{
	void *d = head(skb, ETH_HLEN + olen + vh + ETH_HLEN);
	if (!d)
		return -1;
	__builtin_memcpy(x, d + ETH_HLEN + olen, 8);
	__builtin_memcpy(inner, d + ETH_HLEN + olen + vh, sizeof(*inner));
	return 0;
}

/* A datagram's outer headers, as the wire program needs them: its
 * addresses (16 bytes, IPv4 mapped), its UDP header and their length. */
struct wire_hdr {
	struct addr_key saddr;
	struct addr_key daddr;
	struct udphdr udp;
	__u32 olen;
};

static __always_inline void v4_mapped(struct addr_key *k, __u32 a)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->a[10] = 0xff;
	k->a[11] = 0xff;
	__builtin_memcpy(&k->a[12], &a, 4);
}

/* Reads an IPv4 or IPv6 datagram's outer headers into `w`: 0, or -1 when
 * the packet is not one whole UDP datagram the fast path could take (not
 * UDP, IPv4 options, IPv6 extension headers, a fragment, or lengths that
 * are not the packet's: the stack's to trim or drop, so that the user
 * path sees what the socket gets, or nothing). A GSO packet (a peer's
 * tunnel-GSO super-frame, whose outer lengths are rewritten per segment)
 * is checked later by its inner frame instead. */
static __always_inline int read_outer(struct __sk_buff *skb, struct wire_hdr *w)
{
	int gso = skb->gso_size != 0;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct {
			struct iphdr ip;
			struct udphdr udp;
		} __attribute__((packed)) h;
		void *d = head(skb, ETH_HLEN + sizeof(h));
		if (!d)
			return -1;
		__builtin_memcpy(&h, d + ETH_HLEN, sizeof(h));
		if (h.ip.version != 4 || h.ip.ihl != 5 || h.ip.protocol != IPPROTO_UDP)
			return -1;
		/* IP fragments are the stack's to reassemble. */
		if (h.ip.frag_off & bpf_htons(0x3fff))
			return -1;
		if (!gso && (bpf_ntohs(h.ip.tot_len) != skb->len - ETH_HLEN ||
			     bpf_ntohs(h.udp.len) != skb->len - ETH_HLEN - sizeof(struct iphdr)))
			return -1;
		v4_mapped(&w->saddr, h.ip.saddr);
		v4_mapped(&w->daddr, h.ip.daddr);
		w->udp = h.udp;
		w->olen = OUTER_LEN;
		return 0;
	}
	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return -1;
	struct {
		struct ipv6hdr ip;
		struct udphdr udp;
	} __attribute__((packed)) h;
	void *d = head(skb, ETH_HLEN + sizeof(h));
	if (!d)
		return -1;
	__builtin_memcpy(&h, d + ETH_HLEN, sizeof(h));
	/* UDP right after the fixed header: a fragment header or any other
	 * extension header is the stack's. */
	if (h.ip.version != 6 || h.ip.nexthdr != IPPROTO_UDP)
		return -1;
	if (!gso && (bpf_ntohs(h.ip.payload_len) != skb->len - ETH_HLEN - sizeof(struct ipv6hdr) ||
		     h.udp.len != h.ip.payload_len))
		return -1;
	__builtin_memcpy(w->saddr.a, &h.ip.saddr, 16);
	__builtin_memcpy(w->daddr.a, &h.ip.daddr, 16);
	w->udp = h.udp;
	w->olen = OUTER6_LEN;
	return 0;
}

static __always_inline int same_addr(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}


#endif /* VNET_LIB_DECAP_H */
