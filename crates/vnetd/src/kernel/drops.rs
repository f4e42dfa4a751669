//! The programs' drop events (`bpf/lib/drops.h`): the ring buffer
//! `drop_events` read, and `drop_monitor` set while someone watches (the
//! programs reserve nothing otherwise). Each event names the `S_*` counter
//! its drop was counted in; [`reason_of`] maps it to the one drop-reason
//! list ([`super::maps::STAT_DROPS`], checked when vnetd is built).

use super::maps::{shared, STAT_DROPS};
use super::{map_error, KernelError, Reason};
use aya::maps::{Array, Map, MapData, RingBuf};
use aya::Ebpf;
use std::os::fd::AsFd as _;
use std::sync::Mutex;
use vnet_core::DropReason;
use vnet_engine::drops::{Head, HEAD};

const _: () =
    assert!(shared::DROP_HEAD as usize == HEAD, "bpf/vnet.h's DROP_HEAD is not the user path's HEAD");

/// One drop event as the program sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelDrop {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) when it was dropped.
    pub time_ns: u64,
    pub reason: DropReason,
    /// The ingress device.
    pub ifindex: u32,
    pub head: Head,
}

/// The drop reason of the program's counter `stat`, if it counts drops.
pub fn reason_of(stat: u32) -> Option<DropReason> {
    STAT_DROPS.get(stat as usize).copied().flatten()
}

/// `struct drop_event`'s bytes read (`sys::bpf::DropEvent` is its layout,
/// checked against the object): None if short or of no drop counter.
pub fn parse(b: &[u8]) -> Option<KernelDrop> {
    let u32_at = |at: usize| b.get(at..at + 4).and_then(|s| s.try_into().ok()).map(u32::from_ne_bytes);
    let time_ns = u64::from_ne_bytes(b.get(..8)?.try_into().ok()?);
    let (stat, ifindex, len, caplen) = (u32_at(8)?, u32_at(12)?, u32_at(16)?, u32_at(20)?);
    let mut bytes = [0u8; HEAD];
    let caplen = (caplen as usize).min(HEAD);
    bytes[..caplen].copy_from_slice(b.get(24..24 + caplen)?);
    Some(KernelDrop {
        time_ns,
        reason: reason_of(stat)?,
        ifindex,
        head: Head { bytes, caplen: caplen as u16, len },
    })
}

/// The events ring and the watch flag, through descriptors of their own
/// (the control plane reads them while the daemon holds the object).
pub struct KernelDrops {
    ring: Mutex<RingBuf<MapData>>,
    monitor: Mutex<Array<MapData, u32>>,
}

impl std::fmt::Debug for KernelDrops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelDrops").finish_non_exhaustive()
    }
}

/// Map `name` of the object through a new descriptor.
fn own(ebpf: &Ebpf, name: &str) -> Result<MapData, Reason> {
    let m = ebpf.map(name).ok_or_else(|| KernelError::NoMap(name.into()))?;
    let data = match m {
        Map::RingBuf(d) | Map::Array(d) => d,
        _ => return Err(KernelError::NoMap(name.into())),
    };
    let fd = data.fd().as_fd().try_clone_to_owned().map_err(|e| super::io_error(format!("map {name}"))(e))?;
    MapData::from_fd(fd).map_err(map_error(name.to_string()))
}

impl KernelDrops {
    pub fn open(ebpf: &Ebpf) -> Result<Self, Reason> {
        let ring =
            RingBuf::try_from(Map::RingBuf(own(ebpf, "drop_events")?)).map_err(map_error("drop_events"))?;
        let monitor =
            Array::try_from(Map::Array(own(ebpf, "drop_monitor")?)).map_err(map_error("drop_monitor"))?;
        Ok(KernelDrops { ring: Mutex::new(ring), monitor: Mutex::new(monitor) })
    }

