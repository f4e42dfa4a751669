//! Finishing offloaded frames in software: completing a partial checksum
//! and segmenting a TCP GSO super-frame into MSS-sized frames.
//!
//! vnet passes offloads through whenever the destination can take them (a
//! TAP or packet socket with a `virtio_net_hdr`, a `vnet` link). A
//! destination that cannot (a `raw` link, a device without the header) gets
//! plain frames made here. Every function checks the offsets it is given
//! against the frame and returns an error instead of panicking: the header
//! comes from a VM.

use crate::virtio::{VirtioNetHdr, F_NEEDS_CSUM, GSO_ECN, GSO_TCPV4, GSO_TCPV6};

/// Why a frame could not be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("checksum offsets outside the frame")]
    BadChecksumOffsets,
    #[error("unsupported GSO type {0}")]
    UnsupportedGso(u8),
    #[error("malformed headers for segmentation")]
    BadHeaders,
    #[error("segment buffer too small")]
    NoRoom,
}

/// One's-complement sum of `data` added to `sum` (not folded). The bulk
/// is summed as native-endian 32-bit words in eight lanes (the compiler
/// makes vector adds of them), folded, and byte-swapped on a little-endian
/// machine: RFC 1071's byte-order independence and deferred carries (2^16
/// is 1 modulo 2^16 - 1). The checksums of every segment the user path
/// makes or merges are summed here: it is on the data path (29 GB/s here,
/// against 19 for 64-bit big-endian words).
pub(crate) fn sum16(data: &[u8], sum: u64) -> u64 {
    let mut lanes = [0u64; 8];
    let mut blocks = data.chunks_exact(32);
    for b in &mut blocks {
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane += u64::from(u32::from_ne_bytes([b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]]));
        }
    }
    let bulk = fold(lanes.iter().fold(0u64, |a, &l| a + (l >> 32) + (l & 0xffff_ffff)));
    let mut acc = sum + u64::from(if cfg!(target_endian = "little") { bulk.swap_bytes() } else { bulk });
    let mut pairs = blocks.remainder().chunks_exact(2);
    for c in &mut pairs {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

pub(crate) fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Views of the IP and TCP header fields segmentation reads and writes, by
/// name rather than by offset (as smoltcp's packet types do). Each wraps a
/// slice that starts at its header and that [`layout`] has checked is long
/// enough (20 bytes of IPv4 or TCP, 40 of IPv6).
mod hdr {
    fn put16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }

    /// An IPv4 header.
    pub struct Ipv4<'a>(pub &'a mut [u8]);

    impl Ipv4<'_> {
        const TOTAL_LEN: usize = 2;
        const IDENT: usize = 4;
        const CHECKSUM: usize = 10;
        /// Source and destination: the TCP pseudo-header's addresses.
        pub const ADDRS: core::ops::Range<usize> = 12..20;

        pub fn set_total_len(&mut self, v: u16) {
            put16(self.0, Self::TOTAL_LEN, v);
        }

        pub fn set_ident(&mut self, v: u16) {
            put16(self.0, Self::IDENT, v);
        }

        /// Recomputes the header checksum over the header's `ihl` bytes.
        pub fn fill_checksum(&mut self, ihl: usize) {
            put16(self.0, Self::CHECKSUM, 0);
            let c = !super::fold(super::sum16(&self.0[..ihl], 0));
            put16(self.0, Self::CHECKSUM, c);
        }
    }

    /// An IPv6 header.
    pub struct Ipv6<'a>(pub &'a mut [u8]);

    impl Ipv6<'_> {
        const PAYLOAD_LEN: usize = 4;
        /// Source and destination: the TCP pseudo-header's addresses.
        pub const ADDRS: core::ops::Range<usize> = 8..40;

        pub fn set_payload_len(&mut self, v: u16) {
            put16(self.0, Self::PAYLOAD_LEN, v);
        }
    }

    /// A TCP header (and its payload after it).
    pub struct Tcp<'a>(pub &'a mut [u8]);

    /// TCP flags segmentation treats: FIN and PSH go on the last segment
    /// only, CWR on the first only.
    pub const FIN: u8 = 0x01;
    pub const PSH: u8 = 0x08;
    pub const CWR: u8 = 0x80;

    impl Tcp<'_> {
        const SEQ: usize = 4;
        const FLAGS: usize = 13;
        const CHECKSUM: usize = 16;

        pub fn set_seq(&mut self, v: u32) {
            self.0[Self::SEQ..Self::SEQ + 4].copy_from_slice(&v.to_be_bytes());
        }

        pub fn set_flags(&mut self, v: u8) {
            self.0[Self::FLAGS] = v;
        }

        /// Recomputes the checksum over the slice (the header, and the
        /// payload when it holds it) with `pseudo`: the pseudo-header's sum
        /// (addresses, protocol, length), plus the payload's when it does not.
        pub fn fill_checksum(&mut self, pseudo: u64) {
            put16(self.0, Self::CHECKSUM, 0);
            let c = !super::fold(super::sum16(self.0, pseudo));
            put16(self.0, Self::CHECKSUM, c);
        }
    }
}

