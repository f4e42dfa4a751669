//! The flows a policy allowed: a fixed array every worker shares, with no
//! lock and no allocation per frame.
//!
//! A flow is kept as a 64-bit fingerprint, its key hashed with SipHash
//! under a key drawn at start (so a peer cannot make two flows collide on
//! purpose: a false "known flow" needs a 64-bit collision under a secret
//! key), and the second it was last seen. A key's slot is one of
//! [`WAYS`] consecutive slots; a new flow takes a free or expired one, or
//! else the least recently seen (counted as evicted: its next packet is
//! judged by the rules again, and a reply of it is a new flow).
//!
//! Two workers writing one slot at once may lose one of the two flows the
//! same way; a fingerprint and its time are written as two stores, so a
//! reader may see a new fingerprint with the old time for an instant (a
//! flow one eviction early, never one that was not allowed: a slot is
//! cleared before it is reused, and a fingerprint is never partly written).
//!
//! The table judges an IP packet of a governed network ([`Flows::judge`]):
//! a packet of a flow it knows passes by state; one it does not is judged
//! by the rules (a [`Judge`]), asked through the mirror when there is one
//! ([`FlowMirror::known_or`]: the kernel's flows asked before the rules,
//! told after them), and remembered here when allowed.

use super::account::{Accounts, Dir, FlowRecord, Opened};
pub use super::key::FlowKey;
use super::key::{flow_key, fragment_key};
use super::verdict::{FlowMirror, Judge, Judged, Known, Verdict, Why};
use crate::stats::Counters;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64};
use vnet_wire::classify::{Frag, Icmp, Ip};
use vnet_wire::MacAddr;

/// Slots a key may be in.
pub const WAYS: usize = 8;
/// Seconds an idle flow is kept: TCP, and everything else.
pub const TCP_IDLE_S: u32 = 600;
pub const IDLE_S: u32 = 120;
/// Seconds between two offers of one flow to a mirror ([`Flows::due`]).
pub const OFFER_S: u32 = 10;

/// Seconds `k` is kept idle.
fn idle_s(k: &FlowKey) -> u32 {
    if k.proto == vnet_wire::ip::PROTO_TCP && !k.fragment {
        TCP_IDLE_S
    } else {
        IDLE_S
    }
}

/// The table.
pub struct Flows {
    hasher: std::collections::hash_map::RandomState,
    fingerprints: Box<[AtomicU64]>,
    /// The second each slot was last seen, plus one (0: free).
    seen: Box<[AtomicU32]>,
    /// The second each slot's flow was last offered to a mirror, plus one
    /// (0: not yet).
    offered: Box<[AtomicU32]>,
    /// The clock, in seconds, that [`Flows::tick`] sets.
    now_s: AtomicU32,
    /// Flows overwritten while still fresh (the table was full there).
    pub evicted: AtomicU64,
    /// With a flow log: each slot's account ([`super::account`]), and the
    /// denied flows' own table (with its accounts).
    accounts: Option<Accounts>,
    denied: Option<Box<Flows>>,
}

impl std::fmt::Debug for Flows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flows").field("slots", &self.fingerprints.len()).finish()
    }
}

impl Default for Flows {
    fn default() -> Self {
        Flows::new(1 << 16)
    }
}

