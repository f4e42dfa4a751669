//! `raw`: the Palacios VNET/P format. The UDP payload is the Ethernet
//! frame, nothing else; one frame per datagram, never fragmented, and no
//! way to say a frame still needs its checksum or segmentation, so only
//! finished frames go out this way.

use crate::link::Link;
use crate::port::Payload;

/// Bytes the format adds to a frame inside the UDP payload.
pub const OVERHEAD: usize = 0;

/// Sends one finished frame as one datagram, or a super-frame's segments
/// as GSO batches.
pub fn send(link: &Link, payload: Payload<'_>, flow: u64) -> bool {
    match payload {
        Payload::Frame { parts, hdr: false } => link.io.send(parts, usize::MAX, flow),
        // The engine gives a port that takes no offloads plain frames only.
        Payload::Frame { hdr: true, .. } => false,
        Payload::Segments(segs) => super::send_segments(link, segs, &[], flow),
    }
}

/// The frame a datagram carries: all of it.
pub fn decapsulate(datagram: &mut [u8]) -> &mut [u8] {
    datagram
}
