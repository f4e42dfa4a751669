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
 *
 * This file keeps only the two programs; what they are made of is in
 * lib/, by concern (as Cilium's bpf/lib): common.h (headers, packet
 * access), maps.h (the maps vnetd shares), stats.h (counters), user.h
 * (the hand-off to vnetd), drops.h (every drop: its counter and, while
 * a monitor watches, an event with its reason), encap.h and decap.h (the outer headers),
 * route.h (the forwarding decision), flows.h (policy flows, the clock,
 * the flow cache), neigh.h (ARP and ND answered in place) and guard.h
 * (the IP source guard).
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/stats.h"
#include "lib/user.h"
#include "lib/drops.h"
#include "lib/encap.h"
#include "lib/route.h"
#include "lib/flows.h"
#include "lib/neigh.h"
#include "lib/guard.h"
#include "lib/decap.h"

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
		if (g < 0)
			return dropped(skb, S_SPOOFED_IP);
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
	if (encap(skb, l, &eth) < 0)
		return dropped(skb, S_ERRORS);
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
				flags | BPF_F_ADJ_ROOM_FIXED_GSO) < 0)
		return dropped(skb, S_ERRORS);
	struct ethhdr *e = head(skb, ETH_HLEN);
	if (!e)
		return dropped(skb, S_ERRORS);
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
