//! The layouts the eBPF program shares with vnetd: the object, the
//! constants of `bpf/vnet.h`'s maps and actions, and what a link is to
//! the program ([`link_val`]: its addresses, format and underlay device, or
//! why it stays on the user path). The structs themselves (`RouteKey`,
//! `LinkVal`, ...) are `#[repr(C)]` in `sys::bpf`, beside the other
//! byte-level layouts.

use super::underlay::{Hop, Underlay};
use super::{io_error, KernelError, Reason};
use crate::sys::bpf::LinkVal;
use std::net::{IpAddr, SocketAddr};
use vnet_control::{canonical, LinkDef, LinkFormat, Security, Transport};
use vnet_core::DropReason;

pub(crate) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vnet.bpf.o"));

/// `bpf/vnet.h`'s constants, read from it by the build (build.rs): the
/// one source of each.
pub(crate) mod shared {
    // Not every constant is one vnetd uses: GSO_LIMIT and FMT_RAW are the
    // programs' own; the wire's are vnet-wire's (checked below).
    #![allow(dead_code)]
    include!(concat!(env!("OUT_DIR"), "/vnet_h.rs"));
}

// The programs' wire constants are vnet-wire's.
const _: () = assert!(
    shared::VNET_HDR_LEN as usize == vnet_wire::vnet::HEADER_LEN
        && shared::VNET_WHOLE == vnet_wire::vnet::Flags::WHOLE as u32
        && shared::VXLAN_HDR_LEN as usize == vnet_wire::vxlan::HEADER_LEN
        && shared::VXLAN_FLAG_I == vnet_wire::vxlan::FLAG_I as u32,
    "bpf/vnet.h's wire constants differ from vnet-wire's"
);

pub(crate) const PORT_LINK: u32 = shared::PORT_LINK;
pub(crate) const ACT_IFACE_PEER: u32 = shared::ACT_IFACE;
pub(crate) const ACT_LINK: u32 = shared::ACT_LINK;
pub(crate) const ACT_IFACE_XMIT: u32 = shared::ACT_IFACE_XMIT;
pub(crate) const FMT_VNET: u8 = shared::FMT_VNET as u8;
pub(crate) const FMT_VXLAN: u8 = shared::FMT_VXLAN as u8;
const _: () = assert!(shared::FMT_VNET <= 0xff && shared::FMT_VXLAN <= 0xff, "link_val.format is a byte");
/// Route entries per map (the maps' `max_entries`; `--kernel-routes`).
pub const MAX_ROUTES: usize = shared::MAX_ROUTES as usize;
/// The `neigh` entries the programs answer ARP for (`NEIGH_ENTRIES`).
pub const NEIGH_ENTRIES: usize = shared::NEIGH_ENTRIES as usize;
/// The IP source guard's addresses, over all interfaces (`GUARD_ENTRIES`).
pub const GUARD_ENTRIES: usize = shared::GUARD_ENTRIES as usize;
pub(crate) const GUARD_ON: u8 = shared::GUARD_ON as u8;
pub(crate) const GUARD_USER: u8 = shared::GUARD_USER as u8;
/// The traffic matrix's pairs (`MATRIX_PAIRS`, an LRU map).
pub const MATRIX_PAIRS: usize = shared::MATRIX_PAIRS as usize;
/// `PORT_SLOTS`: counter slots for the ports the kernel path serves (slot 0
/// is no port's: a port past the last shares it, uncounted).
pub(crate) const PORT_SLOTS: u32 = shared::PORT_SLOTS;

/// The programs' counters, in the order of the C enum: each name beside
/// its `S_*` index as the build read it from `bpf/vnet.h`, checked at
/// compile time (a counter moved, added or removed in the enum fails the
/// build until this table follows).
pub const STAT_NAMES: [&str; shared::S_MAX as usize] = in_enum_order([
    (shared::S_VM_SEEN, "kernel_vm_frames"),
    (shared::S_LOCAL, "kernel_local"),
    (shared::S_ENCAP, "kernel_encap"),
    (shared::S_ENCAP_BYTES, "kernel_encap_bytes"),
    (shared::S_WIRE_SEEN, "kernel_wire_datagrams"),
    (shared::S_DECAP, "kernel_decap"),
    (shared::S_DECAP_BYTES, "kernel_decap_bytes"),
    (shared::S_TO_USER, "kernel_to_user"),
    (shared::S_ERRORS, "kernel_errors"),
    (shared::S_NEIGH, "kernel_neigh_answered"),
    (shared::S_POLICY, "kernel_policy_to_user"),
    (shared::S_POLICY_FLOW, "kernel_policy_flows"),
    (shared::S_SPOOFED_IP, "kernel_spoofed_source_ip"),
    (shared::S_DROP_EVENTS, "kernel_drop_events"),
    (shared::S_DROP_EVENTS_LIMITED, "kernel_drop_events_limited"),
    (shared::S_DROP_EVENTS_LOST, "kernel_drop_events_lost"),
]);

