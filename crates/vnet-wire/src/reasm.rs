//! Bounded-memory reassembly of `vnet` fragments.
//!
//! A peer decides how many fragments it sends us, in what order, and whether
//! it ever finishes a frame; none of that may make us hold more memory. So
//! the reassembler owns a fixed pool of `slots` buffers, each `max_frame`
//! bytes, allocated once in [`Reassembler::new`]. A frame in progress takes a
//! slot; it is freed when the frame completes, when it is older than the
//! timeout, or when a new frame needs its slot. Memory is therefore
//! `slots * max_frame` plus a few words per slot, whatever arrives.
//!
//! One sender (a link) holds at most `per_source` slots: its next new frame
//! evicts its own oldest, so a flood on one link (or spoofed datagrams in
//! its name) cannot take the slots of frames arriving on the others. When
//! every slot is busy, the oldest frame of the sender holding the most
//! slots makes room.
//!
//! Received ranges are kept as a short list of disjoint intervals. Duplicate
//! and overlapping fragments are accepted only when the bytes they share
//! with what was received agree: a fragment that would change received
//! bytes drops the frame (`conflicting`), so nobody can splice bytes into a
//! frame by resending a range. A frame whose fragments leave more than
//! `MAX_GAPS` holes, or disagree on the frame length or flags, is dropped.
//!
//! Time is a caller-supplied monotonic count of nanoseconds.

use crate::vnet::VnetRepr;

/// Most disjoint received ranges one frame may have before it is dropped.
pub const MAX_GAPS: usize = 32;

/// Sizing of a [`Reassembler`].
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Frames that may be in progress at once.
    pub slots: usize,
    /// Largest frame accepted, in bytes.
    pub max_frame: usize,
    /// A frame not completed within this many nanoseconds is dropped.
    pub timeout_ns: u64,
    /// Slots one sender may hold at once (at least 1, at most `slots`).
    pub per_source: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slots: 64,
            max_frame: crate::vnet::MAX_CARRIED_LEN as usize,
            timeout_ns: 1_000_000_000,
            per_source: 32,
        }
    }
}

/// What reassembly did with the frames it was given. Every fragment that
/// does not end in a completed frame is accounted for in one of these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub fragments: u64,
    pub completed: u64,
    pub timed_out: u64,
    pub evicted: u64,
    pub too_large: u64,
    pub inconsistent: u64,
    pub too_fragmented: u64,
    /// Frames dropped because a fragment disagreed with bytes received before.
    pub conflicting: u64,
}

impl Stats {
    /// Frames (or lone fragments) refused for what they carried.
    pub fn rejected(&self) -> u64 {
        self.too_large + self.inconsistent + self.too_fragmented + self.conflicting
    }
}

/// The result of one [`Reassembler::push`].
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// The frame is whole; the slice is valid until the next call, and may
    /// be changed in place (to finish a checksum, say).
    Complete(&'a mut [u8]),
    /// Stored; more fragments are needed.
    Pending,
    /// The fragment (and possibly its frame) was dropped; counted in stats.
    Dropped,
}

#[derive(Debug)]
struct Slot {
    busy: bool,
    source: u64,
    frame_id: u32,
    frame_len: u32,
    flags: u8,
    started_ns: u64,
    gaps: [(u32, u32); MAX_GAPS],
    n: usize,
    buf: Box<[u8]>,
}