/// Completes the partial checksum of `frame` as `hdr` describes
/// (`F_NEEDS_CSUM`): sums from `csum_start` to the end, with the field's
/// pseudo-header seed, and stores the result.
pub fn complete_checksum(frame: &mut [u8], hdr: &VirtioNetHdr) -> Result<(), OffloadError> {
    if hdr.flags & F_NEEDS_CSUM == 0 {
        return Ok(());
    }
    let start = hdr.csum_start as usize;
    let field = start + hdr.csum_offset as usize;
    // (`field` is not before `start`: a start past the frame fails here too.)
    if field + 2 > frame.len() {
        return Err(OffloadError::BadChecksumOffsets);
    }
    let c = !fold(sum16(&frame[start..], 0));
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// The offload header a frame needs when it arrived without one from a
/// sender that may have left its work to the devices: a peer's kernel
/// path hands over frames as the VM's stack made them, possibly with a
/// partial TCP/UDP checksum (the pseudo-header sum, as `NEEDS_CSUM` means)
/// and, for TCP, larger than one segment.
///
/// For an IPv4 or IPv6 (no extension headers) TCP or UDP frame: if the L4
/// checksum field holds exactly the pseudo-header sum (what a stack leaves
/// for the device to finish), `NEEDS_CSUM` with its offsets; for TCP with
/// more than `mss` payload bytes (`mss` 0: never), also the TCP GSO type and
/// `mss`. `None` for anything else, or when nothing is needed. A checksum
/// that is neither complete nor partial is a corrupted frame: it is left as
/// it is, for the receiving stack to drop, never "completed".
pub fn infer(frame: &[u8], mss: u16) -> Option<VirtioNetHdr> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let (l4, proto, v4) = match ethertype {
        0x0800 => {
            let ihl = (*frame.get(14)? & 0x0f) as usize * 4;
            let frag = u16::from_be_bytes([*frame.get(20)?, *frame.get(21)?]) & 0x3fff;
            if ihl < 20 || frag != 0 {
                return None;
            }
            (14 + ihl, *frame.get(23)?, true)
        }
        0x86dd => (54, *frame.get(20)?, false),
        _ => return None,
    };
    let (csum_offset, l4_hdr) = match proto {
        6 => (16usize, (*frame.get(l4 + 12)? >> 4) as usize * 4),
        17 => (6, 8),
        _ => return None,
    };
    // A TCP header is at least 20 bytes (its checksum is at 16): a data
    // offset under 5 is a corrupted frame (found by the `offload` fuzz target).
    if l4_hdr < 8 || (proto == 6 && l4_hdr < 20) || l4 + l4_hdr > frame.len() {
        return None;
    }
    // The checksum over the pseudo-header and the segment verifies when complete.
    let seg = &frame[l4..];
    let pseudo = if v4 {
        sum16(&frame[26..34], u64::from(proto) + seg.len() as u64)
    } else {
        sum16(&frame[22..54], u64::from(proto) + seg.len() as u64)
    };
    let complete = fold(sum16(seg, pseudo)) == 0xffff;
    let stored = u16::from_be_bytes([frame[l4 + csum_offset], frame[l4 + csum_offset + 1]]);
    let seed = fold(pseudo);
    // One's complement has two zeros: a seed of 0xffff may be stored as 0.
    let partial = !complete && (stored == seed || (seed == 0xffff && stored == 0));
    if !complete && !partial {
        return None;
    }
    let payload = frame.len() - l4 - l4_hdr;
    let gso = proto == 6 && mss > 0 && payload > mss as usize;
    if complete && !gso {
        return None;
    }
    let mut h = VirtioNetHdr::NONE;
    if !complete {
        h.flags = F_NEEDS_CSUM;
        h.csum_start = l4 as u16;
        h.csum_offset = csum_offset as u16;
    }
    if gso {
        h.gso_type = if v4 { GSO_TCPV4 } else { GSO_TCPV6 };
        h.gso_size = mss;
        h.hdr_len = (l4 + l4_hdr) as u16;
    }
    Some(h)
}

