//! `vnet`: vnet's own format (`vnet_wire::vnet`, `docs/wire.md`). A 20-byte
//! header per datagram with the network id, and frames of up to 64 KB split
//! into underlay-sized datagrams that the receiver reassembles; the frame
//! may begin with its `virtio_net_hdr` (flag `VNET_HDR`), so offloads cross
//! the link and nobody segments in between. Datagrams are laid out as an
//! iovec per header and chunk, straight from the frame's buffer, and given
//! to the link's I/O in GSO batches. The way back in (opening,
//! reassembly, delivery) is `crate::rx::vnet`.

use super::{gso_batches, Facts, Inbound, Keepalive, Tx};
use crate::port::{copy_in, slices_in, Payload, Scratch};
use crate::secure;
use crate::{GSO_MAX_SEGS, MAX_SEGS};
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use vnet_wire::frag;
use vnet_wire::virtio;
use vnet_wire::vnet::{self, Flags, VnetRepr, HEADER_LEN};

/// Bytes the format adds to each datagram.
pub const OVERHEAD: usize = HEADER_LEN;

/// Offloads cross the link; its peer is a vnetd, which answers path MTU
/// probes and keeps an idle link alive.
pub const FACTS: Facts = Facts {
    overhead: OVERHEAD,
    offloads: true,
    any_size: false,
    probes: true,
    keepalive: Keepalive::Datagrams,
    inbound: Inbound::Vnet,
};
/// A secured `vnet` link's: each datagram sealed too.
pub const SECURED: Facts = Facts { overhead: OVERHEAD + secure::OVERHEAD, ..FACTS };

/// Sends a frame as `vnet` datagrams; segments of a finished frame (not
/// given to a port that takes offloads, but possible) go as whole frames.
pub fn send(tx: &Tx<'_>, scratch: &mut Scratch, payload: Payload<'_>, network: u32, flow: u64) -> bool {
    payload.each_frame(|parts, hdr| send_frame(tx, scratch, parts, hdr, network, flow))
}

