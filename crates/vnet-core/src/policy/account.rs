//! Flow logs' accounts: beside each slot of a flow table ([`super::Flows`]),
//! the flow's key, the rule that decided it, when its account opened and
//! when it was last counted, and its packets and bytes each way.
//!
//! Counting is two relaxed atomic adds and a store per packet, into the
//! slot the table already found: no lock, no allocation. An account opens
//! with a new flow (its key and rule written once, under the slot's own
//! lock: once per flow, never per packet). [`Accounts::sweep`], the log's
//! timer, closes an account that has been idle for the log's idle time,
//! or open for its active time (a long flow gives a record per active
//! time, as NetFlow's active timeout does), and hands it out as a
//! [`FlowRecord`]; the key and rule stay, so a flow that goes on opens a
//! new account by itself. The table's size is the cap: an open account
//! whose slot a new flow takes before the sweep closed it is lost and
//! counted ([`Accounts::overflow`]).
//!
//! What is counted: each frame as the policy judged it, Ethernet header
//! included (the length a rule's counters count); a segmentation
//! offload's large frame counts once, with its headers once.

use super::key::FlowKey;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};

/// An account's state.
const FREE: u8 = 0;
const OPEN: u8 = 1;
/// Closed by a sweep; its key and rule kept for the flow's next packet.
const QUIET: u8 = 2;

/// Which way a packet went: the flow's first packet's way, or back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Forward = 0,
    Reverse = 1,
}

/// What opened an account: the flow and what decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The flow as its first packet went.
    pub key: FlowKey,
    /// The rule that decided it (`None`: the network's default, or a
    /// flow known before its account opened).
    pub rule: Option<Arc<str>>,
    pub allow: bool,
}

/// A closed account: one line of the flow log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRecord {
    pub opened: Opened,
    /// Whether the flow was also offered to a mirror (the kernel path
    /// carries its further packets: its record there completes this one).
    pub mirrored: bool,
    /// The second (of the table's clock) the account opened, and the
    /// second it was last counted.
    pub start_s: u32,
    pub end_s: u32,
    /// Forward, then reverse.
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
}

/// The accounts of a table's slots.
pub struct Accounts {
    opened: Box<[Mutex<Option<Opened>>]>,
    state: Box<[AtomicU8]>,
    mirrored: Box<[AtomicU8]>,
    /// Seconds of the table's clock, plus one.
    start: Box<[AtomicU32]>,
    last: Box<[AtomicU32]>,
    packets: Box<[[AtomicU64; 2]]>,
    bytes: Box<[[AtomicU64; 2]]>,
    /// Open accounts lost to a new flow in their slot before a sweep.
    pub overflow: AtomicU64,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts").field("slots", &self.state.len()).finish()
    }
}

fn zeros<T>(n: usize, f: impl Fn() -> T) -> Box<[T]> {
    (0..n).map(|_| f()).collect()
}

impl Accounts {
    pub fn new(slots: usize) -> Self {
        Accounts {
            opened: zeros(slots, || Mutex::new(None)),
            state: zeros(slots, || AtomicU8::new(FREE)),
            mirrored: zeros(slots, || AtomicU8::new(0)),
            start: zeros(slots, || AtomicU32::new(0)),
            last: zeros(slots, || AtomicU32::new(0)),
            packets: zeros(slots, || [AtomicU64::new(0), AtomicU64::new(0)]),
            bytes: zeros(slots, || [AtomicU64::new(0), AtomicU64::new(0)]),
            overflow: AtomicU64::new(0),
        }
    }

    /// Opens slot `slot`'s account for a new flow at second `now` (its
    /// packets are then [`Accounts::count`]ed).
    pub fn open(&self, slot: usize, opened: Opened, now: u32) {
        let Some(st) = self.state.get(slot) else { return };
        if st.swap(FREE, Relaxed) == OPEN && self.packets[slot].iter().any(|p| p.load(Relaxed) != 0) {
            self.overflow.fetch_add(1, Relaxed);
        }
        if let Ok(mut o) = self.opened[slot].lock() {
            *o = Some(opened);
        }
        for d in 0..2 {
            self.packets[slot][d].store(0, Relaxed);
            self.bytes[slot][d].store(0, Relaxed);
        }
        self.mirrored[slot].store(0, Relaxed);
        self.start[slot].store(now + 1, Relaxed);
        self.last[slot].store(now + 1, Relaxed);
        st.store(OPEN, Relaxed);
    }

    /// Counts a packet of the flow in `slot` (if its account was opened).
    pub fn count(&self, slot: usize, dir: Dir, len: usize, now: u32) {
        let Some(st) = self.state.get(slot) else { return };
        match st.load(Relaxed) {
            FREE => return,
            QUIET if st.compare_exchange(QUIET, OPEN, Relaxed, Relaxed).is_ok() => {
                self.start[slot].store(now + 1, Relaxed);
            }
            _ => {}
        }
        self.packets[slot][dir as usize].fetch_add(1, Relaxed);
        self.bytes[slot][dir as usize].fetch_add(len as u64, Relaxed);
        self.last[slot].store(now + 1, Relaxed);
    }

