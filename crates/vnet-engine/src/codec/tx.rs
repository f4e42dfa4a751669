//! What a codec sends through ([`Tx`], built by the link for each send)
//! and the sending helpers the kinds share: sealing, a header in front of
//! a frame's slices, GSO batches.

use crate::port::DatagramTx;
use crate::secure::SecureLink;
use crate::{GSO_MAX_BYTES, GSO_MAX_SEGS};
use std::io::IoSlice;
use std::ops::Range;
use vnet_wire::frag::FrameIds;
use vnet_wire::offload::Segmented;

/// What a codec sends through, built by the link for one send.
pub struct Tx<'a> {
    /// Where the link's datagrams go: to the peer, or through its relay
    /// while the link relays.
    pub out: &'a dyn DatagramTx,
    /// Straight to the peer's address, never through a relay.
    pub direct: &'a dyn DatagramTx,
    /// The largest UDP payload that crosses the underlay unfragmented now.
    pub max_datagram: usize,
    /// The outer IP and UDP headers' length (0: a LAN has none).
    pub outer_len: usize,
    /// Ids of the frames the link fragments.
    pub frame_ids: &'a FrameIds,
    /// The link's sessions, on a secured link.
    pub secure: Option<&'a SecureLink>,
}

impl Tx<'_> {
    /// [`seal`] with the link's session.
    pub fn seal(&self, buf: &mut [u8], plain: usize) -> Option<usize> {
        seal(self.secure, buf, plain)
    }
}

/// Seals the `plain` bytes laid out after the secured header in `buf` (at
/// 0 on a plain link) with `secure`'s session, and returns the datagram's
/// length: `plain` on a plain link, `None` on a secured link without a
/// session.
pub fn seal(secure: Option<&SecureLink>, buf: &mut [u8], plain: usize) -> Option<usize> {
    match secure {
        None => Some(plain),
        Some(sec) => sec.sealer().and_then(|s| s.seal(sec.mode(), buf, plain)),
    }
}

/// Calls `f` with `head` in front of `parts` as one list of slices (on the
/// stack); false if the frame has more pieces than that list holds.
pub(crate) fn with_head(head: &[u8], parts: &[IoSlice<'_>], f: impl FnOnce(&[IoSlice<'_>]) -> bool) -> bool {
    let mut iov = [IoSlice::new(&[]); 8];
    if parts.len() >= iov.len() {
        return false;
    }
    iov[0] = IoSlice::new(head);
    iov[1..=parts.len()].copy_from_slice(parts);
    f(&iov[..=parts.len()])
}

/// How many datagrams of `seg` bytes one GSO send takes.
fn gso_per(seg: usize) -> usize {
    (GSO_MAX_BYTES / seg.max(1)).clamp(1, GSO_MAX_SEGS)
}

/// The datagrams `0..n` of `seg` bytes each, as the index ranges of one GSO
/// send each.
pub(crate) fn gso_batches(n: usize, seg: usize) -> impl Iterator<Item = Range<usize>> {
    let per = gso_per(seg);
    (0..n).step_by(per).map(move |first| first..(first + per).min(n))
}

/// Sends the segments of a finished super-frame, each as one datagram with
/// `prefix` (an encapsulation header, possibly empty) in front, its
/// headers and its payload as they lie: equal-sized datagrams in batches of
/// one GSO send each.
pub(crate) fn send_segments(to: &dyn DatagramTx, segs: Segmented<'_>, prefix: &[u8], flow: u64) -> bool {
    let seg = prefix.len() + segs.seg_len().max(1);
    let mut iov = [IoSlice::new(&[]); 3 * GSO_MAX_SEGS];
    let n = segs.count();
    gso_batches(n, seg).all(|batch| {
        let mut k = 0;
        for i in batch {
            let (h, p) = segs.segment(i);
            if !prefix.is_empty() {
                iov[k] = IoSlice::new(prefix);
                k += 1;
            }
            iov[k] = IoSlice::new(h);
            iov[k + 1] = IoSlice::new(p);
            k += 2;
        }
        to.send(&iov[..k], seg, flow)
    })
}
