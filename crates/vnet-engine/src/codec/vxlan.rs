//! `vxlan`: RFC 7348, as the Linux kernel and Open vSwitch speak it
//! (`vnet_wire::vxlan` has the header and what Linux accepts). One finished
//! frame per datagram with an 8-byte header; VTEPs must not fragment, so a
//! frame larger than the underlay allows is not sent ([`TooBig`]: the link
//! counts it in `too_big` and logs it once; the fix is the VM's MTU: the
//! underlay's less 50 bytes over IPv4, 70 over IPv6).

use super::{Facts, Inbound, Keepalive, Tx};
use crate::port::Payload;
use vnet_wire::vxlan::{VxlanPacket, VxlanRepr, HEADER_LEN};

/// Bytes the format adds inside the UDP payload.
pub const OVERHEAD: usize = HEADER_LEN;

/// Finished frames only; a kernel VTEP sends no keepalives.
pub const FACTS: Facts = Facts {
    overhead: OVERHEAD,
    offloads: false,
    any_size: false,
    probes: false,
    keepalive: Keepalive::None,
    inbound: Inbound::Inferred,
};

/// A frame (or segment) of this many bytes does not fit the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooBig(pub usize);

/// Sends one finished frame, or the segments of one, each as a datagram.
pub fn send(tx: &Tx<'_>, payload: Payload<'_>, vni: u32, flow: u64) -> Result<bool, TooBig> {
    let hdr = VxlanRepr { vni }.header();
    let max = tx.max_datagram;
    match payload {
        Payload::Frame { parts, hdr: false } => {
            let len: usize = parts.iter().map(|p| p.len()).sum();
            if HEADER_LEN + len > max {
                return Err(TooBig(len));
            }
            Ok(super::with_head(&hdr, parts, |iov| tx.direct.send(iov, usize::MAX, flow)))
        }
        Payload::Frame { hdr: true, .. } => Ok(false),
        Payload::Segments(segs) => {
            let seg = segs.seg_len();
            if HEADER_LEN + seg > max {
                return Err(TooBig(seg));
            }
            Ok(super::send_segments(tx.direct, segs, &hdr, flow))
        }
    }
}

/// The key of a datagram from `ip` on the VXLAN socket (its VNI names the
/// link) and where its frame starts; `None` for one Linux would drop.
pub fn arrival(ip: std::net::IpAddr, datagram: &[u8]) -> Option<(vnet_control::RxKey, usize)> {
    let vni = VxlanPacket::new_checked(datagram).ok()?.vni();
    Some((vnet_control::RxKey::Addr(vnet_control::Via::Vxlan, ip, vni), HEADER_LEN))
}
