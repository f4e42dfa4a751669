// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * vnet's in-kernel fast path: TC programs that move unicast frames between
 * local interfaces and UDP links without leaving the kernel.
 *
 *   vnet_from_vm    TC ingress of an interface's host-side netdev (the host
 *                   end of a container's veth, a TAP QEMU opened). A frame
 *                   whose (port, dst, src) the daemon compiled into
 *                   `dests` or `routes_*` goes to another local interface
 *                   (bpf_redirect_peer) or is encapsulated for a link
 *                   (bpf_skb_adjust_room with tunnel GSO, so 64 KB GSO frames
 *                   stay whole) and sent to the underlay (bpf_redirect_neigh).
 *                   An ARP request or a neighbour solicitation for an
 *                   address of `neigh4` or `neigh6` (the daemon's `neigh`
 *                   table) is answered in place: turned into the owner's
 *                   reply and sent back out of the interface it came in by.
 *   vnet_from_wire  TC ingress of the underlay device. A datagram to vnetd's
 *                   port from a configured peer, carrying one whole frame
 *                   (`raw`, or `vnet` with flag WHOLE), or to vnetd's VXLAN
 *                   port from a VTEP with a VXLAN link for its VNI, whose
 *                   route is one local interface, is decapsulated and
 *                   redirected into it.
 *
 * Everything else (broadcast and multicast fan-out, unknown destinations,
 * fragments, ARP from the wire, frames too large for the link) is vnetd's
 * user path's. From an interface, such a frame is handed to vnetd through
 * the interface's hand-off TAP (`handoff`: a TAP vnetd made and reads;
 * vnetd's packet socket on the interface only sends, so no packet tap
 * sees, before TC, the frames the kernel moves). From the wire, it goes on
 * up the stack (TC_ACT_OK) to vnetd's UDP socket, exactly as without the
 * fast path. The daemon owns the routing semantics (Palacios
 * priorities, no reflection, split horizon): it evaluates them and writes
 * only single-destination answers here, per destination (`dests`) where
 * the answer does not depend on the source, else per (port, src, dst)
 * (`routes_*`). Destination entries are updated one by one, each atomic;
 * the (port, src, dst) tables are switched whole: the daemon fills the
 * inactive one and flips `cfg.active`.
 */
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

#include "vnet.h"

#ifndef BPF_F_ADJ_ROOM_DECAP_L3_IPV4
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV4 (1ULL << 7)
#define BPF_F_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)
#endif

#define OUTER_LEN (sizeof(struct iphdr) + sizeof(struct udphdr)) /* 28 */
#define OUTER6_LEN (sizeof(struct ipv6hdr) + sizeof(struct udphdr)) /* 48 */

/* Two route tables: the daemon fills the inactive one, then flips
 * cfg.active. Entries are allocated as written, not preallocated. */
#define ROUTE_TABLE(name)                                                                  \
	struct {                                                                           \
		__uint(type, BPF_MAP_TYPE_HASH);                                           \
		__uint(max_entries, MAX_ROUTES);                                           \
		__uint(map_flags, BPF_F_NO_PREALLOC);                                      \
		__type(key, struct route_key);                                             \
		__type(value, struct route_val);                                           \
	} name SEC(".maps")

ROUTE_TABLE(routes_0);
ROUTE_TABLE(routes_1);

