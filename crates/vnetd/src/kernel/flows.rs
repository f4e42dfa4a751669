//! A policy on the kernel path: which networks have one (`governed`, with
//! the policy's generation and a counter slot each) and the flows the
//! engine allowed (`flows`, the engine's [`FlowMirror`]).
//!
//! The rules are evaluated in one place, the engine
//! ([`vnet_core::policy::PolicySet::decide`]). The programs pass a frame of
//! a governed network only as a further packet or a reply of a flow the
//! engine offered to [`KernelFlows`]; everything else of that network goes
//! to the engine, which judges it and offers what it allows. The engine
//! asks [`KernelFlows`] (`known_or`: `fresh`, else the rules, then `offer`)
//! about a packet it knows no flow for, so a flow the kernel carried alone
//! past the engine's idle time is still known. One meaning on both paths; the kernel path's speed for
//! every packet of an allowed flow but its first (docs/POLICY.md).

use super::maps::addr16;
use super::{KernelError, Reason};
use crate::sys::bpf::{monotonic_ns, ClockVal, FlowCached, FlowVal, GovStats, GovVal, KernelFlowKey};
use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuValues};
use aya::Ebpf;
use std::collections::BTreeMap;
use std::os::fd::AsFd as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use vnet_core::policy::flows::{IDLE_S, TCP_IDLE_S};
use vnet_core::policy::{FlowKey, FlowMirror, Judge, Known, PolicySet};
use vnet_wire::classify::{PROTO_ICMP, PROTO_ICMPV6};
use vnet_wire::ip::{PROTO_TCP, PROTO_UDP};

// The programs' idle times are the engine's.
const _: () = assert!(
    super::maps::shared::FLOW_TCP_IDLE_S == TCP_IDLE_S && super::maps::shared::FLOW_IDLE_S == IDLE_S,
    "bpf/vnet.h's flow idle times differ from vnet_core's"
);

/// Counter slots for governed networks (slot 0 is none's).
const GOV_SLOTS: u32 = super::maps::shared::GOV_SLOTS;

/// The engine's flow as the programs key it, if they ever look it up: a
/// whole packet's flow (not a fragment's), of TCP, UDP or ICMP echo.
fn kernel_key(k: &FlowKey) -> Option<KernelFlowKey> {
    if k.fragment || !matches!(k.proto, PROTO_TCP | PROTO_UDP | PROTO_ICMP | PROTO_ICMPV6) {
        return None;
    }
    Some(canonical(KernelFlowKey {
        net: k.network,
        gen: k.generation as u32,
        src: addr16(k.src),
        dst: addr16(k.dst),
        smac: k.src_mac.0,
        dmac: k.dst_mac.0,
        sport: k.sport.to_be(),
        dport: k.dport.to_be(),
        proto: k.proto,
        pad: [0; 7],
    }))
}

/// `k` with its lower end first (address, then port, then MAC, compared as
/// the programs compare them: native 64-bit words, the port as stored, the
/// MAC as a native word of its 6 bytes and two zeros): both directions of
/// a flow are one entry, found with one lookup. The MACs go with their ends.
fn canonical(k: KernelFlowKey) -> KernelFlowKey {
    let words = |a: &[u8; 16]| {
        let w = |i: usize| {
            u64::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3], a[i + 4], a[i + 5], a[i + 6], a[i + 7]])
        };
        (w(0), w(8))
    };
    let mac = |m: &[u8; 6]| u64::from_ne_bytes([m[0], m[1], m[2], m[3], m[4], m[5], 0, 0]);
    if (words(&k.src), k.sport, mac(&k.smac)) > (words(&k.dst), k.dport, mac(&k.dmac)) {
        KernelFlowKey {
            src: k.dst,
            dst: k.src,
            smac: k.dmac,
            dmac: k.smac,
            sport: k.dport,
            dport: k.sport,
            ..k
        }
    } else {
        k
    }
}

