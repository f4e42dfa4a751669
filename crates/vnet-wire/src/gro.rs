//! Receive coalescing (GRO) of TCP segments, for links that carry one
//! Ethernet frame per datagram (`raw`, VXLAN): consecutive segments of one
//! TCP/IPv4 flow, in order, become one TCP GSO super-frame with a
//! `virtio_net_hdr`, written to the VM's TAP once instead of once per
//! segment, so such a link costs no more per byte than the `vnet` format,
//! which carries 64 KB frames whole.
//!
//! Only the headers are written ([`coalesce`] fills a small buffer); the
//! payloads stay where the datagrams were received and go out as an iovec.
//! The rules are Linux's `tcp_gro_receive` and `inet_gro_receive`: same
//! Ethernet header, IPv4 without options or fragments, same TOS, TTL and
//! addresses; same ports, header length, options (byte for byte), ACK
//! number, window and flags (ACK, and PSH on the last segment only), the
//! sequence numbers contiguous, every segment but the last the same size.
//! Every segment's checksums are verified first (complete, or the partial
//! seed a sender that trusts its device leaves): the super-frame goes to
//! the VM with `NEEDS_CSUM`, and its stack would not look again.
//!
//! Written here rather than taken from a library: no crate does GRO over
//! borrowed frames without copying the payloads, which is the point.

use crate::offload::{fold, sum16};
use crate::virtio::{self, VirtioNetHdr, F_NEEDS_CSUM, GSO_TCPV4};

/// Ethernet 14 + IPv4 20 + TCP up to 60.
const MAX_HDRS: usize = 14 + 20 + 60;
/// The largest super-frame header buffer: `virtio_net_hdr` and [`MAX_HDRS`].
pub const HEAD_MAX: usize = virtio::LEN + MAX_HDRS;
/// Largest IPv4 total length.
const MAX_IP: usize = 65_535;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

/// A run of frames that [`coalesce`] merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// How many frames, from the first: 1 when nothing merged.
    pub frames: usize,
    /// The super-frame's `virtio_net_hdr` and headers: `head[..head_len]`.
    pub head_len: usize,
    /// Where each frame's TCP payload starts (the same in every frame).
    pub payload_at: usize,
}

/// One segment's view: where the TCP header is, its length, its payload length.
struct Seg<'a> {
    f: &'a [u8],
    doff: usize,
    payload: usize,
}

const L4: usize = 14 + 20;

/// A TCP/IPv4 segment that may be merged, its checksums verified.
fn segment(f: &[u8]) -> Option<Seg<'_>> {
    if f.len() < L4 + 20 || f[12..14] != [0x08, 0x00] || f[14] != 0x45 || f[23] != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let frag = u16::from_be_bytes([f[20], f[21]]) & 0x3fff;
    let doff = usize::from(f[L4 + 12] >> 4) * 4;
    if frag != 0 || total != f.len() - 14 || doff < 20 || L4 + doff > f.len() {
        return None;
    }
    let flags = f[L4 + 13];
    if flags & !PSH != ACK || fold(sum16(&f[14..L4], 0)) != 0xffff {
        return None;
    }
    let tcp_len = f.len() - L4;
    let pseudo = sum16(&f[26..34], 6 + tcp_len as u64);
    let stored = u16::from_be_bytes([f[L4 + 16], f[L4 + 17]]);
    let seed = fold(pseudo);
    let complete = fold(sum16(&f[L4..], pseudo)) == 0xffff;
    let partial = stored == seed || (seed == 0xffff && stored == 0);
    let payload = tcp_len - doff;
    (payload > 0 && (complete || partial)).then_some(Seg { f, doff, payload })
}

fn seq(s: &Seg<'_>) -> u32 {
    u32::from_be_bytes([s.f[L4 + 4], s.f[L4 + 5], s.f[L4 + 6], s.f[L4 + 7]])
}

/// Whether `b` may follow `a` in one super-frame (`a`'s flags allow more).
fn follows(a: &Seg<'_>, b: &Seg<'_>) -> bool {
    let (x, y) = (a.f, b.f);
    a.f[L4 + 13] & PSH == 0
        && a.doff == b.doff
        && x[..14] == y[..14]
        // TOS, DF and TTL, protocol, addresses (identification and checksum may differ).
        && x[15] == y[15]
        && x[20] == y[20]
        && x[22..24] == y[22..24]
        && x[26..34] == y[26..34]
        // Ports; then ACK number, header length, flags but PSH, window; then options.
        && x[L4..L4 + 4] == y[L4..L4 + 4]
        && x[L4 + 8..L4 + 13] == y[L4 + 8..L4 + 13]
        && x[L4 + 14..L4 + 16] == y[L4 + 14..L4 + 16]
        && x[L4 + 20..L4 + a.doff] == y[L4 + 20..L4 + b.doff]
        && seq(a).wrapping_add(a.payload as u32) == seq(b)
}

