//! The fast path of `vnet` links for GRO batches that are one whole frame
//! with its offload header, in order (what one GSO send of a peer
//! becomes): the frame is written to its destination from the pieces
//! where they lie, an iovec per datagram payload, with no reassembly copy.
//! A secured link's batch is opened in place first, all of it in one pass
//! ([`crate::SecureLink::open_run`]); a batch that is not such a frame goes
//! on datagram by datagram ([`super::vnet::Rx`]).

use super::deliver::{self, Arrival, Cx};
use super::vnet::Rx;
use super::NextBuf;
use crate::codec::Inbound;
use crate::link::Link;
use crate::GSO_MAX_SEGS;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{RxKey, Via};
use vnet_core::Port as PortId;
use vnet_wire::virtio;
use vnet_wire::vnet::{Flags, VnetPacket, VnetRepr};

/// A GRO batch: datagrams of `seg` bytes in `data` (the last may be shorter).
struct Batch<'b> {
    data: &'b mut [u8],
    seg: usize,
}

impl Rx {
    /// `first` (datagrams of `seg` bytes from `from`) alone, when it is one
    /// whole frame, or `first` and the next receive buffer from the same
    /// peer, asked of `next` only then (a frame of more datagrams than one
    /// GSO send takes, such as the 45 of a 65000-byte frame over a
    /// 1500-byte underlay, comes as two). If they are not such a frame, a
    /// secured link's datagrams (opened in place, so they cannot be opened
    /// again) each go on alone. Returns how many buffers it took: 0
    /// (nothing done: a plain link's batch is anything else, or a
    /// destination needs a contiguous frame), 1 or 2.
    pub(super) fn whole_frames(
        &mut self,
        cx: &mut Cx<'_>,
        from: SocketAddr,
        first: &mut [u8],
        seg: usize,
        next: &mut dyn NextBuf,
    ) -> usize {
        let Some(link) = cx.plane.link_for(RxKey::Addr(Via::Udp, from.ip(), 0)) else { return 0 };
        if link.facts().inbound != Inbound::Vnet {
            return 0;
        }
        let network = link.def.network();
        let n = first.len().div_ceil(seg);
        if !(2..=GSO_MAX_SEGS).contains(&n) {
            return 0;
        }
        let secure = link.secure.is_some();
        let at = Arrival { from, relayed: false };
        let mut a = [(0, 0); GSO_MAX_SEGS];
        let ka = self.pieces(cx, link, at, Batch { data: first, seg }, &mut a);
        let mut run = Run::new();
        let begun = ka == n && run.extend(first, &a[..ka], network);
        if begun && run.complete() {
            if deliver_run(cx, link, &run) {
                return 1;
            }
        } else if let Some((second, seg2)) = if begun { next.next_buf() } else { None } {
            let seg2 = if seg2 > 0 { seg2 } else { second.len() };
            let nb = second.len().div_ceil(seg2.max(1));
            if (1..=GSO_MAX_SEGS).contains(&nb) {
                let mut b = [(0, 0); GSO_MAX_SEGS];
                let kb = self.pieces(cx, link, at, Batch { data: second, seg: seg2 }, &mut b);
                if kb == nb
                    && run.extend(second, &b[..kb], network)
                    && run.complete()
                    && deliver_run(cx, link, &run)
                {
                    cx.fw.global().rx_whole_pairs.fetch_add(1, Relaxed);
                    return 2;
                }
                if secure {
                    // Both opened in place: neither can be opened again.
                    self.each_plain(cx, link, network, at, first, &a[..ka]);
                    self.each_plain(cx, link, network, at, second, &b[..kb]);
                    return 2;
                }
            }
        }
        if !secure {
            return 0;
        }
        self.each_plain(cx, link, network, at, first, &a[..ka]);
        1
    }

