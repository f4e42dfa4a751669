// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * The hand-off to vnetd's user path of a frame from an interface.
 */
#ifndef VNET_LIB_USER_H
#define VNET_LIB_USER_H

#include "stats.h"

/* A frame from an interface that is vnetd's: out of the interface's
 * hand-off TAP, which vnetd reads (or on up the stack, without one). */
static __always_inline int to_user(struct __sk_buff *skb)
{
	__u32 dev = skb->ifindex;
	__u32 *tap = bpf_map_lookup_elem(&handoff, &dev);
	count(S_TO_USER, 1);
	if (!tap)
		return TC_ACT_OK;
	return bpf_redirect(*tap, 0);
}

#endif /* VNET_LIB_USER_H */
