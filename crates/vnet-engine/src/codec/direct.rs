//! `direct`: raw Ethernet on a local device, no encapsulation (VNET/P's
//! direct send and receive, paper 000 §4.4). The link's I/O is a packet
//! socket with a `virtio_net_hdr` on every frame, so offloaded frames go
//! out as they are (the kernel segments for a device that cannot) and the
//! LAN's TCP super-frames come in whole.

use super::{Facts, Inbound, Keepalive, Tx};
use crate::port::Payload;
use vnet_wire::virtio::VirtioNetHdr;

/// Nothing is added to a frame.
pub const OVERHEAD: usize = 0;

/// Offloaded frames go out as they are; a LAN's hosts send no keepalives.
pub const FACTS: Facts = Facts {
    overhead: OVERHEAD,
    offloads: true,
    any_size: false,
    probes: false,
    keepalive: Keepalive::None,
    inbound: Inbound::Device,
};

/// Hands each frame to the device with its offload header (an empty one
/// for a plain frame).
pub fn send(tx: &Tx<'_>, payload: Payload<'_>, flow: u64) -> bool {
    let none = VirtioNetHdr::NONE.emit();
    payload.each_frame(|parts, hdr| {
        if hdr {
            return tx.direct.send(parts, usize::MAX, flow);
        }
        super::with_head(&none, parts, |iov| tx.direct.send(iov, usize::MAX, flow))
    })
}