    /// Notes that the flow in `slot` was offered to a mirror that kept it.
    pub fn mirrored(&self, slot: usize) {
        if let Some(m) = self.mirrored.get(slot) {
            m.store(1, Relaxed);
        }
    }

    /// Closes each open account idle for `idle_s` seconds at second `now`,
    /// or open for `active_s`, and hands it to `out`.
    pub fn sweep(&self, now: u32, idle_s: u32, active_s: u32, out: &mut dyn FnMut(FlowRecord)) {
        for slot in 0..self.state.len() {
            if self.state[slot].load(Relaxed) != OPEN {
                continue;
            }
            let (start, last) = (self.start[slot].load(Relaxed), self.last[slot].load(Relaxed));
            let idle = now.wrapping_sub(last.saturating_sub(1)) >= idle_s;
            let long = now.wrapping_sub(start.saturating_sub(1)) >= active_s;
            if !idle && !long {
                continue;
            }
            let Some(opened) = self.opened[slot].lock().ok().and_then(|o| o.clone()) else { continue };
            self.state[slot].store(QUIET, Relaxed);
            // A long flow's next account starts now.
            self.start[slot].store(now + 1, Relaxed);
            let take = |a: &[AtomicU64; 2]| [a[0].swap(0, Relaxed), a[1].swap(0, Relaxed)];
            let packets = take(&self.packets[slot]);
            let bytes = take(&self.bytes[slot]);
            if packets == [0, 0] {
                continue;
            }
            out(FlowRecord {
                opened,
                mirrored: self.mirrored[slot].load(Relaxed) != 0,
                start_s: start.saturating_sub(1),
                end_s: last.saturating_sub(1),
                packets,
                bytes,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_wire::MacAddr;

    fn opened(sport: u16) -> Opened {
        Opened {
            key: FlowKey {
                generation: 1,
                network: 3,
                src_mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
                dst_mac: MacAddr([0x52, 0x54, 0, 0, 0, 2]),
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                proto: 6,
                sport,
                dport: 5201,
                id: 0,
                fragment: false,
            },
            rule: Some("web".into()),
            allow: true,
        }
    }

    fn swept(a: &Accounts, now: u32) -> Vec<FlowRecord> {
        let mut v = Vec::new();
        a.sweep(now, 5, 60, &mut |r| v.push(r));
        v
    }

    #[test]
    fn an_account_counts_each_way_and_closes_when_idle_then_reopens_with_its_key() {
        let a = Accounts::new(4);
        a.open(1, opened(40000), 10);
        a.count(1, Dir::Forward, 74, 10);
        a.count(1, Dir::Reverse, 74, 10);
        a.count(1, Dir::Forward, 1514, 11);
        a.count(2, Dir::Forward, 60, 11); // no account opened there
        assert!(swept(&a, 15).is_empty(), "idle 4 s of 5: still open");
        let r = swept(&a, 16);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].start_s, r[0].end_s), (10, 11));
        assert_eq!((r[0].packets, r[0].bytes), ([2, 1], [74 + 1514, 74]));
        assert_eq!(r[0].opened, opened(40000));
        assert!(!r[0].mirrored);
        assert!(swept(&a, 30).is_empty(), "closed: nothing more");
        a.count(1, Dir::Forward, 100, 40);
        a.mirrored(1);
        let r = swept(&a, 45);
        assert_eq!((r[0].start_s, r[0].packets, r[0].bytes), (40, [1, 0], [100, 0]), "the flow went on");
        assert!(r[0].mirrored);
    }

    #[test]
    fn a_long_flow_gives_a_record_per_active_time() {
        let a = Accounts::new(2);
        a.open(0, opened(1), 0);
        a.count(0, Dir::Forward, 100, 0);
        for s in 1..=130 {
            a.count(0, Dir::Forward, 100, s);
            let _ = swept(&a, s).into_iter().map(|r| assert!(r.end_s - r.start_s <= 60)).count();
        }
        let mut n = 0;
        a.sweep(200, 5, 60, &mut |_| n += 1);
        assert_eq!(n, 1, "the rest, once idle");
    }

    #[test]
    fn an_open_account_taken_by_a_new_flow_before_a_sweep_is_counted_as_overflow() {
        let a = Accounts::new(1);
        a.open(0, opened(1), 0);
        a.count(0, Dir::Forward, 100, 0);
        a.open(0, opened(2), 1);
        a.count(0, Dir::Forward, 100, 1);
        assert_eq!(a.overflow.load(Relaxed), 1);
        let r = swept(&a, 10);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].opened.key.sport, 2, "the new flow's");
        a.open(0, opened(3), 20);
        a.count(0, Dir::Forward, 100, 20);
        assert_eq!(a.overflow.load(Relaxed), 1, "a closed account is no loss");
        a.open(7, opened(4), 20);
        a.count(7, Dir::Forward, 100, 20); // no such slot: nothing
    }
}
