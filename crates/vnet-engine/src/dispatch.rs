//! How a worker waits for frames, VNET/P's dispatch modes, as a decision
//! fed frame counts and time: `notify` sleeps as soon as its source is
//! empty (guest-driven), `poll` keeps polling for a while past the last
//! frame (VMM-driven), `adaptive` moves between the two. The threads that
//! act on it are the daemon's.
//!
//! `adaptive` polls past the last frame for a *window* that follows the
//! gaps between frames, as KVM's halt polling does for a vCPU: a frame that
//! comes within [`ADAPTIVE_MAX_WINDOW`] of the one before widens the window
//! to twice that gap (a sleep there would have cost a wake-up, which on a
//! VM whose idle vCPUs halt costs 20 us or more), a longer gap halves it, so
//! a request-response exchange (MPI ping-pong) is caught by polling while a
//! ping every 10 ms sleeps. It also keeps the paper's rate rule (polling
//! from 10000 frames/s, back to notify at 1000, measured over 10 ms).
//!
//! `adaptive` polling must not take the CPU from the VMs on a small
//! machine: the worker yields between looks, and when a yield took longer
//! than [`CONTENDED`] another thread wanted the CPU and got it; the worker
//! then stops polling for a while ([`Dispatcher::contended`]). Without
//! that, two busy-polling MPI ranks and the workers of two hosts on two
//! CPUs hand the CPU round in whole time slices (milliseconds per
//! message). `poll` is the operator's choice of a busy core and polls
//! regardless (VNET/P's VMM-driven mode: the guest need not kick).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant};
use vnet_control::Mode;

/// `poll` mode keeps polling this long after the last frame (so traffic as
/// sparse as a ping every 10 ms never waits for a wake-up)...
pub const POLL_IDLE: Duration = Duration::from_millis(20);
/// ...and `adaptive` mode, once its rate put it in polling, this long (at
/// the rates that got it there, frames come far more often).
pub const ADAPTIVE_POLL_IDLE: Duration = Duration::from_micros(250);
/// `adaptive`'s polling window follows the gaps between frames up to this.
pub const ADAPTIVE_MAX_WINDOW: Duration = Duration::from_micros(200);
/// A window narrower than this is closed (no polling).
pub const ADAPTIVE_MIN_WINDOW: Duration = Duration::from_micros(10);
/// A yield that took this long gave the CPU to a thread that wanted it.
pub const CONTENDED: Duration = Duration::from_micros(50);
/// After a contended poll a worker does not poll again for this long, twice
/// that after the next contended one, and so on up to [`HOLD_MAX`]: each
/// try costs a time slice of the thread that wanted the CPU.
pub const HOLD_MIN: Duration = Duration::from_millis(10);
pub const HOLD_MAX: Duration = Duration::from_secs(1);
/// Adaptive dispatch: measuring window and thresholds (frames/s).
pub const ADAPT_WINDOW: Duration = Duration::from_millis(10);
pub const ADAPT_UP: u64 = 10_000;
pub const ADAPT_DOWN: u64 = 1_000;

/// What a worker's dispatch did: its current mode, switches and sleeps.
/// Serialized as named here (`show interfaces`; `link_`-prefixed in `show
/// stats`' global).
#[derive(Debug, Default, serde::Serialize)]
pub struct DispatchStats {
    /// 0 notify, 1 poll: serialized as the word, `dispatch`.
    #[serde(rename = "dispatch", serialize_with = "mode_word")]
    pub polling: AtomicU8,
    /// Switches between notify and poll.
    pub mode_switches: AtomicU64,
    /// Times the worker slept in epoll and was woken.
    pub wakeups: AtomicU64,
    /// Looks a polling worker took (one yield each)...
    pub polls: AtomicU64,
    /// ...and the times a yield gave the CPU away for [`CONTENDED`] or more.
    pub contended: AtomicU64,
    /// Frames a polling look found after an empty one: what polling saved a
    /// wake-up for.
    pub polled_frames: AtomicU64,
}

fn mode_word<S: serde::Serializer>(polling: &AtomicU8, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if polling.load(Relaxed) == 1 { "poll" } else { "notify" })
}

impl DispatchStats {
    pub fn mode_word(&self) -> &'static str {
        if self.polling.load(Relaxed) == 1 {
            "poll"
        } else {
            "notify"
        }
    }
}

/// The adaptive-dispatch decision, sans-IO: fed frame counts and time.
#[derive(Debug)]
pub struct Dispatcher {
    mode: Mode,
    polling: bool,
    window_start: Instant,
    window_frames: u64,
    last_frame: Instant,
    /// `adaptive`: how long past the last frame to poll.
    window: Duration,
    /// Set by [`Dispatcher::contended`]: no polling before this...
    hold_until: Instant,
    /// ...and the hold the next contended poll gets.
    hold: Duration,
}

impl Dispatcher {
    pub fn new(mode: Mode, now: Instant) -> Self {
        Dispatcher {
            mode,
            polling: mode == Mode::Poll,
            window_start: now,
            window_frames: 0,
            last_frame: now,
            window: Duration::ZERO,
            hold_until: now,
            hold: HOLD_MIN,
        }
    }