impl Flows {
    /// A table of `slots` slots (rounded up to a power of two, at least [`WAYS`]).
    pub fn new(slots: usize) -> Self {
        let n = slots.max(WAYS).next_power_of_two();
        Flows {
            hasher: std::collections::hash_map::RandomState::new(),
            fingerprints: (0..n).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..n).map(|_| AtomicU32::new(0)).collect(),
            offered: (0..n).map(|_| AtomicU32::new(0)).collect(),
            now_s: AtomicU32::new(0),
            evicted: AtomicU64::new(0),
            accounts: None,
            denied: None,
        }
    }

    /// A table of `slots` slots whose flows are accounted for a flow log,
    /// with a table of `denied` slots for the denied flows.
    pub fn logging(slots: usize, denied: usize) -> Self {
        let mut f = Flows::new(slots);
        f.accounts = Some(Accounts::new(f.slots()));
        let mut d = Flows::new(denied);
        d.accounts = Some(Accounts::new(d.slots()));
        f.denied = Some(Box::new(d));
        f
    }

    /// Whether flows are accounted.
    pub fn logs(&self) -> bool {
        self.accounts.is_some()
    }

    /// The table's clock, in seconds.
    pub fn now_s(&self) -> u32 {
        self.now_s.load(Relaxed)
    }

    /// Opens the account of the new flow `opened` in `slot`.
    pub fn open(&self, slot: usize, opened: Opened) {
        if let Some(a) = &self.accounts {
            a.open(slot, opened, self.now_s());
        }
    }

    /// Counts a packet of `len` bytes of the flow in `slot`.
    pub fn count(&self, slot: usize, dir: Dir, len: usize) {
        if let Some(a) = &self.accounts {
            a.count(slot, dir, len, self.now_s());
        }
    }

    /// Notes that the flow in `slot` was kept by a mirror.
    pub fn mirrored(&self, slot: usize) {
        if let Some(a) = &self.accounts {
            a.mirrored(slot);
        }
    }

    /// Counts a denied packet of `len` bytes of flow `k` (denied by `rule`,
    /// or by the default), in the denied flows' table.
    pub fn deny(&self, k: &FlowKey, rule: Option<&std::sync::Arc<str>>, len: usize) {
        let Some(d) = &self.denied else { return };
        match d.hit_slot(k) {
            Some(s) => d.count(s, Dir::Forward, len),
            None => {
                let s = d.insert(k);
                d.open(s, Opened { key: *k, rule: rule.cloned(), allow: false });
                d.count(s, Dir::Forward, len);
            }
        }
    }

    /// Closes the accounts idle for `idle_s` seconds or open for
    /// `active_s`, the allowed flows' and the denied ones', into `out`.
    pub fn sweep(&self, idle_s: u32, active_s: u32, out: &mut dyn FnMut(FlowRecord)) {
        if let Some(a) = &self.accounts {
            a.sweep(self.now_s(), idle_s, active_s, out);
        }
        if let Some(d) = &self.denied {
            d.sweep(idle_s, active_s, out);
        }
    }

    /// Open accounts lost to a full table (allowed and denied flows').
    pub fn overflow(&self) -> u64 {
        let own = self.accounts.as_ref().map_or(0, |a| a.overflow.load(Relaxed));
        own + self.denied.as_ref().map_or(0, |d| d.overflow())
    }

    /// The clock: the time now, in nanoseconds of any monotonic clock.
    pub fn tick(&self, now_ns: u64) {
        self.now_s.store((now_ns / 1_000_000_000) as u32, Relaxed);
        if let Some(d) = &self.denied {
            d.tick(now_ns);
        }
    }

    pub fn slots(&self) -> usize {
        self.fingerprints.len()
    }

    /// Fresh flows in the table (a count over every slot: for `show`).
    pub fn live(&self) -> usize {
        let now = self.now_s.load(Relaxed);
        (0..self.slots()).filter(|&i| self.fresh(i, now, IDLE_S.max(TCP_IDLE_S))).count()
    }

    fn place(&self, k: &FlowKey) -> (usize, u64) {
        let h = self.hasher.hash_one(k);
        let first = (h as usize) & (self.slots() - 1) & !(WAYS - 1);
        (first, h | 1)
    }

    fn fresh(&self, i: usize, now: u32, idle: u32) -> bool {
        let seen = self.seen[i].load(Relaxed);
        seen != 0 && now.wrapping_sub(seen - 1) <= idle
    }

    /// Whether `k` is a known flow (and if so, seen now).
    pub fn hit(&self, k: &FlowKey) -> bool {
        self.hit_slot(k).is_some()
    }

    /// The slot of `k` if it is a known flow (seen now).
    pub fn hit_slot(&self, k: &FlowKey) -> Option<usize> {
        let i = self.find(k)?;
        self.seen[i].store(self.now_s.load(Relaxed) + 1, Relaxed);
        Some(i)
    }

    /// The slot of `k` if it is a known flow, changing nothing (not even
    /// when it was last seen: a dry run's look).
    pub fn find(&self, k: &FlowKey) -> Option<usize> {
        let (first, fp) = self.place(k);
        let now = self.now_s.load(Relaxed);
        (first..first + WAYS)
            .find(|&i| self.fingerprints[i].load(Relaxed) == fp && self.fresh(i, now, idle_s(k)))
    }

    /// Whether the flow in `slot` is due to be offered to a mirror: never
    /// offered, or last [`OFFER_S`] seconds ago or more (a mirror that
    /// lost it gets it again). One caller at a time gets `true`.
    pub fn due(&self, slot: usize) -> bool {
        let Some(o) = self.offered.get(slot) else { return false };
        let now = self.now_s.load(Relaxed);
        let last = o.load(Relaxed);
        if last != 0 && now.wrapping_sub(last - 1) < OFFER_S {
            return false;
        }
        o.compare_exchange(last, now + 1, Relaxed, Relaxed).is_ok()
    }

    /// Records `k` as allowed: its slot.
    pub fn insert(&self, k: &FlowKey) -> usize {
        let (first, fp) = self.place(k);
        let now = self.now_s.load(Relaxed);
        let mut victim = first;
        let mut oldest = u32::MAX;
        for i in first..first + WAYS {
            let f = self.fingerprints[i].load(Relaxed);
            if f == fp {
                self.seen[i].store(now + 1, Relaxed);
                return i;
            }
            let seen = self.seen[i].load(Relaxed);
            // Free, or idle past the longest idle time: free.
            let age = if seen == 0 || !self.fresh(i, now, TCP_IDLE_S) { 0 } else { seen };
            if age < oldest {
                (victim, oldest) = (i, age);
            }
        }
        if oldest != 0 {
            self.evicted.fetch_add(1, Relaxed);
        }
        self.seen[victim].store(0, Relaxed);
        self.offered[victim].store(0, Relaxed);
        self.fingerprints[victim].store(fp, Relaxed);
        self.seen[victim].store(now + 1, Relaxed);
        victim
    }
}

