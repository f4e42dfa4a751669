//! Splitting a frame into underlay-sized `vnet` datagrams.
//!
//! The datagrams are laid out back to back in one buffer, every one but the
//! last exactly `segment` bytes long. That is the layout UDP GSO
//! (`UDP_SEGMENT`) takes, so the same buffer can go out in one `sendmsg`
//! or, without GSO, one `sendto` per segment.

use crate::vnet::{max_carried, VnetRepr, HEADER_LEN};
use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// The frame ids one sender gives its frames: a counter put through a keyed
/// permutation of the 32-bit numbers (a four-round Feistel network), so ids
/// do not repeat within 2^32 frames, yet someone who does not see the
/// traffic cannot guess the next one and aim fragments at it. (This keeps
/// blind spoofers out of reassembly; against someone who sees the traffic,
/// only an authenticated link helps.)
#[derive(Debug)]
pub struct FrameIds {
    next: AtomicU32,
    key: [u32; 4],
}

impl FrameIds {
    /// Ids under `seed`, which must be secret and random (the caller reads it
    /// from the system's random source).
    pub fn new(seed: u64) -> Self {
        let mut s = seed;
        let mut key = [0u32; 4];
        for k in key.iter_mut() {
            // splitmix64: spreads the seed's bits over the round keys.
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            *k = (z ^ (z >> 31)) as u32;
        }
        FrameIds { next: AtomicU32::new(key[0] ^ key[3]), key }
    }

    /// The next id.
    pub fn next(&self) -> u32 {
        permute(self.next.fetch_add(1, Relaxed), &self.key)
    }
}

/// A bijection of the 32-bit numbers under `key`.
fn permute(x: u32, key: &[u32; 4]) -> u32 {
    let (mut l, mut r) = ((x >> 16) as u16, x as u16);
    for &k in key {
        let f = ((u32::from(r) ^ k).wrapping_mul(0x9E37_79B1) ^ k.rotate_left(11)) >> 16;
        (l, r) = (r, l ^ f as u16);
    }
    (u32::from(l) << 16) | u32::from(r)
}

/// Where the datagrams of one frame were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segments {
    /// Total bytes written.
    pub total: usize,
    /// Size of every datagram but the last.
    pub segment: usize,
}

impl Segments {
    /// Iterates over the byte ranges of the datagrams in the buffer.
    pub fn ranges(&self) -> impl Iterator<Item = core::ops::Range<usize>> {
        let (total, seg) = (self.total, self.segment.max(1));
        (0..total.div_ceil(seg)).map(move |i| i * seg..((i + 1) * seg).min(total))
    }
}

/// Why a frame could not be split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FragError {
    #[error("frame of {0} bytes is larger than the format carries")]
    TooLarge(usize),
    #[error("datagram size {0} leaves no room for payload")]
    DatagramTooSmall(usize),
    #[error("output buffer too small: need {need}")]
    NoRoom { need: usize },
}

/// Frame bytes each datagram carries at `max_datagram` (at least 1).
pub fn chunk_len(max_datagram: usize) -> usize {
    max_datagram.saturating_sub(HEADER_LEN).max(1)
}

/// How many datagrams a `frame_len`-byte frame becomes at `max_datagram`.
pub fn count(frame_len: usize, max_datagram: usize) -> usize {
    frame_len.div_ceil(chunk_len(max_datagram))
}

/// The bytes of a `frame_len`-byte frame that datagram `i` carries (its
/// header's offset is the range's start).
pub fn chunk(i: usize, frame_len: usize, max_datagram: usize) -> core::ops::Range<usize> {
    let c = chunk_len(max_datagram);
    (i * c).min(frame_len)..((i + 1) * c).min(frame_len)
}

/// Bytes needed in the output buffer for `frame_len` at `max_datagram`.
pub fn needed(frame_len: usize, max_datagram: usize) -> usize {
    frame_len + count(frame_len, max_datagram) * HEADER_LEN
}

