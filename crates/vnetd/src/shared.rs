//! What the control plane and every data-path thread share: the published
//! plane, the daemon-wide counters, and the data path's clock.

use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::Instant;
use vnet_engine::{Forwarder, Global, Plane};

/// State shared by the control plane and every worker.
pub struct Shared {
    pub plane: ArcSwap<Plane>,
    pub global: Arc<Global>,
    start: Instant,
}

impl Shared {
    pub fn new() -> Arc<Self> {
        Arc::new(Shared {
            plane: ArcSwap::from_pointee(Plane::default()),
            global: Arc::default(),
            start: Instant::now(),
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

    /// Runs the links' timers (secured links' handshakes and rekeys); the
    /// daemon calls it a few times a second.
    pub fn tick(&self) {
        let now = self.now_ns();
        for l in self.plane.load().links.values() {
            l.tick(now);
        }
    }
}
