// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * What vnet's eBPF programs (vnet.bpf.c) and vnetd share: the constants and
 * the structs of the maps. The one source of each: vnetd's build script
 * (build.rs) reads the constants from this file into Rust, and checks each
 * struct's size and every field's offset, as the compiled object's BTF
 * says them, against its `#[repr(C)]` twin in `src/sys/bpf.rs` (a struct
 * changed on one side only fails the build). Keep the constants plain
 * `#define NAME NUMBER` lines and each struct's fields named as its twin's.
 */
#ifndef VNET_H
#define VNET_H

#include <linux/types.h>

#define PORT_LINK 0x80000000u /* route_key.port: link id | PORT_LINK */
#define ACT_IFACE 1      /* a veth: into its peer (bpf_redirect_peer) */
#define ACT_LINK 2
#define ACT_IFACE_XMIT 3 /* a TAP or other netdev: out of it (bpf_redirect) */
#define FMT_RAW 0
#define FMT_VNET 1
#define FMT_VXLAN 2
#define VNET_HDR_LEN 20
#define VXLAN_HDR_LEN 8
#define VXLAN_FLAG_I 0x08
#define VNET_WHOLE 0x04
#define MAX_ROUTES 262144 /* the daemon sizes the route maps at load (--kernel-routes) */
#define GSO_LIMIT 65536 /* GSO_LEGACY_MAX_SIZE: larger GSO frames are segmented */

struct route_key {
	__u32 port;   /* ingress: interface ifindex, or PORT_LINK | link id */
	__u8 dst[6];
	__u8 src[6];
};

/* Underlay addresses are 16 bytes: IPv6, or IPv4 as ::ffff:a.b.c.d (the
 * IPv4 address in the last 4 bytes). */
struct link_val {
	__u8 remote_ip[16];
	__u8 local_ip[16];
	__u8 nexthop[16];  /* the route's gateway, or remote_ip */
	__u16 remote_port; /* network order */
	__u8 format;       /* FMT_RAW, FMT_VNET, FMT_VXLAN */
	__u8 v6;           /* 1: the underlay is IPv6 */
	__u32 network;     /* vnet network id, or VXLAN VNI */
	__u32 ifindex;     /* underlay device */
	__u32 mtu;         /* underlay MTU */
};

/* A decision carries everything the programs need after the one hash
 * lookup that finds it: the counter slots of both ports and, for a link,
 * the link itself (one lookup per frame, not four). */
struct route_val {
	__u32 action;   /* ACT_IFACE*: target = ifindex; ACT_LINK: target = link id */
	__u32 target;
	__u32 in_slot;  /* port_stats slot of the ingress port */
	__u32 out_slot; /* ... and of the target */
	struct link_val link; /* ACT_LINK: the link */
};

/* A peer's link, found by the datagram's source: its id, counter slot and
 * the link itself. */
struct peer_val {
	__u32 id;
	__u32 slot;
	struct link_val link;
};

struct cfg {
	__u32 active;      /* which routes table is live: 0 or 1 */
	__u16 port;        /* vnetd's UDP port, network order */
	__u16 vxlan_port;  /* vnetd's VXLAN port, network order (0: none) */
	__u32 policy;      /* 1: some network has a policy (`governed`) */
};

/* A peer's underlay address (16 bytes, as in link_val). */
struct addr_key {
	__u8 a[16];
};

/* A VXLAN peer: its address and VNI. */
struct vxlan_key {
	__u8 addr[16];
	__u32 vni;
};

enum {
	S_VM_SEEN,    /* frames examined from local interfaces */
	S_LOCAL,      /* interface -> interface */
	S_ENCAP,      /* interface -> link */
	S_ENCAP_BYTES,
	S_WIRE_SEEN,  /* datagrams to vnetd's port examined on the underlay */
	S_DECAP,      /* link -> interface */
	S_DECAP_BYTES,
	S_TO_USER,    /* left to vnetd's user path */
	S_ERRORS,     /* a helper failed: frame dropped */
	S_NEIGH,      /* ARP requests answered in place (`neigh`) */
	S_POLICY,     /* frames of a network with a policy, left to vnetd */
	S_POLICY_FLOW, /* ... forwarded here as a flow vnetd's engine allowed */
	S_SPOOFED_IP, /* frames from a guarded interface from an address it does not own: dropped */
	S_DROP_EVENTS, /* drop events sent to vnetd (`drop_events`, while a monitor is attached) */
	S_DROP_EVENTS_LIMITED, /* ... not sent: past the rate limit (`drop_bucket`) */
	S_DROP_EVENTS_LOST, /* ... not sent: the ring buffer was full */
	S_MAX,
};

/* Destination entries: for a destination whose route does not depend on
 * the source (every route that can match it says `any` source and no
 * `from`; a cluster's routes all do), one entry per (network, MAC) whatever
 * the source, so 100000 MACs take 100000 entries, not their square. The
 * programs check for themselves what the daemon could not fold into it:
 * the ingress port's network and port security (`ports`), no reflection.
 * The daemon updates entries one by one (each update is atomic for
 * readers: a frame sees the old decision or the new); only the entries a
 * change touches are written. Looked up first; `routes_*` holds the
 * source-dependent rest. Allocated as entries come (no preallocation), so
 * a big `max_entries` costs nothing until used. */
struct dest_key {
	__u32 net;
	__u8 dst[6];
	__u16 pad;
};

/* An ingress port the destination entries serve (an interface by ifindex,
 * a link as PORT_LINK | id): its network, its counter slot, the one
 * source MAC it may send from when it is locked to one, and its IP source
 * guard (`guarded`: 0 none, GUARD_ON its addresses are in `guard`,
 * GUARD_USER they are more than the map holds: its IP and ARP frames are
 * vnetd's, which guards them). A port that is not here (a standby
 * interface) gets no destination entry. */
