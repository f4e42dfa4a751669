//! Every drop with its reason: per-reason counts and the last drops of each
//! worker, for `vnetctl show drops` and `monitor drops`.
//!
//! A worker's [`Forwarder`](crate::Forwarder) holds a [`DropRing`]: a fixed
//! array of slots it alone writes, the newest over the oldest. A drop costs
//! a count (one relaxed add) and a record: the reason, the ingress port, the
//! policy rule, the engine's clock and the frame's first [`HEAD`] bytes,
//! copied as they are (a few dozen stores, no parsing, no allocation). The
//! summary (MACs, EtherType, addresses, ports) is read from those bytes when
//! someone asks ([`Head::summary`]), by the same code that reads the kernel
//! program's drop events, which carry the same bytes.
//!
//! Readers are other threads (the control plane). Each slot is a seqlock of
//! atomics: the writer marks it odd, stores, marks it with the record's
//! number; a reader that sees the mark change under it, or a newer number,
//! knows the record was overwritten and counts it lost. No `unsafe`, no lock
//! on the writer's side; the rings' list ([`DropBook`]) is locked only when a
//! worker starts and when someone reads.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU64};
use std::sync::{Arc, Mutex, Weak};
use vnet_core::{DropReason, Port as PortId};
use vnet_wire::classify::{classify, L3};
use vnet_wire::MacAddr;

/// Records a worker keeps (a power of two).
pub const RING_SLOTS: usize = 1024;
/// Bytes of each dropped frame kept: Ethernet, two VLAN tags, an IPv6
/// header with an extension header, and the ports.
pub const HEAD: usize = 96;
const HEAD_WORDS: usize = HEAD / 8;
const _: () = assert!(RING_SLOTS.is_power_of_two() && HEAD % 8 == 0);

/// Every counter of [`crate::Global`] (as `show stats` names it), and the
/// drop reason of those that count dropped frames. A test checks that it
/// lists exactly `Global`'s counters, so a counter added there must be
/// placed here: a drop (and then recorded with its reason where it is
/// counted) or not.
pub const GLOBAL_COUNTERS: [(&str, Option<DropReason>); 37] = [
    ("no_route", Some(DropReason::NoRoute)),
    ("policy_denied", Some(DropReason::PolicyDenied)),
    ("unknown_source", Some(DropReason::UnknownSource)),
    ("relay", None),
    ("relayed", None),
    ("relay_refused", Some(DropReason::RelayRefused)),
    ("roams", None),
    // Datagrams that did not authenticate: recorded as `auth_failed`.
    ("roams_refused", Some(DropReason::AuthFailed)),
    // Handshake initiations, not frames.
    ("stranger_initiations", None),
    ("stranger_initiations_limited", None),
    ("stranger_initiations_bad_mac", None),
    ("malformed", Some(DropReason::Malformed)),
    ("wrong_network", Some(DropReason::WrongNetwork)),
    ("unsupported_flags", Some(DropReason::UnsupportedFlags)),
    // Fragments, counted by the reassembly (`docs/wire.md`): no frame yet.
    ("reasm_fragments", None),
    ("reasm_completed", None),
    ("reasm_timed_out", None),
    ("reasm_evicted", None),
    ("reasm_rejected", None),
    ("route_cache_hits", None),
    ("route_cache_misses", None),
    ("rx_whole_batches", None),
    ("rx_whole_pairs", None),
    ("rx_gro_frames", None),
    ("rx_gro_segments", None),
    ("link_recv_calls", None),
    ("link_recv_messages", None),
    ("sw_segmented", None),
    ("sw_checksummed", None),
    ("offload_errors", Some(DropReason::OffloadFailed)),
    ("bad_offload_hdr", Some(DropReason::BadOffloadHeader)),
    ("spoofed_source_mac", Some(DropReason::SpoofedSourceMac)),
    ("spoofed_source_ip", Some(DropReason::SpoofedSourceIp)),
    ("neigh_answered", None),
    ("neigh_flooded", None),
    ("offload_refused", None),
    ("gso_fallbacks", None),
];

/// Why a policy denied a frame, as a record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The rule at this index of the network's policy of this generation
    /// (its low 32 bits): named when read, if the policy is still that one.
    Rule { index: u32, generation: u32 },
    /// The network's default.
    Default,
    /// Unreadable by the policy.
    Unclassifiable,
    /// A later fragment whose first was not allowed.
    OrphanFragment,
    /// A Kubernetes NetworkPolicy's isolation of one end: the policy at
    /// this index of the network's isolation, and whether it was the
    /// sender's egress (else the receiver's ingress).
    NetworkPolicy { policy: u32, egress: bool },
}

