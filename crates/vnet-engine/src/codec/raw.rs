//! `raw`: the Palacios VNET/P format. The UDP payload is the Ethernet
//! frame, nothing else; one frame per datagram, never fragmented, and no
//! way to say a frame still needs its checksum or segmentation, so only
//! finished frames go out this way.

use super::{Facts, Inbound, Keepalive, Tx};
use crate::port::Payload;

/// Bytes the format adds to a frame inside the UDP payload.
pub const OVERHEAD: usize = 0;

/// Finished frames only; the peer may be a Palacios host, which sends no
/// keepalives and would count an empty datagram as an error.
pub const FACTS: Facts = Facts {
    overhead: OVERHEAD,
    offloads: false,
    any_size: false,
    probes: false,
    keepalive: Keepalive::None,
    inbound: Inbound::Frame,
};

/// Sends one finished frame as one datagram, or a super-frame's segments
/// as GSO batches.
pub fn send(tx: &Tx<'_>, payload: Payload<'_>, flow: u64) -> bool {
    match payload {
        Payload::Frame { parts, hdr: false } => tx.direct.send(parts, usize::MAX, flow),
        // The engine gives a port that takes no offloads plain frames only.
        Payload::Frame { hdr: true, .. } => false,
        Payload::Segments(segs) => super::send_segments(tx.direct, segs, &[], flow),
    }
}
