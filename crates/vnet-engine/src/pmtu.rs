//! Path MTU discovery for `vnet` links: packetization-layer probing as RFC
//! 8899 (DPLPMTUD) describes it, with no reliance on ICMP reaching us.
//!
//! Each `vnet` link starts at its configured `mtu`, as vnet always did (a
//! restarted or upgraded vnetd, or one whose peer answers no probes, sends
//! as before), and at once probes both it and [`BASE`] (1280 bytes of IP
//! packet, what every IPv6 path carries and in practice every IPv4 one):
//! a probe is a `vnet`
//! datagram (sealed, on a secured link) padded to the IP size probed, sent
//! with DF and ignoring the kernel's own PMTU cache (`IP_PMTUDISC_PROBE`),
//! which the peer answers with a small acknowledgement echoing its id.
//! Once the base passes, the search sends rounds of up to [`PARALLEL`]
//! probes at once, spread between the largest size acknowledged and the
//! smallest lost; a round ends when every probe is
//! answered or [`PROBE_TIMEOUT_NS`] passed, and the search when the two
//! are within [`STEP`] bytes: two rounds, about half a second, from 1280
//! to 1500. A probe lost by chance below a larger one answered costs
//! nothing; the largest passing size lost by chance leaves the link a
//! step lower until the next raise. The size in use ([`Pmtu::current`])
//! drops, to the largest size acknowledged, as soon as a probe of it (or
//! smaller) is lost, and rises only to a size acknowledged; frames are
//! fragmented to it (the user path), and the kernel path leaves what does
//! not fit to the user path. A path narrower than the configured `mtu`
//! loses the frames larger than it for one probe timeout after a start.
//!
//! Afterwards the size in use is confirmed every [`CONFIRM_NS`] (a path
//! that shrank, a black hole, is found when a confirmation is lost
//! [`MAX_PROBES`] times in a row: back to [`BASE`] and search again), and
//! a path below the configured `mtu` is searched upwards again every
//! [`RAISE_NS`]. A peer that answers no probe at [`BASE`] in
//! [`MAX_PROBES`] tries while it is heard from (a vnetd from before
//! probes) is taken at the configured `mtu`, as before, and probed again
//! every [`RAISE_NS`].
//!
//! Sans-IO: [`Pmtu::tick`] says which probes to send, [`Pmtu::acked`]
//! takes an answer; the link sends and receives.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Where every search starts: the IPv6 minimum MTU.
pub const BASE: u32 = 1280;
/// A probe unanswered after this long is lost.
pub const PROBE_TIMEOUT_NS: u64 = 250_000_000;
/// Base and confirmation probes lost in a row before the size is taken as
/// not passing.
pub const MAX_PROBES: u32 = 3;
/// Probes in one search round.
pub const PARALLEL: usize = 8;
/// The search stops when the largest size passing and the smallest not
/// are this close.
pub const STEP: u32 = 8;
/// The size in use is confirmed this often.
pub const CONFIRM_NS: u64 = 30_000_000_000;
/// A path below the configured MTU (or a peer that does not probe) is
/// tried upwards again this often (RFC 8899's PMTU_RAISE_TIMER).
pub const RAISE_NS: u64 = 600_000_000_000;
/// While the peer is not heard from, a base probe goes this often.
const IDLE_NS: u64 = 1_000_000_000;

/// Where the search is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Probing [`BASE`]: no size is known to pass yet.
    Base,
    /// Searching between the largest size known to pass and the smallest not.
    Search,
    /// Done: the size in use passes, confirmed now and then.
    Done,
    /// The peer answers no probe (a vnetd from before them): the configured
    /// MTU is used, as it always was.
    Unanswered,
}

