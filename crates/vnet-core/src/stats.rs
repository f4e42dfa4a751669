//! Packet, byte and drop counters shared between the data path and control.
//!
//! Counters are relaxed atomics: each is exact on its own, and a reader may
//! see one a frame ahead of another. They live behind `Arc`s held by the
//! control plane, so a route or port keeps its counts across table rebuilds.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one route, link or interface, in one direction.
#[derive(Debug, Default)]
pub struct Counters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    pub drops: AtomicU64,
}

/// A plain copy of [`Counters`] for display.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
}

impl Counters {
    #[inline]
    pub fn add(&self, bytes: usize) {
        self.packets.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes as u64, Relaxed);
    }
    /// `packets` frames of `bytes` bytes in all (a batch counted at once:
    /// two atomic adds, not two a frame).
    #[inline]
    pub fn add_many(&self, packets: u64, bytes: u64) {
        if packets > 0 {
            self.packets.fetch_add(packets, Relaxed);
            self.bytes.fetch_add(bytes, Relaxed);
        }
    }
    #[inline]
    pub fn drop_one(&self) {
        self.drops.fetch_add(1, Relaxed);
    }
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            packets: self.packets.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            drops: self.drops.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_frames_batches_and_drops_and_a_batch_of_none_counts_nothing() {
        let c = Counters::default();
        c.add(100);
        c.add(60);
        c.add_many(3, 900);
        c.add_many(0, 500);
        c.drop_one();
        assert_eq!(c.snapshot(), Snapshot { packets: 5, bytes: 1060, drops: 1 });
    }
}
