//! The worker threads and their one poll/yield loop: each worker waits on
//! its sources (fds it registers with epoll), lets each read a batch, and
//! decides from their dispatch state (`vnet_engine::Dispatcher`) whether to
//! look again at once, yield and look again (polling), or sleep in epoll.
//! What a source reads and where frames go is `dataplane`'s; the vhost-user
//! pair threads poll their rings with the same steps ([`record_look`],
//! [`poll_once`]).

use crate::sys;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vnet_control::Mode;
use vnet_engine::{DispatchStats, Dispatcher};

/// Frames a worker handles per wake-up before it looks at its mode and the
/// stop flag again.
pub const BATCH: usize = 64;
/// A running worker thread and the means to stop it.
pub struct WorkerHandle {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    join: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    /// Stops the worker and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Relaxed);
        let _ = self.waker.wake();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.halt();
    }
}

const WAKE: Token = Token(0);

/// One thing a worker reads from: an interface queue or the link socket.
pub struct Source {
    pub fd: std::os::fd::RawFd,
    pub mode: Mode,
    pub stats: Arc<DispatchStats>,
    /// Handles up to a batch of frames; returns how many it handled.
    pub body: Box<dyn FnMut() -> usize + Send>,
}

/// Runs a worker thread over `sources` until stopped. Every pass reads each
/// source until it is empty (or a batch is done); each source keeps its
/// own dispatch state, and the worker sleeps in epoll only when none of its
/// sources wants to keep polling.
pub fn spawn_worker(name: String, cpu: Option<usize>, mut sources: Vec<Source>) -> io::Result<WorkerHandle> {
    let mut poll = Poll::new()?;
    for (i, s) in sources.iter().enumerate() {
        poll.registry().register(&mut SourceFd(&s.fd), Token(i + 1), Interest::READABLE)?;
    }
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let join = std::thread::Builder::new().name(name.clone()).spawn(move || {
        if let Some(cpu) = cpu {
            match sys::pin_current_thread(cpu) {
                Ok(()) => tracing::debug!("{name} runs on cpu {cpu}"),
                Err(e) => tracing::warn!("{name}: cannot run on cpu {cpu} only: {e}; left unpinned"),
            }
        }
        let mut events = Events::with_capacity(16);
        let now = Instant::now();
        let mut ds: Vec<Dispatcher> = sources.iter().map(|s| Dispatcher::new(s.mode, now)).collect();
        for (s, d) in sources.iter().zip(&ds) {
            s.stats.polling.store(d.polling() as u8, Relaxed);
        }
        // The last look found nothing and the worker polled on (yielded)
        // rather than sleep: what the next look finds, polling caught.
        let mut polled = false;
        while !stop2.load(Relaxed) {
            let (mut total, mut more) = (0, false);
            let now = Instant::now();
            for (s, d) in sources.iter_mut().zip(ds.iter_mut()) {
                let n = (s.body)();
                total += n;
                // A source stops short of a batch only when it is empty.
                more |= n >= BATCH;
                record_look(d, &s.stats, polled, n, n, now);
            }
            polled = false;
            if more {
                continue; // a batch was full: more may be waiting
            }
            if ds.iter().any(|d| d.keep_polling(now)) {
                if total > 0 {
                    continue; // look again at once
                }
                polled = true;
                if !poll_once(sources.iter().map(|s| &*s.stats)) {
                    let now = Instant::now();
                    ds.iter_mut().for_each(|d| d.contended(now));
                }
                continue;
            }
            match poll.poll(&mut events, Some(Duration::from_millis(100))) {
                Ok(()) => {
                    for e in events.iter() {
                        if let Some(s) = e.token().0.checked_sub(1).and_then(|i| sources.get(i)) {
                            s.stats.wakeups.fetch_add(1, Relaxed);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!("worker poll failed: {e}");
                    return;
                }
            }
        }
    })?;
    Ok(WorkerHandle { stop, waker, join: Some(join) })
}

/// The bookkeeping of one look at a source that found `n` frames at `now`
/// (`rate`: what counts toward its dispatch's frame rate, `n` or more):
/// counts what polling caught (`polled`: the look before found nothing and
/// the loop polled on), feeds the dispatch, counts a switch of mode. Both
/// loops, the workers' and the vhost-user pair threads', take it.
pub fn record_look(
    d: &mut Dispatcher,
    stats: &DispatchStats,
    polled: bool,
    n: usize,
    rate: usize,
    now: Instant,
) {
    if polled && n > 0 {
        stats.polled_frames.fetch_add(n as u64, Relaxed);
    }
    if d.record(rate, now) {
        stats.mode_switches.fetch_add(1, Relaxed);
        stats.polling.store(d.polling() as u8, Relaxed);
    }
}

/// An empty look while the dispatch says poll: counts the poll, yields the
/// CPU once, and counts contention. False when another thread kept the
/// CPU (the caller's dispatchers are then told, and back off to sleeping).
pub fn poll_once<'a>(stats: impl Iterator<Item = &'a DispatchStats> + Clone) -> bool {
    stats.clone().for_each(|s| {
        s.polls.fetch_add(1, Relaxed);
    });
    let uncontended = yield_uncontended();
    if !uncontended {
        stats.for_each(|s| {
            s.contended.fetch_add(1, Relaxed);
        });
    }
    uncontended
}

/// Gives the CPU to any other thread that wants it, between two looks of a
/// polling worker; false when one did and kept it for
/// [`vnet_engine::CONTENDED`] or more (the worker should then sleep).
fn yield_uncontended() -> bool {
    let t = Instant::now();
    std::thread::yield_now();
    t.elapsed() < vnet_engine::CONTENDED
}