impl Slot {
    /// Adds `[start, end)` to the received set. False if it would need more
    /// than `MAX_GAPS` disjoint ranges.
    fn add_range(&mut self, start: u32, end: u32) -> bool {
        let (mut s, mut e) = (start, end);
        let mut w = 0;
        let mut inserted = false;
        let mut tmp = [(0u32, 0u32); MAX_GAPS + 1];
        for i in 0..self.n {
            let (a, b) = self.gaps[i];
            if b < s {
                tmp[w] = (a, b);
                w += 1;
            } else if a > e {
                if !inserted {
                    tmp[w] = (s, e);
                    w += 1;
                    inserted = true;
                }
                tmp[w] = (a, b);
                w += 1;
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        if !inserted {
            tmp[w] = (s, e);
            w += 1;
        }
        if w > MAX_GAPS {
            return false;
        }
        self.gaps[..w].copy_from_slice(&tmp[..w]);
        self.n = w;
        true
    }

    fn complete(&self) -> bool {
        self.n == 1 && self.gaps[0] == (0, self.frame_len)
    }

    /// Whether `payload`, placed at `start`, agrees with every byte already
    /// received that it overlaps.
    fn agrees(&self, start: u32, payload: &[u8]) -> bool {
        let end = start as usize + payload.len();
        self.gaps[..self.n].iter().all(|&(a, b)| {
            let (lo, hi) = ((a as usize).max(start as usize), (b as usize).min(end));
            lo >= hi || self.buf[lo..hi] == payload[lo - start as usize..hi - start as usize]
        })
    }
}

/// Reassembles fragmented `vnet` frames in a fixed pool of buffers.
#[derive(Debug)]
pub struct Reassembler {
    cfg: Config,
    slots: Vec<Slot>,
    stats: Stats,
}

impl Reassembler {
    /// Allocates the whole pool now; nothing is allocated later.
    pub fn new(cfg: Config) -> Self {
        let slots = (0..cfg.slots.max(1))
            .map(|_| Slot {
                busy: false,
                source: 0,
                frame_id: 0,
                frame_len: 0,
                flags: 0,
                started_ns: 0,
                gaps: [(0, 0); MAX_GAPS],
                n: 0,
                buf: vec![0u8; cfg.max_frame].into_boxed_slice(),
            })
            .collect();
        Reassembler { cfg, slots, stats: Stats::default() }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Bytes held by the pool; constant for the reassembler's life.
    pub fn memory(&self) -> usize {
        self.slots.len() * (self.cfg.max_frame + core::mem::size_of::<Slot>())
    }

    /// Frames in progress.
    pub fn in_progress(&self) -> usize {
        self.slots.iter().filter(|s| s.busy).count()
    }

    /// Drops frames older than the timeout.
    pub fn expire(&mut self, now_ns: u64) {
        for s in self.slots.iter_mut() {
            if s.busy && now_ns.saturating_sub(s.started_ns) > self.cfg.timeout_ns {
                s.busy = false;
                self.stats.timed_out += 1;
            }
        }
    }

    /// Slots held by `source`.
    fn held_by(&self, source: u64) -> usize {
        self.slots.iter().filter(|s| s.busy && s.source == source).count()
    }

    /// The oldest frame in progress of `source`.
    fn oldest_of(&self, source: u64) -> Option<usize> {
        let mine = self.slots.iter().enumerate().filter(|(_, s)| s.busy && s.source == source);
        mine.min_by_key(|(_, s)| s.started_ns).map(|(i, _)| i)
    }

    /// The slot a new frame from `source` takes, evicting a frame if it must.
    fn slot_for(&mut self, source: u64) -> usize {
        let cap = self.cfg.per_source.clamp(1, self.slots.len());
        let victim = if self.held_by(source) >= cap {
            // The sender's share is used up: its own oldest frame goes.
            self.oldest_of(source)
        } else if let Some(i) = self.slots.iter().position(|s| !s.busy) {
            return i;
        } else {
            // Every slot busy: the greediest sender's oldest frame goes.
            let greediest = self.slots.iter().map(|s| s.source).max_by_key(|&src| self.held_by(src));
            greediest.and_then(|src| self.oldest_of(src))
        };
        self.stats.evicted += 1;
        victim.unwrap_or(0)
    }

    /// Takes one fragment of frame `repr.frame_id` from `source` (any number
    /// that names the sender, such as a link id).
    pub fn push(&mut self, now_ns: u64, source: u64, repr: &VnetRepr, payload: &[u8]) -> Outcome<'_> {
        self.stats.fragments += 1;
        let flen = repr.frame_len as usize;
        let end = repr.offset as usize + payload.len();
        if flen > self.cfg.max_frame || end > flen || payload.is_empty() {
            self.stats.too_large += 1;
            return Outcome::Dropped;
        }
        self.expire(now_ns);
        let found =
            self.slots.iter().position(|s| s.busy && s.source == source && s.frame_id == repr.frame_id);
        let idx = match found {
            Some(i) => {
                if self.slots[i].frame_len != repr.frame_len || self.slots[i].flags != repr.flags.0 {
                    self.slots[i].busy = false;
                    self.stats.inconsistent += 1;
                    return Outcome::Dropped;
                }
                i
            }
            None => {
                let i = self.slot_for(source);
                let s = &mut self.slots[i];
                s.busy = true;
                s.source = source;
                s.frame_id = repr.frame_id;
                s.frame_len = repr.frame_len;
                s.flags = repr.flags.0;
                s.started_ns = now_ns;
                s.n = 0;
                i
            }
        };
        let s = &mut self.slots[idx];
        if !s.agrees(repr.offset, payload) {
            s.busy = false;
            self.stats.conflicting += 1;
            return Outcome::Dropped;
        }
        s.buf[repr.offset as usize..end].copy_from_slice(payload);
        if !s.add_range(repr.offset, end as u32) {
            s.busy = false;
            self.stats.too_fragmented += 1;
            return Outcome::Dropped;
        }
        if s.complete() {
            s.busy = false;
            self.stats.completed += 1;
            return Outcome::Complete(&mut s.buf[..flen]);
        }
        Outcome::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vnet::Flags;
    use proptest::prelude::*;

    fn repr(id: u32, len: u32, off: u32) -> VnetRepr {
        VnetRepr { flags: Flags(0), network: 0, frame_id: id, frame_len: len, offset: off }
    }

    fn frame(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn small() -> Reassembler {
        Reassembler::new(Config { slots: 4, max_frame: 70_000, timeout_ns: 1000, per_source: 4 })
    }

    /// Feeds pieces `(off, len)` of `f` and returns the completed frame.
    fn feed(r: &mut Reassembler, id: u32, f: &[u8], pieces: &[(usize, usize)]) -> Option<Vec<u8>> {
        let mut done = None;
        for &(o, l) in pieces {
            if let Outcome::Complete(b) = r.push(0, 1, &repr(id, f.len() as u32, o as u32), &f[o..o + l]) {
                done = Some(b.to_vec());
            }
        }
        done
    }

    #[test]
    fn rejected_counts_each_refusal() {
        let s =
            Stats { too_large: 1, inconsistent: 2, too_fragmented: 4, conflicting: 8, ..Stats::default() };
        assert_eq!(s.rejected(), 15);
    }

    /// A frame of exactly the largest size is taken; one byte more is too
    /// large.
    #[test]
    fn the_largest_frame_is_taken_and_one_byte_more_refused() {
        let mut r = Reassembler::new(Config { slots: 4, max_frame: 3000, timeout_ns: 1000, per_source: 4 });
        let f = frame(3000);
        assert_eq!(feed(&mut r, 1, &f, &[(0, 1500), (1500, 1500)]), Some(f));
        let g = frame(3001);
        assert_eq!(feed(&mut r, 2, &g, &[(0, 1500), (1500, 1501)]), None);
        assert_eq!((r.stats().too_large, r.stats().fragments, r.stats().completed), (2, 4, 1));
    }

    #[test]
    fn in_order() {
        let f = frame(3000);
        let mut r = small();
        assert_eq!(feed(&mut r, 1, &f, &[(0, 1452), (1452, 1452), (2904, 96)]), Some(f));
        assert_eq!(r.in_progress(), 0);
    }

    #[test]
    fn reordered_duplicated_overlapping() {
        let f = frame(5000);
        let mut r = small();
        let got = feed(&mut r, 2, &f, &[(4000, 1000), (0, 1000), (0, 1000), (500, 2000), (2400, 1700)]);
        assert_eq!(got, Some(f));
        assert_eq!(r.stats().completed, 1);
    }

    #[test]
    fn loss_then_timeout() {
        let f = frame(3000);
        let mut r = small();
        assert_eq!(feed(&mut r, 3, &f, &[(0, 1452), (2904, 96)]), None);
        assert_eq!(r.in_progress(), 1);
        r.expire(5000);
        assert_eq!(r.in_progress(), 0);
        assert_eq!(r.stats().timed_out, 1);
        // The late middle fragment starts a new (incomplete) frame, never a wrong one.
        assert_eq!(feed(&mut r, 3, &f, &[(1452, 1452)]), None);
    }

    #[test]
    fn interleaved_frames_and_sources() {
        let (a, b) = (frame(2000), frame(2100));
        let mut r = small();
        assert!(matches!(r.push(0, 1, &repr(9, 2000, 0), &a[..1000]), Outcome::Pending));
        assert!(matches!(r.push(0, 2, &repr(9, 2100, 0), &b[..1000]), Outcome::Pending));
        assert!(
            matches!(r.push(0, 2, &repr(9, 2100, 1000), &b[1000..]), Outcome::Complete(f) if *f == b[..])
        );
        assert!(
            matches!(r.push(0, 1, &repr(9, 2000, 1000), &a[1000..]), Outcome::Complete(f) if *f == a[..])
        );
    }

    #[test]
    fn inconsistent_length_drops() {
        let mut r = small();
        let f = frame(2000);
        r.push(0, 1, &repr(5, 2000, 0), &f[..1000]);
        assert_eq!(r.push(0, 1, &repr(5, 1900, 1000), &f[1000..1900]), Outcome::Dropped);
        assert_eq!(r.stats().inconsistent, 1);
    }

    #[test]
    fn too_many_gaps_drops() {
        let mut r = small();
        let f = frame(10_000);
        let mut last = Outcome::Pending;
        for i in 0..=MAX_GAPS {
            last = r.push(0, 1, &repr(6, 10_000, (i * 100) as u32), &f[i * 100..i * 100 + 10]);
        }
        assert_eq!(last, Outcome::Dropped);
        assert_eq!(r.stats().too_fragmented, 1);
    }

    #[test]
    fn flood_of_incomplete_frames_stays_bounded() {
        let mut r = small();
        let mem = r.memory();
        let f = frame(65_000);
        for id in 0..10_000u32 {
            r.push(u64::from(id), 1, &repr(id, 65_000, 0), &f[..1400]);
        }
        assert_eq!(r.memory(), mem);
        assert!(r.in_progress() <= 4);
        assert!(r.stats().evicted + r.stats().timed_out >= 9_996);
        // A real frame still gets through after the flood.
        let g = frame(3000);
        assert_eq!(feed(&mut r, 1_000_000, &g, &[(0, 1500), (1500, 1500)]), Some(g));
    }

    #[test]
    fn overlapping_fragment_that_changes_bytes_drops_the_frame() {
        // A spoofer resends a range of someone's frame with other bytes: the
        // frame is dropped, never delivered with the spliced bytes.
        let f = frame(3000);
        let mut r = small();
        assert_eq!(r.push(0, 1, &repr(7, 3000, 0), &f[..2000]), Outcome::Pending);
        let mut forged = f[1000..3000].to_vec();
        forged[500] ^= 0xff;
        assert_eq!(r.push(0, 1, &repr(7, 3000, 1000), &forged), Outcome::Dropped);
        assert_eq!(r.stats().conflicting, 1);
        assert_eq!(r.in_progress(), 0);
        // The same overlap with the same bytes is fine.
        assert_eq!(feed(&mut r, 8, &f, &[(0, 2000), (1000, 2000)]), Some(f));
    }

    #[test]
    fn fragments_disagreeing_on_flags_drop_the_frame() {
        let f = frame(3000);
        let mut r = small();
        assert_eq!(r.push(0, 1, &repr(7, 3000, 0), &f[..1500]), Outcome::Pending);
        let other = VnetRepr { flags: Flags(Flags::VNET_HDR), ..repr(7, 3000, 1500) };
        assert_eq!(r.push(0, 1, &other, &f[1500..]), Outcome::Dropped);
        assert_eq!(r.stats().inconsistent, 1);
    }

    #[test]
    fn one_source_cannot_take_the_others_slots() {
        // Source 1 floods partial frames; source 2's frame in progress
        // survives and completes.
        let mut r =
            Reassembler::new(Config { slots: 8, max_frame: 70_000, timeout_ns: u64::MAX, per_source: 2 });
        let g = frame(3000);
        assert_eq!(r.push(0, 2, &repr(1, 3000, 0), &g[..1500]), Outcome::Pending);
        let f = frame(65_000);
        for id in 0..10_000u32 {
            r.push(u64::from(id) + 1, 1, &repr(id, 65_000, 0), &f[..1400]);
        }
        assert!(r.held_by(1) <= 2);
        assert!(
            matches!(r.push(20_000, 2, &repr(1, 3000, 1500), &g[1500..]), Outcome::Complete(b) if *b == g[..])
        );
    }

    #[test]
    fn full_pool_evicts_the_greediest_sender() {
        let mut r =
            Reassembler::new(Config { slots: 4, max_frame: 70_000, timeout_ns: u64::MAX, per_source: 3 });
        let f = frame(3000);
        // Source 2 starts first (oldest), source 1 takes the other three.
        r.push(0, 2, &repr(1, 3000, 0), &f[..1000]);
        for id in 0..3 {
            r.push(1 + id, 1, &repr(id as u32, 3000, 0), &f[..1000]);
        }
        // A new sender arrives: source 1 (three slots) loses one, not source 2.
        r.push(10, 3, &repr(1, 3000, 0), &f[..1000]);
        assert_eq!(r.held_by(2), 1);
        assert_eq!(r.held_by(1), 2);
        assert_eq!(r.held_by(3), 1);
    }

    #[test]
    fn oversize_dropped() {
        let mut r = small();
        assert_eq!(r.push(0, 1, &repr(1, 80_000, 0), &[0; 10]), Outcome::Dropped);
        assert_eq!(r.stats().too_large, 1);
    }

    proptest! {
        /// Any permutation of a frame's fragments, with duplicates, yields the frame exactly once.
        #[test]
        fn any_order_reassembles(len in 1usize..20_000, nfrags in 1usize..=2 * MAX_GAPS, seed: u64, dups in 0usize..5) {
            // At most 2 * MAX_GAPS fragments can never leave more than MAX_GAPS holes.
            let chunk = len.div_ceil(nfrags);
            let f = frame(len);
            let mut pieces: Vec<(usize, usize)> = (0..len).step_by(chunk).map(|o| (o, chunk.min(len - o))).collect();
            for i in 0..dups { let p = pieces[(seed as usize + i) % pieces.len()]; pieces.push(p); }
            // Deterministic shuffle from the seed.
            let mut s = seed | 1;
            for i in (1..pieces.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                pieces.swap(i, (s % (i as u64 + 1)) as usize);
            }
            let mut r = Reassembler::new(Config { slots: 2, max_frame: 20_000, timeout_ns: u64::MAX, per_source: 2 });
            let mut completions = 0;
            // The model: a frame completes when the pieces since the last
            // completion cover it; duplicates after a completion start a
            // new frame, which completes only if they alone cover it.
            let all: std::collections::BTreeSet<usize> = pieces.iter().map(|p| p.0).collect();
            let mut covered = std::collections::BTreeSet::new();
            let mut expected = 0;
            for &(o, l) in &pieces {
                covered.insert(o);
                if covered == all {
                    expected += 1;
                    covered.clear();
                }
                if let Outcome::Complete(b) = r.push(0, 1, &repr(1, len as u32, o as u32), &f[o..o + l]) {
                    prop_assert_eq!(b, &f[..]);
                    completions += 1;
                }
                prop_assert_eq!(completions, expected, "after the piece at {}", o);
            }
            prop_assert!(completions >= 1);
        }

        #[test]
        fn random_input_never_panics(ops in proptest::collection::vec((0u32..4, 0u32..70_000, 0u32..70_000, 0usize..3000), 0..200)) {
            let mut r = small();
            let data = vec![0xabu8; 3000];
            for (i, (id, len, off, n)) in ops.into_iter().enumerate() {
                let _ = r.push(i as u64 * 10, u64::from(id % 2), &repr(id, len, off), &data[..n]);
            }
            prop_assert!(r.in_progress() <= 4);
        }
    }
}
