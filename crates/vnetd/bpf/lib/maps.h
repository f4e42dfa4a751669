// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * The maps vnetd writes and reads (each one's struct is in vnet.h): the
 * routes, destination entries and ports, the IP source guard, the peers,
 * the configuration, the neighbour tables, the governed networks and their
 * flows, the hand-off TAPs and the counters. The programs' own maps (the
 * clock, the flow cache) are in flows.h.
 */
#ifndef VNET_LIB_MAPS_H
#define VNET_LIB_MAPS_H

#include "common.h"

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

/* The configuration, its one entry (NULL until vnetd wrote it). */
static __always_inline struct cfg *get_cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, MATRIX_PAIRS);
	__type(key, struct pair_key);
	__type(value, struct pair_val);
} pairs SEC(".maps");

#endif /* VNET_LIB_MAPS_H */
