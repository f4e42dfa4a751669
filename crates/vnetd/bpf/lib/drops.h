// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * Drops with their reasons, for vnetd's `monitor drops`. Every frame the
 * programs drop goes through dropped(): counted in its S_* counter (which
 * vnetd maps to its drop reason, one list with the user path's), and,
 * while a monitor is attached, sent to vnetd as a drop_event through the
 * ring buffer `drop_events`.
 *
 * Nothing is reserved unless `drop_monitor`'s one entry is set (vnetd sets
 * it while someone watches, and clears it when they stop): with nobody
 * watching a drop costs its counter and one array lookup. While watched,
 * each CPU may send DROP_EVENTS_PER_SEC events a second, DROP_EVENTS_BURST
 * at once (a token bucket in `drop_bucket`, in nanoseconds of credit: no
 * division); the rest are counted (S_DROP_EVENTS_LIMITED), as are events
 * the full ring could not take (S_DROP_EVENTS_LOST). A flood of drops so
 * costs vnetd a bounded ring and a bounded rate of events to read.
 */
#ifndef VNET_LIB_DROPS_H
#define VNET_LIB_DROPS_H

#include "stats.h"

#define DROP_COST_NS (1000000000ULL / DROP_EVENTS_PER_SEC)
#define DROP_CREDIT_MAX (DROP_COST_NS * DROP_EVENTS_BURST)

/* 1 while a monitor is attached (vnetd writes it). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} drop_monitor SEC(".maps");

/* Each CPU's credit, in nanoseconds, and when it was last topped up. */
struct drop_credit {
	__u64 credit;
	__u64 last;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct drop_credit);
} drop_bucket SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, DROP_RING_BYTES);
} drop_events SEC(".maps");

/* Never used: keeps struct drop_event in the object's BTF, where build.rs
 * checks its layout against vnetd's (a ring buffer map names no type). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct drop_event);
} drop_event_layout SEC(".maps");

/* Whether this CPU may send one more event now (taking its cost). */
static __always_inline int drop_take(__u64 now)
{
	__u32 zero = 0;
	struct drop_credit *b = bpf_map_lookup_elem(&drop_bucket, &zero);
	if (!b)
		return 0;
	__u64 c = b->credit + (now - b->last);
	if (now < b->last || c > DROP_CREDIT_MAX)
		c = DROP_CREDIT_MAX;
	b->last = now;
	if (c < DROP_COST_NS) {
		b->credit = c;
		return 0;
	}
	b->credit = c - DROP_COST_NS;
	return 1;
}

/* Sends a drop event for `skb`, counted `stat`, if a monitor is attached
 * and the rate allows. */
static __always_inline void drop_event(struct __sk_buff *skb, __u32 stat)
{
	__u32 zero = 0;
	__u32 *on = bpf_map_lookup_elem(&drop_monitor, &zero);
	if (!on || !*on)
		return;
	__u64 now = bpf_ktime_get_ns();
	if (!drop_take(now)) {
		count(S_DROP_EVENTS_LIMITED, 1);
		return;
	}
	struct drop_event *e = bpf_ringbuf_reserve(&drop_events, sizeof(*e), 0);
	if (!e) {
		count(S_DROP_EVENTS_LOST, 1);
		return;
	}
	e->time_ns = now;
	e->stat = stat;
	e->ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	e->len = skb->len;
	__u32 n = skb->len < DROP_HEAD ? skb->len : DROP_HEAD;
	e->caplen = 0;
	/* 1 to DROP_HEAD bytes, bounds the verifier sees. */
	if (n >= 1 && n <= DROP_HEAD && bpf_skb_load_bytes(skb, 0, e->head, n) == 0)
		e->caplen = n;
	bpf_ringbuf_submit(e, 0);
	count(S_DROP_EVENTS, 1);
}

/* A frame dropped: counted in `stat`, told to a monitor; the verdict. */
static __always_inline int dropped(struct __sk_buff *skb, __u32 stat)
{
	count(stat, 1);
	drop_event(skb, stat);
	return TC_ACT_SHOT;
}

#endif /* VNET_LIB_DROPS_H */