/* Destination entries (struct dest_key in vnet.h says what they are). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ROUTES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct dest_key);
	__type(value, struct route_val);
} dests SEC(".maps");

/* The ingress ports the destination entries serve (struct port_val). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct port_val);
} ports SEC(".maps");

/* The IP source guard: the addresses each guarded interface owns
 * (struct guard_key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GUARD_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct guard_key);
	__type(value, __u32);
} guard SEC(".maps");

/* Peer address -> its link. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct addr_key);
	__type(value, struct peer_val);
} peers SEC(".maps");

/* VXLAN peer (address, VNI) -> its link. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct vxlan_key);
	__type(value, struct peer_val);
} vxlan_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cfg);
} config SEC(".maps");

/* ARP answered at the edge: (network, IPv4 address) -> MAC. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NEIGH_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct neigh_key);
	__type(value, struct neigh_val);
} neigh4 SEC(".maps");

/* Neighbour solicitations answered at the edge: (network, IPv6 address) -> MAC. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NEIGH_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct neigh6_key);
	__type(value, struct neigh_val);
} neigh6 SEC(".maps");

/* The networks with a policy (`rule`, `policy`; docs/POLICY.md). A frame
 * of one passes here only as a further packet or a reply of a flow
 * vnetd's engine allowed (`flows`); everything else of it (a new flow,
 * fragments, ICMP errors, ARP, other EtherTypes) is left to the engine,
 * which judges it by the rules and writes the flows it allows into
 * `flows`. So the rules have one implementation, and both paths one
 * meaning. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GOV_SLOTS);
	__type(key, __u32);
	__type(value, struct gov_val);
} governed SEC(".maps");

/* The flows the engine allowed. One LRU map for all CPUs, not one per
 * CPU: a flow's two directions and vnetd's reads must find one entry (its
 * `last`, rewritten at most once a second, is what CPUs share). Full, it
 * drops its least recently used flow, whose next packet goes to the
 * engine, which knows it or judges it again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLOW_ENTRIES);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GOV_SLOTS);
	__type(key, __u32);
	__type(value, struct gov_stats);
} gov_stats SEC(".maps");

/* An interface's hand-off TAP (by ifindex): where its frames for vnetd go. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} handoff SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PORT_SLOTS);
	__type(key, __u32);
	__type(value, struct port_stats);
} port_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, S_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, MATRIX_PAIRS);
	__type(key, struct pair_key);
	__type(value, struct pair_val);
} pairs SEC(".maps");

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

static __always_inline struct cfg *get_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

static __always_inline struct route_val *pair_lookup(struct cfg *c, struct route_key *k)
{
	if (c->active)
		return bpf_map_lookup_elem(&routes_1, k);
	return bpf_map_lookup_elem(&routes_0, k);
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

/* A MAC as a native word (its 6 bytes, then zeros), for ordering. */
static __always_inline __u64 mac_word(const __u8 *m)
{
	__u64 w = 0;
	__builtin_memcpy(&w, m, 6);
	return w;
}

/* A flow's key in the order vnetd writes it (kernel::flows::canonical):
 * its lower end (address, then port, then MAC; as native words) first,
 * so both directions of a flow find one entry with one lookup. The MACs
 * go with their ends. */
static __always_inline void canonical(struct flow_key *k)
{
	__u64 a0, a1, b0, b1;
	__builtin_memcpy(&a0, k->src, 8);
	__builtin_memcpy(&a1, k->src + 8, 8);
	__builtin_memcpy(&b0, k->dst, 8);
	__builtin_memcpy(&b1, k->dst + 8, 8);
	__u64 sm = mac_word(k->smac), dm = mac_word(k->dmac);
	int swap = a0 != b0	      ? a0 > b0
		   : a1 != b1	      ? a1 > b1
		   : k->sport != k->dport ? k->sport > k->dport
					  : sm > dm;
	if (!swap)
		return;
	__builtin_memcpy(k->src, &b0, 8);
	__builtin_memcpy(k->src + 8, &b1, 8);
	__builtin_memcpy(k->dst, &a0, 8);
	__builtin_memcpy(k->dst + 8, &a1, 8);
	__builtin_memcpy(k->smac, &dm, 6);
	__builtin_memcpy(k->dmac, &sm, 6);
	__u16 p = k->sport;
	k->sport = k->dport;
	k->dport = p;
}

/* The coarse monotonic clock as the programs read it for a flow's idle
 * time: a load, not a helper call on every packet of a governed network
 * (bpf_ktime_get_coarse_ns cost the kernel path about 50 ns a packet
 * here, a third of what a policy cost it; kernel.bpf_stats_enabled,
 * docs/POLICY.md). A BPF timer rewrites it every CLOCK_TICK_MS, armed by
 * the first packet that reads it. Where the timer cannot be armed, every
 * read asks the kernel's clock (`ticking` 2). */
#define CLOCK_MONOTONIC 1
#define CLOCK_TICK_NS (CLOCK_TICK_MS * 1000000ULL)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct clock_val);
} clock SEC(".maps");

static int clock_tick(void *map, __u32 *key, struct clock_val *v)
{
	v->now = bpf_ktime_get_coarse_ns();
	bpf_timer_start(&v->timer, CLOCK_TICK_NS, 0);
	return 0;
}

