//! The drops vnetd tells: the user path's workers' rings
//! (`vnet_engine::drops`) and the kernel program's drop events
//! (`kernel::drops`), gathered into one numbered history for `show drops`
//! and `vnetctl monitor drops`.
//!
//! Gathering happens when someone asks (a monitor polls a few times a
//! second): each ring is read from where the last read stopped, the kernel
//! ring drained, and the new drops numbered in the order of their times.
//! The history keeps the newest [`HISTORY`] drops; what a ring overwrote
//! before it was read is counted (`lost`). A poll with a cursor (`show
//! drops since N`, what `monitor` sends) is a watch: it holds the kernel
//! program's `drop_monitor` flag on for [`WATCH_LEASE`], renewed by each
//! poll and cleared by the daemon's timer once polls stop, so a host
//! nobody watches makes no kernel events at all.

use crate::kernel::drops::{KernelDrop, KernelDrops};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
pub use vnet_client::drops::entry_text;
use vnet_core::{DropReason, Port};
use vnet_engine::drops::{Denial, DropRing, Head};

/// Drops the history keeps.
pub const HISTORY: usize = 4096;
/// How long one poll keeps the kernel program sending events.
pub const WATCH_LEASE: Duration = Duration::from_secs(3);
/// Kernel events taken off the ring per gathering at most.
const KERNEL_BATCH: usize = 8192;

/// Which data path dropped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    User,
    Kernel,
}

/// Where a dropped frame came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    Unknown,
    /// The user path's port.
    Port(Port),
    /// The kernel program's ingress device.
    Ifindex(u32),
}

/// One drop in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    /// Unix time, in nanoseconds.
    pub wall_ns: u64,
    pub path: Path,
    pub reason: DropReason,
    pub ingress: Ingress,
    pub denial: Option<Denial>,
    pub head: Head,
}

/// What names a drop's ingress and rule (the daemon's state, now).
pub trait Names {
    fn port(&self, p: Port) -> Option<String>;
    fn ifindex(&self, i: u32) -> Option<String>;
    /// The name of the rule that denied a frame that came in on `p`.
    fn rule(&self, p: Option<Port>, d: Denial) -> String;
}

/// The gathered history and the watch.
#[derive(Default)]
pub struct DropLog {
    history: VecDeque<Entry>,
    next_seq: u64,
    /// Each ring read, and the number of its next record.
    cursors: Vec<(Weak<DropRing>, u64)>,
    /// Records overwritten in the rings before they were read.
    pub lost: u64,
    /// Kernel events of no drop counter (none are expected).
    pub odd: u64,
    kernel: Option<Arc<KernelDrops>>,
    watched_until: Option<Instant>,
}

/// The clocks drops are dated by, read once per gathering.
#[derive(Debug, Clone, Copy)]
pub struct Clocks {
    pub wall_ns: u64,
    /// The engine's clock (`Shared::now_ns`).
    pub engine_ns: u64,
    /// CLOCK_MONOTONIC (the kernel program's `bpf_ktime_get_ns`).
    pub mono_ns: u64,
}