impl Phase {
    pub fn word(self) -> &'static str {
        match self {
            Phase::Base => "base",
            Phase::Search => "searching",
            Phase::Done => "done",
            Phase::Unanswered => "unanswered",
        }
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    /// Largest size acknowledged; smallest size lost (`max + 1`: none, as
    /// always in the base and unanswered phases).
    low: u32,
    high: u32,
    /// The round in flight: (id, size) of each probe not yet answered.
    out: [Option<(u32, u32)>; PARALLEL],
    sent_ns: u64,
    /// Base or confirmation rounds lost in a row.
    misses: u32,
    /// No round before this.
    next_ns: u64,
    /// When to search upwards again.
    raise_ns: u64,
    next_id: u32,
}

/// One link's path MTU: the search and the size in use.
#[derive(Debug)]
pub struct Pmtu {
    max: u32,
    current: AtomicU32,
    state: Mutex<State>,
    pub probes_sent: AtomicU64,
    pub probes_acked: AtomicU64,
}

impl Pmtu {
    /// A link configured with `max` (its `mtu`), searching from [`BASE`].
    pub fn new(max: u32, seed: u32) -> Self {
        Pmtu {
            max,
            current: AtomicU32::new(max),
            state: Mutex::new(State {
                phase: Phase::Base,
                low: 0,
                high: max + 1,
                out: [None; PARALLEL],
                sent_ns: 0,
                misses: 0,
                next_ns: 0,
                raise_ns: 0,
                next_id: seed,
            }),
            probes_sent: AtomicU64::new(0),
            probes_acked: AtomicU64::new(0),
        }
    }

    /// The MTU in use: the largest size known to pass.
    pub fn current(&self) -> u32 {
        self.current.load(Relaxed)
    }

    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `send(id, size)` for each probe due now. `heard`: the peer was
    /// heard from lately (an unanswered base probe then means the peer does
    /// not answer probes, not that nothing passes).
    pub fn tick(&self, now_ns: u64, heard: bool, mut send: impl FnMut(u32, u32)) {
        let mut st = self.lock();
        let st = &mut *st;
        if st.out.iter().any(Option::is_some) {
            if now_ns.saturating_sub(st.sent_ns) < PROBE_TIMEOUT_NS {
                return;
            }
            self.round_over(st, now_ns, heard);
        }
        if now_ns < st.next_ns {
            return;
        }
        let mut sizes = [0u32; PARALLEL];
        let n = match st.phase {
            Phase::Base | Phase::Unanswered => {
                // The base, and the size in use (what frames are sent at).
                sizes[0] = BASE.min(self.max);
                sizes[1] = self.current();
                1 + usize::from(sizes[1] > sizes[0])
            }
            Phase::Search if st.high.saturating_sub(st.low) <= STEP => {
                st.phase = Phase::Done;
                st.next_ns = now_ns + CONFIRM_NS;
                return;
            }
            Phase::Search => self.spread(st, &mut sizes),
            Phase::Done if st.low < self.max && now_ns >= st.raise_ns => {
                st.phase = Phase::Search;
                st.high = self.max + 1;
                st.raise_ns = now_ns + RAISE_NS;
                self.spread(st, &mut sizes)
            }
            Phase::Done => {
                sizes[0] = st.low;
                1
            }
        };
        st.sent_ns = now_ns;
        for (slot, &size) in st.out.iter_mut().zip(&sizes[..n]) {
            st.next_id = st.next_id.wrapping_add(1);
            *slot = Some((st.next_id, size));
            self.probes_sent.fetch_add(1, Relaxed);
            send(st.next_id, size);
        }
    }

    /// A search round's sizes between `low` and `high`, exclusive: the
    /// configured MTU while it is not known to fail, and the rest evenly
    /// spread (multiples of 4).
    fn spread(&self, st: &State, sizes: &mut [u32; PARALLEL]) -> usize {
        let (low, high) = (st.low, st.high.min(self.max + 1));
        let mut n = 0;
        if high > self.max {
            sizes[0] = self.max;
            n = 1;
        }
        let top = high.min(self.max);
        let k = ((top.saturating_sub(low)) / STEP).min((PARALLEL - n) as u32);
        // Each size strictly between `low` and `top`, and all distinct: with
        // k >= 1, `top - low >= STEP * k`, so sizes are at least
        // `STEP * k / (k + 1) >= 4` apart before rounding down to 4.
        for i in 1..=k {
            sizes[n] = (low + (top - low) * i / (k + 1)) & !3;
            n += 1;
        }
        n
    }

