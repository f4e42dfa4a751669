//! The kernel path's flows for the flow log: the programs' `flows` map
//! scanned (`kernel::flows::KernelFlows::scan`) once a second, each entry's
//! counts compared with the last scan's. A flow whose counts have not
//! grown for the log's idle time (two seconds more: the engine's record
//! of its first packet comes by then) or that has been counted for its
//! active time gives a record of what was counted since its last one.
//!
//! The engine judges a flow's first packet and hands the flow to the
//! programs (`FlowMirror::offer`); its account of that first packet
//! ([`Tracker::hold`]) is held here and joins the kernel's record, so a
//! flow is one record, in the way its first packet went and with the rule
//! that allowed it. An entry idle past the flow's own idle time passes
//! nothing any more: it is taken out of the map once recorded.
//! Bounded: at most `cap` flows are tracked (the map's size); more are
//! counted as overflow.

use super::record::{Line, Path};
use crate::kernel::flows::KernelCount;
use crate::sys::bpf::KernelFlowKey;
use std::collections::HashMap;
use std::net::IpAddr;
use vnet_core::policy::FlowKey;
use vnet_wire::MacAddr;

/// Seconds past the idle time a kernel record waits for the engine's part.
pub const GRACE_S: u64 = 2;

/// One tracked flow.
#[derive(Debug, Default)]
struct Tracked {
    /// Counts at the last scan, and those already recorded: packets and
    /// bytes, the key's way then back.
    seen: [u64; 4],
    reported: [u64; 4],
    changed_s: u64,
    start_s: u64,
    /// The flow as the engine knew it (its first packet's way, its rule),
    /// and whether that way is the key's.
    template: Option<(Line, bool)>,
    /// The engine's counts not yet recorded (in the template's way).
    held: Option<Line>,
    present: bool,
}

/// The tracked flows.
#[derive(Debug)]
pub struct Tracker {
    flows: HashMap<KernelFlowKey, Tracked>,
    cap: usize,
    /// Flows not tracked: the cap was reached.
    pub overflow: u64,
}