/// Merges frames from the first of `frames` while they are one TCP flow's
/// consecutive segments (module doc): for 2 or more, writes the
/// super-frame's `virtio_net_hdr` and headers into `head`. Never reads
/// outside a frame, whatever the frames hold.
pub fn coalesce<'a>(frames: impl IntoIterator<Item = &'a [u8]>, head: &mut [u8; HEAD_MAX]) -> Run {
    let one = Run { frames: 1, head_len: 0, payload_at: 0 };
    let mut it = frames.into_iter();
    let Some(first) = it.next().and_then(segment) else { return one };
    let (f0, mss, hdrs) = (first.f, first.payload, L4 + first.doff);
    let (mut n, mut total) = (1, mss);
    let mut prev = first;
    for f in it {
        let Some(s) = segment(f) else { break };
        // All but the last the first one's size; the whole under 64 KB.
        let fits = hdrs - 14 + total + s.payload <= MAX_IP;
        if !follows(&prev, &s) || prev.payload != mss || s.payload > mss || !fits {
            break;
        }
        total += s.payload;
        n += 1;
        prev = s;
    }
    if n < 2 {
        return one;
    }
    let vh = VirtioNetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: hdrs as u16,
        gso_size: mss as u16,
        csum_start: L4 as u16,
        csum_offset: 16,
    };
    head[..virtio::LEN].copy_from_slice(&vh.emit());
    let h = &mut head[virtio::LEN..virtio::LEN + hdrs];
    h.copy_from_slice(&f0[..hdrs]);
    // IPv4: the whole length, a new header checksum.
    let ip_len = (hdrs - 14 + total) as u16;
    h[16..18].copy_from_slice(&ip_len.to_be_bytes());
    h[24..26].fill(0);
    let c = !fold(sum16(&h[14..L4], 0));
    h[24..26].copy_from_slice(&c.to_be_bytes());
    // TCP: the last segment's PSH; the checksum field the pseudo-header sum
    // (a partial checksum, as a stack leaves it for the device).
    h[L4 + 13] = prev.f[L4 + 13];
    let seed = fold(sum16(&h[26..34], 6 + (hdrs - L4 + total) as u64));
    h[L4 + 16..L4 + 18].copy_from_slice(&seed.to_be_bytes());
    Run { frames: n, head_len: virtio::LEN + hdrs, payload_at: hdrs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::{complete_checksum, segment_tcp};

    /// A TCP/IPv4 super-frame of `len` payload bytes with a partial
    /// checksum, as a VM hands it over with TSO, and its header.
    fn super_frame(len: usize, flags: u8) -> (Vec<u8>, VirtioNetHdr) {
        let mut f = vec![0u8; 54 + len];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((40 + len) as u16).to_be_bytes());
        f[20] = 0x40; // DF
        f[22] = 64;
        f[23] = 6;
        f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f[34..38].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[42..46].copy_from_slice(&77u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = flags;
        f[48..50].copy_from_slice(&512u16.to_be_bytes());
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let c = !fold(sum16(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let seed = fold(sum16(&f[26..34], 6 + 20 + len as u64));
        f[50..52].copy_from_slice(&seed.to_be_bytes());
        let vh = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1400,
            csum_start: 34,
            csum_offset: 16,
        };
        (f, vh)
    }

    /// The super-frame segmented (complete checksums), as a raw link's peer sends it.
    fn segments(len: usize, flags: u8) -> Vec<Vec<u8>> {
        let (f, vh) = super_frame(len, flags);
        let mut out = vec![0u8; 4 * 65_536];
        let mut ranges = Vec::new();
        segment_tcp(&f, &vh, &mut out, &mut ranges).unwrap();
        ranges.into_iter().map(|r| out[r].to_vec()).collect()
    }

    /// Recomputes a segment's IPv4 and TCP checksums (complete).
    fn checksums(f: &mut [u8]) {
        f[24..26].fill(0);
        let c = !fold(sum16(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f[50..52].fill(0);
        let c = !fold(sum16(&f[34..], sum16(&f[26..34], 6 + (f.len() - 34) as u64)));
        f[50..52].copy_from_slice(&c.to_be_bytes());
    }

    /// One segment of the test flow: `len` payload bytes at `seq`, checksums complete.
    fn one(seq: u32, len: usize) -> Vec<u8> {
        let (mut f, mut vh) = super_frame(len, ACK);
        f[38..42].copy_from_slice(&seq.to_be_bytes());
        vh.gso_size = len as u16;
        let mut out = vec![0u8; 2 * 65_536];
        let mut ranges = Vec::new();
        segment_tcp(&f, &vh, &mut out, &mut ranges).unwrap();
        out[ranges[0].clone()].to_vec()
    }

    /// A run ends at a segment shorter than the first (it must be the
    /// last) or longer; it takes segments up to exactly 64 KB of IP packet.
    #[test]
    fn a_run_ends_where_its_rules_say() {
        let frames = |v: &[Vec<u8>]| coalesce(v.iter().map(|s| &s[..]), &mut [0u8; HEAD_MAX]).frames;
        assert_eq!(frames(&[one(1000, 1400), one(2400, 1400)]), 2);
        assert_eq!(frames(&[one(1000, 1400), one(2400, 1000), one(3400, 1400)]), 2, "after a short one");
        assert_eq!(frames(&[one(1000, 1000), one(2000, 1400)]), 1, "a longer one");
        // Small segments (a frame of under 443 bytes read whole).
        let small: Vec<Vec<u8>> = (0..4).map(|i| one(1000 + 100 * i, 100)).collect();
        assert_eq!(frames(&small), 4);
        // 46 x 1400 + 1095 = 65495 bytes: with 40 of headers, 65535, the
        // largest IP packet: all 47 in one run.
        let (f, vh) = super_frame(46 * 1400 + 1095, ACK);
        let mut out = vec![0u8; 4 * 65_536];
        let mut ranges = Vec::new();
        segment_tcp(&f, &vh, &mut out, &mut ranges).unwrap();
        let segs: Vec<Vec<u8>> = ranges.into_iter().map(|r| out[r].to_vec()).collect();
        assert_eq!((segs.len(), frames(&segs)), (47, 47));
    }

    /// A pure ACK after data is never merged into it (it would vanish, a
    /// window update with it); a run stops one byte short of an IP packet
    /// larger than 65535 bytes.
    #[test]
    fn a_pure_ack_and_the_byte_past_64k_end_a_run() {
        let frames = |v: &[Vec<u8>]| coalesce(v.iter().map(|s| &s[..]), &mut [0u8; HEAD_MAX]).frames;
        let mut ack = one(2400, 1);
        ack.truncate(54);
        ack[16..18].copy_from_slice(&40u16.to_be_bytes());
        checksums(&mut ack);
        assert!(segment(&ack).is_none(), "no payload, no segment to merge");
        assert_eq!(frames(&[one(1000, 1400), ack]), 1);
        // 46 x 1400 + 1096: 40 + 65496 = 65536 bytes of IP: the last waits.
        let mut run: Vec<Vec<u8>> = (0..46).map(|i| one(1000 + 1400 * i, 1400)).collect();
        run.push(one(1000 + 1400 * 46, 1096));
        assert_eq!(frames(&run), 46);
    }

    /// Sequence numbers are read whole: a run whose numbers carry into
    /// every byte (0x00ffff00 + 1400 = 0x01000478) is still one run.
    #[test]
    fn a_run_across_a_carry_in_every_byte_of_the_sequence_is_one() {
        let (mut f, vh) = super_frame(4200, ACK);
        f[38..42].copy_from_slice(&0x00ff_ff00u32.to_be_bytes());
        let mut out = vec![0u8; 4 * 65_536];
        let mut ranges = Vec::new();
        segment_tcp(&f, &vh, &mut out, &mut ranges).unwrap();
        let segs: Vec<Vec<u8>> = ranges.into_iter().map(|r| out[r].to_vec()).collect();
        let mut head = [0u8; HEAD_MAX];
        assert_eq!(coalesce(segs.iter().map(|s| &s[..]), &mut head).frames, 3);
    }

    /// `segment` at its edges (mutation testing): each refusal alone, a
    /// partial checksum taken, a corrupted one not, a seed of 0xffff
    /// stored as 0 taken, another seed stored as 0 not; the head's size.
    #[test]
    fn segments_are_taken_or_refused_at_their_edges() {
        assert_eq!(HEAD_MAX, 10 + 14 + 20 + 60);
        let s = segments(100, ACK)[0].clone();
        assert!(segment(&s).is_some());
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut g = s.clone();
            f(&mut g);
            segment(&g).is_some()
        };
        assert!(!with(&|g| g[20] |= 0x20), "a fragment (more fragments)");
        assert!(
            !with(&|g| {
                g[17] ^= 1;
                checksums(g)
            }),
            "a total length that is not the frame's"
        );
        assert!(
            !with(&|g| {
                g[46] = 4 << 4;
                checksums(g)
            }),
            "a data offset under 20"
        );
        let mut t = segments(20, ACK)[0].clone();
        t[46] = 15 << 4;
        checksums(&mut t);
        assert!(segment(&t).is_none(), "a data offset past the frame");
        // Partial: the pseudo-header's sum stored, as a sender leaves it.
        let seed = |g: &[u8]| fold(sum16(&g[26..34], 6 + (g.len() - 34) as u64));
        let store = |g: &mut Vec<u8>, v: u16| g[50..52].copy_from_slice(&v.to_be_bytes());
        assert!(with(&|g| store(g, seed(g))), "partial");
        assert!(!with(&|g| store(g, seed(g) ^ 0x0100)), "corrupted");
        // The seed's other zero: pick the destination so that it is 0xffff.
        let mut z = s.clone();
        let k = (0..=u16::MAX)
            .find(|&k| {
                z[32..34].copy_from_slice(&k.to_be_bytes());
                seed(&z) == 0xffff
            })
            .unwrap();
        z[32..34].copy_from_slice(&k.to_be_bytes());
        checksums(&mut z);
        store(&mut z, 0);
        assert!(segment(&z).is_some(), "0 for a seed of 0xffff");
        z[33] ^= 1;
        checksums(&mut z);
        store(&mut z, 0);
        assert!(segment(&z).is_none(), "0 for another seed");
    }

    /// The frame a run makes, written out: the head and the payloads.    /// The frame a run makes, written out: the head and the payloads.
    fn merged(head: &[u8], run: Run, frames: &[Vec<u8>]) -> Vec<u8> {
        let mut v = head[virtio::LEN..run.head_len].to_vec();
        for f in &frames[..run.frames] {
            v.extend_from_slice(&f[run.payload_at..]);
        }
        v
    }

    #[test]
    fn segments_of_one_super_frame_merge_back_into_it() {
        let segs = segments(60_000, ACK | PSH);
        assert_eq!(segs.len(), 43);
        let mut head = [0u8; HEAD_MAX];
        let run = coalesce(segs.iter().map(|s| &s[..]), &mut head);
        assert_eq!(run, Run { frames: 43, head_len: virtio::LEN + 54, payload_at: 54 });
        let vh = VirtioNetHdr::parse(&head).unwrap();
        assert_eq!((vh.gso_type, vh.gso_size, vh.hdr_len, vh.flags), (GSO_TCPV4, 1400, 54, F_NEEDS_CSUM));
        // Completed, it is the original frame with its checksum done.
        let mut m = merged(&head, run, &segs);
        let (mut want, wvh) = super_frame(60_000, ACK | PSH);
        complete_checksum(&mut m, &vh).unwrap();
        complete_checksum(&mut want, &wvh).unwrap();
        // (Segmentation numbered the IP identifications; the first stays.)
        assert_eq!(m, want);
    }

    #[test]
    fn anything_but_the_next_segment_of_the_flow_ends_a_run() {
        let segs = segments(14_000, ACK);
        let mut head = [0u8; HEAD_MAX];
        let run_of =
            |v: &[Vec<u8>], head: &mut [u8; HEAD_MAX]| coalesce(v.iter().map(|s| &s[..]), head).frames;
        assert_eq!(run_of(&segs, &mut head), 10);
        type Mutation = fn(&mut Vec<u8>);
        let breaks: [(&str, Mutation, bool); 10] = [
            ("a flipped payload byte", |f| f[60] ^= 1, false),
            ("another port", |f| f[35] ^= 1, true),
            ("another TTL", |f| f[22] = 63, true),
            ("a SYN", |f| f[47] |= 0x02, true),
            ("another window", |f| f[49] ^= 1, true),
            ("another ACK number", |f| f[45] ^= 1, true),
            ("a sequence gap", |f| f[41] ^= 1, true),
            ("IP options", |f| f[14] = 0x46, true),
            ("a fragment", |f| f[21] = 1, true),
            ("a wrong IP checksum", |f| f[24] ^= 1, false),
        ];
        for (what, m, refresh) in breaks {
            let mut v = segs.clone();
            m(&mut v[4]);
            if refresh {
                checksums(&mut v[4]);
            }
            assert_eq!(run_of(&v, &mut head), 4, "{what}");
        }
        // A PSH ends a run after it; a short segment too.
        let mut v = segs.clone();
        v[2][47] |= PSH;
        checksums(&mut v[2]);
        assert_eq!(run_of(&v, &mut head), 3);
        let short = segments(1400 * 3 + 100, ACK);
        assert_eq!(run_of(&short, &mut head), 4);
        let mut bad = short.clone();
        bad.swap(3, 2);
        assert_eq!(run_of(&bad, &mut head), 2);
        // Nothing merges with non-TCP or truncated frames, and nothing panics.
        for cut in 0..60 {
            let v = vec![segs[0][..cut].to_vec(), segs[1].clone()];
            assert_eq!(run_of(&v, &mut head), 1, "cut at {cut}");
        }
    }
}