impl Denial {
    fn pack(this: Option<Denial>) -> (u64, u64) {
        match this {
            None => (0, 0),
            Some(Denial::Rule { index, generation }) => (1, u64::from(index) | u64::from(generation) << 32),
            Some(Denial::Default) => (2, 0),
            Some(Denial::Unclassifiable) => (3, 0),
            Some(Denial::OrphanFragment) => (4, 0),
            Some(Denial::NetworkPolicy { policy, egress }) => {
                (5, u64::from(policy) | u64::from(egress) << 32)
            }
        }
    }

    fn unpack(kind: u64, v: u64) -> Option<Denial> {
        match kind {
            1 => Some(Denial::Rule { index: v as u32, generation: (v >> 32) as u32 }),
            2 => Some(Denial::Default),
            3 => Some(Denial::Unclassifiable),
            4 => Some(Denial::OrphanFragment),
            5 => Some(Denial::NetworkPolicy { policy: v as u32, egress: v >> 32 == 1 }),
            _ => None,
        }
    }
}

/// A frame's first bytes and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub bytes: [u8; HEAD],
    /// How many of `bytes` are the frame's.
    pub caplen: u16,
    /// The frame's whole length.
    pub len: u32,
}

/// What a dropped frame was, as far as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub src: Option<MacAddr>,
    pub dst: Option<MacAddr>,
    /// The EtherType under the VLAN tags.
    pub ether: Option<u16>,
    pub src_ip: Option<std::net::IpAddr>,
    pub dst_ip: Option<std::net::IpAddr>,
    pub proto: Option<u8>,
    /// TCP or UDP ports.
    pub ports: Option<(u16, u16)>,
}

impl Head {
    /// The first bytes of `frame`.
    #[inline]
    pub fn of(frame: &[u8]) -> Head {
        let n = frame.len().min(HEAD);
        let mut bytes = [0u8; HEAD];
        bytes[..n].copy_from_slice(&frame[..n]);
        Head { bytes, caplen: n as u16, len: frame.len().min(u32::MAX as usize) as u32 }
    }

    /// The MACs, EtherType, addresses and ports, as far as the bytes go.
    pub fn summary(&self) -> Summary {
        let b = &self.bytes[..usize::from(self.caplen).min(HEAD)];
        let mac = |at: usize| b.get(at..at + 6).map(|m| MacAddr([m[0], m[1], m[2], m[3], m[4], m[5]]));
        let mut s = Summary {
            dst: mac(0),
            src: mac(6),
            ether: b.get(12..14).map(|e| u16::from_be_bytes([e[0], e[1]])),
            ..Summary::default()
        };
        if let Ok(f) = classify(b) {
            s.ether = Some(f.ether);
            match f.l3 {
                L3::Ip(ip) => {
                    (s.src_ip, s.dst_ip, s.proto) = (Some(ip.src), Some(ip.dst), Some(ip.proto));
                    if matches!(ip.proto, 6 | 17) && (ip.sport, ip.dport) != (0, 0) {
                        s.ports = Some((ip.sport, ip.dport));
                    }
                }
                L3::Arp { sender, target } => {
                    (s.src_ip, s.dst_ip) = (Some(sender.into()), Some(target.into()))
                }
                L3::Other => {}
            }
        }
        s
    }
}

/// One drop as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropRecord {
    /// Its number in its ring (the ring's drops before it).
    pub seq: u64,
    /// The engine's clock when it was recorded (to [`crate::plane::TICK_NS`]).
    pub time_ns: u64,
    pub reason: DropReason,
    /// Where it came in, if known.
    pub ingress: Option<PortId>,
    /// For a policy denial: what denied it.
    pub denial: Option<Denial>,
    pub head: Head,
}

/// One ring slot: a seqlock mark and the record's words.
#[derive(Default)]
struct Slot {
    /// 2 x (record number + 1) once written; odd while being written.
    mark: AtomicU64,
    time: AtomicU64,
    /// reason | denial kind << 8 | ingress kind << 16 | caplen << 32
    meta: AtomicU64,
    ingress: AtomicU64,
    denial: AtomicU64,
    len: AtomicU64,
    head: [AtomicU64; HEAD_WORDS],
}

/// A worker's last drops. Written by one thread, read by any.
pub struct DropRing {
    slots: Box<[Slot]>,
    /// Records written.
    head: AtomicU64,
}

impl Default for DropRing {
    fn default() -> Self {
        DropRing { slots: (0..RING_SLOTS).map(|_| Slot::default()).collect(), head: AtomicU64::new(0) }
    }
}

