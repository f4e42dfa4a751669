//! vhost-user-net interfaces: vnetd serves a vhost-user socket, QEMU (the
//! front end) shares the guest's memory with it, and vnetd reads the frames
//! the guest sends straight from its TX virtqueue and writes the frames for
//! it straight into its RX buffers. No TAP, no kernel crossing per frame:
//! this is the position VNET/P took inside the VMM.
//!
//! The protocol, the memory table and the rings come from the rust-vmm
//! crates (`vhost`, `vhost-user-backend`, `virtio-queue`, `vm-memory`);
//! what is written here is the network device on top of them, because it is
//! the data path: how frames leave and enter the rings, when vnetd wakes and
//! when it wakes the guest.
//!
//! - **Offloads.** vnetd offers checksum and TSO4/6 both ways, mergeable RX
//!   buffers and `VERSION_1`: the guest hands over 64 KB segments with a
//!   partial checksum, and gets them back the same way (a frame spreads over
//!   as many RX buffers as it needs, `num_buffers` says how many). A guest
//!   that declines the RX offloads gets finished frames (the data path's
//!   software segmentation).
//! - **Dispatch on the rings** (the paper's modes, per interface): `notify`
//!   processes the TX ring when the guest kicks and re-enables kicks at
//!   once (guest-driven); `poll` keeps the kicks suppressed and polls the
//!   ring for a while after the last frame (VMM-driven); `adaptive`
//!   switches by frame rate with the data path's hysteresis.
//! - **Optimistic interrupts** (VNET/P+): the guest is signalled as soon as
//!   the first frame of a burst is in its RX ring, and once more when the
//!   burst ends (the data path's batch), never on a timer; with `EVENT_IDX`
//!   every signal the guest did not ask for is suppressed. Kicks, signals,
//!   suppressed signals and mode switches are counted.
//! - **Multiqueue** where QEMU asks (`queues N`: N pairs, each served by
//!   its own thread; frames for the guest spread over the pairs by flow).
//! - **Reconnect.** vnetd listens on the socket for as long as the interface
//!   exists; when QEMU goes away the connection's state is dropped and the
//!   next QEMU started on the same socket is served afresh.
//!
//! Nothing the guest writes is trusted: descriptor addresses and lengths go
//! through `vm-memory`'s checked accessors, a chain longer than the largest
//! frame is dropped and counted, and a ring without buffers drops the frame
//! (counted) rather than queueing it.

use crate::shared::Shared;
use arc_swap::ArcSwapOption;
use std::io::{self, IoSlice};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};
use vmm_sys_util::timerfd::TimerFd;
use vnet_core::Port;
use vnet_engine::flow::flow_hash;
use vnet_engine::port::{Payload, Port as EnginePort, Scratch};
use vnet_engine::{DispatchStats, Dispatcher, Forwarder};
use vnet_wire::virtio::{self, VirtioNetHdr};

mod serve;
pub use serve::{serve, Serve};

type Mem = GuestMemoryAtomic<vnet_virtio::Memory>;
type Ring = VringRwLock<Mem>;

/// Ring size vnetd accepts (QEMU's default is 256).
const QUEUE_SIZE: usize = 1024;
/// Most queue pairs an interface offers.
pub const MAX_PAIRS: usize = 16;
/// How often an `adaptive` ring's rate is looked at when no kick comes.
const TICK: std::time::Duration = std::time::Duration::from_millis(100);
/// Frames taken from the TX ring before the dispatch looks at its mode.
const TX_BATCH: usize = 64;
/// Bytes of a TX frame copied out for routing (its headers) when the rest
/// is cut through from guest memory.
const CUT_HEAD: usize = 128;
use vnet_virtio::{Rings, HDR_MRG};