/// Which of the programs' counters count drops, and the reason of each:
/// every `S_*` listed in enum order, checked at compile time as
/// [`STAT_NAMES`] is (a counter added to `bpf/vnet.h` fails the build until
/// it is listed here, drop or not). The programs drop only through
/// `dropped(skb, S_*)` (`bpf/lib/drops.h`); a test checks that each
/// counter they drop with has a reason here.
pub const STAT_DROPS: [Option<DropReason>; shared::S_MAX as usize] = in_enum_order([
    (shared::S_VM_SEEN, None),
    (shared::S_LOCAL, None),
    (shared::S_ENCAP, None),
    (shared::S_ENCAP_BYTES, None),
    (shared::S_WIRE_SEEN, None),
    (shared::S_DECAP, None),
    (shared::S_DECAP_BYTES, None),
    (shared::S_TO_USER, None),
    (shared::S_ERRORS, Some(DropReason::KernelError)),
    (shared::S_NEIGH, None),
    (shared::S_POLICY, None),
    (shared::S_POLICY_FLOW, None),
    (shared::S_SPOOFED_IP, Some(DropReason::SpoofedSourceIp)),
    (shared::S_DROP_EVENTS, None),
    (shared::S_DROP_EVENTS_LIMITED, None),
    (shared::S_DROP_EVENTS_LOST, None),
]);

/// The `S_*` names and indices, as the build read them.
#[cfg(test)]
pub(crate) const STAT_CONSTS: &[(&str, u32)] = &shared::S_CONSTS;

/// The values of `(index, value)` rows, refused (at compile time, in a
/// const) unless each row's index is its place.
const fn in_enum_order<T: Copy, const N: usize>(rows: [(u32, T); N]) -> [T; N] {
    let mut i = 0;
    while i < N {
        assert!(rows[i].0 as usize == i, "STAT_NAMES/STAT_DROPS: a row is not at its bpf/vnet.h S_* index");
        i += 1;
    }
    let mut out = [rows[0].1; N];
    let mut i = 1;
    while i < N {
        out[i] = rows[i].1;
        i += 1;
    }
    out
}

/// What the kernel needs to send on a link, and the underlay device; or
/// why the link stays on the user path.
pub(crate) fn link_val(
    def: &LinkDef,
    mtu: u32,
    listen: SocketAddr,
    under: &mut Underlay,
) -> Result<(LinkVal, String), Reason> {
    let (remote, format, network) = match def.transport {
        Transport::Udp { security: Security::Auth(_) | Security::Encrypt(_), .. } => {
            // Kernel IPsec (xfrm) under the eBPF encapsulation is the way to
            // keep such links in the kernel; until it is built they are the
            // user path's, visibly (never sent unprotected).
            return Err(KernelError::UserPath(
                "a link with `security` is served by the user path, which authenticates and encrypts its \
                 datagrams (the kernel path has no IPsec yet)",
            ));
        }
        Transport::Udp { remote, format: LinkFormat::Vnet, network, security: Security::None, .. } => {
            (remote, FMT_VNET, network)
        }
        // A VTEP takes the frames as the VM made them too: the outer headers
        // go through tunnel GSO, and a receiving VTEP (or vnetd) finishes
        // checksums; the VM's MTU must fit the link (else: the user path).
        Transport::Vxlan { remote, vni } => (remote, FMT_VXLAN, vni),
        Transport::Udp { format: LinkFormat::Raw, .. } => {
            // The kernel hands frames over as the VM made them (checksums
            // may be partial, TCP frames larger than a segment); a `vnet`
            // datagram says so with its WHOLE flag, a `raw` one cannot, and
            // a Palacios peer could not finish them.
            return Err(KernelError::UserPath(
                "the raw format (Palacios) stays on the user path: it cannot mark frames whose checksum or \
                 segmentation the receiver must finish",
            ));
        }
        Transport::Tcp { .. } => {
            return Err(KernelError::UserPath("TCP links are served by the user path (a stream is vnetd's)"))
        }
        Transport::Direct { .. } => {
            return Err(KernelError::UserPath("direct links are served by the user path"))
        }
    };
    let rip = canonical(remote.ip());
    let hop = under.hop(rip).ok_or(KernelError::NoRoute(rip))?;
    let lip = match canonical(listen.ip()) {
        a if !a.is_unspecified() && a.is_ipv4() == rip.is_ipv4() => a,
        _ => under.source_towards(rip).map_err(|e| io_error(format!("no local address towards {rip}"))(e))?,
    };
    if lip.is_ipv4() != rip.is_ipv4() {
        return Err(KernelError::UserPath(
            "the link's local address and its peer's are of different families",
        ));
    }
    let ifindex = under.ifindex(&hop.dev).map_err(|e| io_error(format!("no ifindex for {}", hop.dev))(e))?;
    let Hop { dev, gateway } = hop;
    let v = LinkVal {
        remote_ip: addr16(rip),
        local_ip: addr16(lip),
        nexthop: addr16(gateway.unwrap_or(rip)),
        remote_port: remote.port().to_be(),
        format,
        v6: rip.is_ipv6().into(),
        network,
        ifindex,
        mtu,
    };
    Ok((v, dev))
}

/// An address as the programs keep it: 16 bytes, IPv4 mapped.
pub(crate) fn addr16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}