    /// A round's time is up: what is still out was lost.
    fn round_over(&self, st: &mut State, now_ns: u64, heard: bool) {
        let lost = st.out.iter().flatten().map(|&(_, size)| size).min();
        st.out = [None; PARALLEL];
        let Some(lost) = lost else { return };
        match st.phase {
            Phase::Search => {
                // Above `low`: an answer drops every probe at or below its size.
                st.high = st.high.min(lost);
                if self.current() >= st.high {
                    // The size in use does not pass: the largest that does.
                    self.current.store(st.low, Relaxed);
                }
            }
            Phase::Base | Phase::Unanswered | Phase::Done => {
                st.misses += 1;
                if st.misses < MAX_PROBES {
                    return;
                }
                st.misses = 0;
                match st.phase {
                    Phase::Base if heard => {
                        // Heard from, yet no probe answered: a peer without probes.
                        st.phase = Phase::Unanswered;
                        self.current.store(self.max, Relaxed);
                        st.next_ns = now_ns + RAISE_NS;
                    }
                    Phase::Base | Phase::Unanswered => st.next_ns = now_ns + IDLE_NS,
                    _ => {
                        // The size in use stopped passing: from the base again.
                        st.phase = Phase::Base;
                        st.low = 0;
                        st.high = self.max + 1;
                        self.current.store(BASE.min(self.max), Relaxed);
                    }
                }
            }
        }
    }