/// What vnetd offers the guest.
fn offered_features(pairs: usize) -> u64 {
    let bits = [
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_RING_F_INDIRECT_DESC,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_HOST_TSO4,
        VIRTIO_NET_F_HOST_TSO6,
        VIRTIO_NET_F_HOST_ECN,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_GUEST_ECN,
        VIRTIO_NET_F_MRG_RXBUF,
        // After a live migration the guest announces itself (a gratuitous
        // ARP, an unsolicited NA) when QEMU tells it to: its first frame
        // on the destination, which activates the interface there.
        VIRTIO_NET_F_GUEST_ANNOUNCE,
    ];
    // QEMU starts a vhost-user NIC only with the protocol features, and
    // migrates it only if the back end logs the pages it writes.
    let mut f = bits.iter().fold(0u64, |f, b| f | 1 << b)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        | VhostUserVirtioFeatures::LOG_ALL.bits();
    if pairs > 1 {
        f |= 1 << VIRTIO_NET_F_MQ | 1 << VIRTIO_NET_F_CTRL_VQ;
    }
    f
}

/// The RX offloads that let vnetd hand the guest frames as they came.
const GUEST_OFFLOADS: u64 =
    1 << VIRTIO_NET_F_GUEST_CSUM | 1 << VIRTIO_NET_F_GUEST_TSO4 | 1 << VIRTIO_NET_F_GUEST_TSO6;

/// The ring counters of a vhost-user interface. Serialized as named here
/// (`show interfaces`, `vnet_interface_<name>`), the connection's three
/// with a `vhost_` prefix.
#[derive(Debug, Default, serde::Serialize)]
pub struct RingStats {
    /// TX kicks from the guest (each one woke vnetd).
    pub kicks: AtomicU64,
    /// RX kicks: the guest refilled its receive buffers.
    pub rx_kicks: AtomicU64,
    /// Interrupts sent to the guest, first-of-burst ones among them.
    pub signals: AtomicU64,
    pub early_signals: AtomicU64,
    /// Signals EVENT_IDX said the guest did not need.
    pub signals_suppressed: AtomicU64,
    /// Frames for the guest dropped: no (or too few) RX buffers posted.
    pub rx_no_buffers: AtomicU64,
    /// Chains from the guest that could not be read (dropped).
    pub bad_chains: AtomicU64,
    /// Frames from the guest cut through: handed to their destination
    /// from guest memory, not through the frame buffer.
    pub cut_through: AtomicU64,
    /// Small frames for the guest held for the end of their burst and
    /// placed there together, under one lock of the ring.
    pub held_frames: AtomicU64,
    /// Front ends served since the interface was made (1 + reconnects).
    #[serde(rename = "vhost_connections")]
    pub connections: AtomicU64,
    /// Whether a front end is connected now (0/1).
    #[serde(rename = "vhost_connected", serialize_with = "flag")]
    pub connected: AtomicBool,
    /// Features the guest acknowledged.
    #[serde(rename = "vhost_features")]
    pub features: AtomicU64,
    /// Per queue pair: frames placed in its RX ring, and chains taken from
    /// its TX ring (over every connection), so how a guest spreads its
    /// traffic over the pairs shows.
    #[serde(skip)]
    pub pair_rx: [AtomicU64; MAX_PAIRS],
    #[serde(skip)]
    pub pair_tx: [AtomicU64; MAX_PAIRS],
}

/// A flag as 0/1, so Prometheus text carries it.
fn flag<S: serde::Serializer>(b: &AtomicBool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::from(b.load(Relaxed)))
}

/// One front-end connection: the guest's memory and, as each pair's thread
/// first hears from it, that pair's RX ring (set once: a new connection is
/// a new `Conn`, so reading it takes no atomic write).
struct Conn {
    mem: Mem,
    rx: Vec<std::sync::OnceLock<Ring>>,
    /// Pairs whose RX ring is known, for spreading frames by flow.
    live: AtomicUsize,
    acked: AtomicU64,
    /// Per pair: the burst in progress (frames since the guest was last
    /// signalled, the small frames held for the end of the burst).
    bursts: Vec<Mutex<Burst>>,
}

impl Conn {
    fn hdr_len(&self) -> usize {
        let a = self.acked.load(Relaxed);
        if a & (1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MRG_RXBUF) != 0 {
            HDR_MRG
        } else {
            virtio::LEN
        }
    }
}