static __noinline __u64 clock_arm(struct clock_val *v)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	v->now = now;
	long e = bpf_timer_init(&v->timer, &clock, CLOCK_MONOTONIC);
	/* -EBUSY: another CPU armed it first. */
	if (e == 0) {
		if (bpf_timer_set_callback(&v->timer, clock_tick) || bpf_timer_start(&v->timer, CLOCK_TICK_NS, 0))
			e = -1;
	}
	v->ticking = e == 0 || e == -16 ? 1 : 2;
	return now;
}

/* The time for idle checks: at most a tick behind the kernel's coarse
 * clock (which is itself a tick behind the one vnetd writes `last` with). */
static __always_inline __u64 coarse_now(void)
{
	__u32 zero = 0;
	struct clock_val *v = bpf_map_lookup_elem(&clock, &zero);
	if (!v)
		return bpf_ktime_get_coarse_ns();
	if (v->ticking == 1)
		return v->now;
	if (v->ticking == 2)
		return bpf_ktime_get_coarse_ns();
	return clock_arm(v);
}

/* The flows a CPU found in `flows` within the last FLOW_CACHE_NS, a few
 * per CPU (by their ports' and addresses' last bytes): a further packet
 * of one is known without the hash lookup of its 64-byte key, the largest
 * part of what a policy cost the kernel path (about 70 ns a packet here,
 * kernel.bpf_stats_enabled). What that leaves out for at most
 * FLOW_CACHE_NS: the flow's `last` (rewritten once a second anyway) and
 * the LRU's note that it was used. A flow leaves `flows` only by its idle
 * time (minutes: a cached one was seen under a second ago) or to make
 * room (its packets would be allowed again by the engine, whose flow it
 * is); a new policy generation is another key. A cached key is compared
 * whole (same_flow: generation, addresses, MACs, ports, protocol). */
#define FLOW_CACHE_SLOTS 16
#define FLOW_CACHE_NS 1000000000ULL

struct flow_cached {
	struct flow_key k;
	__u64 at;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FLOW_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct flow_cached);
} flow_cache SEC(".maps");

static __always_inline int same_flow(const struct flow_key *a, const struct flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	_Static_assert(sizeof(struct flow_key) == 64, "same_flow compares eight words");
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4] && x[5] == y[5] &&
	       x[6] == y[6] && x[7] == y[7];
}

/* Whether `k` (either direction) is a flow the engine allowed, seen within
 * its idle time; seen now if so. `now` is coarse_now(), behind the clock
 * vnetd writes `last` with (a `last` ahead of it is fresh): idle times are
 * minutes, `last` is rewritten once a second. */
static __always_inline int flow_fresh(struct flow_key *k, __u64 now)
{
	__u64 idle = (k->proto == IPPROTO_TCP ? FLOW_TCP_IDLE_S : FLOW_IDLE_S) * 1000000000ULL;
	canonical(k);
	__u32 slot = (k->sport ^ k->dport ^ k->src[15] ^ k->dst[15]) & (FLOW_CACHE_SLOTS - 1);
	struct flow_cached *c = bpf_map_lookup_elem(&flow_cache, &slot);
	if (c && now - c->at <= FLOW_CACHE_NS && same_flow(&c->k, k))
		return 1;
	struct flow_val *v = bpf_map_lookup_elem(&flows, k);
	if (!v)
		return 0;
	__u64 last = v->last;
	if (now > last) {
		if (now - last > idle)
			return 0;
		if (now - last > 1000000000ULL)
			v->last = now;
	}
	if (c) {
		__builtin_memcpy(&c->k, k, sizeof(*k));
		c->at = now;
	}
	return 1;
}

/* The destination and source MACs of the Ethernet header at `eth`. */
static __always_inline void frame_macs(struct flow_key *k, const void *eth)
{
	__builtin_memcpy(k->dmac, eth, 6);
	__builtin_memcpy(k->smac, eth + 6, 6);
}