fn addr(a: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(a);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// A record of kernel key `k` in its own (canonical) way.
fn line_of(k: &KernelFlowKey) -> Line {
    let key = FlowKey {
        generation: u64::from(k.gen),
        network: k.net,
        src_mac: MacAddr(k.smac),
        dst_mac: MacAddr(k.dmac),
        src: addr(k.src),
        dst: addr(k.dst),
        proto: k.proto,
        sport: u16::from_be(k.sport),
        dport: u16::from_be(k.dport),
        id: 0,
        fragment: false,
    };
    Line::of(&key, Path::Kernel, true, None)
}

impl Tracker {
    pub fn new(cap: usize) -> Self {
        Tracker { flows: HashMap::new(), cap, overflow: 0 }
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    fn entry(&mut self, k: KernelFlowKey, now: u64) -> Option<&mut Tracked> {
        if !self.flows.contains_key(&k) && self.flows.len() >= self.cap {
            self.overflow += 1;
            return None;
        }
        Some(self.flows.entry(k).or_insert_with(|| Tracked {
            changed_s: now,
            start_s: now,
            ..Tracked::default()
        }))
    }

    /// The engine's record `line` of the flow the programs know as `k`
    /// (`fwd`: `line`'s way is the key's), at Unix second `now`.
    pub fn hold(&mut self, k: KernelFlowKey, fwd: bool, line: Line, now: u64) {
        let Some(t) = self.entry(k, now) else { return };
        t.present = true;
        let mut template = Line { packets: 0, bytes: 0, packets_back: 0, bytes_back: 0, ..line.clone() };
        template.path = Path::Kernel;
        t.template = Some((template, fwd));
        match &mut t.held {
            Some(h) => h.absorb(&line),
            None => t.held = Some(line),
        }
    }

    /// One scan's `counts` at Unix second `now` (CLOCK_MONOTONIC `mono_ns`):
    /// records into `out`; the keys of dead entries (idle past the flow's
    /// own time, `t.flow_idle_ns`) returned, to be taken out of the map.
    pub fn scan(
        &mut self,
        counts: &[KernelCount],
        now: u64,
        mono_ns: u64,
        t: Timeouts,
        out: &mut dyn FnMut(Line),
    ) -> Vec<KernelFlowKey> {
        for f in self.flows.values_mut() {
            f.present = false;
        }
        let mut dead = Vec::new();
        for c in counts {
            let Some(f) = self.entry(c.key, now) else { continue };
            f.present = true;
            let new = [c.packets[0], c.packets[1], c.bytes[0], c.bytes[1]];
            if new.iter().zip(&f.seen).any(|(n, s)| n > s) {
                if f.seen == f.reported && f.held.is_none() {
                    f.start_s = now;
                }
                f.seen = std::array::from_fn(|i| new[i].max(f.seen[i]));
                f.changed_s = now;
            }
            if mono_ns.saturating_sub(c.last_ns) > (t.flow_idle_ns)(c.key.proto) {
                dead.push(c.key);
            }
        }
        // A set to look in: a guest that opened 65536 flows and let them
        // all go idle at once must not make this scan quadratic.
        let dead_set: std::collections::HashSet<&KernelFlowKey> = dead.iter().collect();
        let mut gone = Vec::new();
        for (k, f) in &mut self.flows {
            let pending = f.seen != f.reported || f.held.is_some();
            let quiet = now.saturating_sub(f.changed_s) >= u64::from(t.idle_s) + GRACE_S;
            let long = now.saturating_sub(f.start_s) >= u64::from(t.active_s);
            let ends = !f.present || dead_set.contains(k);
            if pending && (quiet || long || ends) {
                out(record(k, f, now));
            }
            if ends {
                gone.push(*k);
            }
        }
        for k in &gone {
            self.flows.remove(k);
        }
        dead
    }
}

/// The log's times, and a flow's own idle time by protocol (ns).
#[derive(Clone, Copy)]
pub struct Timeouts {
    pub idle_s: u32,
    pub active_s: u32,
    pub flow_idle_ns: fn(u8) -> u64,
}

/// `f`'s record of what was counted since its last, closing it.
fn record(k: &KernelFlowKey, f: &mut Tracked, now: u64) -> Line {
    let d: [u64; 4] = std::array::from_fn(|i| f.seen[i].saturating_sub(f.reported[i]));
    let (mut line, fwd) = f.template.clone().unwrap_or_else(|| (line_of(k), true));
    let (p, b, pb, bb) = if fwd { (d[0], d[2], d[1], d[3]) } else { (d[1], d[3], d[0], d[2]) };
    (line.packets, line.bytes, line.packets_back, line.bytes_back) = (p, b, pb, bb);
    (line.start, line.end) = (f.start_s, f.changed_s.max(f.start_s));
    if let Some(h) = f.held.take() {
        if d == [0; 4] {
            line.path = Path::User;
        }
        line.absorb(&h);
    }
    f.reported = f.seen;
    f.start_s = now;
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kkey() -> KernelFlowKey {
        let mut src = [0u8; 16];
        src[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        let mut dst = src;
        dst[15] = 2;
        KernelFlowKey {
            net: 7,
            gen: 2,
            src,
            dst,
            smac: [0x52, 0x54, 0, 0, 0, 1],
            dmac: [0x52, 0x54, 0, 0, 0, 2],
            sport: 5201u16.to_be(),
            dport: 40000u16.to_be(),
            proto: 6,
            pad: [0; 7],
        }
    }

    fn ten_minutes(_: u8) -> u64 {
        600_000_000_000
    }

    const T: Timeouts = Timeouts { idle_s: 5, active_s: 60, flow_idle_ns: ten_minutes };

    fn count(p: [u64; 2], b: [u64; 2]) -> KernelCount {
        KernelCount { key: kkey(), last_ns: 1_000_000_000, packets: p, bytes: b }
    }

    #[test]
    fn a_kernel_flow_is_one_record_with_the_engines_first_packet_in_its_way() {
        let mut t = Tracker::new(4);
        let mut out = Vec::new();
        // The engine's record of the first packet: 10.0.0.2:40000 -> 10.0.0.1:5201,
        // the key's way reversed.
        let mut first = line_of(&kkey());
        (first.src, first.dst, first.sport, first.dport) = (first.dst, first.src, 40000, 5201);
        (first.rule, first.path, first.start, first.end, first.packets, first.bytes) =
            (Some("web".into()), Path::User, 99, 99, 1, 74);
        t.hold(kkey(), false, first, 100);
        for (s, p) in [(100, 10), (101, 20), (102, 20)] {
            t.scan(&[count([p / 2, p], [p * 30, p * 1000])], s, 2_000_000_000, T, &mut |l| out.push(l));
        }
        assert!(out.is_empty(), "not yet quiet");
        t.scan(&[count([10, 20], [600, 20000])], 108, 2_000_000_000, T, &mut |l| out.push(l));
        assert_eq!(out.len(), 1);
        let l = &out[0];
        assert_eq!((l.path, l.rule.as_deref(), l.sport, l.dport), (Path::Kernel, Some("web"), 40000, 5201));
        assert_eq!((l.packets, l.bytes, l.packets_back, l.bytes_back), (21, 20074, 10, 600));
        assert_eq!((l.start, l.end), (99, 101));
        t.scan(&[count([10, 20], [600, 20000])], 120, 2_000_000_000, T, &mut |l| out.push(l));
        assert_eq!(out.len(), 1, "nothing new: no record");
        t.scan(&[count([10, 21], [600, 20100])], 121, 2_000_000_000, T, &mut |l| out.push(l));
        let dead = t.scan(&[], 122, 2_000_000_000, T, &mut |l| out.push(l));
        assert!(dead.is_empty());
        assert_eq!(out.len(), 2, "gone from the map: its last counts recorded");
        assert_eq!((out[1].packets, out[1].bytes, out[1].packets_back), (1, 100, 0));
        assert!(t.is_empty());
    }

    #[test]
    fn the_tracker_is_capped_and_counts_what_it_could_not_track() {
        let mut t = Tracker::new(1);
        let mut other = count([1, 0], [60, 0]);
        other.key.sport = 1;
        let mut out = Vec::new();
        let dead = t.scan(&[count([1, 0], [60, 0]), other], 0, 700_000_000_000, T, &mut |l| out.push(l));
        assert_eq!(t.overflow, 1, "the second flow: past the cap");
        assert_eq!(dead, vec![kkey()], "idle past the flow's own time: dead");
        assert_eq!((out.len(), out[0].path, out[0].sport), (1, Path::Kernel, 5201), "in the key's own way");
        assert!(t.is_empty(), "recorded and forgotten");
    }
}
