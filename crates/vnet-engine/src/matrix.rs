//! Who talks to whom on the user path: frames and bytes per (source MAC,
//! destination MAC) pair this host forwarded, in bounded memory.
//!
//! A fixed table of [`SLOTS`] pairs, shared by every worker and counted
//! into with atomics, as the route and port counters are: a frame's pair is
//! found by a hash of its two MACs and at most [`PROBES`] slots of linear
//! probing; an empty slot is claimed by compare-and-swap of that hash. A
//! pair that finds no slot (the table holds [`SLOTS`] pairs already) is
//! counted in [`Matrix::other`], so nothing a guest sends can make vnetd
//! hold more, and the totals always add up. Nothing is allocated per frame.
//!
//! The hash is keyed with a random key of the process (SipHash, std's
//! `RandomState`): a guest that cannot know the key cannot choose MAC pairs
//! that land on a victim's slots, or share its 64-bit hash (two pairs of one
//! hash would share a slot). And pairs leave: [`Matrix::sweep`], called
//! once a second, frees the slot of a pair that sent nothing for
//! [`IDLE_SWEEPS`] sweeps, its counts kept in `other`, so MACs a guest
//! varies fill the table for a minute, not for the life of the process.
//!
//! Written here rather than with a concurrent map crate: it is on the data
//! path, per frame, and must neither allocate nor lock.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use vnet_wire::MacAddr;

/// Pairs the table holds.
pub const SLOTS: usize = 4096;
/// Slots a pair may be looked for in.
pub const PROBES: usize = 8;
/// Sweeps (seconds) a pair may stay idle before its slot is freed.
pub const IDLE_SWEEPS: u64 = 60;

/// A slot's key while a sweep frees it: no pair's (their keys are odd).
const FREEING: u64 = 2;

/// A cache line of its own: two workers counting two pairs (a flow's data
/// and its acknowledgements) never share one.
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    /// The pair's hash (0: empty).
    key: AtomicU64,
    src: AtomicU64,
    dst: AtomicU64,
    frames: AtomicU64,
    bytes: AtomicU64,
    /// The sweeps' own: `frames` at the last sweep, and sweeps since it changed.
    seen: AtomicU64,
    quiet: AtomicU64,
}

/// One pair's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    pub src: MacAddr,
    pub dst: MacAddr,
    pub frames: u64,
    pub bytes: u64,
}

/// The table.
pub struct Matrix {
    slots: Box<[Slot]>,
    /// The hash's key: random, one per table.
    key: std::collections::hash_map::RandomState,
    other_frames: AtomicU64,
    other_bytes: AtomicU64,
    /// Pairs whose slots sweeps freed.
    evicted: AtomicU64,
}