impl DropLog {
    /// Reads what is new in `rings` and, if given, the kernel program's
    /// ring into the history.
    pub fn gather(&mut self, rings: &[Arc<DropRing>], kernel: Option<&Arc<KernelDrops>>, c: Clocks) {
        let mut new: Vec<Entry> = Vec::new();
        let mut recs = Vec::new();
        self.cursors.retain(|(w, _)| w.strong_count() > 0);
        for ring in rings {
            let at = match self.cursors.iter().position(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(ring)))
            {
                Some(i) => i,
                None => {
                    self.cursors.push((Arc::downgrade(ring), 0));
                    self.cursors.len() - 1
                }
            };
            recs.clear();
            let (next, lost) = ring.read_from(self.cursors[at].1, &mut recs);
            self.cursors[at].1 = next;
            self.lost += lost;
            new.extend(recs.iter().map(|r| Entry {
                seq: 0,
                wall_ns: c.wall_ns.saturating_sub(c.engine_ns.saturating_sub(r.time_ns)),
                path: Path::User,
                reason: r.reason,
                ingress: r.ingress.map_or(Ingress::Unknown, Ingress::Port),
                denial: r.denial,
                head: r.head,
            }));
        }
        if let Some(k) = kernel {
            let mut events: Vec<KernelDrop> = Vec::new();
            self.odd += k.drain(KERNEL_BATCH, &mut events) as u64;
            new.extend(events.iter().map(|e| Entry {
                seq: 0,
                wall_ns: c.wall_ns.saturating_sub(c.mono_ns.saturating_sub(e.time_ns)),
                path: Path::Kernel,
                reason: e.reason,
                ingress: Ingress::Ifindex(e.ifindex),
                denial: None,
                head: e.head,
            }));
        }
        new.sort_by_key(|e| e.wall_ns);
        for mut e in new {
            e.seq = self.next_seq;
            self.next_seq += 1;
            if self.history.len() == HISTORY {
                self.history.pop_front();
            }
            self.history.push_back(e);
        }
    }

    /// The next number a drop will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The newest `last` drops, of those numbered `since` on if given.
    pub fn last(&self, last: usize, since: Option<u64>) -> Vec<Entry> {
        let from = since.unwrap_or(0);
        let mut v: Vec<Entry> =
            self.history.iter().rev().take_while(|e| e.seq >= from).take(last).copied().collect();
        v.reverse();
        v
    }

    /// Someone polls: the kernel program sends events for [`WATCH_LEASE`]
    /// more (`kernel`: the loaded program's, if any).
    pub fn watch(
        &mut self,
        kernel: Option<Arc<KernelDrops>>,
        now: Instant,
    ) -> Result<(), crate::kernel::KernelError> {
        let same = match (&self.kernel, &kernel) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let starting = self.watched_until.is_none_or(|t| t <= now) || !same;
        self.watched_until = Some(now + WATCH_LEASE);
        if !same {
            if let Some(old) = self.kernel.take() {
                let _ = old.watch(false);
            }
            self.kernel = kernel;
        }
        match (&self.kernel, starting) {
            (Some(k), true) => k.watch(true),
            _ => Ok(()),
        }
    }

    /// The daemon's timer: a watch nobody renewed ends.
    pub fn expire(&mut self, now: Instant) {
        if self.watched_until.is_some_and(|t| t <= now) {
            self.watched_until = None;
            if let Some(k) = &self.kernel {
                if let Err(e) = k.watch(false) {
                    tracing::warn!("drop events: could not stop the kernel program's: {e}");
                }
            }
        }
    }

    /// Whether someone watches now.
    pub fn watched(&self, now: Instant) -> bool {
        self.watched_until.is_some_and(|t| t > now)
    }
}

/// A drop as `show drops json` and `monitor --json` give it.
pub fn entry_json(e: &Entry, names: &dyn Names) -> Value {
    let s = e.head.summary();
    let mut v = json!({
        "seq": e.seq,
        "time": e.wall_ns as f64 / 1e9,
        "path": match e.path { Path::User => "user", Path::Kernel => "kernel" },
        "reason": e.reason.name(),
        "len": e.head.len,
    });
    let m = v.as_object_mut().expect("an object");
    match e.ingress {
        Ingress::Port(p @ Port::Interface(_)) => m.insert("interface".into(), names.port(p).into()),
        Ingress::Port(p @ Port::Link(_)) => m.insert("link".into(), names.port(p).into()),
        Ingress::Ifindex(i) => m.insert("interface".into(), names.ifindex(i).into()),
        Ingress::Unknown => None,
    };
    let port = match e.ingress {
        Ingress::Port(p) => Some(p),
        _ => None,
    };
    if let Some(d) = e.denial {
        m.insert("rule".into(), names.rule(port, d).into());
    }
    let mut put = |k: &str, x: Option<String>| {
        if let Some(x) = x {
            m.insert(k.into(), x.into());
        }
    };
    put("src_mac", s.src.map(|a| a.to_string()));
    put("dst_mac", s.dst.map(|a| a.to_string()));
    put("ethertype", s.ether.map(|t| format!("{t:#06x}")));
    put("src_ip", s.src_ip.map(|a| a.to_string()));
    put("dst_ip", s.dst_ip.map(|a| a.to_string()));
    put("proto", s.proto.map(proto_name));
    if let Some((sp, dp)) = s.ports {
        m.insert("src_port".into(), sp.into());
        m.insert("dst_port".into(), dp.into());
    }
    v
}