/// The guest side of a vhost-user interface, as the data path sees it.
pub struct VhostDev {
    pub socket: PathBuf,
    pub pairs: usize,
    /// CPUs for the queue-pair threads: pair p on `cpus[p % len]` (empty:
    /// unplaced), as `vnetd --worker-cpus` places the other workers.
    cpus: Vec<usize>,
    pub stats: RingStats,
    conn: ArcSwapOption<Conn>,
    stop: AtomicBool,
    shutdown: Mutex<Option<ShutdownHandle>>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for VhostDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostDev").field("socket", &self.socket).field("pairs", &self.pairs).finish()
    }
}

impl VhostDev {
    /// Whether frames may reach the guest with their offload header as is.
    pub fn takes_offloads(&self) -> bool {
        self.stats.features.load(Relaxed) & GUEST_OFFLOADS == GUEST_OFFLOADS
    }

    /// Writes one frame into the guest's RX ring. `parts` concatenated are
    /// the 10-byte `virtio_net_hdr` and the frame. Returns whether it was
    /// placed (or held, below); the guest is signalled for the first frame
    /// of a burst, and by [`VhostDev::end_burst`] for the rest.
    ///
    /// The first frame of a burst is placed at once (optimistic
    /// interrupts). A small frame after it (at most [`HELD_FRAME`] bytes)
    /// is copied aside while the guest has posted buffers for it, and the
    /// frames held are placed together at the end of the burst, under one
    /// lock of the ring and one opening of its rings: at 64-byte frames the
    /// lock, the loads and the opening cost more than the frame. A frame
    /// that is not held places the ones held before it first, so a pair's
    /// frames keep their order.
    pub fn deliver(&self, parts: &[IoSlice<'_>]) -> bool {
        let guard = self.conn.load();
        let Some(conn) = guard.as_ref() else {
            self.stats.rx_no_buffers.fetch_add(1, Relaxed);
            return false;
        };
        // The pair by flow, where the guest runs more than one.
        let live = conn.live.load(Relaxed).max(1);
        let pair = if live > 1 { (flow_hash(frame_start(parts)) % live as u64) as usize } else { 0 };
        let Some(ring) = conn.rx.get(pair).and_then(|r| r.get()) else {
            self.stats.rx_no_buffers.fetch_add(1, Relaxed);
            return false;
        };
        let mut b = conn.bursts[pair].lock().unwrap_or_else(|e| e.into_inner());
        if b.frames > 0 && b.hold(parts) {
            b.frames += 1;
            return true;
        }
        let first = b.frames == 0;
        let placed = self.place(conn, pair, ring, &mut b, Some(parts), first);
        if placed {
            b.frames += 1;
            if first {
                self.stats.early_signals.fetch_add(1, Relaxed);
            }
        }
        placed
    }

    /// Places the frames `b` holds and then `frame` (if any) in pair
    /// `pair`'s RX ring, under one lock of it; then, if `signal`, signals
    /// the guest (for a `frame`, only if it was placed). Counts what is
    /// placed and what finds no buffer; returns whether `frame` was placed.
    /// `b` learns how many chains the guest has left posted, which the next
    /// frames held may take.
    fn place(
        &self,
        conn: &Conn,
        pair: usize,
        ring: &Ring,
        b: &mut Burst,
        frame: Option<&[IoSlice<'_>]>,
        signal: bool,
    ) -> bool {
        let hdr_len = conn.hdr_len();
        let mrg = conn.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let mem = conn.mem.memory();
        let mut v = ring.get_mut();
        let rings = if v.is_enabled() { Rings::open(v.get_queue(), &mem).ok() } else { None };
        let Some(mut r) = rings else {
            let lost = b.held as u64 + u64::from(frame.is_some());
            self.stats.rx_no_buffers.fetch_add(lost, Relaxed);
            b.clear();
            return false;
        };
        let (mut placed, mut lost, mut bad) = (0u64, 0u64, 0u64);
        let mut put =
            |r: &mut Rings<'_>, parts: &[IoSlice<'_>]| match vnet_virtio::scatter(r, parts, hdr_len, mrg) {
                Some(p) => {
                    placed += 1;
                    bad += p.bad_used as u64;
                    true
                }
                None => {
                    lost += 1;
                    false
                }
            };
        for k in 0..b.held {
            put(&mut r, &[IoSlice::new(b.frame(k))]);
        }
        if b.held > 0 {
            self.stats.held_frames.fetch_add(b.held as u64, Relaxed);
        }
        b.clear();
        let ok = frame.is_some_and(|f| put(&mut r, f));
        b.credit = r.available().unwrap_or(0);
        if placed > 0 {
            self.stats.pair_rx[pair].fetch_add(placed, Relaxed);
        }
        if lost > 0 {
            self.stats.rx_no_buffers.fetch_add(lost, Relaxed);
        }
        if bad > 0 {
            self.stats.bad_chains.fetch_add(bad, Relaxed);
        }
        if signal && (ok || frame.is_none()) {
            self.signal(&r, &mut b.asked, &v);
        }
        r.close(v.get_queue_mut());
        ok
    }

    /// The end of a data-path batch: signals each pair that got frames
    /// since its first-of-burst signal.
    pub fn end_burst(&self) {
        let guard = self.conn.load();
        let Some(conn) = guard.as_ref() else { return };
        for (pair, b) in conn.bursts.iter().enumerate() {
            let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
            let Some(ring) = conn.rx[pair].get() else { continue };
            // Frames are held only after a burst's first, so a burst with
            // frames held has had more than one: they are placed and the
            // guest signalled under the same lock of the ring.
            if std::mem::take(&mut b.frames) > 1 {
                self.place(conn, pair, ring, &mut b, None, true);
            }
        }
    }

    /// Signals the guest that a ring has used buffers, unless it said it
    /// wants no signal: with `EVENT_IDX` by its used event index, since
    /// the used index `asked` (when it was last asked; updated); without,
    /// by `VRING_AVAIL_F_NO_INTERRUPT` (a guest polling its rings sets it).
    /// Called with the ring's lock held (`v`), after the used entries were
    /// published.
    fn signal(&self, r: &Rings<'_>, asked: &mut u16, v: &vhost_user_backend::VringState<Mem>) {
        if r.needs_signal(asked) {
            self.stats.signals.fetch_add(1, Relaxed);
            let _ = v.signal_used_queue();
        } else {
            self.stats.signals_suppressed.fetch_add(1, Relaxed);
        }
    }

    /// Whether the connected front end has the guest's pages logged (a
    /// live migration is under way), and the writes marked in its log
    /// since the guest's memory was last mapped.
    pub fn dirty_log(&self) -> (bool, u64) {
        let guard = self.conn.load();
        let Some(conn) = guard.as_ref() else { return (false, 0) };
        let mem = conn.mem.memory();
        let on = vnet_virtio::log::logs(&mem).any(vnet_virtio::DirtyLog::logging);
        (on, vnet_virtio::log::marked(&mem))
    }

    /// Stops serving: drops the connection, ends the listener thread and
    /// removes the socket.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.shutdown.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.shutdown();
        }
        // Wake an accept that waits for a front end.
        let _ = UnixStream::connect(&self.socket);
        if let Some(j) = self.server.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = j.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl EnginePort for VhostDev {
    fn takes_offloads(&self) -> bool {
        VhostDev::takes_offloads(self)
    }

    /// Places each frame in the guest's RX ring; a plain frame gets an
    /// empty `virtio_net_hdr` in front (the guest always reads one).
    fn send(&self, _: &mut Scratch, payload: Payload<'_>) -> bool {
        payload.each_frame(|parts, hdr| {
            if hdr {
                return self.deliver(parts);
            }
            let none = VirtioNetHdr::NONE.emit();
            // A frame in one or two pieces (nearly all) without filling a
            // 66-slice array first: at small frames that array cost more
            // than the frame's copy.
            match *parts {
                [p] => return self.deliver(&[IoSlice::new(&none), p]),
                [p, q] => return self.deliver(&[IoSlice::new(&none), p, q]),
                _ => {}
            }
            let mut all = [IoSlice::new(&[]); vnet_engine::GSO_MAX_SEGS + 2];
            if parts.len() + 1 > all.len() {
                return false;
            }
            all[0] = IoSlice::new(&none);
            all[1..=parts.len()].copy_from_slice(parts);
            self.deliver(&all[..=parts.len()])
        })
    }

    fn batches(&self) -> bool {
        true
    }

    fn end_burst(&self) {
        VhostDev::end_burst(self)
    }
}

/// Largest frame (with its 10-byte header) held for the end of a burst.
pub const HELD_FRAME: usize = 256;
/// Most frames held at once per pair.
const HELD: usize = 64;

/// A pair's burst in progress: how many frames it has had since the guest
/// was last signalled, and the small frames held for its end, copied into
/// a buffer of the pair's (allocated once a connection).
struct Burst {
    frames: usize,
    held: usize,
    /// RX chains the guest had posted and vnetd not taken when the ring
    /// was last open, less the frames held since: a frame is held only
    /// while one is left for it (a small frame takes one chain of a driver
    /// that posts buffers of at least 256 bytes, as every driver does).
    credit: u16,
    /// The RX ring's used index when the guest's wish for a signal was
    /// last read (`Rings::needs_signal`).
    asked: u16,
    buf: Vec<u8>,
    len: [u16; HELD],
}

impl Burst {
    fn new() -> Burst {
        Burst { frames: 0, held: 0, credit: 0, asked: 0, buf: vec![0u8; HELD * HELD_FRAME], len: [0; HELD] }
    }