    /// The peer answered probe `id`.
    pub fn acked(&self, id: u32, now_ns: u64) {
        let mut st = self.lock();
        let Some(slot) = st.out.iter().position(|o| o.is_some_and(|(i, _)| i == id)) else { return };
        let Some((_, size)) = st.out[slot].take() else { return };
        self.probes_acked.fetch_add(1, Relaxed);
        st.misses = 0;
        st.low = st.low.max(size);
        self.current.fetch_max(st.low, Relaxed);
        match st.phase {
            Phase::Base | Phase::Unanswered => {
                // (`high` is `max + 1` in these phases: nothing is known to fail.)
                st.phase = if st.low < self.max { Phase::Search } else { Phase::Done };
                st.raise_ns = now_ns + RAISE_NS;
                st.next_ns = if st.phase == Phase::Done { now_ns + CONFIRM_NS } else { now_ns };
            }
            Phase::Search => st.next_ns = now_ns,
            Phase::Done => st.next_ns = now_ns + CONFIRM_NS,
        }
        // Sizes at or below one answered need no answer of their own.
        let low = st.low;
        for o in st.out.iter_mut() {
            if o.is_some_and(|(_, s)| s <= low) {
                *o = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search against a path that carries `path` bytes (and
    /// answers every probe that fits) until it is done; returns the MTU in
    /// use and the probes sent.
    fn search(max: u32, path: u32, answers: bool) -> (u32, Phase, u64) {
        let p = Pmtu::new(max, 7);
        let mut now = 0;
        for _ in 0..1000 {
            let mut due = Vec::new();
            p.tick(now, true, |id, size| due.push((id, size)));
            for (id, size) in due {
                assert!(size <= max && size >= BASE.min(max), "probe of {size}");
                if answers && size <= path {
                    p.acked(id, now + 1_000_000);
                }
            }
            if p.phase() == Phase::Done || p.phase() == Phase::Unanswered {
                break;
            }
            now += 50_000_000;
        }
        (p.current(), p.phase(), p.probes_sent.load(Relaxed))
    }

    #[test]
    fn finds_the_path_mtu_to_within_a_step_and_never_uses_a_size_not_acknowledged() {
        assert_eq!(search(1500, 1500, true).0, 1500);
        for path in [1280, 1300, 1400, 1450, 1499] {
            let (mtu, phase, probes) = search(1500, path, true);
            assert_eq!(phase, Phase::Done, "path {path}");
            assert!(mtu <= path && path - mtu <= STEP, "path {path}: {mtu}");
            assert!(probes <= 1 + 2 * PARALLEL as u64 + 8, "path {path}: {probes} probes");
        }
        let (mtu, _, _) = search(9000, 1280, true);
        assert_eq!(mtu, 1280);
        // A link configured below the base probes its own MTU only.
        assert_eq!(search(1000, 9000, true).0, 1000);
    }

    #[test]
    fn a_peer_that_answers_no_probe_while_heard_gets_the_configured_mtu() {
        assert_eq!(search(1500, 1500, false), (1500, Phase::Unanswered, 2 * u64::from(MAX_PROBES)));
    }

    #[test]
    fn a_path_that_shrinks_is_found_by_the_confirmation_and_searched_again() {
        let p = Pmtu::new(1500, 1);
        drive(&p, 0, 10 * SEC, |s| s <= 1500);
        assert_eq!((p.current(), p.phase()), (1500, Phase::Done));
        let rounds = drive(&p, 10 * SEC, 500 * SEC, |s| s <= 1300);
        assert!(p.current() <= 1300 && 1300 - p.current() <= STEP, "{}", p.current());
        assert_eq!(p.phase(), Phase::Done);
        // Searched from nothing known: its first round tries the MTU again.
        let search = rounds.iter().find(|(_, s)| s.len() > 2).unwrap();
        assert_eq!(search.1[0], 1500, "{rounds:?}");
    }

    #[test]
    fn a_peer_not_heard_is_probed_at_the_base_again_each_idle_time() {
        let p = Pmtu::new(1500, 1);
        let mut rounds = Vec::new();
        for now in (0..5 * SEC).step_by(100_000_000) {
            p.tick(now, false, |_, _| rounds.push(now / 100_000_000));
        }
        // Three rounds, 300 ms apart; the third missed, a second's pause.
        let want = [0, 0, 3, 3, 6, 6, 19, 19, 22, 22, 25, 25, 38, 38, 41, 41, 44, 44];
        assert_eq!(rounds, want);
        assert_eq!(p.phase(), Phase::Base);
    }

    const SEC: u64 = 1_000_000_000;

    /// Ticks `p` every 100 ms from `from` to `to` (ns), answering each
    /// probe at once when `answer(size)`; returns each round: its time
    /// and sizes.
    fn drive(p: &Pmtu, from: u64, to: u64, mut answer: impl FnMut(u32) -> bool) -> Vec<(u64, Vec<u32>)> {
        let mut rounds = Vec::new();
        for now in (from..to).step_by(100_000_000) {
            let mut due = Vec::new();
            p.tick(now, true, |id, size| due.push((id, size)));
            if !due.is_empty() {
                rounds.push((now, due.iter().map(|d| d.1).collect()));
            }
            for (id, size) in due {
                if answer(size) {
                    p.acked(id, now);
                }
            }
        }
        rounds
    }

    #[test]
    fn phases_are_said_as_their_words() {
        let words = [Phase::Base, Phase::Search, Phase::Done, Phase::Unanswered].map(Phase::word);
        assert_eq!(words, ["base", "searching", "done", "unanswered"]);
    }

    #[test]
    fn a_round_is_over_at_exactly_the_probe_timeout() {
        let p = Pmtu::new(1500, 1);
        p.tick(0, true, |_, _| {});
        assert_eq!(p.probes_sent.load(Relaxed), 2, "the base and the MTU in use");
        p.tick(PROBE_TIMEOUT_NS - 1, true, |_, _| {});
        assert_eq!(p.probes_sent.load(Relaxed), 2, "still out");
        p.tick(PROBE_TIMEOUT_NS, true, |_, _| {});
        assert_eq!(p.probes_sent.load(Relaxed), 4, "lost, and the next round out");
    }

    #[test]
    fn a_link_at_the_base_mtu_probes_it_once_a_round_and_is_done_when_it_passes() {
        let p = Pmtu::new(BASE, 1);
        let rounds = drive(&p, 0, 2 * CONFIRM_NS + 1, |_| true);
        // Done at once: confirmed each CONFIRM_NS from then.
        assert_eq!(rounds, vec![(0, vec![BASE]), (CONFIRM_NS, vec![BASE]), (2 * CONFIRM_NS, vec![BASE])]);
        assert_eq!((p.current(), p.phase()), (BASE, Phase::Done));
    }

    #[test]
    fn a_found_path_is_confirmed_every_confirm_time_and_searched_upwards_every_raise_time() {
        // A path of 1400 under a 1500 link: done below 1500, so searched
        // upwards again (with a 1500 probe) each RAISE_NS; confirmed at
        // its size each CONFIRM_NS between.
        let p = Pmtu::new(1500, 3);
        let rounds = drive(&p, 0, 2 * RAISE_NS + 60 * SEC, |s| s <= 1400);
        let raises: Vec<u64> =
            rounds.iter().filter(|(t, s)| *t > 0 && s.contains(&1500)).map(|r| r.0).collect();
        assert_eq!(raises.len(), 2, "{raises:?}");
        assert!((RAISE_NS..RAISE_NS + CONFIRM_NS).contains(&raises[0]), "{raises:?}");
        assert!((RAISE_NS..RAISE_NS + CONFIRM_NS).contains(&(raises[1] - raises[0])), "{raises:?}");
        let found = p.current();
        assert!(found <= 1400 && 1400 - found <= STEP, "{found}");
        let confirms: Vec<u64> = rounds.iter().filter(|(_, s)| *s == [found]).map(|r| r.0).collect();
        assert!(confirms.len() >= 38, "{}", confirms.len());
        assert!(confirms.windows(2).all(|w| w[1] - w[0] >= CONFIRM_NS), "{confirms:?}");
        // A path that carries the whole MTU is never searched again.
        let p = Pmtu::new(1500, 3);
        let rounds = drive(&p, 0, 2 * RAISE_NS, |_| true);
        assert!(rounds[1..].iter().all(|(_, s)| *s == [1500]), "{:?}", &rounds[..3]);
        assert!(rounds[1..].windows(2).all(|w| w[1].0 - w[0].0 == CONFIRM_NS), "never a search between");
        // The base round at 0, done at 0.1 s, then one each CONFIRM_NS (39 before the end).
        assert_eq!(rounds.len() as u64, 2 * RAISE_NS / CONFIRM_NS, "a confirmation each CONFIRM_NS");
    }

    #[test]
    fn search_rounds_spread_their_probes_evenly_below_what_failed() {
        let p = Pmtu::new(1500, 1);
        let spread = |low: u32, high: u32| {
            let st = State { low, high, ..*p.lock() };
            let mut sizes = [0u32; PARALLEL];
            let n = p.spread(&st, &mut sizes);
            sizes[..n].to_vec()
        };
        // Nothing known to fail: the MTU, and seven between.
        assert_eq!(spread(1280, 1501), [1500, 1304, 1332, 1360, 1388, 1416, 1444, 1472]);
        // 40 bytes to search: five sizes (one a STEP), the MTU first.
        assert_eq!(spread(1460, 1501), [1500, 1464, 1472, 1480, 1484, 1492]);
        // The MTU failed: below it only.
        assert_eq!(spread(1460, 1500), [1464, 1472, 1480, 1484, 1492]);
        assert_eq!(spread(1496, 1500), Vec::<u32>::new(), "less than a STEP left");
    }

    #[test]
    fn an_unknown_or_late_answer_changes_nothing() {
        let p = Pmtu::new(1500, 1);
        let mut due = Vec::new();
        p.tick(0, true, |id, size| due.push((id, size)));
        let (id, _) = due[0];
        p.acked(id.wrapping_add(5), 1);
        assert_eq!((p.current(), p.phase()), (1500, Phase::Base));
        p.acked(id, 2);
        p.acked(id, 3);
        assert_eq!(p.probes_acked.load(Relaxed), 1);
    }
}