impl DropRing {
    /// Records a drop (its writer only: a ring has one).
    #[inline]
    pub fn write(&self, r: &DropRecord) {
        let n = self.head.load(Relaxed);
        let s = &self.slots[n as usize & (RING_SLOTS - 1)];
        s.mark.store(2 * n + 1, Relaxed);
        fence(Release);
        let (ik, iv) = match r.ingress {
            None => (0, 0),
            Some(PortId::Interface(i)) => (1, i),
            Some(PortId::Link(l)) => (2, l),
        };
        let (dk, dv) = Denial::pack(r.denial);
        s.time.store(r.time_ns, Relaxed);
        s.meta.store(r.reason as u64 | dk << 8 | ik << 16 | u64::from(r.head.caplen) << 32, Relaxed);
        s.ingress.store(u64::from(iv), Relaxed);
        s.denial.store(dv, Relaxed);
        s.len.store(u64::from(r.head.len), Relaxed);
        for (w, c) in s.head.iter().zip(r.head.bytes.chunks_exact(8)) {
            w.store(u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]), Relaxed);
        }
        s.mark.store(2 * n + 2, Release);
        self.head.store(n + 1, Release);
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.head.load(Acquire)
    }

    /// The records numbered `from` on that are still here, oldest first,
    /// into `out`; returns the next number to ask for and how many of the
    /// records asked for were overwritten before they were read.
    pub fn read_from(&self, from: u64, out: &mut Vec<DropRecord>) -> (u64, u64) {
        let end = self.written();
        let start = from.max(end.saturating_sub(RING_SLOTS as u64));
        let mut lost = start.saturating_sub(from);
        for n in start..end {
            match self.read_one(n) {
                Some(r) => out.push(r),
                None => lost += 1,
            }
        }
        (end, lost)
    }

    fn read_one(&self, n: u64) -> Option<DropRecord> {
        let s = &self.slots[n as usize & (RING_SLOTS - 1)];
        if s.mark.load(Acquire) != 2 * n + 2 {
            return None;
        }
        let (time_ns, meta, iv, dv, len) = (
            s.time.load(Relaxed),
            s.meta.load(Relaxed),
            s.ingress.load(Relaxed),
            s.denial.load(Relaxed),
            s.len.load(Relaxed),
        );
        let mut bytes = [0u8; HEAD];
        for (c, w) in bytes.chunks_exact_mut(8).zip(&s.head) {
            c.copy_from_slice(&w.load(Relaxed).to_ne_bytes());
        }
        fence(Acquire);
        if s.mark.load(Relaxed) != 2 * n + 2 {
            return None;
        }
        let ingress = match (meta >> 16) & 0xff {
            1 => Some(PortId::Interface(iv as u32)),
            2 => Some(PortId::Link(iv as u32)),
            _ => None,
        };
        let caplen = ((meta >> 32) as u16).min(HEAD as u16);
        Some(DropRecord {
            seq: n,
            time_ns,
            reason: DropReason::from_u8(meta as u8)?,
            ingress,
            denial: Denial::unpack((meta >> 8) & 0xff, dv),
            head: Head { bytes, caplen, len: len as u32 },
        })
    }
}

/// The daemon's drop counts by reason, its workers' rings and the clock
/// records are dated by.
pub struct DropBook {
    counts: [AtomicU64; DropReason::COUNT],
    rings: Mutex<Vec<Weak<DropRing>>>,
    /// The engine's clock as last told ([`DropBook::set_clock`]).
    clock_ns: AtomicU64,
}

impl Default for DropBook {
    fn default() -> Self {
        DropBook {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            rings: Mutex::new(Vec::new()),
            clock_ns: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for DropBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DropBook").field("counts", &self.counts()).finish_non_exhaustive()
    }
}

impl DropBook {
    /// A new ring for a worker, listed for readers.
    pub fn ring(&self) -> Arc<DropRing> {
        let r = Arc::new(DropRing::default());
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings.retain(|w| w.strong_count() > 0);
        rings.push(Arc::downgrade(&r));
        r
    }

    /// The live rings, in the order their workers started.
    pub fn rings(&self) -> Vec<Arc<DropRing>> {
        let rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings.iter().filter_map(Weak::upgrade).collect()
    }

    #[inline]
    pub fn count(&self, reason: DropReason) {
        self.counts[reason as usize].fetch_add(1, Relaxed);
    }

    /// Drops by reason, every reason listed.
    pub fn counts(&self) -> [(DropReason, u64); DropReason::COUNT] {
        DropReason::ALL.map(|r| (r, self.counts[r as usize].load(Relaxed)))
    }

    /// The engine's clock, for the records (the daemon's timer sets it).
    pub fn set_clock(&self, now_ns: u64) {
        self.clock_ns.store(now_ns, Relaxed);
    }

