//! One module per link kind: how a frame becomes datagrams (encapsulation),
//! how datagrams become frames again (decapsulation), and what the kind
//! adds to a frame (overhead). The I/O is not here: a link's datagrams go
//! to its [`crate::DatagramTx`].

pub mod direct;
pub mod raw;
pub mod stream;
pub mod vnet;
pub mod vxlan;

use crate::link::Link;
use crate::{GSO_MAX_BYTES, GSO_MAX_SEGS};
use std::io::IoSlice;
use std::ops::Range;
use vnet_wire::offload::Segmented;

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
pub(crate) fn send_segments(link: &Link, segs: Segmented<'_>, prefix: &[u8], flow: u64) -> bool {
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
        link.io.send(&iov[..k], seg, flow)
    })
}
