//! The last step in: what the receive side carries from step to step
//! ([`Cx`], [`Arrival`]), what it tells a link of its peer ([`heard`],
//! [`refused`]), and a frame found, handed to the forwarder with its link
//! as ingress.

use crate::forward::Forwarder;
use crate::link::Link;
use crate::plane::Plane;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use vnet_core::Port as PortId;
use vnet_wire::virtio::{self, VirtioNetHdr};

/// What every step of the way in needs: the worker's forwarder, the plane
/// it reads, and the caller's clock (for reassembly timeouts and the
/// links' liveness).
pub struct Cx<'a> {
    pub fw: &'a mut Forwarder,
    pub plane: &'a Plane,
    pub now_ns: u64,
}

/// Where a datagram came from, and whether through a relay
/// ([`crate::relay`]: it moves no link, and answers go back that way).
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub from: SocketAddr,
    pub relayed: bool,
}

/// A secured datagram of `link` verified: the peer is alive, and (unless
/// it came through a relay) heard directly, and followed if it moved.
pub(super) fn heard(cx: &Cx<'_>, link: &Link, at: Arrival) {
    link.alive.heard(cx.now_ns);
    if !at.relayed {
        link.heard_direct.store(cx.now_ns.saturating_add(1), Relaxed);
        link.authenticated_from(at.from, cx.fw.global());
    }
}

/// A datagram of secured `link` that did not verify (or was a replay):
/// dropped, and counted as a refused roam when it came from an address the
/// link does not send to.
pub(super) fn refused(cx: &Cx<'_>, link: &Link, at: Arrival) {
    link.rx.drop_one();
    cx.fw.dropped(vnet_core::DropReason::AuthFailed, Some(vnet_core::Port::Link(link.def.id)), &[], None);
    if !at.relayed && link.endpoint().is_some_and(|e| e.ip() != at.from.ip()) {
        cx.fw.global().roams_refused.fetch_add(1, Relaxed);
    }
}

/// Delivers a frame of `link` with offload header `vh` (a `raw` datagram's,
/// a LAN's).
pub fn frame(cx: &mut Cx<'_>, link: &Link, vh: VirtioNetHdr, frame: &mut [u8]) {
    link.rx.add(frame.len());
    cx.fw.forward(cx.plane, PortId::Link(link.def.id), vh, frame);
}

/// Delivers a `vnet` frame payload (a datagram's or a stream record's),
/// which begins with a `virtio_net_hdr` when `with_vh`.
pub(super) fn payload(cx: &mut Cx<'_>, port: PortId, with_vh: bool, bytes: &mut [u8]) {
    if !with_vh {
        cx.fw.forward(cx.plane, port, VirtioNetHdr::NONE, bytes);
        return;
    }
    match VirtioNetHdr::parse(bytes) {
        Some(vh) => cx.fw.forward(cx.plane, port, vh, &mut bytes[virtio::LEN..]),
        None => {
            cx.fw.global().malformed.fetch_add(1, Relaxed);
            cx.fw.dropped(vnet_core::DropReason::Malformed, Some(port), &[], None);
        }
    }
}

/// The bytes of the frame in a payload of `len` bytes that begins with a
/// `virtio_net_hdr` when `with_vh`: what a link counts as received.
pub(super) fn frame_len(with_vh: bool, len: usize) -> usize {
    len - if with_vh { virtio::LEN.min(len) } else { 0 }
}

/// Delivers a record taken off link `link`'s stream (`codec::stream`): a
/// frame payload that begins with its `virtio_net_hdr` when `with_vh`.
pub fn stream_record(cx: &mut Cx<'_>, link: &Link, with_vh: bool, bytes: &mut [u8]) {
    link.rx.add(frame_len(with_vh, bytes.len()));
    payload(cx, PortId::Link(link.def.id), with_vh, bytes);
}