/// An IP packet of a governed network, as [`Flows::judge`] judges it.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The policy's generation ([`FlowKey::generation`]).
    pub generation: u64,
    pub network: u32,
    /// The frame's source and destination MACs.
    pub macs: (MacAddr, MacAddr),
    pub ip: &'a Ip,
    pub len: usize,
    /// Whether the judgement counts and remembers (the data path) or
    /// changes nothing (a dry run: `vnetctl trace`).
    pub live: bool,
    /// The network's counters: packets passed by state, and later
    /// fragments of no allowed first.
    pub stateful: &'a Counters,
    pub orphan_fragments: &'a AtomicU64,
}

impl Flows {
    /// The verdict on `p`: passed by state (a further packet or a reply of
    /// a known flow, an ICMP error about one between its own ends, a later
    /// fragment of an allowed first), or else `judge`'s, asked through
    /// `mirror` when there is one ([`FlowMirror::known_or`]); an allowed
    /// packet's flow remembered (and its first fragment's later ones), a
    /// denied one counted in the flow log's denied flows. A dry run looks
    /// the flows up without refreshing, inserting or counting.
    pub fn judge(
        &self,
        p: &Packet<'_>,
        mirror: Option<&dyn FlowMirror>,
        judge: &mut dyn Judge<'_>,
    ) -> Verdict {
        let (ip, g, live) = (p.ip, p.generation, p.live);
        let hit = |k: &FlowKey| if live { self.hit_slot(k) } else { self.find(k) };
        let why = if let Frag::Later { id } = ip.frag {
            if hit(&fragment_key(g, p.network, p.macs, ip, id)).is_none() {
                if live {
                    p.orphan_fragments.fetch_add(1, Relaxed);
                }
                return Verdict { allow: false, why: Why::OrphanFragment };
            }
            Why::Fragment
        } else if let Some(about) = quoted(p) {
            // Related only between the quoted flow's own ends: the error
            // comes from the quoted packet's far end (its MAC) and goes to
            // its sender (MAC and address). A third VM's error about a
            // known flow meets the rules.
            if ip.dst != about.src {
                return self.judged(p, judge.judge(), None);
            }
            if hit(&about).is_none() && hit(&about.reversed()).is_none() {
                if let Known::Judged { judged, .. } = ask(mirror, &about, false, judge) {
                    return self.judged(p, judged, None);
                }
            }
            Why::Related
        } else {
            let k = flow_key(g, p.network, p.macs, ip);
            let (why, slot, known, kept) = if let Some(s) = hit(&k) {
                (Why::Established, Some(s), k, None)
            } else if let Some(s) = hit(&k.reversed()) {
                (Why::Reply, Some(s), k.reversed(), None)
            } else {
                match ask(mirror, &k, live, judge) {
                    Known::Judged { judged, kept } => return self.judged(p, judged, mirror.map(|_| kept)),
                    Known::Fresh { kept } => {
                        // A flow the mirror carried alone: known here again
                        // (its account opens with no rule: the rules did
                        // not see it).
                        let s = live.then(|| {
                            let s = self.insert(&k);
                            self.open(s, Opened { key: k, rule: None, allow: true });
                            s
                        });
                        (Why::Established, s, k, Some(kept))
                    }
                }
            };
            if let (Some(slot), true) = (slot, live) {
                let dir = if why == Why::Reply { Dir::Reverse } else { Dir::Forward };
                self.count(slot, dir, p.len);
                self.offered_to(mirror, slot, &known, kept);
            }
            why
        };
        if !live {
            return Verdict { allow: true, why };
        }
        if let Frag::First { id } = ip.frag {
            self.insert(&fragment_key(g, p.network, p.macs, ip, id));
        }
        p.stateful.add(p.len);
        Verdict { allow: true, why }
    }