fn send_frame(
    tx: &Tx<'_>,
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
    let flags = Flags(if with_vh { Flags::VNET_HDR } else { 0 });
    if tx.secure.is_some() {
        return send_sealed(tx, scratch, parts, skip..skip + total, (flags, network), flow);
    }
    let dgram = tx.max_datagram;
    if total > vnet::max_carried(flags) as usize || dgram <= HEADER_LEN {
        return false;
    }
    // At most MAX_SEGS datagrams: the scratch's headers.
    let n = frag::count(total, dgram);
    if n > scratch.vnet_hdrs.len() {
        return false;
    }
    let base = VnetRepr { flags, network, frame_id: tx.frame_ids.next(), frame_len: total as u32, offset: 0 };
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
        if !tx.out.send(&iov[..k], dgram, flow) {
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
/// `(flags, network)`: the header's.
fn send_sealed(
    tx: &Tx<'_>,
    scratch: &mut Scratch,
    parts: &[IoSlice<'_>],
    frame: std::ops::Range<usize>,
    (flags, network): (Flags, u32),
    flow: u64,
) -> bool {
    let Some(sec) = tx.secure else { return false };
    let total = frame.len();
    // The plain `vnet` datagram each secured one carries.
    let dgram = tx.max_datagram.saturating_sub(secure::OVERHEAD);
    if total > vnet::max_carried(flags) as usize || dgram <= HEADER_LEN {
        return false;
    }
    let n = frag::count(total, dgram);
    if n > MAX_SEGS {
        return false;
    }
    let Some(session) = sec.sealer() else { return false };
    let base = VnetRepr { flags, network, frame_id: tx.frame_ids.next(), frame_len: total as u32, offset: 0 };
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
        .all(|b| tx.out.send(&[IoSlice::new(&out[b.start * seg..(b.end * seg).min(pos)])], seg, flow))
}

/// Sends a path MTU probe of IP size `size` (`ack`: the answer to the
/// peer's probe `id` of that size, no padding), sealed on a secured link.
/// A probe is sent from the link's timer, not per frame: its buffer is
/// allocated; an answer's is on the stack. `network`: the link's.
pub fn send_probe(tx: &Tx<'_>, network: u32, id: u32, size: u32, ack: bool) -> bool {
    let flags = Flags(if ack { Flags::PROBE_ACK } else { Flags::PROBE });
    let repr = VnetRepr { flags, network, frame_id: id, frame_len: size, offset: 0 };
    let over = tx.secure.map_or(0, |_| secure::OVERHEAD);
    let plain =
        if ack { HEADER_LEN } else { (size as usize).saturating_sub(tx.outer_len + over).max(HEADER_LEN) };
    let mut small = [0u8; secure::OVERHEAD + HEADER_LEN];
    let mut big = Vec::new();
    let buf: &mut [u8] = if ack {
        &mut small
    } else {
        big.resize(over + plain, 0);
        &mut big
    };
    let at = if over > 0 { secure::DATA_HEADER } else { 0 };
    if repr.emit(&mut buf[at..]).is_none() {
        return false;
    }
    let Some(n) = tx.seal(buf, plain) else { return false };
    tx.out.send(&[IoSlice::new(&buf[..n])], n, 0)
}

/// Tells the peer where this link sees it (a `vnet` datagram flagged
/// `ENDPOINT`, sealed on a secured link): `e`, its endpoint now, directly.
pub fn send_endpoint(tx: &Tx<'_>, network: u32, e: SocketAddr) -> bool {
    let repr = VnetRepr { flags: Flags(Flags::ENDPOINT), network, frame_id: 0, frame_len: 0, offset: 0 };
    let over = tx.secure.map_or(0, |_| secure::OVERHEAD);
    let at = if over > 0 { secure::DATA_HEADER } else { 0 };
    let plain = HEADER_LEN + 18;
    let mut buf = [0u8; secure::OVERHEAD + HEADER_LEN + 18];
    if repr.emit(&mut buf[at..]).is_none() {
        return false;
    }
    let ip = match e.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    buf[at + HEADER_LEN..at + HEADER_LEN + 16].copy_from_slice(&ip.octets());
    buf[at + HEADER_LEN + 16..at + plain].copy_from_slice(&e.port().to_be_bytes());
    let Some(n) = tx.seal(&mut buf, plain) else { return false };
    tx.direct.send(&[IoSlice::new(&buf[..n])], n, 0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::tests::Kept;
    use crate::secure::tests::{handshake, pair};
    use crate::secure::SecureLink;
    use vnet_wire::frag::FrameIds;

    /// What `f` sends on a link whose datagrams hold `max_datagram`
    /// bytes (secured by `sec`), and whether it said it sent.
    fn sent_at(
        max_datagram: usize,
        sec: Option<&SecureLink>,
        f: impl FnOnce(&Tx<'_>) -> bool,
    ) -> (bool, Vec<Vec<u8>>) {
        let kept = Kept::default();
        let ids = FrameIds::new(1);
        let tx = Tx { out: &kept, direct: &kept, max_datagram, outer_len: 28, frame_ids: &ids, secure: sec };
        let ok = f(&tx);
        (ok, kept.sent.into_inner().unwrap())
    }

    /// Sends a `len`-byte frame: whether it went, and in how many datagrams.
    fn send_len(
        len: usize,
        max_datagram: usize,
        sec: Option<&SecureLink>,
        scratch: &mut Scratch,
    ) -> (bool, usize) {
        let frame = vec![0x5a; len];
        let parts = [IoSlice::new(&frame)];
        let (ok, d) = sent_at(max_datagram, sec, |t| {
            send(t, scratch, Payload::Frame { parts: &parts, hdr: false }, 0, 0)
        });
        (ok, d.len())
    }

    /// Calls `f` with no security and with a session (and what each adds
    /// to a datagram).
    fn plain_and_secured(f: impl Fn(Option<&SecureLink>, usize)) {
        let (a, b) = pair(secure::Mode::Encrypt);
        handshake(&a, &b, 1);
        f(None, 0);
        f(Some(&a), secure::OVERHEAD);
    }

    #[test]
    fn a_frame_goes_in_at_most_max_segs_datagrams_and_up_to_the_largest_carried() {
        plain_and_secured(|sec, over| {
            let s = &mut Scratch::default();
            // Datagrams of 400 bytes of frame.
            let dgram = over + HEADER_LEN + 400;
            assert_eq!(send_len(400 * MAX_SEGS, dgram, sec, s), (true, MAX_SEGS), "secured {}", over > 0);
            assert_eq!(send_len(400 * MAX_SEGS + 1, dgram, sec, s), (false, 0), "secured {}", over > 0);
            // The largest frame a `vnet` datagram says it carries, and one more.
            let max = vnet::max_carried(Flags(0)) as usize;
            assert!(send_len(max, 1472, sec, s).0);
            assert_eq!(send_len(max + 1, 1472, sec, s), (false, 0));
            // A datagram with room for its header only carries nothing.
            assert_eq!(send_len(14, over + HEADER_LEN, sec, s), (false, 0));
            assert_eq!(send_len(14, over + HEADER_LEN + 1, sec, s), (true, 14));
        });
    }

    /// What `f` sends on a link of 1472-byte datagrams (secured by `sec`).
    fn sent(sec: Option<&SecureLink>, f: impl FnOnce(&Tx<'_>) -> bool) -> Vec<Vec<u8>> {
        let (ok, d) = sent_at(1472, sec, f);
        assert!(ok);
        d
    }

    #[test]
    fn probes_are_as_large_as_the_ip_size_they_test_and_answers_a_header_alone() {
        plain_and_secured(|sec, over| {
            let probe = sent(sec, |t| send_probe(t, 3, 9, 1400, false));
            assert_eq!(probe.iter().map(Vec::len).collect::<Vec<_>>(), [1400 - 28], "secured {}", over > 0);
            let ack = sent(sec, |t| send_probe(t, 3, 9, 1400, true));
            assert_eq!(ack[0].len(), over + HEADER_LEN);
        });
    }

    #[test]
    fn an_endpoint_is_said_as_an_ipv6_address_and_port_after_the_header() {
        let e: SocketAddr = "10.1.2.3:4789".parse().unwrap();
        let d = sent(None, |t| send_endpoint(t, 3, e)).remove(0);
        let p = vnet::VnetPacket::new_checked(&d[..]).unwrap();
        assert_eq!((p.flags().0, p.network()), (Flags::ENDPOINT, 3));
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&p.payload()[..16]);
        assert_eq!(std::net::Ipv6Addr::from(ip).to_ipv4_mapped(), Some([10, 1, 2, 3].into()));
        assert_eq!(p.payload()[16..], 4789u16.to_be_bytes());
    }

    #[test]
    fn an_all_zero_offload_header_is_left_out_however_its_pieces_lie() {
        let frame = [0x5au8; 60];
        let send_as = |pieces: &[&[u8]]| {
            let parts: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
            let d = sent(None, |t| {
                send(t, &mut Scratch::default(), Payload::Frame { parts: &parts, hdr: true }, 0, 0)
            });
            let p = vnet::VnetPacket::new_checked(&d[0][..]).unwrap();
            (p.flags().0 & Flags::VNET_HDR != 0, p.payload().len())
        };
        let zero = [0u8; virtio::LEN];
        let mut some = zero;
        some[7] = 1;
        assert_eq!(send_as(&[&zero, &frame]), (false, 60), "none: left out");
        assert_eq!(send_as(&[&zero[..4], &zero[4..], &frame]), (false, 60), "none, in two pieces");
        assert_eq!(send_as(&[&some, &frame]), (true, 70), "one: carried");
        assert_eq!(send_as(&[&some[..4], &some[4..], &frame]), (true, 70), "one, in two pieces");
        let whole: Vec<u8> = zero.iter().chain(&frame).copied().collect();
        assert_eq!(send_as(&[&whole]), (false, 60), "with its frame in one piece");
    }

    #[test]
    fn a_secured_frame_is_sealed_only_into_scratch_that_holds_it_all() {
        let (a, b) = pair(secure::Mode::Encrypt);
        handshake(&a, &b, 1);
        // 3000 bytes at 1472: three datagrams, each 52 bytes more than its share.
        let need = 3 * (secure::OVERHEAD + HEADER_LEN) + 3000;
        let mut s = Scratch { sealed: vec![0; need], ..Scratch::default() };
        assert_eq!(send_len(3000, 1472, Some(&a), &mut s), (true, 3));
        for short in [1, secure::TAG + HEADER_LEN] {
            let mut s = Scratch { sealed: vec![0; need - short], ..Scratch::default() };
            assert_eq!(send_len(3000, 1472, Some(&a), &mut s), (false, 0), "{short} bytes short");
        }
    }
}