    /// Tells the programs whether someone watches (they send events only then).
    pub fn watch(&self, on: bool) -> Result<(), Reason> {
        let mut m = self.monitor.lock().unwrap_or_else(|p| p.into_inner());
        m.set(0, u32::from(on), 0).map_err(map_error("drop_monitor"))
    }

    /// Takes up to `max` events off the ring, oldest first; returns how
    /// many it took that named no drop counter (none should).
    pub fn drain(&self, max: usize, out: &mut Vec<KernelDrop>) -> usize {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut odd = 0;
        for _ in 0..max {
            let Some(item) = ring.next() else { break };
            match parse(&item) {
                Some(d) => out.push(d),
                None => odd += 1,
            }
        }
        odd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C sources, to check what drops there against the table.
    /// (lib/drops.h, where `dropped` is, is not one: the others call it.)
    const SOURCES: [(&str, &str); 11] = [
        ("vnet.bpf.c", include_str!("../../bpf/vnet.bpf.c")),
        ("lib/common.h", include_str!("../../bpf/lib/common.h")),
        ("lib/decap.h", include_str!("../../bpf/lib/decap.h")),
        ("lib/encap.h", include_str!("../../bpf/lib/encap.h")),
        ("lib/flows.h", include_str!("../../bpf/lib/flows.h")),
        ("lib/guard.h", include_str!("../../bpf/lib/guard.h")),
        ("lib/maps.h", include_str!("../../bpf/lib/maps.h")),
        ("lib/neigh.h", include_str!("../../bpf/lib/neigh.h")),
        ("lib/route.h", include_str!("../../bpf/lib/route.h")),
        ("lib/stats.h", include_str!("../../bpf/lib/stats.h")),
        ("lib/user.h", include_str!("../../bpf/lib/user.h")),
    ];

    #[test]
    fn every_counter_the_programs_drop_with_has_a_reason_and_no_drop_goes_around_it() {
        let names = super::super::maps::STAT_NAMES;
        let index = |s: &str| -> Option<usize> {
            // `S_SPOOFED_IP` -> its index, through the generated constants' table.
            super::super::maps::STAT_CONSTS.iter().find(|(n, _)| *n == s).map(|(_, i)| *i as usize)
        };
        let mut seen = 0;
        for (file, text) in SOURCES {
            for (k, _) in text.match_indices("dropped(skb, ") {
                let stat: String = text[k + 13..].chars().take_while(|c| *c != ')').collect();
                let i = index(&stat).unwrap_or_else(|| panic!("{file}: dropped with unknown {stat}"));
                assert!(
                    reason_of(i as u32).is_some(),
                    "{file}: {stat} ({}) drops but has no reason",
                    names[i]
                );
                seen += 1;
            }
            assert!(
                !text.contains("TC_ACT_SHOT"),
                "{file}: a TC_ACT_SHOT outside dropped(): every drop goes through lib/drops.h"
            );
        }
        assert!(seen >= 5, "the programs' drops were not found ({seen})");
    }

    #[test]
    fn an_event_parses_to_its_reason_and_frame_head_and_garbage_is_refused() {
        let mut b = Vec::new();
        b.extend(42u64.to_ne_bytes());
        b.extend(shared::S_SPOOFED_IP.to_ne_bytes());
        b.extend(7u32.to_ne_bytes());
        b.extend(60u32.to_ne_bytes());
        b.extend(3u32.to_ne_bytes());
        b.extend([1u8, 2, 3]);
        b.resize(24 + HEAD, 0);
        let d = parse(&b).expect("an event");
        assert_eq!((d.time_ns, d.reason, d.ifindex), (42, DropReason::SpoofedSourceIp, 7));
        assert_eq!((d.head.caplen, d.head.len, &d.head.bytes[..4]), (3, 60, &[1, 2, 3, 0][..]));
        b[8..12].copy_from_slice(&shared::S_LOCAL.to_ne_bytes());
        assert_eq!(parse(&b), None, "a counter of no drop");
        assert_eq!(parse(&b[..20]), None, "short");
    }
}