    /// Records `frames` handled at `now`; returns true when the mode switched.
    pub fn record(&mut self, frames: usize, now: Instant) -> bool {
        self.window_frames += frames as u64;
        if frames > 0 {
            let gap = now.saturating_duration_since(self.last_frame);
            if now >= self.hold_until && gap < self.window {
                self.hold = (self.hold / 2).max(HOLD_MIN); // polling paid off
            }
            if gap <= ADAPTIVE_MAX_WINDOW {
                self.window = self.window.max(gap * 2).clamp(ADAPTIVE_MIN_WINDOW, ADAPTIVE_MAX_WINDOW);
            } else if self.window >= ADAPTIVE_MIN_WINDOW * 2 {
                self.window /= 2;
            } else {
                self.window = Duration::ZERO;
            }
            self.last_frame = now;
        }
        let el = now.duration_since(self.window_start);
        if el < ADAPT_WINDOW {
            return false;
        }
        let rate = self.window_frames * 1_000_000 / el.as_micros().max(1) as u64;
        self.window_start = now;
        self.window_frames = 0;
        if self.mode != Mode::Adaptive {
            return false;
        }
        let before = self.polling;
        if !self.polling && rate >= ADAPT_UP {
            self.polling = true;
        } else if self.polling && rate <= ADAPT_DOWN {
            self.polling = false;
        }
        before != self.polling
    }

    /// Whether to keep polling rather than sleep, at `now`.
    pub fn keep_polling(&self, now: Instant) -> bool {
        if now < self.hold_until {
            return false;
        }
        let idle = match self.mode {
            Mode::Poll => POLL_IDLE,
            Mode::Adaptive if self.polling => ADAPTIVE_POLL_IDLE.max(self.window),
            Mode::Adaptive => self.window,
            Mode::Notify => return false,
        };
        now.saturating_duration_since(self.last_frame) < idle
    }

    /// Another thread wanted this CPU while the worker polled at `now` (a
    /// yield took [`CONTENDED`] or more). `adaptive`: no polling for the
    /// hold, which doubles each time (up to [`HOLD_MAX`]) and halves again
    /// each time polling catches a frame, and the window closes. `poll`
    /// keeps polling.
    pub fn contended(&mut self, now: Instant) {
        if self.mode != Mode::Adaptive {
            return;
        }
        self.hold_until = now + self.hold;
        self.hold = (self.hold * 2).min(HOLD_MAX);
        self.window = Duration::ZERO;
    }