    /// `p` as `judged` (by the rules): a denied packet counted in the flow
    /// log's denied flows; an allowed one's flow remembered (and its later
    /// fragments), its account opened. `kept`: whether the mirror kept it
    /// (`None`: no mirror, or none asked to keep it).
    fn judged(&self, p: &Packet<'_>, judged: Judged<'_>, kept: Option<bool>) -> Verdict {
        let (ip, g, v) = (p.ip, p.generation, judged.verdict);
        if !p.live {
            return v;
        }
        if !v.allow {
            if self.logs() {
                self.deny(&flow_key(g, p.network, p.macs, ip), judged.rule, p.len);
            }
            return v;
        }
        if let Frag::First { id } = ip.frag {
            self.insert(&fragment_key(g, p.network, p.macs, ip, id));
        }
        // An ICMP error opens no flow of its own; everything else does.
        if !matches!(ip.icmp, Icmp::Error { .. }) {
            let k = flow_key(g, p.network, p.macs, ip);
            let slot = self.insert(&k);
            self.open(slot, Opened { key: k, rule: judged.rule.cloned(), allow: true });
            self.count(slot, Dir::Forward, p.len);
            if let Some(kept) = kept {
                self.noted_offer(slot, kept);
            }
        }
        v
    }

    /// Flow `k` (in `slot`) and the mirror: offered to it when due
    /// (`kept`: `None`, not asked yet), or, offered already as it was
    /// asked, noted.
    fn offered_to(&self, mirror: Option<&dyn FlowMirror>, slot: usize, k: &FlowKey, kept: Option<bool>) {
        let Some(m) = mirror else { return };
        match kept {
            Some(kept) => self.noted_offer(slot, kept),
            None => {
                if self.due(slot) && m.offer(k) {
                    self.mirrored(slot);
                }
            }
        }
    }

    /// The flow in `slot` was just offered to the mirror (`kept`: and kept
    /// by it): its next offer due in [`OFFER_S`] seconds.
    fn noted_offer(&self, slot: usize, kept: bool) {
        self.due(slot);
        if kept {
            self.mirrored(slot);
        }
    }
}

/// The flow an ICMP error `p` quotes, keyed as its sender sent it (from
/// the error's destination MAC to its source MAC); `None`: not an ICMP error.
fn quoted(p: &Packet<'_>) -> Option<FlowKey> {
    let Icmp::Error { src, dst, proto, sport, dport } = p.ip.icmp else { return None };
    Some(FlowKey {
        generation: p.generation,
        network: p.network,
        src_mac: p.macs.1,
        dst_mac: p.macs.0,
        src,
        dst,
        proto,
        sport,
        dport,
        id: 0,
        fragment: false,
    })
}