/// Writes `frame` as `vnet` datagrams of at most `max_datagram` bytes into
/// `out`. `base` gives network, flags and frame id; length and offset are
/// filled in per datagram.
pub fn split(
    base: VnetRepr,
    frame: &[u8],
    max_datagram: usize,
    out: &mut [u8],
) -> Result<Segments, FragError> {
    if frame.is_empty() || frame.len() > max_carried(base.flags) as usize {
        return Err(FragError::TooLarge(frame.len()));
    }
    if max_datagram <= HEADER_LEN {
        return Err(FragError::DatagramTooSmall(max_datagram));
    }
    let need = needed(frame.len(), max_datagram);
    if out.len() < need {
        return Err(FragError::NoRoom { need });
    }
    let mut pos = 0;
    for i in 0..count(frame.len(), max_datagram) {
        let r = chunk(i, frame.len(), max_datagram);
        let repr = VnetRepr { frame_len: frame.len() as u32, offset: r.start as u32, ..base };
        let piece = &frame[r];
        // `out` was checked to hold `need` bytes above.
        let _ = repr.emit(&mut out[pos..]);
        out[pos + HEADER_LEN..pos + HEADER_LEN + piece.len()].copy_from_slice(piece);
        pos += HEADER_LEN + piece.len();
    }
    Ok(Segments { total: pos, segment: max_datagram.min(pos) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vnet::{Flags, VnetPacket, MAX_CARRIED_LEN, MAX_FRAME_LEN};

    fn base() -> VnetRepr {
        VnetRepr { flags: Flags(0), network: 3, frame_id: 77, frame_len: 0, offset: 0 }
    }

    #[test]
    fn split_and_reparse() {
        let frame: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let mut out = vec![0u8; needed(3000, 1472)];
        let s = split(base(), &frame, 1472, &mut out).unwrap();
        assert_eq!(s.segment, 1472);
        assert_eq!(s.total, 3000 + 3 * 20);
        let mut rebuilt = vec![0u8; 3000];
        for r in s.ranges() {
            let p = VnetPacket::new_checked(&out[r]).unwrap();
            let o = p.offset() as usize;
            rebuilt[o..o + p.payload().len()].copy_from_slice(p.payload());
            assert_eq!(p.frame_len(), 3000);
            assert_eq!(p.frame_id(), 77);
        }
        assert_eq!(rebuilt, frame);
    }

    #[test]
    fn whole_frame_is_one_segment() {
        let mut out = [0u8; 100];
        let s = split(base(), &[1u8; 60], 1472, &mut out).unwrap();
        assert_eq!(s, Segments { total: 80, segment: 80 });
        assert_eq!(s.ranges().count(), 1);
    }

    #[test]
    fn frame_ids_are_distinct_and_not_guessable_from_the_last() {
        let ids = FrameIds::new(0x1234_5678_9abc_def0);
        let seen: Vec<u32> = (0..100_000).map(|_| ids.next()).collect();
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), seen.len(), "ids repeat");
        // Not a counter: almost no id is its predecessor plus a constant step.
        let step = seen[1].wrapping_sub(seen[0]);
        let same_step = seen.windows(2).filter(|w| w[1].wrapping_sub(w[0]) == step).count();
        assert!(same_step < 100, "{same_step} ids follow a fixed step");
        assert!(seen.iter().filter(|&&id| id < 1000).count() < 10, "ids start near zero");
        // Another key gives other ids.
        let other = FrameIds::new(0x1234_5678_9abc_def1);
        let same = (0..1000).filter(|&i| other.next() == seen[i]).count();
        assert!(same < 5);
    }

    #[test]
    fn the_permutation_is_a_bijection_on_a_slice() {
        // A Feistel network is a bijection by construction; check a slice.
        let key = [1, 2, 3, 4];
        let mut out: Vec<u32> = (0..1u32 << 18).map(|x| permute(x, &key)).collect();
        out.sort_unstable();
        out.dedup();
        assert_eq!(out.len(), 1 << 18);
    }

    /// The permutation is the documented Feistel network, to the bit (a
    /// known answer: another round function would still be a bijection).
    #[test]
    fn the_permutation_gives_its_known_answers() {
        let key = [0x0123_4567, 0x89ab_cdef, 0xdead_beef, 0x0bad_f00d];
        assert_eq!((permute(0, &key), permute(0x1234_5678, &key)), (0x6334_5136, 0x1356_f578));
    }

    #[test]
    fn the_largest_frame_splits_and_one_byte_more_is_refused() {
        let mut out = vec![0u8; 2 * MAX_FRAME_LEN as usize];
        let f = vec![7u8; MAX_FRAME_LEN as usize];
        assert!(split(base(), &f, 1472, &mut out).is_ok());
        let g = vec![7u8; MAX_FRAME_LEN as usize + 1];
        assert_eq!(split(base(), &g, 1472, &mut out), Err(FragError::TooLarge(g.len())));
        // With a virtio_net_hdr in front: a largest frame and its header.
        let vh = VnetRepr { flags: Flags(Flags::VNET_HDR), ..base() };
        let f = vec![7u8; MAX_CARRIED_LEN as usize];
        assert!(split(vh, &f, 1472, &mut out).is_ok());
        let g = vec![7u8; MAX_CARRIED_LEN as usize + 1];
        assert_eq!(split(vh, &g, 1472, &mut out), Err(FragError::TooLarge(g.len())));
    }

    #[test]
    fn errors() {
        let mut out = [0u8; 10];
        assert_eq!(split(base(), &[], 1472, &mut out), Err(FragError::TooLarge(0)));
        assert_eq!(split(base(), &[1; 5], 20, &mut out), Err(FragError::DatagramTooSmall(20)));
        assert_eq!(split(base(), &[1; 5], 1000, &mut out), Err(FragError::NoRoom { need: 25 }));
    }
}