/// The TCP/IP header layout of a GSO frame.
struct Layout {
    l3: usize,
    l4: usize,
    hdrs: usize,
    v4: bool,
}

fn layout(frame: &[u8], hdr: &VirtioNetHdr) -> Result<Layout, OffloadError> {
    let v4 = match hdr.gso_type & !GSO_ECN {
        GSO_TCPV4 => true,
        GSO_TCPV6 => false,
        t => return Err(OffloadError::UnsupportedGso(t)),
    };
    let l3 = match frame.get(12..14) {
        Some([0x81, 0x00]) => 18,
        Some(_) => 14,
        None => return Err(OffloadError::BadHeaders),
    };
    let l4 = hdr.csum_start as usize;
    let min_l4 = l3 + if v4 { 20 } else { 40 };
    if l4 < min_l4 || l4 + 20 > frame.len() {
        return Err(OffloadError::BadHeaders);
    }
    let doff = (frame[l4 + 12] >> 4) as usize * 4;
    if doff < 20 || l4 + doff > frame.len() {
        return Err(OffloadError::BadHeaders);
    }
    Ok(Layout { l3, l4, hdrs: l4 + doff, v4 })
}

/// A TCP super-frame cut into segments without copying its payload:
/// segment `i` is its headers, `heads[i * hdr_len..][..hdr_len]` (each
/// with its own sequence number, lengths, identification and checksums),
/// followed by `payload[i * mss..]`, at most `mss` bytes of it. Every
/// segment but possibly the last has the same length (so they can leave in
/// one UDP GSO send, an iovec pair each).
#[derive(Debug, Clone, Copy)]
pub struct Segmented<'a> {
    pub heads: &'a [u8],
    pub hdr_len: usize,
    pub payload: &'a [u8],
    pub mss: usize,
}

impl<'a> Segmented<'a> {
    /// How many segments.
    pub fn count(&self) -> usize {
        self.payload.len().div_ceil(self.mss).max(1)
    }

    /// Segment `i`'s headers and payload (empty slices past the last).
    pub fn segment(&self, i: usize) -> (&'a [u8], &'a [u8]) {
        let h = self.heads.get(i * self.hdr_len..(i + 1) * self.hdr_len).unwrap_or_default();
        let from = (i * self.mss).min(self.payload.len());
        (h, &self.payload[from..(from + self.mss).min(self.payload.len())])
    }

    /// The length of every segment but the last (the largest).
    pub fn seg_len(&self) -> usize {
        self.hdr_len + self.mss.min(self.payload.len())
    }
}

