//! The one trait every place a frame can leave by implements: TAPs,
//! netdevs, vhost-user rings and links in the daemon, recording ports in
//! the simulator. Transmit is a call with the frame as slices, so a port
//! writes straight from the buffer the frame was read into (an iovec per
//! piece), whatever it is. Below the ports, [`DatagramTx`] is the one
//! trait a link's datagrams leave by (the daemon's link sockets, the
//! simulator's wire).

use std::io::IoSlice;
use std::ops::Range;
use vnet_wire::offload::Segmented;

/// What a port is given to send.
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    /// One frame. `parts` concatenated are a `virtio_net_hdr` and the frame
    /// when `hdr` (only ports that take offloads get that), else the plain
    /// frame.
    Frame { parts: &'a [IoSlice<'a>], hdr: bool },
    /// The segments of one finished TCP super-frame, each a plain frame of
    /// two pieces (its headers, its payload where the super-frame was),
    /// all of one length but the last.
    Segments(Segmented<'a>),
}

impl<'a> Payload<'a> {
    /// Calls `f` with each plain frame, as slices (a `Frame` with a header
    /// is passed as it is, header first); stops at the first `false`.
    pub fn each_frame(&self, mut f: impl FnMut(&[IoSlice<'_>], bool) -> bool) -> bool {
        match *self {
            Payload::Frame { parts, hdr } => f(parts, hdr),
            Payload::Segments(s) => (0..s.count()).all(|i| {
                let (h, p) = s.segment(i);
                f(&[IoSlice::new(h), IoSlice::new(p)], false)
            }),
        }
    }

    /// The frame's first bytes (after the header, if any), as far as the
    /// first slice holds them: enough for a flow hash.
    pub fn frame_start(&self) -> &'a [u8] {
        match *self {
            Payload::Frame { parts, hdr } => {
                let mut skip = if hdr { vnet_wire::virtio::LEN } else { 0 };
                for p in parts {
                    // `IoSlice` derefs to a slice borrowed from `parts`' lifetime.
                    let s: &'a [u8] = slice_of(p);
                    if s.len() > skip {
                        return &s[skip..];
                    }
                    skip -= s.len();
                }
                &[]
            }
            Payload::Segments(s) => s.segment(0).0,
        }
    }
}

/// The bytes of an `IoSlice` with the lifetime of the slice it was made of.
fn slice_of<'a>(s: &'a IoSlice<'a>) -> &'a [u8] {
    s
}

/// A place frames leave by.
pub trait Port: Send + Sync {
    /// Whether the port takes frames with their `virtio_net_hdr` (partial
    /// checksums, TCP super-frames) as they are.
    fn takes_offloads(&self) -> bool;

