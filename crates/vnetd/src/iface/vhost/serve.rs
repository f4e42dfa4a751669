//! Serving a vhost-user socket: the listener bound when the interface is
//! made, and each front end served, from accept to disconnect, by the
//! rust-vmm daemon over this device's backend ([`super::VhostDev`]).

use super::{tick_event, Burst, Conn, NetBackend, PairWorker, RingStats, VhostDev, MAX_PAIRS, TICK};
use crate::shared::Shared;
use arc_swap::ArcSwapOption;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;
use vnet_control::Mode;
use vnet_engine::BUF;
use vnet_engine::{DispatchStats, Dispatcher};

/// How a vhost-user interface is served.
#[derive(Debug, Clone)]
pub struct Serve {
    /// Queue pairs offered (1-16).
    pub pairs: usize,
    /// Dispatch on the TX rings.
    pub mode: Mode,
    /// CPUs for the pair threads (pair p on `cpus[p % len]`; empty: any).
    pub cpus: Vec<usize>,
}

/// Starts serving `socket` for interface `iface`: the listener is bound now
/// (so errors reach the transaction), front ends are served one after the
/// other on a thread until [`VhostDev::stop`].
pub fn serve(
    shared: &Arc<Shared>,
    iface: u32,
    name: &str,
    socket: &Path,
    cfg: Serve,
    dispatch: Arc<DispatchStats>,
) -> io::Result<Arc<VhostDev>> {
    let (pairs, mode) = (cfg.pairs.clamp(1, MAX_PAIRS), cfg.mode);
    crate::paths::claim_socket_path(socket)?;
    let mut listener = Listener::new(socket, false).map_err(|e| io::Error::other(format!("{e}")))?;
    let dev = Arc::new(VhostDev {
        socket: socket.to_path_buf(),
        pairs,
        cpus: cfg.cpus,
        stats: RingStats::default(),
        conn: ArcSwapOption::empty(),
        stop: AtomicBool::new(false),
        shutdown: Mutex::new(None),
        server: Mutex::new(None),
    });
    let (d2, shared2, name2) = (dev.clone(), shared.clone(), name.to_string());
    let join = std::thread::Builder::new().name(format!("vhost-{name}")).spawn(move || {
        while !d2.stop.load(Relaxed) {
            if let Err(e) = serve_one(&d2, &shared2, iface, &name2, &mut listener, mode, &dispatch) {
                tracing::warn!(interface = %name2, "vhost-user connection: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    })?;
    *dev.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(join);
    Ok(dev)
}

/// Why serving a front end failed (logged; the next one is waited for).
#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("timerfd: {0}")]
    Timer(#[source] io::Error),
    /// The backend crate's (its error is `Display` but not `std::error::Error`).
    #[error("{0}")]
    Backend(vhost_user_backend::Error),
    #[error("registering a pair's tick: {0}")]
    Tick(#[source] io::Error),
}

impl From<vhost_user_backend::Error> for ServeError {
    fn from(e: vhost_user_backend::Error) -> Self {
        ServeError::Backend(e)
    }
}

/// Serves one front end, from accept to disconnect.
fn serve_one(
    dev: &Arc<VhostDev>,
    shared: &Arc<Shared>,
    iface: u32,
    name: &str,
    listener: &mut Listener,
    mode: Mode,
    dispatch: &Arc<DispatchStats>,
) -> Result<(), ServeError> {
    let mem = GuestMemoryAtomic::new(vnet_virtio::Memory::new());
    let conn = Arc::new(Conn {
        mem: mem.clone(),
        rx: (0..dev.pairs).map(|_| std::sync::OnceLock::new()).collect(),
        live: AtomicUsize::new(0),
        acked: AtomicU64::new(0),
        bursts: (0..dev.pairs).map(|_| Mutex::new(Burst::new())).collect(),
    });
    let now = Instant::now();
    let workers = (0..dev.pairs)
        .map(|p| {
            Mutex::new(PairWorker {
                fw: shared.forwarder(),
                buf: vec![0u8; BUF],
                ranges: [(vm_memory::GuestAddress(0), 0); vnet_virtio::MAX_TX_RANGES],
                dispatch: Dispatcher::new(mode, now),
                // The counter runs over every connection: start from it.
                placed_seen: dev.stats.pair_rx[p].load(Relaxed),
                placed_on_cpu: false,
                tx_asked: 0,
            })
        })
        .collect();
    dispatch.polling.store((mode == Mode::Poll) as u8, Relaxed);
    let ticks: Vec<Mutex<TimerFd>> = if mode == Mode::Adaptive {
        (0..dev.pairs)
            .map(|_| {
                let mut t = TimerFd::new()?;
                t.reset(TICK, Some(TICK))?;
                Ok(Mutex::new(t))
            })
            .collect::<io::Result<_>>()
            .map_err(ServeError::Timer)?
    } else {
        Vec::new()
    };
    let backend = NetBackend {
        iface,
        dev: dev.clone(),
        conn: conn.clone(),
        shared: shared.clone(),
        dispatch: dispatch.clone(),
        workers: Arc::new(workers),
        ticks: Arc::new(ticks),
    };
    let ticks = backend.ticks.clone();
    let mut daemon = VhostUserDaemon::new(format!("vhost-{name}"), backend, mem)?;
    for (h, t) in daemon.get_epoll_handlers().iter().zip(ticks.iter()) {
        let fd = t.lock().unwrap_or_else(|e| e.into_inner()).as_raw_fd();
        h.register_listener(fd, EventSet::IN, u64::from(tick_event(dev.pairs))).map_err(ServeError::Tick)?;
    }
    daemon.start(listener)?;
    if dev.stop.load(Relaxed) {
        daemon.request_shutdown();
        let _ = daemon.wait();
        return Ok(());
    }
    *dev.shutdown.lock().unwrap_or_else(|e| e.into_inner()) = daemon.shutdown_handle();
    dev.conn.store(Some(conn));
    dev.stats.connections.fetch_add(1, Relaxed);
    dev.stats.connected.store(true, Relaxed);
    tracing::info!(interface = %name, "vhost-user front end connected");
    let r = daemon.wait();
    dev.conn.store(None);
    dev.stats.connected.store(false, Relaxed);
    *dev.shutdown.lock().unwrap_or_else(|e| e.into_inner()) = None;
    drop(daemon); // ends the ring threads and unmaps the guest's memory
    match r {
        Ok(()) => tracing::info!(interface = %name, "vhost-user front end gone; waiting for the next"),
        Err(e) => tracing::info!(interface = %name, "vhost-user front end gone ({e}); waiting for the next"),
    }
    Ok(())
}