/// The programs' `flows` map, as the engine's mirror.
pub struct KernelFlows {
    map: Mutex<BpfHashMap<MapData, KernelFlowKey, FlowVal>>,
    /// The same map and the CPUs' caches of it, for the flow log's scan
    /// (its own handle: a scan never holds up the engine's offers).
    scan: Mutex<BpfHashMap<MapData, KernelFlowKey, FlowVal>>,
    cache: Mutex<Option<PerCpuArray<MapData, FlowCached>>>,
    /// Flows written, and writes the kernel refused.
    pub offered: AtomicU64,
    pub failed: AtomicU64,
}

impl std::fmt::Debug for KernelFlows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelFlows").field("offered", &self.offered).finish()
    }
}

impl KernelFlows {
    /// The object's `flows` map, through a descriptor of its own (the
    /// engine's workers write it while the daemon holds the object).
    pub fn open(ebpf: &Ebpf) -> Result<Self, Reason> {
        let no = || KernelError::NoMap("flows".into());
        let Some(Map::LruHashMap(data)) = ebpf.map("flows") else { return Err(no()) };
        let handle = || -> Result<BpfHashMap<MapData, KernelFlowKey, FlowVal>, Reason> {
            let fd =
                data.fd().as_fd().try_clone_to_owned().map_err(|e| super::io_error("the flows map")(e))?;
            let data = MapData::from_fd(fd).map_err(super::map_error("flows"))?;
            BpfHashMap::try_from(Map::LruHashMap(data)).map_err(super::map_error("flows"))
        };
        let (map, scan) = (handle()?, handle()?);
        // Without the cache map (an older object): the scan reads the map alone.
        let cache = match ebpf.map("flow_cache") {
            Some(Map::PerCpuArray(c)) => c
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .ok()
                .and_then(|fd| MapData::from_fd(fd).ok())
                .and_then(|d| PerCpuArray::try_from(Map::PerCpuArray(d)).ok()),
            _ => None,
        };
        Ok(KernelFlows {
            map: Mutex::new(map),
            scan: Mutex::new(scan),
            cache: Mutex::new(cache),
            offered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// Every flow in the map (at most `max`), with what the programs
    /// counted of it: its value's counts and those the CPUs' caches hold
    /// yet. The map is read before the caches, so an entry a CPU adds to
    /// its value meanwhile is missed by this scan (and found by the next),
    /// never counted twice.
    pub fn scan(&self, max: usize) -> Vec<KernelCount> {
        let Ok(m) = self.scan.lock() else { return Vec::new() };
        let mut out: Vec<KernelCount> = m
            .iter()
            .filter_map(Result::ok)
            .take(max)
            .map(|(key, v)| KernelCount { key, last_ns: v.last, packets: v.packets, bytes: v.bytes })
            .collect();
        drop(m);
        let mut cached: std::collections::HashMap<KernelFlowKey, ([u64; 2], [u64; 2])> = Default::default();
        if let Ok(c) = self.cache.lock() {
            for slot in 0..super::maps::shared::FLOW_CACHE_SLOTS {
                let Some(per) = c.as_ref().and_then(|c| c.get(&slot, 0).ok()) else { continue };
                for e in per.iter().filter(|e| e.packets != [0, 0]) {
                    let (p, b) = cached.entry(e.k).or_default();
                    for d in 0..2 {
                        p[d] += e.packets[d];
                        b[d] += e.bytes[d];
                    }
                }
            }
        }
        for o in &mut out {
            if let Some((p, b)) = cached.get(&o.key) {
                for d in 0..2 {
                    o.packets[d] += p[d];
                    o.bytes[d] += b[d];
                }
            }
        }
        out
    }

    /// Removes flow `key` from the map (one idle past its time: the
    /// programs pass nothing by it any more).
    pub fn remove(&self, key: &KernelFlowKey) {
        if let Ok(mut m) = self.scan.lock() {
            let _ = m.remove(key);
        }
    }
}

/// A flow of the programs' map and what they counted of it (0: from the
/// key's `src` end, 1: back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCount {
    pub key: KernelFlowKey,
    /// When the programs last saw it (CLOCK_MONOTONIC ns).
    pub last_ns: u64,
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
}

/// The programs' key of the engine's flow `k` (`None`: a flow they never
/// look up), and whether `k`'s way is the key's (its `src` end first).
pub fn key_of(k: &FlowKey) -> Option<(KernelFlowKey, bool)> {
    let key = kernel_key(k)?;
    Some((key, key.src == addr16(k.src) && key.sport == k.sport.to_be() && key.smac == k.src_mac.0))
}

impl FlowMirror for KernelFlows {
    fn fresh(&self, k: &FlowKey) -> bool {
        let Some(key) = kernel_key(k) else { return false };
        let idle = u64::from(if k.proto == PROTO_TCP { TCP_IDLE_S } else { IDLE_S }) * 1_000_000_000;
        let now = monotonic_ns();
        let Ok(m) = self.map.lock() else { return false };
        m.get(&key, 0).is_ok_and(|v| now.saturating_sub(v.last) <= idle)
    }

    fn offer(&self, k: &FlowKey) -> bool {
        let Some(key) = kernel_key(k) else { return false };
        let Ok(mut m) = self.map.lock() else { return false };
        let now = monotonic_ns();
        // A flow the programs saw within the last seconds is theirs: a
        // write now would race their counts (they keep its `last`).
        let val = match m.get(&key, 0) {
            Ok(v) if now.saturating_sub(v.last) < 3_000_000_000 => {
                self.offered.fetch_add(1, Relaxed);
                return true;
            }
            Ok(v) => FlowVal { last: now, ..v },
            Err(_) => FlowVal { last: now, ..FlowVal::default() },
        };
        match m.insert(key, val, 0) {
            Ok(()) => {
                self.offered.fetch_add(1, Relaxed);
                true
            }
            Err(_) => {
                self.failed.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Asked by the engine's table for a flow it does not know: the map
    /// first (a flow the programs carried alone), else the rules, and
    /// what they allow written into the map (with `keep`) before the
    /// engine remembers it.
    fn known_or<'a>(&self, k: &FlowKey, keep: bool, judge: &mut dyn Judge<'a>) -> Known<'a> {
        if self.fresh(k) {
            return Known::Fresh { kept: keep && self.offer(k) };
        }
        let judged = judge.judge();
        Known::Judged { judged, kept: keep && judged.verdict.allow && self.offer(k) }
    }
}

/// The governed networks as last written: each one's generation and slot.
#[derive(Debug, Default)]
pub struct Governed {
    held: BTreeMap<u32, GovVal>,
}

impl Governed {
    /// Whether some network has a policy (`cfg.policy`).
    pub fn any(&self) -> bool {
        !self.held.is_empty()
    }

    /// Writes `governed` for `policy`: each network keeps its slot (its
    /// counters go on), a new one takes a free slot with its counters
    /// zeroed, and every entry carries the policy's generation.
    pub fn write(&mut self, ebpf: &mut Ebpf, policy: &PolicySet) -> Result<(), Reason> {
        let gen = policy.generation as u32;
        let mut used: std::collections::BTreeSet<u32> =
            self.held.iter().filter(|(n, _)| policy.nets.contains_key(n)).map(|(_, v)| v.slot).collect();
        let mut next = BTreeMap::new();
        let mut fresh_slots = Vec::new();
        let mut nets: Vec<u32> = policy.nets.keys().copied().collect();
        nets.sort_unstable();
        for n in nets {
            let slot = match self.held.get(&n) {
                Some(v) => v.slot,
                None => {
                    // Past the slots, a network is governed but uncounted (slot 0).
                    let s = (1..GOV_SLOTS).find(|s| !used.contains(s)).unwrap_or(0);
                    used.insert(s);
                    fresh_slots.push(s);
                    s
                }
            };
            next.insert(n, GovVal { gen, slot });
        }
        if next == self.held {
            return Ok(());
        }
        if !fresh_slots.is_empty() {
            let mut stats: PerCpuArray<&mut MapData, GovStats> = super::object::map(ebpf, "gov_stats")?;
            let cpus = aya::util::nr_cpus().map_err(|(_, e)| super::io_error("the CPU count")(e))?;
            for s in fresh_slots.into_iter().filter(|s| *s != 0) {
                let zero = PerCpuValues::try_from(vec![GovStats::default(); cpus])
                    .map_err(|e| super::io_error("gov_stats")(e))?;
                stats.set(s, zero, 0).map_err(super::map_error("gov_stats"))?;
            }
        }
        super::object::write_diff(ebpf, "governed", &mut self.held, next)
    }

    /// What the programs forwarded by known flows, per governed network:
    /// (packets, bytes), summed over the CPUs.
    pub fn counts(&self, ebpf: &Ebpf) -> BTreeMap<u32, (u64, u64)> {
        let Some(m) = ebpf.map("gov_stats") else { return BTreeMap::new() };
        let Ok(stats) = PerCpuArray::<&MapData, GovStats>::try_from(m) else { return BTreeMap::new() };
        self.held
            .iter()
            .filter(|(_, v)| v.slot != 0)
            .map(|(n, v)| {
                let sum = stats
                    .get(&v.slot, 0)
                    .map_or((0, 0), |per| per.iter().fold((0, 0), |(p, b), s| (p + s.packets, b + s.bytes)));
                (*n, sum)
            })
            .collect()
    }
}

/// The programs' clock for idle checks (`clock`, a BPF timer's): whether
/// it ticks, and how far behind CLOCK_MONOTONIC it is (ms), for `show
/// policy`. Not armed until a governed network's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KernelClock {
    pub state: &'static str,
    pub behind_ms: Option<u64>,
}

impl KernelClock {
    pub fn read(ebpf: &Ebpf) -> Option<KernelClock> {
        let m = ebpf.map("clock")?;
        let a = aya::maps::Array::<&MapData, ClockVal>::try_from(m).ok()?;
        let v = a.get(&0, 0).ok()?;
        let state = match v.ticking {
            0 => "not armed",
            1 => "ticking",
            _ => "no timer (the clock read on every packet)",
        };
        let behind_ms = (v.ticking == 1).then(|| monotonic_ns().saturating_sub(v.now) / 1_000_000);
        Some(KernelClock { state, behind_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_key_is_the_engines_flow_with_ports_on_the_wire_and_ipv4_mapped() {
        let (c, s) =
            (vnet_wire::MacAddr([0x52, 0x54, 0, 0, 0, 1]), vnet_wire::MacAddr([0x52, 0x54, 0, 0, 0, 2]));
        let k = FlowKey {
            generation: (7 << 32) | 3,
            network: 9,
            src_mac: c,
            dst_mac: s,
            src: "10.0.0.1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            proto: PROTO_TCP,
            sport: 0x1234,
            dport: 5432,
            id: 0,
            fragment: false,
        };
        let kk = kernel_key(&k).unwrap();
        assert_eq!((kk.net, kk.gen, kk.proto), (9, 3, PROTO_TCP), "the generation's low 32 bits");
        // Whichever end comes first, both directions are one key.
        assert_eq!(kernel_key(&k.reversed()).unwrap(), kk, "a flow's two directions are one entry");
        let v4_first = kk.src[0] == 0;
        let (v4, v6, port, mac) =
            if v4_first { (kk.src, kk.dst, kk.sport, kk.smac) } else { (kk.dst, kk.src, kk.dport, kk.dmac) };
        assert_eq!(v4[10..], [0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(v6[..2], [0xfd, 0]);
        assert_eq!(port.to_ne_bytes(), [0x12, 0x34], "as on the wire");
        assert_eq!(mac, c.0, "the MACs go with their ends");
        // The same addresses and ports to another MAC, or from another: another entry.
        let other = vnet_wire::MacAddr([0x52, 0x54, 0, 0, 0, 3]);
        assert_ne!(kernel_key(&FlowKey { dst_mac: other, ..k }).unwrap(), kk);
        assert_ne!(kernel_key(&FlowKey { src_mac: other, ..k }.reversed()).unwrap(), kk);
        // Between equal addresses, the port decides; between equal ports too, the MAC.
        let same = FlowKey { dst: k.src, ..k };
        assert_eq!(kernel_key(&same).unwrap(), kernel_key(&same.reversed()).unwrap());
        let still = FlowKey { dport: k.sport, ..same };
        assert_eq!(kernel_key(&still).unwrap(), kernel_key(&still.reversed()).unwrap());
        assert!(kernel_key(&FlowKey { fragment: true, ..k }).is_none(), "fragments are the engine's");
        assert!(kernel_key(&FlowKey { proto: 47, ..k }).is_none(), "so is GRE");
    }
}
