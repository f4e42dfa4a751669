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
//! Two pairs of the same 64-bit hash would share a slot (with 4096 pairs,
//! a chance of about one in 10^12).
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
    other_frames: AtomicU64,
    other_bytes: AtomicU64,
}

impl Default for Matrix {
    fn default() -> Self {
        Matrix {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            other_frames: AtomicU64::new(0),
            other_bytes: AtomicU64::new(0),
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

/// A 64-bit hash of the pair, never 0 (splitmix64's finaliser).
fn hash(src: u64, dst: u64) -> u64 {
    let mut z = src.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ dst.rotate_left(29);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

impl Matrix {
    /// Counts one frame of `len` bytes from `src` to `dst`.
    #[inline]
    pub fn count(&self, src: MacAddr, dst: MacAddr, len: usize) {
        let (s, d) = (mac_u64(src), mac_u64(dst));
        let h = hash(s, d);
        let start = h as usize % SLOTS;
        for i in 0..PROBES {
            let slot = &self.slots[(start + i) % SLOTS];
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

    /// Frames and bytes of pairs the table had no room for.
    pub fn other(&self) -> (u64, u64) {
        (self.other_frames.load(Relaxed), self.other_bytes.load(Relaxed))
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