    /// Takes the `vnet` datagrams at `ranges` of `data` one by one.
    fn each_plain(
        &mut self,
        cx: &mut Cx<'_>,
        link: &Arc<Link>,
        network: u32,
        at: Arrival,
        data: &mut [u8],
        ranges: &[(usize, usize)],
    ) {
        for &(x, y) in ranges {
            self.plain(cx, link, network, at, &mut data[x..y]);
        }
    }

    /// The `vnet` datagrams of `batch`, as ranges of its data into `out`:
    /// each datagram, or on a secured link what it opened to in place
    /// (those that do not open are left out). Returns how many.
    fn pieces(
        &mut self,
        cx: &Cx<'_>,
        link: &Arc<Link>,
        at: Arrival,
        batch: Batch<'_>,
        out: &mut [(usize, usize); GSO_MAX_SEGS],
    ) -> usize {
        let Batch { data, seg } = batch;
        let mut opened = [const { None }; GSO_MAX_SEGS];
        let run = open_run(cx, link, at, Batch { data: &mut *data, seg }, &mut opened);
        let mut k = 0;
        for (i, d) in data.chunks_mut(seg).enumerate().take(GSO_MAX_SEGS) {
            let r = if i < run {
                match opened[i].take() {
                    Some(r) => r,
                    None => continue,
                }
            } else {
                match link.secure {
                    Some(_) => match self.open(cx, link, at, d) {
                        Some(r) => r,
                        None => continue,
                    },
                    None => 0..d.len(),
                }
            };
            out[k] = (i * seg + r.start, i * seg + r.end);
            k += 1;
        }
        k
    }
}

/// On a secured link, the data datagrams `batch` begins with, opened
/// together ([`crate::SecureLink::open_run`]) and counted as
/// [`Rx::open`] counts each: `out[i]`, datagram `i`'s `vnet` datagram
/// (`None`: dropped, or a keepalive). The link hears its peer once for the
/// run. Returns how many datagrams it took (0 on a plain link).
fn open_run(
    cx: &Cx<'_>,
    link: &Arc<Link>,
    at: Arrival,
    batch: Batch<'_>,
    out: &mut [Option<Range<usize>>; GSO_MAX_SEGS],
) -> usize {
    let Some(sec) = &link.secure else { return 0 };
    let n = sec.open_run(batch.data, batch.seg, out);
    let mut any = false;
    for r in &mut out[..n] {
        match r {
            Some(x) => {
                any = true;
                if Range::is_empty(x) {
                    link.alive.keepalives_received.fetch_add(1, Relaxed);
                    *r = None;
                }
            }
            None => deliver::refused(cx, link, at),
        }
    }
    if any {
        deliver::heard(cx, link, at);
    }
    n
}

/// Delivers a whole frame `run` of `link` to its destination; false
/// (nothing done) if a destination needs a contiguous frame.
fn deliver_run(cx: &mut Cx<'_>, link: &Link, run: &Run<'_>) -> bool {
    if !cx.fw.forward_parts(cx.plane, PortId::Link(link.def.id), &run.iov[..run.n], run.len) {
        return false;
    }
    link.rx.add(run.len - virtio::LEN);
    link.alive.heard(cx.now_ns);
    cx.fw.global().rx_whole_batches.fetch_add(1, Relaxed);
    true
}

/// The `vnet` datagrams of one frame with its offload header, in order,
/// gathered from one or two GRO batches: an iovec per datagram payload.
struct Run<'a> {
    iov: [IoSlice<'a>; 2 * GSO_MAX_SEGS],
    n: usize,
    /// The first datagram's header, which every other must match.
    first: Option<VnetRepr>,
    /// The frame's bytes so far, and the offset the next datagram must have.
    len: usize,
}

impl<'a> Run<'a> {
    fn new() -> Self {
        Run { iov: [IoSlice::new(&[]); 2 * GSO_MAX_SEGS], n: 0, first: None, len: 0 }
    }