/// An IP protocol's name (its number otherwise).
fn proto_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_engine::drops::{DropBook, DropRecord};

    struct Named;
    impl Names for Named {
        fn port(&self, p: Port) -> Option<String> {
            Some(format!("{p:?}"))
        }
        fn ifindex(&self, i: u32) -> Option<String> {
            Some(format!("if{i}"))
        }
        fn rule(&self, _: Option<Port>, d: Denial) -> String {
            format!("{d:?}")
        }
    }

    fn frame() -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 8, 0];
        f.extend([0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend([0, 22, 0, 80, 0, 0, 0, 0, 0, 0, 0, 0, 0x50, 0x02, 0, 0, 0, 0, 0, 0]);
        f
    }

    fn rec(reason: DropReason, t: u64) -> DropRecord {
        DropRecord {
            seq: 0,
            time_ns: t,
            reason,
            ingress: Some(Port::Interface(1)),
            denial: (reason == DropReason::PolicyDenied).then_some(Denial::Default),
            head: Head::of(&frame()),
        }
    }

    const CLOCKS: Clocks = Clocks { wall_ns: 1_000_000_000_000, engine_ns: 5_000, mono_ns: 0 };

    #[test]
    fn drops_of_every_ring_are_numbered_once_in_time_order_and_the_history_is_bounded() {
        let book = DropBook::default();
        let (a, b) = (book.ring(), book.ring());
        a.write(&rec(DropReason::NoRoute, 3_000));
        b.write(&rec(DropReason::PolicyDenied, 1_000));
        let mut log = DropLog::default();
        log.gather(&book.rings(), None, CLOCKS);
        let got: Vec<_> = log.last(10, None).iter().map(|e| (e.seq, e.reason)).collect();
        assert_eq!(got, [(0, DropReason::PolicyDenied), (1, DropReason::NoRoute)]);
        log.gather(&book.rings(), None, CLOCKS);
        assert_eq!(log.next_seq(), 2, "nothing read twice");
        a.write(&rec(DropReason::WrongNetwork, 4_000));
        log.gather(&book.rings(), None, CLOCKS);
        assert_eq!(
            log.last(10, Some(2)).iter().map(|e| e.reason).collect::<Vec<_>>(),
            [DropReason::WrongNetwork]
        );
        assert_eq!(log.last(1, None)[0].wall_ns, CLOCKS.wall_ns - 1_000);
        for _ in 0..3 {
            for _ in 0..vnet_engine::drops::RING_SLOTS {
                a.write(&rec(DropReason::NoRoute, 4_000));
            }
            log.gather(&book.rings(), None, CLOCKS);
        }
        assert_eq!(log.history.len(), HISTORY.min(3 + 3 * vnet_engine::drops::RING_SLOTS));
        assert_eq!(log.lost, 0);
    }

    #[test]
    fn a_poll_is_a_watch_for_the_lease_and_the_timer_ends_it() {
        let mut log = DropLog::default();
        let now = Instant::now();
        assert!(!log.watched(now));
        log.watch(None, now).expect("no kernel path: nothing to tell");
        assert!(log.watched(now + WATCH_LEASE / 2));
        log.expire(now + WATCH_LEASE / 2);
        assert!(log.watched(now + WATCH_LEASE / 2), "renewed within the lease: kept");
        log.expire(now + WATCH_LEASE);
        assert!(!log.watched(now + WATCH_LEASE / 2), "past the lease: ended");
    }

    #[test]
    fn a_drop_reads_as_json_and_as_one_line_with_its_reason_ports_and_rule() {
        let book = DropBook::default();
        let a = book.ring();
        a.write(&rec(DropReason::PolicyDenied, 5_000));
        let mut log = DropLog::default();
        log.gather(&book.rings(), None, CLOCKS);
        let v = entry_json(&log.last(1, None)[0], &Named);
        assert_eq!(v["reason"], "policy_denied");
        assert_eq!(v["rule"], "Default");
        assert_eq!(
            (v["src_ip"].as_str(), v["dst_port"].as_u64(), v["proto"].as_str()),
            (Some("10.0.0.1"), Some(80), Some("tcp"))
        );
        assert_eq!(v["interface"], "Interface(1)");
        let line = entry_text(&v);
        assert!(line.contains("user   policy_denied"), "{line}");
        assert!(line.contains("in Interface(1) 02:00:00:00:00:0a > 02:00:00:00:00:0b 0x0800 10.0.0.1:22 > 10.0.0.2:80 tcp rule Default len 54"), "{line}");
    }
}