    #[inline]
    pub fn clock(&self) -> u64 {
        self.clock_ns.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_frame() -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 8, 0];
        f.extend([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend([0x04, 0xd2, 0x16, 0x2e, 0, 8, 0, 0]);
        f
    }

    fn record(reason: DropReason, frame: &[u8]) -> DropRecord {
        DropRecord {
            seq: 0,
            time_ns: 7,
            reason,
            ingress: Some(PortId::Interface(3)),
            denial: Some(Denial::Rule { index: 2, generation: 9 }),
            head: Head::of(frame),
        }
    }

    #[test]
    fn a_record_reads_back_as_written_with_the_frames_summary() {
        let ring = DropRing::default();
        let f = udp_frame();
        ring.write(&record(DropReason::PolicyDenied, &f));
        let mut out = Vec::new();
        assert_eq!(ring.read_from(0, &mut out), (1, 0));
        assert_eq!(out, [record(DropReason::PolicyDenied, &f)]);
        let s = out[0].head.summary();
        assert_eq!(s.src, Some(MacAddr([2, 0, 0, 0, 0, 0xa])));
        assert_eq!(s.dst, Some(MacAddr([2, 0, 0, 0, 0, 0xb])));
        assert_eq!((s.ether, s.proto, s.ports), (Some(0x0800), Some(17), Some((1234, 5678))));
        assert_eq!(s.src_ip, Some([10, 0, 0, 1].into()));
        assert_eq!(out[0].head.len, f.len() as u32);
    }

    #[test]
    fn the_ring_keeps_its_newest_records_and_counts_the_overwritten_as_lost() {
        let ring = DropRing::default();
        let f = udp_frame();
        let extra = 10;
        for _ in 0..RING_SLOTS as u64 + extra {
            ring.write(&record(DropReason::NoRoute, &f));
        }
        let mut out = Vec::new();
        let (next, lost) = ring.read_from(0, &mut out);
        assert_eq!((next, lost, out.len()), (RING_SLOTS as u64 + extra, extra, RING_SLOTS));
        assert_eq!(out.first().map(|r| r.seq), Some(extra));
        out.clear();
        assert_eq!(ring.read_from(next, &mut out), (next, 0), "nothing new");
        assert!(out.is_empty());
    }

    #[test]
    fn a_short_or_garbled_frame_still_gives_what_it_has() {
        let s = Head::of(&[1, 2, 3]).summary();
        assert_eq!(s, Summary::default());
        let mut f = udp_frame();
        f[14] = 0x99; // not IPv4 after all
        let s = Head::of(&f).summary();
        assert_eq!((s.ether, s.src_ip), (Some(0x0800), None));
        let big = vec![0u8; 9000];
        assert_eq!((Head::of(&big).caplen, Head::of(&big).len), (HEAD as u16, 9000));
    }

    #[test]
    fn readers_on_another_thread_see_whole_records_or_count_them_lost() {
        let ring = Arc::new(DropRing::default());
        let f = udp_frame();
        let w = ring.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..200_000u64 {
                let mut r = record(DropReason::NoRoute, &f);
                r.time_ns = i;
                r.head.len = i as u32;
                w.write(&r);
            }
        });
        let (mut next, mut seen, mut lost) = (0, 0u64, 0u64);
        let mut out = Vec::new();
        while !writer.is_finished() || next < ring.written() {
            out.clear();
            let (n, l) = ring.read_from(next, &mut out);
            for r in &out {
                assert_eq!(r.time_ns, u64::from(r.head.len), "a torn record");
            }
            (next, seen, lost) = (n, seen + out.len() as u64, lost + l);
        }
        writer.join().expect("writer");
        assert_eq!(seen + lost, 200_000);
    }

    #[test]
    fn every_global_counter_is_placed_as_a_drop_with_its_reason_or_not() {
        let v = serde_json::to_value(crate::Global::default()).expect("Global serializes");
        let mut have: Vec<&str> = v.as_object().expect("an object").keys().map(String::as_str).collect();
        have.sort_unstable();
        let mut listed: Vec<&str> = GLOBAL_COUNTERS.iter().map(|(n, _)| *n).collect();
        listed.sort_unstable();
        assert_eq!(have, listed, "GLOBAL_COUNTERS must list exactly Global's counters");
    }

    #[test]
    fn the_book_counts_by_reason_and_lists_live_rings_only() {
        let book = DropBook::default();
        book.count(DropReason::WrongNetwork);
        book.count(DropReason::WrongNetwork);
        assert_eq!(book.counts()[DropReason::WrongNetwork as usize], (DropReason::WrongNetwork, 2));
        let a = book.ring();
        let b = book.ring();
        drop(a);
        assert_eq!(book.rings().len(), 1);
        assert!(Arc::ptr_eq(&book.rings()[0], &b));
    }
}
