//! How a worker waits for frames, VNET/P's dispatch modes, as a decision
//! fed frame counts and time: `notify` sleeps as soon as its source is
//! empty (guest-driven), `poll` keeps polling for a while past the last
//! frame (VMM-driven), `adaptive` moves between the two by frame rate with
//! the paper's hysteresis (up at 10000 frames/s, down at 1000, measured
//! over 10 ms). The threads that act on it are the daemon's.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant};
use vnet_control::Mode;

/// `poll` mode keeps polling this long after the last frame (so traffic as
/// sparse as a ping every 10 ms never waits for a wake-up)...
pub const POLL_IDLE: Duration = Duration::from_millis(20);
/// ...and `adaptive` mode, once its rate put it in polling, this long (at
/// the rates that got it there, frames come far more often).
pub const ADAPTIVE_POLL_IDLE: Duration = Duration::from_micros(250);
/// Adaptive dispatch: measuring window and thresholds (frames/s).
pub const ADAPT_WINDOW: Duration = Duration::from_millis(10);
pub const ADAPT_UP: u64 = 10_000;
pub const ADAPT_DOWN: u64 = 1_000;

/// What a worker's dispatch did: its current mode, switches and sleeps.
#[derive(Debug, Default)]
pub struct DispatchStats {
    /// 0 notify, 1 poll.
    pub polling: AtomicU8,
    pub switches: AtomicU64,
    /// Times the worker slept in epoll and was woken.
    pub wakeups: AtomicU64,
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
}

impl Dispatcher {
    pub fn new(mode: Mode, now: Instant) -> Self {
        Dispatcher { mode, polling: mode == Mode::Poll, window_start: now, window_frames: 0, last_frame: now }
    }

    /// Records `frames` handled at `now`; returns true when the mode switched.
    pub fn record(&mut self, frames: usize, now: Instant) -> bool {
        self.window_frames += frames as u64;
        if frames > 0 {
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
        let idle = if self.mode == Mode::Poll { POLL_IDLE } else { ADAPTIVE_POLL_IDLE };
        self.polling && now.duration_since(self.last_frame) < idle
    }

    pub fn polling(&self) -> bool {
        self.polling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
