//! `vxlan`: RFC 7348, as the Linux kernel and Open vSwitch speak it
//! (`vnet_wire::vxlan` has the header and what Linux accepts). One finished
//! frame per datagram with an 8-byte header; VTEPs must not fragment, so a
//! frame larger than the underlay allows is dropped, counted in `too_big`,
//! and logged once per link (the fix is the VM's MTU: the underlay's less 50
//! bytes over IPv4, 70 over IPv6).

use crate::link::Link;
use crate::port::Payload;
use std::sync::atomic::Ordering::Relaxed;
use vnet_wire::vxlan::{VxlanPacket, VxlanRepr, HEADER_LEN};

/// Bytes the format adds inside the UDP payload.
pub const OVERHEAD: usize = HEADER_LEN;

/// Sends one finished frame, or the segments of one, each as a datagram.
pub fn send(link: &Link, payload: Payload<'_>, vni: u32, flow: u64) -> bool {
    let hdr = VxlanRepr { vni }.header();
    let max = link.max_datagram();
    match payload {
        Payload::Frame { parts, hdr: false } => {
            let len: usize = parts.iter().map(|p| p.len()).sum();
            if HEADER_LEN + len > max {
                return too_big(link, len);
            }
            super::with_head(&hdr, parts, |iov| link.io.send(iov, usize::MAX, flow))
        }
        Payload::Frame { hdr: true, .. } => false,
        Payload::Segments(segs) => {
            let seg = segs.seg_len();
            if HEADER_LEN + seg > max {
                return too_big(link, seg);
            }
            super::send_segments(link, segs, &hdr, flow)
        }
    }
}

fn too_big(link: &Link, len: usize) -> bool {
    link.too_big.fetch_add(1, Relaxed);
    if !link.too_big_logged.swap(true, Relaxed) {
        tracing::warn!(
            link = %link.def.name,
            frame = len,
            largest = link.max_whole_frame(),
            "a {len}-byte frame does not fit this VXLAN link (underlay MTU {}): VTEPs do not fragment, \
             so such frames are dropped; give the VM an MTU of at most {} (logged once)",
            link.def.mtu,
            link.max_whole_frame().saturating_sub(14),
        );
    }
    false
}

/// The VNI and the inner frame of a datagram, or `None` for one Linux would
/// drop too (flags other than I, reserved bits set, too short).
pub fn decapsulate(datagram: &mut [u8]) -> Option<(u32, &mut [u8])> {
    let vni = VxlanPacket::new_checked(&*datagram).ok()?.vni();
    Some((vni, &mut datagram[HEADER_LEN..]))
}