    /// Copies `parts` aside if it is small and there is room and credit.
    fn hold(&mut self, parts: &[IoSlice<'_>]) -> bool {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > HELD_FRAME || self.held == HELD || self.credit == 0 {
            return false;
        }
        let mut at = self.held * HELD_FRAME;
        for p in parts {
            self.buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.len[self.held] = total as u16;
        self.held += 1;
        self.credit -= 1;
        true
    }

    fn frame(&self, k: usize) -> &[u8] {
        &self.buf[k * HELD_FRAME..k * HELD_FRAME + usize::from(self.len[k])]
    }

    fn clear(&mut self) {
        self.held = 0;
    }
}

/// The frame's first bytes: what follows the 10-byte header in `parts`.
fn frame_start<'a>(parts: &'a [IoSlice<'a>]) -> &'a [u8] {
    let mut skip = virtio::LEN;
    for p in parts {
        if p.len() > skip {
            return &p[skip..];
        }
        skip -= p.len();
    }
    &[]
}

/// Per-thread state of a pair's worker: its forwarder, frame buffer and
/// dispatch.
struct PairWorker {
    fw: Forwarder,
    buf: Vec<u8>,
    /// The guest ranges of the frame being cut through.
    ranges: [(vm_memory::GuestAddress, usize); vnet_virtio::MAX_TX_RANGES],
    dispatch: Dispatcher,
    /// `RingStats::pair_rx` of this pair when the dispatch last looked.
    placed_seen: u64,
    /// Whether this pair's thread has been put on its CPU (the library
    /// makes the threads; each places itself at its first event).
    placed_on_cpu: bool,
    /// The TX ring's used index when the guest's wish for a signal was
    /// last read.
    tx_asked: u16,
}

/// The `vhost-user-backend` device of one connection.
#[derive(Clone)]
struct NetBackend {
    iface: u32,
    dev: Arc<VhostDev>,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    dispatch: Arc<DispatchStats>,
    workers: Arc<Vec<Mutex<PairWorker>>>,
    /// `adaptive` only: a 100 ms tick per pair thread, so that a ring that
    /// went idle while polling is seen to be idle and goes back to `notify`
    /// (an idle ring sends no kicks that would tell).
    ticks: Arc<Vec<Mutex<TimerFd>>>,
}

/// A 100 ms tick's event id on a pair thread: past the rings and the
/// library's exit event.
fn tick_event(pairs: usize) -> u16 {
    (2 * pairs + 1) as u16
}

impl VhostUserBackend for NetBackend {
    type Bitmap = vnet_virtio::DirtyLog;
    type Vring = Ring;

    fn num_queues(&self) -> usize {
        2 * self.dev.pairs
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        offered_features(self.dev.pairs)
    }

    fn acked_features(&self, features: u64) {
        self.conn.acked.store(features, Relaxed);
        self.dev.stats.features.store(features, Relaxed);
        // Logging ends when QEMU clears LOG_ALL (the migration ended or
        // failed); it began with the log QEMU set (`DirtyLog::replace`).
        if features & VhostUserVirtioFeatures::LOG_ALL.bits() == 0 {
            vnet_virtio::log::stop_logging(&self.conn.mem.memory());
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // LOG_SHMFD: the dirty log is memory QEMU shares (SET_LOG_BASE).
        let mut p = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::LOG_SHMFD;
        if self.dev.pairs > 1 {
            p |= VhostUserProtocolFeatures::MQ;
        }
        p
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn update_memory(&self, _mem: Mem) -> io::Result<()> {
        // The handler has already swapped the memory every ring and the
        // data path read through `Conn::mem`.
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.dev.pairs).map(|p| 0b11u64 << (2 * p)).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(&self, event: u16, _evset: EventSet, vrings: &[Ring], thread: usize) -> io::Result<()> {
        if event == tick_event(self.dev.pairs) {
            if let Some(t) = self.ticks.get(thread) {
                let _ = t.lock().unwrap_or_else(|e| e.into_inner()).wait();
            }
            if let Some(w) = self.workers.get(thread) {
                let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                self.place(thread, &mut w);
                self.record(thread, &mut w, false, 0, Instant::now());
            }
            return Ok(());
        }
        let (Some(rx), Some(tx), Some(slot)) = (vrings.first(), vrings.get(1), self.conn.rx.get(thread))
        else {
            return Ok(());
        };
        if slot.get().is_none() && slot.set(rx.clone()).is_ok() {
            self.conn.live.fetch_max(thread + 1, Relaxed);
        }
        if event == 0 {
            // New RX buffers. A frame that finds none is dropped, never
            // queued for them, so these kicks are of no use: switched off
            // (each would wake this thread to contend for the ring's lock).
            self.dev.stats.rx_kicks.fetch_add(1, Relaxed);
            let _ = rx.disable_notification();
            return Ok(());
        }
        self.dev.stats.kicks.fetch_add(1, Relaxed);
        self.dispatch.wakeups.fetch_add(1, Relaxed);
        let Some(w) = self.workers.get(thread) else { return Ok(()) };
        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
        self.place(thread, &mut w);
        self.serve_tx(thread, tx, &mut w);
        Ok(())
    }
}

impl NetBackend {
    /// Puts the calling pair thread on its CPU, once per connection.
    fn place(&self, pair: usize, w: &mut PairWorker) {
        if w.placed_on_cpu || self.dev.cpus.is_empty() {
            return;
        }
        w.placed_on_cpu = true;
        let cpu = self.dev.cpus[pair % self.dev.cpus.len()];
        if let Err(e) = crate::sys::pin_current_thread(cpu) {
            tracing::warn!(pair, "vhost-user pair thread: cannot run on cpu {cpu} only: {e}; left unpinned");
        }
    }

    /// Empties the TX ring, keeps polling it as the dispatch mode says (kicks
    /// stay suppressed meanwhile), then re-enables kicks.
    fn serve_tx(&self, pair: usize, tx: &Ring, w: &mut PairWorker) {
        loop {
            let _ = tx.disable_notification();
            let mut polled = false;
            loop {
                let n = self.tx_batch(tx, w);
                self.dev.stats.pair_tx[pair].fetch_add(n as u64, Relaxed);
                let now = Instant::now();
                self.record(pair, w, std::mem::take(&mut polled), n, now);
                if n > 0 {
                    continue;
                }
                if w.dispatch.keep_polling(now) && !self.dev.stop.load(Relaxed) {
                    polled = true;
                    if !crate::workers::poll_once(std::iter::once(&*self.dispatch)) {
                        w.dispatch.contended(Instant::now());
                    }
                    continue;
                }
                break;
            }
            // A frame may have come between the last look and re-enabling.
            match tx.enable_notification() {
                Ok(true) if !self.dev.stop.load(Relaxed) => continue,
                _ => break,
            }
        }
    }

    /// A look that took `n` frames from the guest at `now` (`polled`: the
    /// one before found nothing and the thread polled on).
    fn record(&self, pair: usize, w: &mut PairWorker, polled: bool, n: usize, now: Instant) {
        // The pair's frame rate counts both ways, as the paper's did: what
        // the guest sends and what it is given.
        let placed = self.dev.stats.pair_rx.get(pair).map_or(0, |p| p.load(Relaxed));
        let given = placed.wrapping_sub(w.placed_seen) as usize;
        w.placed_seen = placed;
        crate::workers::record_look(&mut w.dispatch, &self.dispatch, polled, n, n + given, now);
    }

    /// Takes up to a batch of frames from the TX ring and forwards them:
    /// cut through (VNET/P+) where it can be, the frame's headers copied
    /// out for routing and the rest handed over from guest memory, so it is
    /// copied once, by the destination; through the frame buffer otherwise.
    /// A TX buffer is given back only once its frame has been taken.
    fn tx_batch(&self, tx: &Ring, w: &mut PairWorker) -> usize {
        let plane = self.shared.plane.load();
        let Some(ifc) = plane.ifaces.get(&self.iface) else { return 0 };
        let mem = self.conn.mem.memory();
        let hdr_len = self.conn.hdr_len();
        let port = Port::Interface(self.iface);
        let mut n = 0;
        // Frames and bytes taken, and frames cut through: counted once a
        // batch (two atomic adds a frame were a tenth of a 64-byte frame's cost).
        let (mut frames, mut bytes, mut cut) = (0u64, 0u64, 0u64);
        // The TX ring's lock for the whole batch (one lock, not two a frame):
        // only this pair's thread takes frames from it; a front end's
        // control message waits for the batch.
        let mut txv = tx.get_mut();
        let Ok(mut r) = Rings::open(txv.get_queue(), &mem) else { return 0 };
        while n < TX_BATCH {
            let Some(head) = r.pop() else { break };
            n += 1;
            let split =
                vnet_virtio::split(&*mem, r.chain(head), &mut w.buf, hdr_len + CUT_HEAD, &mut w.ranges);
            let taken = match split.filter(|sp| sp.copied >= hdr_len && sp.len > hdr_len) {
                Some(sp) => self.take(&plane, port, &mem, hdr_len, sp, w),
                None => None,
            };
            match taken {
                Some((len, through)) => {
                    frames += 1;
                    bytes += len as u64;
                    cut += u64::from(through);
                }
                None => {
                    self.dev.stats.bad_chains.fetch_add(1, Relaxed);
                    ifc.rx.drop_one();
                }
            }
            if !r.used(head, 0) {
                self.dev.stats.bad_chains.fetch_add(1, Relaxed);
            }
        }
        if n > 0 {
            // Completions of the guest's sends (one used-index store for the
            // batch): it reclaims its buffers.
            r.publish();
            self.dev.signal(&r, &mut w.tx_asked, &txv);
        }
        r.close(txv.get_queue_mut());
        drop(txv);
        ifc.rx.add_many(frames, bytes);
        if cut > 0 {
            self.dev.stats.cut_through.fetch_add(cut, Relaxed);
        }
        if n > 0 {
            w.fw.report();
        }
        n
    }

    /// Forwards one frame read by [`vnet_virtio::split`]: cut through when
    /// some of it stayed in guest memory and its destinations take it in
    /// pieces, else copied whole into the frame buffer first. Returns the
    /// frame's length and whether it was cut through; `None` for a frame
    /// that is not one (a bad header, memory not the guest's).
    fn take(
        &self,
        plane: &vnet_engine::Plane,
        port: Port,
        mem: &vnet_virtio::Memory,
        hdr_len: usize,
        sp: vnet_virtio::Split,
        w: &mut PairWorker,
    ) -> Option<(usize, bool)> {
        // The 10-byte header right before the frame (past `num_buffers`).
        let vh_at = hdr_len - virtio::LEN;
        w.buf.copy_within(..virtio::LEN, vh_at);
        let vh = VirtioNetHdr::parse(&w.buf[vh_at..])?;
        let frame_len = sp.len - hdr_len;
        if sp.ranges > 0 && sp.copied >= hdr_len + 14 {
            let mut iov = [IoSlice::new(&[]); vnet_virtio::MAX_TX_RANGES + 1];
            iov[0] = IoSlice::new(&w.buf[vh_at..sp.copied]);
            let mut k = 1;
            for &(a, l) in &w.ranges[..sp.ranges] {
                let Ok(s) = vm_memory::GuestMemoryBackend::get_slice(mem, a, l) else { break };
                iov[k] = IoSlice::new(crate::sys::guest_bytes(&s));
                k += 1;
            }
            if k == sp.ranges + 1 && w.fw.forward_parts(plane, port, &iov[..k], virtio::LEN + frame_len) {
                return Some((frame_len, true));
            }
        }
        // Whole, in the frame buffer: the ranges copied after the head.
        let mut at = sp.copied;
        for &(a, l) in &w.ranges[..sp.ranges] {
            vnet_virtio::read_into(mem, a, w.buf.get_mut(at..at + l)?)?;
            at += l;
        }
        w.fw.forward(plane, port, vh, &mut w.buf[hdr_len..sp.len]);
        Some((frame_len, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_holds_small_frames_while_the_guest_has_buffers_and_room_is_left() {
        let mut b = Burst::new();
        let small = [0x11u8; 70];
        let parts = [IoSlice::new(&small[..10]), IoSlice::new(&small[10..])];
        assert!(!b.hold(&parts), "no credit yet: the ring was never open");
        b.credit = 2;
        assert!(!b.hold(&[IoSlice::new(&[0u8; HELD_FRAME + 1])]), "too large");
        assert!(b.hold(&parts) && b.hold(&parts));
        assert!(!b.hold(&parts), "credit used up");
        assert_eq!((b.held, b.frame(1)), (2, &small[..]));
        b.clear();
        b.credit = u16::MAX;
        for _ in 0..HELD {
            assert!(b.hold(&parts));
        }
        assert!(!b.hold(&parts), "room used up");
    }

    #[test]
    fn frame_start_skips_the_header_however_it_is_split() {
        let (h, f) = ([9u8; 10], [1u8, 2, 3, 4]);
        let mut joined = h.to_vec();
        joined.extend_from_slice(&f);
        assert_eq!(frame_start(&[IoSlice::new(&h), IoSlice::new(&f)]), &f);
        assert_eq!(frame_start(&[IoSlice::new(&joined)]), &f);
        assert_eq!(frame_start(&[IoSlice::new(&h[..4]), IoSlice::new(&h[4..]), IoSlice::new(&f)]), &f);
        assert!(frame_start(&[IoSlice::new(&h)]).is_empty());
    }

    #[test]
    fn features_offer_offloads_and_multiqueue_only_when_asked() {
        let one = offered_features(1);
        assert_ne!(one & 1 << VIRTIO_NET_F_MRG_RXBUF, 0);
        assert_eq!(one & GUEST_OFFLOADS, GUEST_OFFLOADS);
        assert_eq!(one & 1 << VIRTIO_NET_F_MQ, 0);
        assert_ne!(offered_features(4) & 1 << VIRTIO_NET_F_MQ, 0);
    }
}
