// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * What every part of the programs uses: the kernel's headers, vnet.h (what
 * the programs share with vnetd), the outer headers' lengths, direct access
 * to a packet's head and MAC comparisons.
 */
#ifndef VNET_LIB_COMMON_H
#define VNET_LIB_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "../vnet.h"

#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif

#define OUTER_LEN (sizeof(struct iphdr) + sizeof(struct udphdr)) /* 28 */
#define OUTER6_LEN (sizeof(struct ipv6hdr) + sizeof(struct udphdr)) /* 48 */

/* The packet's first `need` bytes for direct access (pulled into the
 * linear part when they are not), or NULL. Direct reads and writes cost a
 * bounds check; each bpf_skb_{load,store}_bytes is a helper call. */
static __always_inline void *head(struct __sk_buff *skb, __u32 need)
{
	void *data = (void *)(long)skb->data;
	if (data + need > (void *)(long)skb->data_end) {
		if (bpf_skb_pull_data(skb, need) < 0)
			return NULL;
		data = (void *)(long)skb->data;
		if (data + need > (void *)(long)skb->data_end)
			return NULL;
	}
	return data;
}

/* The same, a byte at a time: for a MAC in a buffer on the stack, where the
 * verifier refuses a misaligned word. */
static __always_inline int same_mac_bytes(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

static __always_inline int same_mac(const __u8 *a, const __u8 *b)
{
	return *(const __u32 *)a == *(const __u32 *)b && *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

#endif /* VNET_LIB_COMMON_H */