/// `k` as `mirror` knows it, or else `judge`'s judgement (with no mirror:
/// judged); `keep`: a flow fresh or allowed offered to the mirror.
fn ask<'a>(mirror: Option<&dyn FlowMirror>, k: &FlowKey, keep: bool, judge: &mut dyn Judge<'a>) -> Known<'a> {
    match mirror {
        Some(m) => m.known_or(k, keep, judge),
        None => Known::Judged { judged: judge.judge(), kept: false },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_wire::MacAddr;

    fn key(sport: u16) -> FlowKey {
        FlowKey {
            generation: 1,
            network: 0,
            src_mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
            dst_mac: MacAddr([0x52, 0x54, 0, 0, 0, 2]),
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            proto: 17,
            sport,
            dport: 53,
            id: 0,
            fragment: false,
        }
    }

    #[test]
    fn a_flow_is_found_after_insertion_in_its_direction_until_it_idles_out() {
        let f = Flows::new(64);
        f.tick(5_000_000_000);
        assert!(!f.hit(&key(1)));
        f.insert(&key(1));
        assert!(f.hit(&key(1)) && !f.hit(&key(1).reversed()) && !f.hit(&key(2)));
        assert!(!f.hit(&FlowKey { generation: 2, ..key(1) }), "a new generation knows no flow");
        f.tick((5 + u64::from(IDLE_S)) * 1_000_000_000);
        assert!(f.hit(&key(1)), "idle exactly its time: kept, and seen again now");
        f.tick((6 + 2 * u64::from(IDLE_S)) * 1_000_000_000);
        assert!(!f.hit(&key(1)), "idle past its time: gone");
        let tcp = FlowKey { proto: 6, ..key(1) };
        f.insert(&tcp);
        f.tick((6 + 2 * u64::from(IDLE_S) + u64::from(TCP_IDLE_S)) * 1_000_000_000);
        assert!(f.hit(&tcp), "TCP idles longer");
        assert_eq!(f.live(), 1);
    }

    #[test]
    fn a_flow_is_due_to_its_mirror_when_new_and_again_after_its_interval() {
        let f = Flows::new(64);
        f.tick(1_000_000_000);
        let s = f.insert(&key(1));
        assert!(f.due(s) && !f.due(s), "once, to one caller");
        f.tick((1 + u64::from(OFFER_S) - 1) * 1_000_000_000);
        assert!(!f.due(s), "not before its interval");
        f.tick((1 + u64::from(OFFER_S)) * 1_000_000_000);
        assert!(f.due(s), "again after it");
        assert_eq!(f.insert(&key(1)), s, "the same flow keeps its slot");
        assert!(!f.due(s), "and its offer");
        assert!(!f.due(usize::MAX), "no such slot");
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_seen_and_counts_it() {
        let f = Flows::new(8); // one bucket: every key shares it
        for s in 0..8u16 {
            f.tick(u64::from(s) * 1_000_000_000);
            f.insert(&key(s));
        }
        assert_eq!(f.evicted.load(Relaxed), 0);
        f.tick(9_000_000_000);
        assert!(f.hit(&key(0)), "seen again now: the most recent");
        f.insert(&key(100));
        assert_eq!(f.evicted.load(Relaxed), 1);
        assert!(!f.hit(&key(1)), "the least recently seen went");
        assert!(f.hit(&key(0)) && f.hit(&key(100)) && f.hit(&key(7)));
        assert_eq!(format!("{f:?}"), "Flows { slots: 8 }");
    }

    #[test]
    fn a_logging_table_accounts_allowed_and_denied_flows_apart() {
        let f = Flows::logging(64, 8);
        f.tick(1_000_000_000);
        let rule: std::sync::Arc<str> = "web".into();
        let s = f.insert(&key(1));
        f.open(s, Opened { key: key(1), rule: Some(rule.clone()), allow: true });
        f.count(s, Dir::Forward, 100);
        f.count(s, Dir::Reverse, 60);
        for _ in 0..3 {
            f.deny(&key(2), Some(&rule), 70);
        }
        f.tick(20_000_000_000);
        let mut out = Vec::new();
        f.sweep(10, 60, &mut |r| out.push(r));
        out.sort_by_key(|r| r.opened.allow);
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].opened.allow, out[0].packets, out[0].bytes), (false, [3, 0], [210, 0]));
        assert_eq!((out[1].opened.allow, out[1].packets, out[1].bytes), (true, [1, 1], [100, 60]));
        assert_eq!(out[1].opened.rule.as_deref(), Some("web"));
        assert_eq!(f.overflow(), 0);
        let plain = Flows::new(8);
        plain.deny(&key(2), None, 70);
        plain.count(3, Dir::Forward, 70);
        plain.open(3, Opened { key: key(3), rule: None, allow: true });
        plain.sweep(0, 0, &mut |_| panic!("no log, no records"));
        assert!(!plain.logs() && f.logs());
    }

    #[test]
    fn a_guest_retrying_many_denied_flows_fills_only_the_denied_table_and_the_rest_is_counted() {
        // The control: as many denied flows as the table has slots, each
        // kept and recorded, nothing lost.
        let f = Flows::logging(64, 8);
        f.tick(1_000_000_000);
        let one = |sport: u16| FlowKey { dport: sport, ..key(sport) };
        for s in 0..8 {
            f.deny(&one(s), None, 60);
        }
        assert_eq!(f.overflow(), 0);
        // A flood of new denied flows: the table stays 8 slots, what it
        // could not keep is counted, and the allowed flows' table is untouched.
        let g = Flows::logging(64, 8);
        g.tick(1_000_000_000);
        for s in 0..10_000 {
            g.deny(&one(s), None, 60);
        }
        assert!(g.overflow() >= 10_000 - 8, "{}", g.overflow());
        g.tick(30_000_000_000);
        let mut n = 0;
        g.sweep(10, 60, &mut |r| {
            assert!(!r.opened.allow);
            n += 1;
        });
        assert!(n <= 8, "{n} records: at most the table's slots");
        f.tick(30_000_000_000);
        let mut m = 0;
        f.sweep(10, 60, &mut |_| m += 1);
        assert_eq!(m, 8);
    }
}