/// Cuts a TCP GSO frame into segments of at most `gso_size` payload bytes
/// (the TSO a device would do): their headers, with correct IP and TCP
/// fields and checksums, are written into `heads`; the payloads are read
/// (for the checksums) where they are, not copied. Fails, panicking never,
/// on headers that do not describe the frame or when `heads` is too small.
pub fn segment_headers<'a>(
    frame: &'a [u8],
    hdr: &VirtioNetHdr,
    heads: &'a mut [u8],
) -> Result<Segmented<'a>, OffloadError> {
    let lay = layout(frame, hdr)?;
    let mss = hdr.gso_size as usize;
    if mss == 0 {
        return Err(OffloadError::BadHeaders);
    }
    let payload = &frame[lay.hdrs..];
    let h = &frame[..lay.hdrs];
    let n = payload.len().div_ceil(mss).max(1);
    let room = heads.get_mut(..n * lay.hdrs).ok_or(OffloadError::NoRoom)?;
    // The fields that change from segment to segment, off the frame's headers.
    let seq0 = u32::from_be_bytes([h[lay.l4 + 4], h[lay.l4 + 5], h[lay.l4 + 6], h[lay.l4 + 7]]);
    let flags0 = h[lay.l4 + 13];
    let id0 = if lay.v4 { u16::from_be_bytes([h[lay.l3 + 4], h[lay.l3 + 5]]) } else { 0 };
    for (i, seg) in room.chunks_exact_mut(lay.hdrs).enumerate() {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        seg.copy_from_slice(h);
        let len = lay.hdrs + chunk.len();
        let (l3, l4) = seg.split_at_mut(lay.l4);
        let l3 = &mut l3[lay.l3..];
        let l3len = len - lay.l3;
        let addrs = if lay.v4 {
            let mut ip = hdr::Ipv4(l3);
            ip.set_total_len(l3len as u16);
            ip.set_ident(id0.wrapping_add(i as u16));
            ip.fill_checksum(lay.l4 - lay.l3);
            sum16(&ip.0[hdr::Ipv4::ADDRS], 0)
        } else {
            let mut ip = hdr::Ipv6(l3);
            ip.set_payload_len((l3len - 40) as u16);
            sum16(&ip.0[hdr::Ipv6::ADDRS], 0)
        };
        let mut tcp = hdr::Tcp(l4);
        tcp.set_seq(seq0.wrapping_add((i * mss) as u32));
        let mut f = flags0;
        if i + 1 < n {
            f &= !(hdr::FIN | hdr::PSH);
        }
        if i > 0 {
            f &= !hdr::CWR;
        }
        tcp.set_flags(f);
        // The TCP header's length is a multiple of 4: its sum and the
        // payload's add up to the segment's.
        let l4len = len - lay.l4;
        tcp.fill_checksum(sum16(chunk, addrs + 6 + l4len as u64));
    }
    Ok(Segmented { heads: room, hdr_len: lay.hdrs, payload, mss })
}