struct port_val {
	__u32 slot;
	__u32 net;
	__u8 lock[6];
	__u8 locked;
	__u8 guarded;
};

#define GUARD_ON 1
#define GUARD_USER 2

/* The IP source guard (`guard`): an address (16 bytes, IPv4 mapped) a
 * guarded interface (by ifindex) owns; the value is unused (1). Looked up
 * once per IP or ARP frame from a guarded interface, never otherwise. */
struct guard_key {
	__u32 port;
	__u8 addr[16];
};

#define GUARD_ENTRIES 65536

/* Per-port counters, merged by the daemon into `show`: an array indexed by
 * the slot the daemon gives each port it serves (slot 0 is no port's), so
 * counting is no hash lookup; the programs only add to them. */
struct port_stats {
	__u64 rx_packets;
	__u64 rx_bytes;
	__u64 tx_packets;
	__u64 tx_bytes;
};

#define PORT_SLOTS 4096

/* Who talks to whom (`show matrix`): frames and bytes per (source,
 * destination) MAC pair the programs forwarded, per CPU. The least
 * recently used pairs make room for new ones (their counts go with them),
 * so the map holds at most MATRIX_PAIRS whatever the guests send. */
struct pair_key {
	__u8 src[6];
	__u8 dst[6];
};

struct pair_val {
	__u64 frames;
	__u64 bytes;
};

#define MATRIX_PAIRS 4096

/* Addresses whose ARP requests are answered at the edge (`neigh`): an
 * IPv4 address in a vnet network, and its MAC. */
struct neigh_key {
	__u32 net;
	__u8 ip[4];
};

struct neigh_val {
	__u8 mac[6];
	__u16 pad;
};

#define NEIGH_ENTRIES 65536

/* Neighbour solicitations answered at the edge: an IPv6 address in a vnet
 * network (its MAC is a neigh_val). */
struct neigh6_key {
	__u32 net;
	__u8 ip[16];
};

/* A network with a policy (`governed`): the policy's generation (the low
 * 32 bits of vnet_core's) and the network's slot in `gov_stats`. */
struct gov_val {
	__u32 gen;
	__u32 slot;
};

#define GOV_SLOTS 4096

/* Frames the programs forwarded by a known flow, per governed network's
 * slot and per CPU (added to `show policy`'s "passed by state"). */
struct gov_stats {
	__u64 packets;
	__u64 bytes;
};

/* A flow vnetd's engine allowed (vnet_core::policy::FlowKey, as vnetd
 * writes it into `flows`): the network, the policy's generation, the
 * addresses (16 bytes, IPv4 mapped), the frame's source and destination
 * MACs (a flow is between two VMs: the same addresses sent to another
 * MAC, or from another, are another flow), the protocol and the ports as
 * on the wire (network order; an ICMP echo's identifier as the request's
 * source port, the reply's destination port). 64 bytes, compared as eight
 * words (same_flow). */
struct flow_key {
	__u32 net;
	__u32 gen;
	__u8 src[16];
	__u8 dst[16];
	__u8 smac[6];
	__u8 dmac[6];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[7];
} __attribute__((aligned(8)));

/* When the flow was last seen (CLOCK_MONOTONIC ns; written by the
 * programs at most once a second, so a flow's CPUs share the line), and
 * its frames and bytes each way (0: from the key's `src` end, 1: back),
 * for vnetd's flow log: added from a CPU's flow_cache entry when the entry
 * goes (atomically: one flow's CPUs share it), so a known flow's packet
 * writes here at most once a second per CPU. */
struct flow_val {
	__u64 last;
	__u64 packets[2];
	__u64 bytes[2];
};

/* Entries of each CPU's flow_cache (flows.h). */
#define FLOW_CACHE_SLOTS 16

/* A flow a CPU found in `flows` lately (flow_cache, flows.h), and what
 * that CPU forwarded of it since (not yet added to its flow_val; vnetd's
 * flow log reads both). */
struct flow_cached {
	struct flow_key k;
	__u64 at;
	__u64 packets[2];
	__u64 bytes[2];
};

/* The programs' clock for idle checks (`clock`, one entry): the coarse
 * monotonic clock as a BPF timer wrote it last, every CLOCK_TICK_MS. */
struct clock_val {
	struct bpf_timer timer;
	__u64 now;
	__u32 ticking; /* 0: not yet armed, 1: ticking, 2: no timer (read the clock) */
	__u32 pad;
};

#define CLOCK_TICK_MS 250

#define FLOW_ENTRIES 65536
#define FLOW_TCP_IDLE_S 600 /* vnet_core::policy::flows::TCP_IDLE_S */
#define FLOW_IDLE_S 120     /* ... IDLE_S */

/* A frame the programs dropped, for vnetd's `monitor drops` (`drop_events`,
 * a ring buffer): when, why (the S_* counter it was counted in, which
 * vnetd maps to its drop reason), where (the ingress ifindex), its length
 * and its first DROP_HEAD bytes (`caplen` of them). */
struct drop_event {
	__u64 time_ns;  /* bpf_ktime_get_ns */
	__u32 stat;     /* S_* */
	__u32 ifindex;
	__u32 len;
	__u32 caplen;
	__u8 head[96];  /* DROP_HEAD */
};

#define DROP_HEAD 96
#define DROP_RING_BYTES 262144 /* drop_events' size: 2048 events */
#define DROP_EVENTS_PER_SEC 2000 /* per CPU, the rate limit of drop events */
#define DROP_EVENTS_BURST 200 /* ... and the most sent at once after a quiet time */

#endif /* VNET_H */