    /// `adaptive`'s current polling window.
    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn polling(&self) -> bool {
        self.polling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_said_as_its_word_in_show_and_in_json() {
        let s = DispatchStats::default();
        assert_eq!(s.mode_word(), "notify");
        assert_eq!(serde_json::to_value(&s).unwrap()["dispatch"], "notify");
        s.polling.store(1, Relaxed);
        assert_eq!(s.mode_word(), "poll");
        assert_eq!(serde_json::to_value(&s).unwrap()["dispatch"], "poll");
    }

    #[test]
    fn polling_ends_exactly_at_its_idle_time_counted_from_the_last_frame_not_the_last_look() {
        let t0 = Instant::now();
        let mut d = Dispatcher::new(Mode::Poll, t0);
        d.record(1, t0);
        assert!(d.keep_polling(t0 + POLL_IDLE - Duration::from_nanos(1)));
        assert!(!d.keep_polling(t0 + POLL_IDLE), "idle for exactly POLL_IDLE: sleep");
        // A look that found nothing is no frame.
        d.record(0, t0 + Duration::from_millis(15));
        assert!(!d.keep_polling(t0 + POLL_IDLE));
    }

    #[test]
    fn a_hold_ends_exactly_when_it_says_and_halves_only_when_polling_after_it_catches_a_frame() {
        let (ms, us) = (Duration::from_millis, Duration::from_micros);
        let t0 = Instant::now();
        let mut d = Dispatcher::new(Mode::Adaptive, t0);
        d.contended(t0);
        d.contended(t0);
        let held = t0 + 2 * HOLD_MIN;
        assert_eq!((d.hold_until, d.hold), (held, 4 * HOLD_MIN), "10 then 20 ms held, 40 ms next");
        // Frames 50 us apart while held: a window opens, the hold stays.
        d.record(1, t0 + ms(1));
        d.record(1, t0 + ms(1) + us(50));
        d.record(1, t0 + ms(1) + us(100));
        assert_eq!((d.window, d.hold), (us(100), 4 * HOLD_MIN));
        // After the hold, a frame within the window (halved by the long gap
        // to 50 us; 30 us): polling paid off.
        d.record(1, held + us(10));
        d.record(1, held + us(40));
        assert_eq!(d.hold, 2 * HOLD_MIN);
        // Polling at 20000 frames/s, then held again: no look until the
        // hold's end, and at its end exactly the idle rule decides.
        let t1 = t0 + ms(40);
        assert!(d.record(200, t1) && d.polling());
        d.contended(t1);
        d.record(300, t1 + 2 * HOLD_MIN - us(100)); // 15000/s: still polling
        assert!(d.polling());
        assert!(!d.keep_polling(t1 + 2 * HOLD_MIN - Duration::from_nanos(1)), "held");
        assert!(d.keep_polling(t1 + 2 * HOLD_MIN), "the hold is over, a frame 100 us ago");
    }

    #[test]
    fn adaptive_switches_with_hysteresis() {
        let t0 = Instant::now();
        let mut d = Dispatcher::new(Mode::Adaptive, t0);
        assert!(!d.polling());
        // 200 frames in 10 ms = 20000/s: up.
        assert!(d.record(200, t0 + Duration::from_millis(10)));
        assert!(d.polling());
        // 50 frames in 10 ms = 5000/s: between the thresholds, stay.
        assert!(!d.record(50, t0 + Duration::from_millis(20)));
        assert!(d.polling());
        // 5 frames in 10 ms = 500/s: down.
        assert!(d.record(5, t0 + Duration::from_millis(30)));
        assert!(!d.polling());
        // Fixed modes never switch.
        let mut p = Dispatcher::new(Mode::Poll, t0);
        assert!(!p.record(0, t0 + Duration::from_secs(1)) && p.polling());
        let mut n = Dispatcher::new(Mode::Notify, t0);
        assert!(!n.record(100_000, t0 + Duration::from_secs(1)) && !n.polling());
    }

    #[test]
    fn polling_stops_after_idle() {
        let t0 = Instant::now();
        let mut d = Dispatcher::new(Mode::Poll, t0);
        d.record(1, t0);
        assert!(d.keep_polling(t0 + Duration::from_millis(5)));
        assert!(!d.keep_polling(t0 + Duration::from_millis(25)));
        let mut a = Dispatcher::new(Mode::Adaptive, t0);
        a.record(500, t0 + Duration::from_millis(10));
        assert!(a.polling() && a.keep_polling(t0 + Duration::from_micros(10_100)));
        assert!(!a.keep_polling(t0 + Duration::from_millis(11)));
    }

    #[test]
    fn the_adaptive_window_follows_the_gaps_between_frames() {
        let us = Duration::from_micros;
        let t0 = Instant::now();
        let mut d = Dispatcher::new(Mode::Adaptive, t0);
        // A ping every 10 ms: never polls.
        for k in 1..=5 {
            d.record(1, t0 + Duration::from_millis(10 * k));
            assert_eq!(d.window(), Duration::ZERO);
            assert!(!d.keep_polling(t0 + Duration::from_millis(10 * k) + us(1)));
        }
        // A ping-pong with a frame every 40 us: polls 80 us past each.
        let t1 = t0 + Duration::from_millis(60);
        d.record(1, t1);
        let mut t = t1;
        for _ in 0..10 {
            t += us(40);
            d.record(1, t);
        }
        assert_eq!(d.window(), us(80));
        assert!(d.keep_polling(t + us(79)) && !d.keep_polling(t + us(81)));
        // It never polls longer than the bound, whatever the gaps.
        t += us(150);
        d.record(1, t);
        assert_eq!(d.window(), ADAPTIVE_MAX_WINDOW);
        // Long gaps close it again, halving.
        t += Duration::from_millis(5);
        d.record(1, t);
        assert_eq!(d.window(), ADAPTIVE_MAX_WINDOW / 2);
        for _ in 0..4 {
            t += Duration::from_millis(5);
            d.record(1, t);
        }
        assert_eq!(d.window(), Duration::ZERO);
    }

    #[test]
    fn a_contended_cpu_stops_polling_for_a_hold_that_backs_off() {
        let us = Duration::from_micros;
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut p = Dispatcher::new(Mode::Poll, t0);
        p.record(1, t0 + us(20));
        p.contended(t0 + us(21));
        assert!(p.keep_polling(t0 + us(22)), "poll polls regardless");
        let mut d = Dispatcher::new(Mode::Adaptive, t0);
        let mut t = t0;
        for _ in 0..3 {
            t += us(20);
            d.record(1, t);
        }
        assert!(d.keep_polling(t + us(5)));
        d.contended(t + us(6));
        // Frames keep coming, but no polling for 10 ms...
        t += us(20);
        d.record(1, t);
        assert!(!d.keep_polling(t + us(1)));
        t = t0 + ms(11);
        d.record(1, t);
        t += us(20);
        d.record(1, t);
        assert!(d.keep_polling(t + us(1)));
        // ...then 20 ms after the next contended poll.
        d.contended(t + us(2));
        assert!(!d.keep_polling(t + ms(19)));
        assert_eq!(d.hold, HOLD_MIN * 4);
        // Notify never polls.
        let mut n = Dispatcher::new(Mode::Notify, t0);
        n.record(1, t0 + us(10));
        n.record(1, t0 + us(20));
        assert!(!n.keep_polling(t0 + us(21)));
    }
}