/// Splits a TCP GSO frame as [`segment_headers`] does, each segment
/// written whole, back to back, into `out`: the ranges of the segments in
/// `out`. (For the fuzzer and tests; the data path sends the pieces.)
pub fn segment_tcp(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    out: &mut [u8],
    ranges: &mut Vec<core::ops::Range<usize>>,
) -> Result<(), OffloadError> {
    ranges.clear();
    let mut heads = vec![0u8; out.len()];
    let segs = segment_headers(frame, hdr, &mut heads)?;
    let mut pos = 0;
    for i in 0..segs.count() {
        let (h, p) = segs.segment(i);
        let seg = out.get_mut(pos..pos + h.len() + p.len()).ok_or(OffloadError::NoRoom)?;
        seg[..h.len()].copy_from_slice(h);
        seg[h.len()..].copy_from_slice(p);
        ranges.push(pos..pos + seg.len());
        pos += seg.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::F_NEEDS_CSUM;

    /// A TCP/IPv4 frame with `payload` bytes, checksum fields left as the
    /// pseudo-header seed (as a kernel hands it over with NEEDS_CSUM).
    fn tcp4(payload: usize, flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + payload];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 88, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 88, 1, 1]);
        let t = &mut f[34..54];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&1000u32.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = (i * 13) as u8;
        }
        f
    }

    /// Verifies a TCP/IPv4 frame's checksums.
    fn valid_tcp4(f: &[u8]) -> bool {
        let ip_ok = fold(sum16(&f[14..34], 0)) == 0xffff;
        let l4len = f.len() - 34;
        let sum = sum16(&f[26..34], 6 + l4len as u64);
        ip_ok && fold(sum16(&f[34..], sum)) == 0xffff
    }

    fn partial(f: &mut [u8]) -> VirtioNetHdr {
        // Seed the TCP checksum with the pseudo-header sum, as Linux does.
        let l4len = f.len() - 34;
        let seed = fold(sum16(&f[26..34], 6 + l4len as u64));
        f[50..52].copy_from_slice(&seed.to_be_bytes());
        let ipc = !fold(sum16(&f[14..34], 0));
        f[24..26].copy_from_slice(&ipc.to_be_bytes());
        VirtioNetHdr { flags: F_NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..Default::default() }
    }

    #[test]
    fn a_tcp_header_shorter_than_its_checksum_is_no_offload_and_no_panic() {
        // Found by the `offload` fuzz target: a data offset of 2 (8 bytes)
        // put the checksum field past the frame's end.
        let f = [
            82, 84, 0, 0, 0, 2, 82, 84, 0, 0, 0, 1, 8, 0, 69, 0, 5, 160, 0, 128, 0, 0, 64, 6, 0, 0, 10, 255,
            255, 203, 220, 221, 222, 223, 17, 255, 226, 227, 228, 229, 255, 255, 255, 116, 117, 118, 38, 119,
        ];
        assert_eq!(infer(&f, 0), None);
        assert_eq!(infer(&f, 1448), None);
    }

    #[test]
    fn infers_what_a_kernel_sent_frame_needs() {
        // Partial checksum, larger than one segment: NEEDS_CSUM and TCP GSO.
        let mut f = tcp4(4000, 0x18);
        let seeded = partial(&mut f);
        let h = infer(&f, 1448).unwrap();
        assert_eq!((h.flags, h.csum_start, h.csum_offset), (F_NEEDS_CSUM, 34, 16));
        assert_eq!((h.gso_type, h.gso_size, h.hdr_len), (GSO_TCPV4, 1448, 54));
        // Completing it as inferred gives a valid frame.
        complete_checksum(&mut f, &seeded).unwrap();
        assert!(valid_tcp4(&f));
        // Complete and small: nothing to do.
        let mut g = tcp4(100, 0x18);
        let hg = partial(&mut g);
        complete_checksum(&mut g, &hg).unwrap();
        assert_eq!(infer(&g, 1448), None);
        // Partial and small: checksum only.
        let mut p = tcp4(100, 0x18);
        partial(&mut p);
        assert_eq!(infer(&p, 1448).map(|h| (h.flags, h.gso_type)), Some((F_NEEDS_CSUM, 0)));
        // A corrupted checksum (neither complete nor the seed) is not "partial".
        let mut bad = tcp4(100, 0x18);
        partial(&mut bad);
        bad[50] ^= 0x40;
        assert_eq!(infer(&bad, 1448), None);
        // mss 0: never GSO, however large.
        let mut big = tcp4(4000, 0x18);
        partial(&mut big);
        assert_eq!(infer(&big, 0).map(|h| (h.flags, h.gso_type)), Some((F_NEEDS_CSUM, 0)));
        // Not TCP/UDP over IP, or truncated: nothing.
        assert_eq!(infer(&[0u8; 20], 1448), None);
        assert_eq!(infer(&f[..40], 1448), None);
    }

    /// A TCP/IPv6 frame (fd00::1 to fd00::2) of `payload` bytes, its TCP
    /// sequence number `seq` and flags `flags`, its checksum field 0.
    fn tcp6(payload: usize, seq: u32, flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 20 + payload];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[18..20].copy_from_slice(&((20 + payload) as u16).to_be_bytes());
        f[20] = 6;
        f[21] = 64;
        f[22..38].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f[38..54].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f[58..62].copy_from_slice(&seq.to_be_bytes());
        f[66] = 5 << 4;
        f[67] = flags;
        for (i, b) in f[74..].iter_mut().enumerate() {
            *b = i as u8;
        }
        f
    }

    /// [`tcp6`] with its checksum seeded, as a stack leaves it.
    fn tcp6_partial(payload: usize) -> Vec<u8> {
        let mut f = tcp6(payload, 0, 0x10);
        let seed = fold(sum16(&f[22..54], 6 + (20 + payload) as u64));
        f[70..72].copy_from_slice(&seed.to_be_bytes());
        f
    }

    /// The edges of `infer` mutation testing found unchecked: IPv6's
    /// pseudo-header, a payload of exactly one segment, headers and no
    /// payload, a frame cut inside its TCP header, and a seed of 0xffff
    /// stored as 0 (the other zero of one's complement).
    #[test]
    fn infers_at_its_edges() {
        let f = tcp6_partial(4000);
        let h = infer(&f, 1440).unwrap();
        assert_eq!((h.flags, h.csum_start, h.csum_offset), (F_NEEDS_CSUM, 54, 16));
        assert_eq!((h.gso_type, h.gso_size, h.hdr_len), (GSO_TCPV6, 1440, 74));
        // One segment exactly: a checksum to finish, no GSO.
        let mut one = tcp4(1448, 0x18);
        partial(&mut one);
        assert_eq!(infer(&one, 1448).map(|h| (h.flags, h.gso_type)), Some((F_NEEDS_CSUM, 0)));
        // Headers only.
        let mut empty = tcp4(0, 0x10);
        partial(&mut empty);
        assert_eq!(infer(&empty, 1448).map(|h| h.flags), Some(F_NEEDS_CSUM));
        // Cut inside the TCP header (its data offset readable).
        assert_eq!(infer(&one[..50], 1448), None);
        // UDP: a partial checksum at offset 6, never GSO.
        let mut u = tcp4(100, 0x18);
        u[23] = 17;
        let seed = fold(sum16(&u[26..34], 17 + 120));
        u[40..42].copy_from_slice(&seed.to_be_bytes());
        let h = infer(&u, 8).unwrap();
        assert_eq!((h.flags, h.csum_start, h.csum_offset, h.gso_type), (F_NEEDS_CSUM, 34, 6, 0));
        // An IPv4 header with options (24 bytes): TCP starts after them.
        let mut opt = tcp4(100, 0x18);
        opt[14] = 0x46;
        opt.splice(34..34, [1, 1, 1, 0]);
        opt[16..18].copy_from_slice(&(24 + 20 + 100u16).to_be_bytes());
        let seed = fold(sum16(&opt[26..34], 6 + 120));
        opt[54..56].copy_from_slice(&seed.to_be_bytes());
        let h = infer(&opt, 1448).unwrap();
        assert_eq!((h.flags, h.csum_start, h.csum_offset), (F_NEEDS_CSUM, 38, 16));
        // An IPv4 header under 20 bytes, a fragment: nothing.
        let mut short = one.clone();
        short[14] = 0x44;
        assert_eq!(infer(&short, 1448), None);
        let mut frag = one.clone();
        frag[20] |= 0x20;
        assert_eq!(infer(&frag, 1448), None);
        // A seed of 0xffff stored as 0: partial. Another seed stored as 0:
        // corrupted. (The destination's last bytes pick the seed.)
        let mut z = tcp4(100, 0x18);
        let seed = |f: &[u8]| fold(sum16(&f[26..34], 6 + (f.len() - 34) as u64));
        let k = (0..=u16::MAX).find(|&k| {
            z[32..34].copy_from_slice(&k.to_be_bytes());
            seed(&z) == 0xffff
        });
        z[32..34].copy_from_slice(&k.unwrap().to_be_bytes());
        z[50..52].fill(0);
        assert_eq!(infer(&z, 1448).map(|h| h.flags), Some(F_NEEDS_CSUM), "0 for a seed of 0xffff");
        z[33] ^= 1;
        assert_ne!(seed(&z), 0xffff);
        assert_eq!(infer(&z, 1448), None, "0 for another seed");
    }

    /// `segment_headers` refuses GSO headers that do not fit the frame, at
    /// each bound, and takes a frame of headers only; `seg_len` is the
    /// longest segment's.
    #[test]
    fn segments_at_their_edges() {
        let gso = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            flags: F_NEEDS_CSUM,
            hdr_len: 54,
        };
        let mut heads = vec![0u8; 64 * 54];
        let f = tcp4(0, 0x10);
        let s = segment_headers(&f, &gso, &mut heads).unwrap();
        assert_eq!((s.count(), s.seg_len()), (1, 54), "headers only: one segment");
        assert_eq!(segment_headers(&f[..44], &gso, &mut heads).err(), Some(OffloadError::BadHeaders));
        // TCP said to start inside the IP header.
        // (Byte 42, where its data offset would be, says 20.)
        let inside = VirtioNetHdr { csum_start: 30, ..gso };
        let mut t = tcp4(100, 0x10);
        t[42] = 5 << 4;
        assert_eq!(segment_headers(&t, &inside, &mut heads).err(), Some(OffloadError::BadHeaders));
        // A data offset under 20 bytes.
        let mut d = tcp4(100, 0x10);
        d[46] = 4 << 4;
        assert_eq!(segment_headers(&d, &gso, &mut heads).err(), Some(OffloadError::BadHeaders));
        // A data offset of 32 (options) on a frame cut at 58.
        let mut o = tcp4(4, 0x10);
        o[46] = 8 << 4;
        assert_eq!(segment_headers(&o, &gso, &mut heads).err(), Some(OffloadError::BadHeaders));
        let big = tcp4(4000, 0x10);
        let s = segment_headers(&big, &gso, &mut heads).unwrap();
        assert_eq!((s.count(), s.seg_len()), (3, 54 + 1448));
        let small = tcp4(100, 0x10);
        assert_eq!(segment_headers(&small, &gso, &mut heads).unwrap().seg_len(), 54 + 100);
    }

    #[test]
    fn completes_checksum() {
        let mut f = tcp4(333, 0x18);
        let h = partial(&mut f);
        complete_checksum(&mut f, &h).unwrap();
        assert!(valid_tcp4(&f));
        let bad = VirtioNetHdr { csum_start: 400, ..h };
        assert_eq!(complete_checksum(&mut f, &bad), Err(OffloadError::BadChecksumOffsets));
        // Without NEEDS_CSUM: nothing to do, nothing changed.
        let before = f.clone();
        assert_eq!(complete_checksum(&mut f, &VirtioNetHdr::NONE), Ok(()));
        assert_eq!(f, before);
        // The field's last byte may be the frame's last.
        let end = VirtioNetHdr { csum_start: 34, csum_offset: (f.len() - 36) as u16, ..h };
        assert_eq!(complete_checksum(&mut f, &end), Ok(()));
        let past = VirtioNetHdr { csum_offset: (f.len() - 35) as u16, ..end };
        assert_eq!(complete_checksum(&mut f, &past), Err(OffloadError::BadChecksumOffsets));
    }

    #[test]
    fn segments_tcp4() {
        let mut f = tcp4(4000, 0x19); // PSH|ACK|FIN
        let mut h = partial(&mut f);
        h.gso_type = GSO_TCPV4;
        h.gso_size = 1448;
        let mut out = vec![0u8; 8000];
        let mut ranges = Vec::new();
        segment_tcp(&f, &h, &mut out, &mut ranges).unwrap();
        assert_eq!(ranges.len(), 3);
        let mut data = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            let s = &out[r.clone()];
            assert!(valid_tcp4(s), "segment {i}");
            let seq = u32::from_be_bytes([s[38], s[39], s[40], s[41]]);
            assert_eq!(seq, 1000 + 1448 * i as u32);
            assert_eq!(u16::from_be_bytes([s[18], s[19]]), 0x1234 + i as u16);
            let fin = s[47] & 1 == 1;
            assert_eq!(fin, i == 2);
            data.extend_from_slice(&s[54..]);
        }
        assert_eq!(data, &f[54..]);
        assert_eq!(ranges[0].len(), ranges[1].len());
    }

    #[test]
    fn segments_tcp6() {
        // Ethernet, IPv6 (40), TCP (20), 3000 bytes: two segments of 1440.
        let f = tcp6(3000, 7, 0x19); // PSH|ACK|FIN
        let h = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV6,
            hdr_len: 74,
            gso_size: 1440,
            csum_start: 54,
            csum_offset: 16,
        };
        let (mut out, mut ranges) = (vec![0u8; 8000], Vec::new());
        segment_tcp(&f, &h, &mut out, &mut ranges).unwrap();
        assert_eq!(ranges.len(), 3);
        let mut data = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            let s = &out[r.clone()];
            let l4len = s.len() - 54;
            assert_eq!(u16::from_be_bytes([s[18], s[19]]) as usize, l4len, "segment {i}: payload length");
            assert_eq!(u32::from_be_bytes([s[58], s[59], s[60], s[61]]), 7 + 1440 * i as u32);
            assert_eq!(s[67] & 1 == 1, i == 2, "FIN only on the last");
            let pseudo = sum16(&s[22..54], 0) + 6 + l4len as u64;
            assert_eq!(fold(sum16(&s[54..], pseudo)), 0xffff, "segment {i}: TCP checksum");
            data.extend_from_slice(&s[74..]);
        }
        assert_eq!(data, &f[74..]);
    }

    #[test]
    fn rejects_bad_headers() {
        let f = tcp4(100, 0x10);
        let mut out = vec![0u8; 1000];
        let mut r = Vec::new();
        let h = VirtioNetHdr { gso_type: GSO_TCPV4, gso_size: 50, csum_start: 20, ..Default::default() };
        assert_eq!(segment_tcp(&f, &h, &mut out, &mut r), Err(OffloadError::BadHeaders));
        let h = VirtioNetHdr { gso_type: 3, gso_size: 50, csum_start: 34, ..Default::default() };
        assert_eq!(segment_tcp(&f, &h, &mut out, &mut r), Err(OffloadError::UnsupportedGso(3)));
        let h = VirtioNetHdr { gso_type: GSO_TCPV4, gso_size: 10, csum_start: 34, ..Default::default() };
        assert_eq!(segment_tcp(&f, &h, &mut out[..300], &mut r), Err(OffloadError::NoRoom));
    }

    proptest::proptest! {
        #[test]
        fn sum16_by_words_is_the_16_bit_sum(data in proptest::collection::vec(proptest::num::u8::ANY, 0..600), seed in 0u64..1 << 20) {
            let mut naive = seed;
            for (i, b) in data.iter().enumerate() {
                naive += u64::from(*b) << if i % 2 == 0 { 8 } else { 0 };
            }
            proptest::prop_assert_eq!(fold(sum16(&data, seed)), fold(naive));
        }

        /// A valid GSO frame first (a TCP/IPv4 super-frame with a partial
        /// checksum and a right header, as a guest hands it over), then
        /// one field of the frame or of the header changed. Unchanged, it
        /// segments into frames of at most `gso_size` payload bytes, each
        /// with valid checksums, whose payloads are the frame's; changed,
        /// it segments or is refused, and never panics or writes out of
        /// `out`. (Random bytes reach segmentation in under one case in
        /// 20000; these all do.)
        #[test]
        fn valid_gso_frames_mutated_one_field_at_a_time_never_panic(
            payload in 0usize..6000, mss in 1u16..3000, which in 0usize..8, at in 0usize..70, x: u8, v: u16,
        ) {
            let mut f = tcp4(payload, 0x18);
            let mut h = partial(&mut f);
            h.gso_type = GSO_TCPV4;
            h.gso_size = mss;
            h.hdr_len = 54;
            // Room for every segment (a 1-byte MSS makes one a byte).
            let mut out = vec![0u8; 70_000.max(payload.div_ceil(mss as usize).max(1) * (54 + mss as usize))];
            let mut r = Vec::new();
            if which == 0 {
                // Unchanged: the segments are right.
                proptest::prop_assert!(segment_tcp(&f, &h, &mut out, &mut r).is_ok());
                let mut data = Vec::new();
                for s in &r {
                    let seg = &out[s.clone()];
                    proptest::prop_assert!(valid_tcp4(seg));
                    proptest::prop_assert!(seg.len() - 54 <= mss as usize);
                    data.extend_from_slice(&seg[54..]);
                }
                proptest::prop_assert_eq!(&data[..], &f[54..]);
            } else {
                match which {
                    1 => h.gso_size = v,
                    2 => h.csum_start = v,
                    3 => h.csum_offset = v,
                    4 => h.hdr_len = v,
                    5 => h.gso_type = x,
                    6 => h.flags = x,
                    _ => {
                        let i = at % f.len();
                        f[i] = x; // a byte of the headers (or the first payload bytes)
                    }
                }
                let _ = segment_tcp(&f, &h, &mut out, &mut r);
                for s in &r {
                    proptest::prop_assert!(s.end <= out.len());
                }
                let mut c = f.clone();
                let _ = complete_checksum(&mut c, &h);
                let _ = infer(&f, h.gso_size);
            }
        }

        #[test]
        fn never_panics_on_offload_input(frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
                                         flags: u8, gso_type: u8, gso_size: u16, cs: u16, co: u16) {
            let h = VirtioNetHdr { flags, gso_type, hdr_len: 0, gso_size, csum_start: cs, csum_offset: co };
            let mut f = frame.clone();
            let _ = complete_checksum(&mut f, &h);
            let mut out = vec![0u8; 2000];
            let mut r = Vec::new();
            let _ = segment_tcp(&frame, &h, &mut out, &mut r);
            let _ = infer(&frame, gso_size);
        }
    }
}