/* Whether the IP packet at `l3` (a constant: one inlined copy per place
 * and encapsulation, so the reads are direct) in a frame with EtherType
 * `proto` of governed network `net` is a further packet or a reply of a
 * flow the engine allowed. Only what the engine reads the same way and
 * passes by the same flow is looked at (vnet_wire::classify,
 * vnet_core::policy::flow_key): IPv4 without options and unfragmented,
 * IPv6 without extension headers; TCP, UDP, ICMP echo; the transport
 * header long enough to be read (16 bytes of TCP, 8 of UDP or ICMP,
 * inside the IP length). Anything else is the engine's (0). The flow is
 * keyed with the frame's MACs (the untagged Ethernet header just before
 * `l3`), so only its own two ends' frames are in it. The Ethernet and IP
 * headers and the transport header's first 8 bytes are read from the
 * frame's linear part (pulled there when they are not: a frame shorter
 * than them is the engine's anyway); each bpf_skb_load_bytes was a
 * helper call on every packet of a governed network. */
static __always_inline int flow_known(struct __sk_buff *skb, __u32 l3, __u16 proto, __u32 net, __u32 gen)
{
	struct flow_key k = {.net = net, .gen = gen};
	if (skb->len <= l3)
		return 0;
	__u32 hl, plen, len = skb->len - l3;
	__u8 h[8];
	int v6 = 0;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		void *d = head(skb, l3 + sizeof(ip) + sizeof(h));
		if (!d)
			return 0;
		__builtin_memcpy(&ip, d + l3, sizeof(ip));
		__builtin_memcpy(h, d + l3 + sizeof(ip), sizeof(h));
		if (ip.version != 4 || ip.ihl != 5 || (ip.frag_off & bpf_htons(0x3fff)))
			return 0;
		frame_macs(&k, d + l3 - ETH_HLEN);
		k.src[10] = k.src[11] = k.dst[10] = k.dst[11] = 0xff;
		__builtin_memcpy(&k.src[12], &ip.saddr, 4);
		__builtin_memcpy(&k.dst[12], &ip.daddr, 4);
		k.proto = ip.protocol;
		hl = sizeof(ip);
		plen = bpf_ntohs(ip.tot_len);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip;
		void *d = head(skb, l3 + sizeof(ip) + sizeof(h));
		if (!d)
			return 0;
		__builtin_memcpy(&ip, d + l3, sizeof(ip));
		__builtin_memcpy(h, d + l3 + sizeof(ip), sizeof(h));
		if (ip.version != 6)
			return 0;
		frame_macs(&k, d + l3 - ETH_HLEN);
		__builtin_memcpy(k.src, &ip.saddr, 16);
		__builtin_memcpy(k.dst, &ip.daddr, 16);
		k.proto = ip.nexthdr;
		hl = sizeof(ip);
		plen = bpf_ntohs(ip.payload_len) + sizeof(ip);
		v6 = 1;
	} else {
		return 0;
	}
	/* The packet ends at its IP length or the frame's end, the nearer. */
	if (plen > len)
		plen = len;
	__u32 need = k.proto == IPPROTO_TCP ? 16 : 8;
	if (plen < hl + need)
		return 0;
	if (k.proto == IPPROTO_TCP || k.proto == IPPROTO_UDP) {
		__builtin_memcpy(&k.sport, h, 2);
		__builtin_memcpy(&k.dport, h + 2, 2);
	} else if (k.proto == (v6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP)) {
		__u8 request = v6 ? 128 : 8, reply = v6 ? 129 : 0;
		if (h[0] == request)
			__builtin_memcpy(&k.sport, h + 4, 2);
		else if (h[0] == reply)
			__builtin_memcpy(&k.dport, h + 4, 2);
		else
			return 0; /* errors (related to a flow) and the rest */
	} else {
		return 0;
	}
	return flow_fresh(&k, coarse_now());
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
	if (bpf_skb_store_bytes(skb, 0, r, len, 0) < 0) {
		count(S_ERRORS, 1);
		return TC_ACT_SHOT;
	}
	count(S_NEIGH, 1);
	port_count(pv->slot, 0, skb->len);
	port_count(pv->slot, 1, skb->len);
	return bpf_redirect(port, 0);
}