    /// Sends what `payload` holds: one frame, or the segments of one.
    /// Returns whether all of it was taken. `scratch` is the calling
    /// worker's, for encapsulation headers.
    fn send(&self, scratch: &mut Scratch, payload: Payload<'_>) -> bool;

    /// Whether the port wants [`Port::end_burst`] after a batch it got
    /// frames in (a vhost-user ring signals its guest then).
    fn batches(&self) -> bool {
        false
    }

    /// The end of a worker's batch.
    fn end_burst(&self) {}
}

/// Carries a link's datagrams to its peer.
pub trait DatagramTx: Send + Sync {
    /// Sends the datagrams laid out in `iov`: one datagram when `seg` is at
    /// least their total length, else datagrams of `seg` bytes each (the
    /// last may be shorter), as one GSO send where the transport can. `flow`
    /// is the inner flow's hash (it picks the outer source port).
    fn send(&self, iov: &[IoSlice<'_>], seg: usize, flow: u64) -> bool;

    /// Sends to `to` from now on (a roaming peer); false where the
    /// transport cannot (a stream, a LAN).
    fn retarget(&self, _to: std::net::SocketAddr) -> bool {
        false
    }
}

/// Per-worker scratch space ports may use while sending: allocated once.
pub struct Scratch {
    /// `vnet` headers of the datagrams of one frame.
    pub vnet_hdrs: Vec<[u8; vnet_wire::vnet::HEADER_LEN]>,
    /// The secured datagrams of one frame (a secured link seals copies).
    pub sealed: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        let per = vnet_wire::vnet::HEADER_LEN + crate::secure::OVERHEAD;
        Scratch {
            vnet_hdrs: vec![[0u8; vnet_wire::vnet::HEADER_LEN]; crate::MAX_SEGS],
            sealed: vec![0u8; crate::BUF + crate::MAX_SEGS * per],
        }
    }
}

/// The pieces of `parts` (each a sub-slice of one part) that cover bytes
/// `range` of their concatenation, in order.
fn pieces<'a>(parts: &'a [IoSlice<'a>], range: Range<usize>) -> impl Iterator<Item = &'a [u8]> {
    let mut at = 0;
    parts.iter().map_while(move |p| {
        let (s, e) = (at, at + p.len());
        at = e;
        if s >= range.end {
            return None;
        }
        let (from, to) = (range.start.clamp(s, e) - s, range.end.min(e) - s);
        Some(&slice_of(p)[from..to])
    })
}

/// Appends to `out` (from index `*k`) slices covering bytes `range` of the
/// concatenation of `parts`. Returns false if `out` is too small.
pub fn slices_in<'a>(
    parts: &'a [IoSlice<'a>],
    range: Range<usize>,
    out: &mut [IoSlice<'a>],
    k: &mut usize,
) -> bool {
    for piece in pieces(parts, range).filter(|p| !p.is_empty()) {
        let Some(slot) = out.get_mut(*k) else { return false };
        *slot = IoSlice::new(piece);
        *k += 1;
    }
    true
}

/// Copies bytes `range` of the concatenation of `parts` into `dst`, which
/// must be exactly as long. Returns false if the parts or `dst` fall short.
pub fn copy_in<'a>(parts: &'a [IoSlice<'a>], range: Range<usize>, dst: &mut [u8]) -> bool {
    let mut w = 0;
    for piece in pieces(parts, range.clone()) {
        let Some(d) = dst.get_mut(w..w + piece.len()) else { return false };
        d.copy_from_slice(piece);
        w += piece.len();
    }
    w == range.len() && w == dst.len()
}

/// A port that takes nothing (sends fail): a placeholder where a plane is
/// built for its routes alone, as the kernel path's compiler and tests do.
pub struct Nowhere;

impl Port for Nowhere {
    fn takes_offloads(&self) -> bool {
        false
    }
    fn send(&self, _: &mut Scratch, _: Payload<'_>) -> bool {
        false
    }
}

impl DatagramTx for Nowhere {
    fn send(&self, _: &[IoSlice<'_>], _: usize, _: u64) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A link's datagrams kept as sent, one by one (or each send refused).
    #[derive(Default)]
    pub(crate) struct Kept {
        pub sent: Mutex<Vec<Vec<u8>>>,
        pub refuse: bool,
    }

    impl DatagramTx for Kept {
        fn send(&self, iov: &[IoSlice<'_>], seg: usize, _: u64) -> bool {
            let all: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
            self.sent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(all.chunks(seg.max(1)).map(<[u8]>::to_vec));
            !self.refuse
        }
    }

    #[test]
    fn a_frames_start_is_found_past_its_header_however_the_pieces_lie() {
        let h = vnet_wire::virtio::LEN;
        let bytes: Vec<u8> = (0..40).collect();
        let start = |cuts: &[usize], hdr: bool| {
            let mut at = 0;
            let mut parts = Vec::new();
            for &c in cuts.iter().chain([&bytes.len()]) {
                parts.push(IoSlice::new(&bytes[at..c]));
                at = c;
            }
            Payload::Frame { parts: &parts, hdr }.frame_start().to_vec()
        };
        assert_eq!(start(&[], false), bytes, "plain, whole");
        assert_eq!(start(&[], true), &bytes[h..], "header and frame in one piece");
        assert_eq!(start(&[h], true), &bytes[h..], "the header a piece of its own");
        assert_eq!(start(&[4, h + 6], true), &bytes[h..h + 6], "the header in two pieces");
        assert_eq!(start(&[4, 7], true), &bytes[h..], "in three");
        assert_eq!(start(&[h - 2, h], true), &bytes[h..], "a piece ends where the frame starts");
        let short = [IoSlice::new(&bytes[..h])];
        assert!(Payload::Frame { parts: &short, hdr: true }.frame_start().is_empty(), "a header alone");
    }

    #[test]
    fn a_range_of_pieces_is_copied_only_into_a_place_exactly_its_size() {
        let bytes: Vec<u8> = (0..20).collect();
        let parts = [IoSlice::new(&bytes[..7]), IoSlice::new(&bytes[7..])];
        let mut dst = [0u8; 6];
        assert!(copy_in(&parts, 4..10, &mut dst));
        assert_eq!(dst, [4, 5, 6, 7, 8, 9]);
        assert!(!copy_in(&parts, 4..8, &mut dst), "a place larger than the range");
        assert!(!copy_in(&parts, 4..12, &mut dst), "smaller");
        let mut long = [0u8; 10];
        assert!(!copy_in(&parts, 15..25, &mut long), "parts that end before the range");
        let mut out = [IoSlice::new(&[]); 2];
        let mut k = 0;
        assert!(slices_in(&parts, 5..9, &mut out, &mut k));
        assert_eq!((k, &*out[0], &*out[1]), (2, &bytes[5..7], &bytes[7..9]));
        assert!(!slices_in(&parts, 0..3, &mut out, &mut k), "no room left");
    }

    #[test]
    fn nowhere_takes_nothing() {
        let frame = [IoSlice::new(&[0u8; 60])];
        assert!(!Port::takes_offloads(&Nowhere));
        assert!(!Port::send(&Nowhere, &mut Scratch::default(), Payload::Frame { parts: &frame, hdr: false }));
        assert!(!DatagramTx::send(&Nowhere, &frame, 60, 0));
    }
}
