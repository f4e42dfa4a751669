//! Bounded-memory reassembly of `vnet` fragments.
//!
//! A peer decides how many fragments it sends us, in what order, and whether
//! it ever finishes a frame; none of that may make us hold more memory. So
//! the reassembler owns a fixed pool of `slots` buffers, each `max_frame`
//! bytes, allocated once in [`Reassembler::new`]. A frame in progress takes a
//! slot; it is freed when the frame completes, when it is older than the
//! timeout, or when every slot is busy and a new frame arrives (the oldest
//! is evicted). Memory is therefore `slots * max_frame` plus a few words per
//! slot, whatever arrives.
//!
//! Received ranges are kept as a short list of disjoint intervals. Duplicate
//! and overlapping fragments are accepted (later bytes overwrite earlier
//! ones); a frame whose fragments leave more than `MAX_GAPS` holes, or whose
//! fragments disagree on the frame length, is dropped.
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
}

impl Default for Config {
    fn default() -> Self {
        Config { slots: 64, max_frame: crate::vnet::MAX_FRAME_LEN as usize, timeout_ns: 1_000_000_000 }
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
        let idx =
            match self.slots.iter().position(|s| s.busy && s.source == source && s.frame_id == repr.frame_id)
            {
                Some(i) => {
                    if self.slots[i].frame_len != repr.frame_len {
                        self.slots[i].busy = false;
                        self.stats.inconsistent += 1;
                        return Outcome::Dropped;
                    }
                    i
                }
                None => {
                    let i = match self.slots.iter().position(|s| !s.busy) {
                        Some(i) => i,
                        None => {
                            // Every slot busy: evict the oldest frame.
                            let i = self
                                .slots
                                .iter()
                                .enumerate()
                                .min_by_key(|(_, s)| s.started_ns)
                                .map(|(i, _)| i)
                                .unwrap_or(0);
                            self.stats.evicted += 1;
                            i
                        }
                    };
                    let s = &mut self.slots[i];
                    s.busy = true;
                    s.source = source;
                    s.frame_id = repr.frame_id;
                    s.frame_len = repr.frame_len;
                    s.started_ns = now_ns;
                    s.n = 0;
                    i
                }
            };
        let s = &mut self.slots[idx];
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
        Reassembler::new(Config { slots: 4, max_frame: 70_000, timeout_ns: 1000 })
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
            let mut r = Reassembler::new(Config { slots: 2, max_frame: 20_000, timeout_ns: u64::MAX });
            let mut completions = 0;
            for &(o, l) in &pieces {
                if let Outcome::Complete(b) = r.push(0, 1, &repr(1, len as u32, o as u32), &f[o..o + l]) {
                    prop_assert_eq!(b, &f[..]);
                    completions += 1;
                }
            }
            // Duplicates arriving after completion start a new partial frame, never a second completion
            // unless they alone cover the frame.
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
