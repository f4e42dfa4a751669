//! `vnet`: vnet's own format (`vnet_wire::vnet`, `docs/wire.md`). A 20-byte
//! header per datagram with the network id, and frames of up to 64 KB split
//! into underlay-sized datagrams that the receiver reassembles; the frame
//! may begin with its `virtio_net_hdr` (flag `VNET_HDR`), so offloads cross
//! the link and nobody segments in between. Datagrams are laid out as an
//! iovec per header and chunk, straight from the frame's buffer, and given
//! to the link's I/O in GSO batches.

use super::gso_batches;
use crate::link::Link;
use crate::port::{copy_in, slices_in, Payload, Scratch};
use crate::secure::{self, SecureLink};
use crate::{GSO_MAX_SEGS, MAX_SEGS};
use std::io::IoSlice;
use vnet_wire::frag;
use vnet_wire::virtio;
use vnet_wire::vnet::{Flags, VnetRepr, HEADER_LEN, MAX_FRAME_LEN};

/// Bytes the format adds to each datagram.
pub const OVERHEAD: usize = HEADER_LEN;

/// Sends a frame as `vnet` datagrams; segments of a finished frame (not
/// given to a port that takes offloads, but possible) go as whole frames.
pub fn send(link: &Link, scratch: &mut Scratch, payload: Payload<'_>, network: u32, flow: u64) -> bool {
    payload.each_frame(|parts, hdr| send_frame(link, scratch, parts, hdr, network, flow))
}

fn send_frame(
    link: &Link,
    scratch: &mut Scratch,
    parts: &[IoSlice<'_>],
    hdr: bool,
    network: u32,
    flow: u64,
) -> bool {
    let total_in: usize = parts.iter().map(|p| p.len()).sum();
    // An all-zero header says nothing: leave it out (and the flag unset).
    let skip = if hdr && header_is_none(parts) { virtio::LEN } else { 0 };
    let with_vh = hdr && skip == 0;
    let total = total_in - skip;
    if let Some(sec) = &link.secure {
        let flags = Flags(if with_vh { Flags::VNET_HDR } else { 0 });
        return send_sealed(link, sec, scratch, parts, skip..skip + total, flags, network, flow);
    }
    let dgram = link.max_datagram();
    if total > MAX_FRAME_LEN as usize + virtio::LEN || dgram <= HEADER_LEN {
        return false;
    }
    let n = frag::count(total, dgram);
    if n > MAX_SEGS || n > scratch.vnet_hdrs.len() {
        return false;
    }
    let base = VnetRepr {
        flags: Flags(if with_vh { Flags::VNET_HDR } else { 0 }),
        network,
        frame_id: link.frame_ids.next(),
        frame_len: total as u32,
        offset: 0,
    };
    for (i, h) in scratch.vnet_hdrs[..n].iter_mut().enumerate() {
        let offset = frag::chunk(i, total, dgram).start as u32;
        let _ = VnetRepr { offset, ..base }.emit(h);
    }
    let mut iov = [IoSlice::new(&[]); 4 * GSO_MAX_SEGS];
    for batch in gso_batches(n, dgram) {
        let mut k = 0;
        for i in batch {
            let r = frag::chunk(i, total, dgram);
            if k >= iov.len() {
                return false;
            }
            iov[k] = IoSlice::new(&scratch.vnet_hdrs[i]);
            k += 1;
            if !slices_in(parts, r.start + skip..r.end + skip, &mut iov, &mut k) {
                return false;
            }
        }
        if !link.io.send(&iov[..k], dgram, flow) {
            return false;
        }
    }
    true
}

/// A frame (bytes `frame` of `parts`) over a secured link: each `vnet`
/// datagram is laid out after its secured header in the scratch buffer,
/// sealed in place, and the datagrams go out in GSO batches (all but the
/// last are the same size). Without a session the frame is dropped
/// (counted in the link's `no_session`) while the handshake runs.
#[allow(clippy::too_many_arguments)]
fn send_sealed(
    link: &Link,
    sec: &SecureLink,
    scratch: &mut Scratch,
    parts: &[IoSlice<'_>],
    frame: std::ops::Range<usize>,
    flags: Flags,
    network: u32,
    flow: u64,
) -> bool {
    let total = frame.len();
    // The plain `vnet` datagram each secured one carries.
    let dgram = link.max_datagram().saturating_sub(secure::OVERHEAD);
    if total > MAX_FRAME_LEN as usize + virtio::LEN || dgram <= HEADER_LEN {
        return false;
    }
    let n = frag::count(total, dgram);
    if n > MAX_SEGS {
        return false;
    }
    let Some(session) = sec.sealer() else { return false };
    let base =
        VnetRepr { flags, network, frame_id: link.frame_ids.next(), frame_len: total as u32, offset: 0 };
    let out = &mut scratch.sealed;
    let mut pos = 0;
    for i in 0..n {
        let r = frag::chunk(i, total, dgram);
        let plain = HEADER_LEN + r.len();
        let at = pos + secure::DATA_HEADER;
        if out.len() < at + plain + secure::TAG {
            return false;
        }
        let _ = VnetRepr { offset: r.start as u32, ..base }.emit(&mut out[at..]);
        let bytes = frame.start + r.start..frame.start + r.end;
        if !copy_in(parts, bytes, &mut out[at + HEADER_LEN..at + plain]) {
            return false;
        }
        let Some(m) = session.seal(sec.mode(), &mut out[pos..], plain) else { return false };
        pos += m;
    }
    let seg = dgram + secure::OVERHEAD;
    gso_batches(n, seg)
        .all(|b| link.io.send(&[IoSlice::new(&out[b.start * seg..(b.end * seg).min(pos)])], seg, flow))
}

/// Whether the `virtio_net_hdr` at the front of `parts` is all zeros.
fn header_is_none(parts: &[IoSlice<'_>]) -> bool {
    let mut left = virtio::LEN;
    for p in parts {
        let take = p.len().min(left);
        if p[..take].iter().any(|&b| b != 0) {
            return false;
        }
        left -= take;
        if left == 0 {
            return true;
        }
    }
    false
}