/* Whether a frame from a guarded interface (`port`, its `ports` entry
 * `pv`) comes from an address it owns, as vnet_wire::guard reads it: its
 * IPv4 or IPv6 source, or its ARP sender (an IPv4 ARP), is in `guard`;
 * or it is a DHCP client's request (0.0.0.0, UDP 68 to 67), an ARP probe
 * (sender 0.0.0.0), or from :: a neighbour solicitation or an MLD report
 * behind a hop-by-hop header (duplicate address detection). 0: it may go
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
		__u8 *ip = head(skb, ETH_HLEN + 20);
		if (!ip)
			return 1;
		ip += ETH_HLEN;
		if ((ip[0] >> 4) != 4 || (ip[0] & 0x0f) < 5)
			return 1;
		__u32 src;
		__builtin_memcpy(&src, ip + 12, 4);
		if (src == 0) {
			/* A DHCP client's request: UDP 68 -> 67, a first fragment. */
			__u8 p[4];
			if (ip[9] != IPPROTO_UDP || (ip[6] & 0x1f) || ip[7] ||
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
		__builtin_memcpy(k.addr, ip + 8, 16);
		__u8 any = 0;
#pragma clang loop unroll(full)
		for (int i = 0; i < 16; i++)
			any |= k.addr[i];
		if (!any) {
			/* From ::, duplicate address detection only. */
			__u8 nh = ip[6], h[2];
			if (bpf_skb_load_bytes(skb, ETH_HLEN + 40, h, 2) < 0)
				return -1;
			if (nh == 58)
				return h[0] == 135 ? 0 : -1;
			__u8 t;
			if (nh != 0 || h[0] != 58 ||
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
		if (spa == 0)
			return 0; /* a probe */
		k.addr[10] = k.addr[11] = 0xff;
		__builtin_memcpy(&k.addr[12], &spa, 4);
	} else {
		return proto == bpf_htons(0x8100) || proto == bpf_htons(0x88a8) ? 1 : 0;
	}
	return bpf_map_lookup_elem(&guard, &k) ? 0 : -1;
}

SEC("classifier")
int vnet_from_vm(struct __sk_buff *skb)
{
	struct cfg *c = get_cfg();
	if (!c)
		return to_user(skb);
	count(S_VM_SEEN, 1);
	/* The port's entry, looked up once for all that follows. */
	__u32 port = skb->ifindex;
	struct port_val *pv = bpf_map_lookup_elem(&ports, &port);
	/* The IP source guard, before anything else. */
	if (pv && pv->guarded) {
		int g = source_guard(skb, port, pv);
		if (g < 0) {
			count(S_SPOOFED_IP, 1);
			return TC_ACT_SHOT;
		}
		if (g > 0)
			return to_user(skb);
	}
	/* With a policy in some network: the port's network's, before
	 * anything else (an ARP answer too); a port the maps do not serve is
	 * vnetd's to judge. */
	__u32 gslot = 0;
	struct port_val *gp = pv;
	if (c->policy) {
		if (!gp)
			return to_user(skb);
		struct gov_val *g = bpf_map_lookup_elem(&governed, &gp->net);
		if (g) {
			/* skb->protocol: the frame's EtherType (a tag in the frame
			 * leaves it 0x8100, which is no flow's). */
			if (skb->vlan_present ||
			    !flow_known(skb, ETH_HLEN, skb->protocol, gp->net, g->gen)) {
				count(S_POLICY, 1);
				return to_user(skb);
			}
			gslot = g->slot;
		}
	}
	int answered = answer_neigh(skb);
	if (answered >= 0)
		return answered;
	struct ethhdr eth;
	struct link_val *l = NULL;
	__u32 in_slot = 0;
	struct route_val *r = vm_decision(skb, c, &eth, &l, &in_slot, pv);
	if (!r)
		return to_user(skb);
	__u32 len = skb->len;
	if (r->action == ACT_IFACE || r->action == ACT_IFACE_XMIT) {
		count(S_LOCAL, 1);
		port_count(in_slot, 0, len);
		port_count(r->out_slot, 1, len);
		pair_count(&eth, len);
		gov_count(gslot, len);
		if (r->action == ACT_IFACE_XMIT)
			return bpf_redirect(r->target, 0);
		bpf_skb_change_type(skb, PACKET_HOST);
		return bpf_redirect_peer(r->target, 0);
	}
	if (!l)
		return to_user(skb);
	__u32 out_slot = r->out_slot;
	if (encap(skb, l, &eth) < 0) {
		count(S_ERRORS, 1);
		return TC_ACT_SHOT;
	}
	count(S_ENCAP, 1);
	count(S_ENCAP_BYTES, len);
	port_count(in_slot, 0, len);
	port_count(out_slot, 1, len);
	pair_count(&eth, len);
	gov_count(gslot, len);
	/* The daemon resolved the route to the peer when it wrote the link:
	 * with its next hop given, the kernel skips the route lookup and only
	 * finds (or resolves) the neighbour. */
	struct bpf_redir_neigh nh = {};
	if (l->v6) {
		nh.nh_family = 10; /* AF_INET6 */
		__builtin_memcpy(nh.ipv6_nh, l->nexthop, 16);
	} else {
		nh.nh_family = 2; /* AF_INET */
		__builtin_memcpy(&nh.ipv4_nh, &l->nexthop[12], 4);
	}
	return bpf_redirect_neigh(l->ifindex, &nh, sizeof(nh), 0);
}

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

SEC("classifier")
int vnet_from_wire(struct __sk_buff *skb)
{
	struct cfg *c = get_cfg();
	if (!c)
		return TC_ACT_OK;
	struct wire_hdr w;
	if (read_outer(skb, &w) < 0)
		return TC_ACT_OK;
	int vxlan = c->vxlan_port && w.udp.dest == c->vxlan_port;
	if (w.udp.dest != c->port && !vxlan)
		return TC_ACT_OK;
	count(S_WIRE_SEEN, 1);
	int gso = skb->gso_size != 0;
	struct peer_val *pv;
	__u8 x[8];
	struct ethhdr inner;
	__u32 v6 = w.olen == OUTER6_LEN;
	__u32 vh = vxlan ? VXLAN_HDR_LEN : VNET_HDR_LEN;
	__u32 olen = v6 ? OUTER6_LEN : OUTER_LEN;
	__u32 inner_off = ETH_HLEN + olen + vh;
	/* Constant lengths for the verifier: one inlined copy per underlay
	 * and format. */
	int rc;
	if (v6)
		rc = vxlan ? read_encap(skb, OUTER6_LEN, VXLAN_HDR_LEN, x, &inner)
			   : read_encap(skb, OUTER6_LEN, VNET_HDR_LEN, x, &inner);
	else
		rc = vxlan ? read_encap(skb, OUTER_LEN, VXLAN_HDR_LEN, x, &inner)
			   : read_encap(skb, OUTER_LEN, VNET_HDR_LEN, x, &inner);
	if (rc)
		goto user;
	if (vxlan) {
		/* Anything but flags I and zero reserved bits is the user path's
		 * (which drops and counts it, as Linux would). */
		if (x[0] != VXLAN_FLAG_I || x[1] || x[2] || x[3] || x[7])
			goto user;
		struct vxlan_key vk = {.vni = ((__u32)x[4] << 16) | ((__u32)x[5] << 8) | x[6]};
		__builtin_memcpy(vk.addr, w.saddr.a, 16);
		pv = bpf_map_lookup_elem(&vxlan_peers, &vk);
	} else {
		pv = bpf_map_lookup_elem(&peers, &w.saddr);
	}
	if (!pv)
		goto user;
	__u32 lid = pv->id, link_slot = pv->slot;
	struct link_val *l = &pv->link;
	if ((l->format == FMT_VXLAN) != vxlan || l->v6 != v6)
		goto user;
	/* To the address vnetd's link leaves from (it listens there), not any
	 * address of the host's; and in on the device the host's route to
	 * the peer leaves by (strict reverse-path filtering's rule: this
	 * program runs before rp_filter and netfilter, so a datagram with the
	 * peer's source address arriving elsewhere is left to them, on the
	 * way to vnetd's socket). */
	if (!same_addr(w.daddr.a, l->local_ip) || skb->ingress_ifindex != l->ifindex)
		goto user;
	/* The engine's network of a link: a `vnet` link's id, 0 for VXLAN. */
	__u32 gnet = vxlan ? 0 : l->network, gslot = 0;
	struct gov_val *g = c->policy ? bpf_map_lookup_elem(&governed, &gnet) : NULL;
	if (g) {
		/* The inner IP header's offset, a constant in each copy. */
		__u16 p = inner.h_proto;
		int known;
		if (v6)
			known = vxlan ? flow_known(skb, ETH_HLEN + OUTER6_LEN + VXLAN_HDR_LEN + ETH_HLEN, p, gnet, g->gen)
				      : flow_known(skb, ETH_HLEN + OUTER6_LEN + VNET_HDR_LEN + ETH_HLEN, p, gnet, g->gen);
		else
			known = vxlan ? flow_known(skb, ETH_HLEN + OUTER_LEN + VXLAN_HDR_LEN + ETH_HLEN, p, gnet, g->gen)
				      : flow_known(skb, ETH_HLEN + OUTER_LEN + VNET_HDR_LEN + ETH_HLEN, p, gnet, g->gen);
		if (!known) {
			count(S_POLICY, 1);
			goto user;
		}
		gslot = g->slot;
	}
	if (l->format == FMT_VNET) {
		__u32 net;
		__builtin_memcpy(&net, &x[4], 4);
		if (x[0] != 1 || x[1] != VNET_WHOLE || x[2] != 0 || x[3] != VNET_HDR_LEN ||
		    bpf_ntohl(net) != l->network)
			goto user;
	} else if (!vxlan) {
		goto user; /* raw links are the user path's */
	}
	if (inner.h_dest[0] & 1 || !fast_proto(inner.h_proto))
		goto user;
	/* The inner IP length must be the frame's: exactly, for a GSO packet
	 * (one inner frame must fill it; several datagrams that GRO merged,
	 * whose first inner frame is shorter than the whole, are the socket's
	 * to split); exactly or short by Ethernet's padding of a minimum-size
	 * frame, for one datagram. A length of 0 or 0xffff (a super-frame past
	 * 64 KB, BIG TCP, an IPv6 jumbogram) cannot be checked and, like any
	 * other lie, is the user path's. */
	{
		__u32 l3 = inner_off + ETH_HLEN, inner_len, room = skb->len - l3;
		__u16 v;
		if (inner.h_proto == bpf_htons(ETH_P_IP)) {
			if (bpf_skb_load_bytes(skb, l3 + 2, &v, 2) < 0)
				goto user;
			inner_len = bpf_ntohs(v);
			if (inner_len < sizeof(struct iphdr))
				goto user;
		} else {
			if (bpf_skb_load_bytes(skb, l3 + 4, &v, 2) < 0)
				goto user;
			inner_len = bpf_ntohs(v) + 40;
		}
		if (inner_len != room && (gso || inner_len > room || room > ETH_ZLEN - ETH_HLEN))
			goto user;
	}
	__u32 in_slot = 0;
	struct route_val *r = lookup(c, PORT_LINK | lid, inner.h_dest, inner.h_source, &in_slot, NULL);
	if (!r || (r->action != ACT_IFACE && r->action != ACT_IFACE_XMIT))
		goto user;
	__u32 action = r->action, target = r->target, out_slot = r->out_slot;
	__u64 flags = inner.h_proto == bpf_htons(ETH_P_IPV6) ? BPF_F_ADJ_ROOM_DECAP_L3_IPV6
							      : BPF_F_ADJ_ROOM_DECAP_L3_IPV4;
	if (bpf_skb_adjust_room(skb, -(__s32)(olen + vh + ETH_HLEN), BPF_ADJ_ROOM_MAC,
				flags | BPF_F_ADJ_ROOM_FIXED_GSO) < 0) {
		count(S_ERRORS, 1);
		return TC_ACT_SHOT;
	}
	struct ethhdr *e = head(skb, ETH_HLEN);
	if (!e) {
		count(S_ERRORS, 1);
		return TC_ACT_SHOT;
	}
	__builtin_memcpy(e, &inner, sizeof(inner));
	count(S_DECAP, 1);
	count(S_DECAP_BYTES, skb->len);
	port_count(link_slot, 0, skb->len);
	port_count(out_slot, 1, skb->len);
	pair_count(&inner, skb->len);
	gov_count(gslot, skb->len);
	if (action == ACT_IFACE_XMIT)
		return bpf_redirect(target, 0);
	bpf_skb_change_type(skb, PACKET_HOST);
	return bpf_redirect_peer(target, 0);
user:
	count(S_TO_USER, 1);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