impl Default for Matrix {
    fn default() -> Self {
        Matrix {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            key: std::collections::hash_map::RandomState::new(),
            other_frames: AtomicU64::new(0),
            other_bytes: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matrix").field("pairs", &self.pairs().len()).finish()
    }
}

fn mac_u64(m: MacAddr) -> u64 {
    m.0.iter().fold(0u64, |a, b| a << 8 | u64::from(*b))
}

fn u64_mac(v: u64) -> MacAddr {
    let b = v.to_be_bytes();
    MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl Matrix {
    /// The pair's keyed 64-bit hash, odd (never 0 or [`FREEING`]).
    fn hash(&self, src: u64, dst: u64) -> u64 {
        use std::hash::BuildHasher;
        self.key.hash_one((src, dst)) | 1
    }

    /// Counts one frame of `len` bytes from `src` to `dst`.
    #[inline]
    pub fn count(&self, src: MacAddr, dst: MacAddr, len: usize) {
        let (s, d) = (mac_u64(src), mac_u64(dst));
        let h = self.hash(s, d);
        for i in 0..PROBES {
            let slot = &self.slots[(h as usize).wrapping_add(i) % SLOTS];
            let mut k = slot.key.load(Relaxed);
            if k == 0 {
                match slot.key.compare_exchange(0, h, Relaxed, Relaxed) {
                    Ok(_) => {
                        slot.src.store(s, Relaxed);
                        slot.dst.store(d, Relaxed);
                        k = h;
                    }
                    Err(now) => k = now,
                }
            }
            if k == h {
                slot.frames.fetch_add(1, Relaxed);
                slot.bytes.fetch_add(len as u64, Relaxed);
                return;
            }
        }
        self.other_frames.fetch_add(1, Relaxed);
        self.other_bytes.fetch_add(len as u64, Relaxed);
    }

    /// Every pair counted (in no order).
    pub fn pairs(&self) -> Vec<Pair> {
        self.slots
            .iter()
            .filter(|s| s.key.load(Relaxed) != 0)
            .map(|s| Pair {
                src: u64_mac(s.src.load(Relaxed)),
                dst: u64_mac(s.dst.load(Relaxed)),
                frames: s.frames.load(Relaxed),
                bytes: s.bytes.load(Relaxed),
            })
            // A slot claimed a moment ago, its MACs not yet written.
            .filter(|p| p.frames > 0 && (p.src != MacAddr([0; 6]) || p.dst != MacAddr([0; 6])))
            .collect()
    }

    /// Frames and bytes of pairs the table had no room for, and of pairs
    /// whose slots were freed.
    pub fn other(&self) -> (u64, u64) {
        (self.other_frames.load(Relaxed), self.other_bytes.load(Relaxed))
    }

    /// Pairs whose slots sweeps have freed.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }

    /// Frees the slots of pairs idle for [`IDLE_SWEEPS`] sweeps (call once
    /// a second, from one thread); their counts move to `other`. A worker
    /// that matched the slot just before it was freed may count a frame
    /// into it after: that frame goes to the slot's next pair, and the
    /// totals still add up.
    pub fn sweep(&self) {
        for slot in self.slots.iter() {
            let k = slot.key.load(Relaxed);
            if k == 0 || k == FREEING {
                continue;
            }
            let f = slot.frames.load(Relaxed);
            if slot.seen.swap(f, Relaxed) != f {
                slot.quiet.store(0, Relaxed);
                continue;
            }
            if slot.quiet.fetch_add(1, Relaxed) + 1 < IDLE_SWEEPS {
                continue;
            }
            if slot.key.compare_exchange(k, FREEING, Relaxed, Relaxed).is_err() {
                continue;
            }
            self.other_frames.fetch_add(slot.frames.swap(0, Relaxed), Relaxed);
            self.other_bytes.fetch_add(slot.bytes.swap(0, Relaxed), Relaxed);
            slot.src.store(0, Relaxed);
            slot.dst.store(0, Relaxed);
            slot.seen.store(0, Relaxed);
            slot.quiet.store(0, Relaxed);
            self.evicted.fetch_add(1, Relaxed);
            slot.key.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u32) -> MacAddr {
        let b = i.to_be_bytes();
        MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
    }

    #[test]
    fn pairs_add_up_and_a_full_table_counts_the_rest_as_other() {
        let m = Matrix::default();
        m.count(mac(1), mac(2), 100);
        m.count(mac(1), mac(2), 50);
        m.count(mac(2), mac(1), 60);
        let mut p = m.pairs();
        p.sort_by_key(|p| p.bytes);
        assert_eq!(
            p,
            vec![
                Pair { src: mac(2), dst: mac(1), frames: 1, bytes: 60 },
                Pair { src: mac(1), dst: mac(2), frames: 2, bytes: 150 },
            ]
        );
        // Far more pairs than slots: the table holds at most SLOTS, and
        // every frame is somewhere.
        let n = 3 * SLOTS as u32;
        for i in 0..n {
            m.count(mac(10 + i), mac(9), 10);
        }
        let pairs = m.pairs();
        assert!(pairs.len() <= SLOTS, "{}", pairs.len());
        let (of, ob) = m.other();
        let frames: u64 = pairs.iter().map(|p| p.frames).sum::<u64>() + of;
        let bytes: u64 = pairs.iter().map(|p| p.bytes).sum::<u64>() + ob;
        assert_eq!((frames, bytes), (u64::from(n) + 3, u64::from(n) * 10 + 210));
        assert!(of > 0);
    }

    #[test]
    fn idle_pairs_leave_and_their_counts_stay_in_other() {
        let m = Matrix::default();
        m.count(mac(1), mac(2), 100);
        m.count(mac(3), mac(4), 10);
        for s in 0..IDLE_SWEEPS {
            m.count(mac(1), mac(2), 100);
            m.sweep();
            assert_eq!(m.pairs().len(), 2, "sweep {s}: nothing idle long enough yet");
        }
        assert_eq!(m.evicted(), 0);
        m.count(mac(1), mac(2), 100);
        m.sweep();
        let p = m.pairs();
        assert_eq!(
            (p.len(), p[0].src, m.evicted()),
            (1, mac(1), 1),
            "the idle pair left, the busy one stayed"
        );
        assert_eq!(m.other(), (1, 10), "the idle pair's counts are in other");
        // A guest varying its MACs: the table empties again once they stop.
        for i in 0..2 * SLOTS as u32 {
            m.count(mac(100 + i), mac(2), 1);
        }
        assert!(m.pairs().len() > SLOTS / 2);
        for _ in 0..=IDLE_SWEEPS {
            m.sweep();
        }
        assert!(m.pairs().is_empty(), "{}", m.pairs().len());
        assert!(m.evicted() > 1 + SLOTS as u64 / 2, "{}", m.evicted());
        m.count(mac(100), mac(2), 1);
        assert_eq!(m.pairs().len(), 1, "a freed slot is claimed again");
    }

    #[test]
    fn the_hash_is_keyed_per_table_and_odd() {
        let (a, b) = (Matrix::default(), Matrix::default());
        let (s, d) = (mac_u64(mac(1)), mac_u64(mac(2)));
        assert_ne!(a.hash(s, d), b.hash(s, d), "two tables, two keys");
        assert_eq!(a.hash(s, d), a.hash(s, d));
        // Odd: never an empty slot's key (0) or a freeing one's.
        assert!((0..200).all(|i| a.hash(s, i) & 1 == 1));
        assert_eq!(format!("{a:?}"), "Matrix { pairs: 0 }");
        a.count(mac(1), mac(2), 1);
        assert_eq!(format!("{a:?}"), "Matrix { pairs: 1 }");
    }

    #[test]
    fn a_slot_claimed_but_not_yet_written_is_no_pair_and_a_zero_mac_is_one() {
        let m = Matrix::default();
        let zero = MacAddr([0; 6]);
        m.count(zero, mac(2), 10);
        m.count(mac(1), zero, 20);
        // A worker between claiming a slot and writing it: its key set,
        // then the MACs, then the counts.
        let claimed = |k: usize, macs: bool, frames: u64| {
            let s = &m.slots[k];
            s.key.store(0x1001, Relaxed);
            if macs {
                s.src.store(mac_u64(mac(7)), Relaxed);
                s.dst.store(mac_u64(mac(8)), Relaxed);
            }
            s.frames.store(frames, Relaxed);
        };
        let free = (0..SLOTS).filter(|&k| m.slots[k].key.load(Relaxed) == 0);
        let free: Vec<usize> = free.take(2).collect();
        claimed(free[0], false, 0);
        claimed(free[1], true, 0);
        let mut p = m.pairs();
        p.sort_by_key(|p| p.bytes);
        let want = vec![
            Pair { src: zero, dst: mac(2), frames: 1, bytes: 10 },
            Pair { src: mac(1), dst: zero, frames: 1, bytes: 20 },
        ];
        assert_eq!(p, want);
        // Counted, MACs not yet written: not listed either.
        claimed(free[1], false, 0);
        m.slots[free[1]].src.store(0, Relaxed);
        m.slots[free[1]].dst.store(0, Relaxed);
        m.slots[free[1]].frames.store(1, Relaxed);
        assert_eq!(m.pairs().len(), 2);
    }

    #[test]
    fn workers_counting_at_once_lose_nothing() {
        let m = std::sync::Arc::new(Matrix::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u32 {
                        m.count(mac(i % 7), mac(100 + t % 2), 3);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let total: u64 = m.pairs().iter().map(|p| p.frames).sum::<u64>() + m.other().0;
        assert_eq!(total, 40_000);
        assert_eq!(m.pairs().len(), 14);
    }
}
