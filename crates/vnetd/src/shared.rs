//! What the control plane and every data-path thread share: the published
//! plane, the daemon-wide counters, and the data path's clock.

use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::Instant;
use vnet_engine::link::Liveness;
use vnet_engine::{Forwarder, Global, Plane};

/// State shared by the control plane and every worker.
pub struct Shared {
    pub plane: ArcSwap<Plane>,
    pub global: Arc<Global>,
    start: Instant,
    /// Woken when a standby interface's VM arrives (a live migration's
    /// switch-over): the control plane then activates it.
    pub arrivals: Arc<tokio::sync::Notify>,
    /// What the engine calls on an arrival: a wake-up of `arrivals` (never
    /// blocks; a wake-up while none waits is kept for the next).
    pub wake: vnet_engine::plane::Wake,
    /// Woken when a standby interface became active: cluster mode claims
    /// its MAC at once rather than at its next look.
    pub activated: Arc<tokio::sync::Notify>,
    /// Cluster mode: the network's admin revoked this host (its links'
    /// peers refuse it: the reason a link is down).
    pub revoked: std::sync::atomic::AtomicBool,
    /// The drops gathered for `show drops`, and the watch on the kernel's.
    pub drop_log: std::sync::Mutex<crate::drops::DropLog>,
    /// The flow log (`--flow-log`), if asked for: set once at the start.
    pub flow_log: std::sync::OnceLock<Arc<crate::flowlog::FlowLog>>,
}

/// The wall clock, in nanoseconds since the Unix epoch: what secured
/// links date their handshake initiations by (they must grow across
/// restarts; the engine is given this clock rather than reading one).
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl Shared {
    pub fn new() -> Arc<Self> {
        let arrivals = Arc::new(tokio::sync::Notify::new());
        let n = arrivals.clone();
        Arc::new(Shared {
            plane: ArcSwap::from_pointee(Plane::default()),
            global: Arc::default(),
            start: Instant::now(),
            arrivals,
            wake: Arc::new(move || n.notify_one()),
            activated: Arc::new(tokio::sync::Notify::new()),
            revoked: std::sync::atomic::AtomicBool::new(false),
            drop_log: Default::default(),
            flow_log: std::sync::OnceLock::new(),
        })
    }

    /// The data path's clock, for the engine.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// A forwarder for a new worker.
    pub fn forwarder(&self) -> Forwarder {
        Forwarder::new(self.global.clone())
    }

    /// Runs the plane's timer (secured links' handshakes and rekeys,
    /// keepalives, broadcast-limit windows) and logs a link whose peer went
    /// down or came back; the daemon calls it every [`vnet_engine::plane::TICK_NS`].
    pub fn tick(&self) {
        let now = self.now_ns();
        let revoked = self.revoked.load(std::sync::atomic::Ordering::Relaxed);
        self.global.drops.set_clock(now);
        if let Ok(mut log) = self.drop_log.try_lock() {
            log.expire(Instant::now());
        }
        self.plane.load().tick(now, |l, state| match (state, l.alive.age_ns(now)) {
            (Liveness::Up, _) => tracing::info!(link = %l.def.name, "peer up"),
            (Liveness::Down, _) if revoked => {
                tracing::warn!(link = %l.def.name, "peer down: this host was revoked by the network's admin")
            }
            (Liveness::Down, Some(a)) => {
                tracing::warn!(link = %l.def.name, "peer down: nothing heard for {} ms", a / 1_000_000)
            }
            (Liveness::Down, None) => tracing::warn!(link = %l.def.name, "peer down: never heard from"),
            (Liveness::Quiet, _) => {}
        });
    }
}