    /// Adds the datagrams at `ranges` of `data`; false if one is not the
    /// frame's next (the run is then of no use).
    fn extend(&mut self, data: &'a [u8], ranges: &[(usize, usize)], network: u32) -> bool {
        for &(x, y) in ranges {
            let d = &data[x..y];
            let Ok(p) = VnetPacket::new_checked(d) else { return false };
            let r = VnetRepr::parse(&p);
            let ok = match self.first {
                None => r.offset == 0 && r.flags.0 == Flags::VNET_HDR && r.network == network,
                Some(f) => r.frame_id == f.frame_id && r.frame_len == f.frame_len && r.flags == f.flags,
            };
            if !ok || r.offset as usize != self.len || self.n == self.iov.len() {
                return false;
            }
            self.first.get_or_insert(r);
            self.len += p.payload().len();
            self.iov[self.n] = IoSlice::new(&d[p.header_len()..]);
            self.n += 1;
        }
        true
    }

    /// The datagrams make the whole frame.
    fn complete(&self) -> bool {
        self.first.is_some_and(|f| f.frame_len as usize == self.len) && self.len > virtio::LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_wire::vnet::HEADER_LEN;

    /// `vnet` datagrams laid out one after another, each `(repr, payload
    /// length)`; returns the bytes and each datagram's range.
    fn datagrams(ds: &[(VnetRepr, usize)]) -> (Vec<u8>, Vec<(usize, usize)>) {
        let (mut data, mut ranges) = (Vec::new(), Vec::new());
        for &(r, len) in ds {
            let at = data.len();
            data.resize(at + HEADER_LEN, 0);
            r.emit(&mut data[at..]).unwrap();
            data.extend(std::iter::repeat_n(0x5a, len));
            ranges.push((at, data.len()));
        }
        (data, ranges)
    }

    const H: VnetRepr =
        VnetRepr { flags: Flags(Flags::VNET_HDR), network: 5, frame_id: 9, frame_len: 300, offset: 0 };

    fn extends(ds: &[(VnetRepr, usize)]) -> bool {
        let (data, ranges) = datagrams(ds);
        Run::new().extend(&data, &ranges, 5)
    }

    #[test]
    fn a_run_is_one_frames_datagrams_in_order_from_its_first() {
        let second = VnetRepr { offset: 100, ..H };
        assert!(extends(&[(H, 100), (second, 200)]));
        // The first: at offset 0, with an offload header only, in the link's network.
        assert!(!extends(&[(VnetRepr { network: 6, ..H }, 100)]), "another network");
        assert!(!extends(&[(VnetRepr { flags: Flags(0), ..H }, 100)]), "no offload header");
        assert!(!extends(&[(VnetRepr { offset: 100, ..H }, 100)]), "not the frame's start");
        // The rest: the same frame, flags, and the next offset.
        assert!(!extends(&[(H, 100), (VnetRepr { frame_id: 8, ..second }, 200)]), "another frame");
        assert!(!extends(&[(H, 100), (VnetRepr { frame_len: 400, ..second }, 200)]), "another length");
        let other_flags = VnetRepr { flags: Flags(Flags::VNET_HDR | Flags::AUTH), ..second };
        assert!(!extends(&[(H, 100), (other_flags, 200)]), "other flags");
        assert!(!extends(&[(H, 100), (VnetRepr { offset: 96, ..second }, 200)]), "not next");
    }

    #[test]
    fn a_run_is_complete_with_its_frames_last_byte_and_more_than_an_offload_header() {
        let (data, ranges) = datagrams(&[(H, 100), (VnetRepr { offset: 100, ..H }, 200)]);
        let mut run = Run::new();
        assert!(run.extend(&data, &ranges[..1], 5) && !run.complete(), "100 of 300 bytes");
        assert!(run.extend(&data, &ranges[1..], 5) && run.complete());
        assert_eq!((run.n, run.len), (2, 300));
        let header_only = VnetRepr { frame_len: virtio::LEN as u32, ..H };
        let (data, ranges) = datagrams(&[(header_only, virtio::LEN)]);
        let mut run = Run::new();
        assert!(run.extend(&data, &ranges, 5) && !run.complete(), "an offload header and no frame");
    }
}
