//! A per-worker route cache: a fixed, direct-mapped array of decisions.
//!
//! No allocation after construction and no sharing: each data-path worker
//! owns one. Entries are tagged with the generation of the table that made
//! them, so publishing a new table invalidates every entry at once without
//! touching them.

use crate::table::{Decision, Port, RouteTable};
use core::hash::{Hash, Hasher};
use rustc_hash::FxHasher;
use vnet_wire::MacAddr;

/// Decisions with more ports than this are not cached (recomputed each time).
pub const MAX_CACHED_FANOUT: usize = 8;

#[derive(Clone, Copy)]
struct Entry {
    generation: u64,
    ingress: Port,
    src: MacAddr,
    dst: MacAddr,
    n: u8,
    dests: [Decision; MAX_CACHED_FANOUT],
}

/// Hit and miss counts of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
}

/// See the module documentation.
pub struct RouteCache {
    entries: Box<[Entry]>,
    mask: usize,
    stats: CacheStats,
}

impl RouteCache {
    /// A cache of `slots` entries, rounded up to a power of two.
    pub fn new(slots: usize) -> Self {
        let n = slots.max(1).next_power_of_two();
        let empty = Entry {
            generation: u64::MAX,
            ingress: Port::Interface(u32::MAX),
            src: MacAddr::ZERO,
            dst: MacAddr::ZERO,
            n: 0,
            dests: [(Port::Interface(0), 0); MAX_CACHED_FANOUT],
        };
        RouteCache { entries: vec![empty; n].into_boxed_slice(), mask: n - 1, stats: CacheStats::default() }
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The decision for a frame, from the cache or from `table`. The result
    /// is written to `out` (cleared first).
    pub fn lookup(
        &mut self,
        table: &RouteTable,
        ingress: Port,
        src: MacAddr,
        dst: MacAddr,
        out: &mut Vec<Decision>,
    ) {
        let mut h = FxHasher::default();
        (ingress, src, dst).hash(&mut h);
        let e = &mut self.entries[h.finish() as usize & self.mask];
        if e.generation == table.generation() && e.ingress == ingress && e.src == src && e.dst == dst {
            self.stats.hits += 1;
            out.clear();
            out.extend_from_slice(&e.dests[..e.n as usize]);
            return;
        }
        self.stats.misses += 1;
        table.lookup(ingress, src, dst, out);
        if out.len() <= MAX_CACHED_FANOUT {
            e.generation = table.generation();
            e.ingress = ingress;
            e.src = src;
            e.dst = dst;
            e.n = out.len() as u8;
            e.dests[..out.len()].copy_from_slice(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::MacSpec::*;
    use crate::table::{Route, SourceFilter};

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    #[test]
    fn hit_after_miss_and_invalidated_by_new_generation() {
        let t1 = RouteTable::new(1, vec![Route::new(0, Any, Addr(mac(2)), Port::Link(0), SourceFilter::Any)]);
        let mut c = RouteCache::new(16);
        let mut out = Vec::with_capacity(8);
        c.lookup(&t1, Port::Interface(0), mac(1), mac(2), &mut out);
        c.lookup(&t1, Port::Interface(0), mac(1), mac(2), &mut out);
        assert_eq!(out, vec![(Port::Link(0), 0)]);
        assert_eq!(c.stats(), CacheStats { hits: 1, misses: 1 });

        // The route moves to link 1: the cached decision must not survive.
        let t2 = RouteTable::new(2, vec![Route::new(0, Any, Addr(mac(2)), Port::Link(1), SourceFilter::Any)]);
        c.lookup(&t2, Port::Interface(0), mac(1), mac(2), &mut out);
        assert_eq!(out, vec![(Port::Link(1), 0)]);
        assert_eq!(c.stats().misses, 2);

        // A deleted route stops traffic at once.
        let t3 = RouteTable::new(3, vec![]);
        c.lookup(&t3, Port::Interface(0), mac(1), mac(2), &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn wide_fanout_is_correct_uncached() {
        let b = MacAddr::BROADCAST;
        let routes = (0..20).map(|i| Route::new(i, Any, Addr(b), Port::Link(i), SourceFilter::Any)).collect();
        let t = RouteTable::new(1, routes);
        let mut c = RouteCache::new(4);
        let mut out = Vec::new();
        for _ in 0..3 {
            c.lookup(&t, Port::Interface(0), mac(1), b, &mut out);
            assert_eq!(out.len(), 20);
        }
    }

    #[test]
    fn colliding_keys_do_not_confuse() {
        let t = RouteTable::new(
            1,
            (1..=40u8)
                .map(|i| Route::new(i as u32, Any, Addr(mac(i)), Port::Link(i as u32), SourceFilter::Any))
                .collect(),
        );
        let mut c = RouteCache::new(2); // forces collisions
        let mut out = Vec::new();
        for round in 0..3 {
            for i in 1..=40u8 {
                c.lookup(&t, Port::Interface(0), mac(100), mac(i), &mut out);
                assert_eq!(out, vec![(Port::Link(i as u32), i as u32 - 1)], "round {round}");
            }
        }
    }
}
