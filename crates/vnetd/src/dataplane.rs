//! The data path: workers that move frames between interfaces (TAPs and
//! netdevs) and the UDP link socket.
//!
//! Written by hand because it is the product: no library does Palacios
//! routing over TAPs and UDP with vnet's formats. The shape leaves room for
//! the fast paths that come later (batched and offloaded I/O, an eBPF
//! kernel path, vhost-user rings): a worker owns one source of frames and
//! everything it needs per frame (route cache, decision list, scratch
//! buffer, reassembler), so the per-frame path takes no lock and allocates
//! nothing.
//!
//! What the workers share is one [`Plane`]: the route table, the ports by
//! id and the link socket, published through an [`ArcSwap`]. The control
//! plane never changes a plane; it builds a new one and stores it. A worker
//! loads the current plane for each frame (a few nanoseconds, no lock), and
//! its route cache notices the new table's generation and starts over.

use arc_swap::ArcSwap;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use rustc_hash::FxHashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use vnet_control::{LinkDef, LinkFormat};
use vnet_core::table::Decision;
use vnet_core::{Counters, Port, RouteCache, RouteTable};
use vnet_wire::vnet::{Flags, VnetPacket, VnetRepr, MAX_FRAME_LEN};
use vnet_wire::{frag, reasm, EthernetFrame, MacAddr};

/// Largest frame read from a TAP or received from a link.
pub const MAX_FRAME: usize = MAX_FRAME_LEN as usize;
/// Route cache entries per worker.
const CACHE_SLOTS: usize = 4096;
/// Size of a worker's encapsulation scratch buffer: a largest frame split at
/// the smallest underlay MTU, with headers.
const SCRATCH: usize = 2 * MAX_FRAME;
/// Socket buffer size asked for on the link socket.
pub const SOCKET_BUFFER: usize = 8 << 20;

/// A local interface as the data path sees it.
#[derive(Debug)]
pub struct IfacePort {
    pub id: u32,
    pub name: String,
    pub dev: String,
    /// The VM's MAC, when known (a TAP's own address, or the `mac` option).
    pub mac: Option<MacAddr>,
    /// The TAP's file, or a packet socket bound to the netdev: either way a
    /// read takes one frame from the VM and a write gives one to it.
    pub file: File,
    /// Frames from the VM.
    pub rx: Counters,
    /// Frames to the VM.
    pub tx: Counters,
}

/// A link as the data path sees it.
#[derive(Debug)]
pub struct LinkPort {
    pub def: LinkDef,
    /// Frames received from the peer.
    pub rx: Counters,
    /// Frames sent to the peer.
    pub tx: Counters,
    next_frame_id: AtomicU32,
}

impl LinkPort {
    pub fn new(def: LinkDef) -> Self {
        LinkPort { def, rx: Counters::default(), tx: Counters::default(), next_frame_id: AtomicU32::new(0) }
    }

    /// The largest UDP payload that crosses the underlay unfragmented.
    fn max_datagram(&self) -> usize {
        let ip = if self.def.remote.is_ipv4() { 20 } else { 40 };
        (self.def.mtu as usize).saturating_sub(ip + 8)
    }
}

/// Daemon-wide counters of frames that no port accounts for.
#[derive(Debug, Default)]
pub struct Global {
    /// Frames no route matched.
    pub no_route: AtomicU64,
    /// Datagrams from an address that is not a configured link.
    pub unknown_source: AtomicU64,
    /// Frames or datagrams too short or malformed to route.
    pub malformed: AtomicU64,
    /// `vnet` datagrams carrying another network id than the link's.
    pub wrong_network: AtomicU64,
    /// Reassembly, as last reported by the link worker.
    pub reasm_fragments: AtomicU64,
    pub reasm_completed: AtomicU64,
    pub reasm_timed_out: AtomicU64,
    pub reasm_evicted: AtomicU64,
    pub reasm_rejected: AtomicU64,
    /// Route cache totals over all workers.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
}

/// What every worker reads: an immutable snapshot of routes and ports.
#[derive(Default)]
pub struct Plane {
    pub table: RouteTable,
    pub ifaces: FxHashMap<u32, Arc<IfacePort>>,
    pub links: FxHashMap<u32, Arc<LinkPort>>,
    /// Links by peer IP, to attribute arriving datagrams.
    pub links_by_ip: FxHashMap<IpAddr, u32>,
    pub socket: Option<Arc<UdpSocket>>,
}

/// State shared by the control plane and every worker.
pub struct Shared {
    pub plane: ArcSwap<Plane>,
    pub global: Global,
    start: Instant,
}

impl Shared {
    pub fn new() -> Arc<Self> {
        Arc::new(Shared {
            plane: ArcSwap::from_pointee(Plane::default()),
            global: Global::default(),
            start: Instant::now(),
        })
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

/// Per-worker forwarding state: nothing here is shared or allocated per frame.
struct Forwarder {
    shared: Arc<Shared>,
    cache: RouteCache,
    decisions: Vec<Decision>,
    scratch: Vec<u8>,
    cache_reported: (u64, u64),
}

impl Forwarder {
    fn new(shared: Arc<Shared>) -> Self {
        Forwarder {
            shared,
            cache: RouteCache::new(CACHE_SLOTS),
            decisions: Vec::with_capacity(64),
            scratch: vec![0u8; SCRATCH],
            cache_reported: (0, 0),
        }
    }

    /// Routes one frame that arrived on `ingress` and delivers it.
    fn forward(&mut self, plane: &Plane, ingress: Port, frame: &[u8]) {
        let g = &self.shared.global;
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            g.malformed.fetch_add(1, Relaxed);
            return;
        };
        self.cache.lookup(&plane.table, ingress, eth.src(), eth.dst(), &mut self.decisions);
        if self.decisions.is_empty() {
            g.no_route.fetch_add(1, Relaxed);
        }
        for &(port, ri) in &self.decisions {
            let delivered = match port {
                Port::Interface(id) => plane.ifaces.get(&id).is_some_and(|i| {
                    // A TAP write or packet-socket send takes a whole frame or fails.
                    let ok = matches!((&i.file).write(frame), Ok(n) if n == frame.len());
                    count(&i.tx, ok, frame.len());
                    ok
                }),
                Port::Link(id) => match (plane.links.get(&id), &plane.socket) {
                    (Some(l), Some(sock)) => {
                        let ok = send_link(l, sock, frame, &mut self.scratch).is_ok();
                        count(&l.tx, ok, frame.len());
                        ok
                    }
                    _ => false,
                },
            };
            if let Some(r) = plane.table.route(ri) {
                count(&r.counters, delivered, frame.len());
            }
        }
    }

    /// Publishes this worker's cache counts into the global totals.
    fn report(&mut self) {
        let s = self.cache.stats();
        let g = &self.shared.global;
        g.cache_hits.fetch_add(s.hits - self.cache_reported.0, Relaxed);
        g.cache_misses.fetch_add(s.misses - self.cache_reported.1, Relaxed);
        self.cache_reported = (s.hits, s.misses);
    }
}

/// Counts a frame as delivered or dropped.
#[inline]
fn count(c: &Counters, ok: bool, len: usize) {
    if ok {
        c.add(len);
    } else {
        c.drop_one();
    }
}

/// Encapsulates `frame` for link `l` and sends it.
fn send_link(l: &LinkPort, sock: &UdpSocket, frame: &[u8], scratch: &mut [u8]) -> io::Result<()> {
    match l.def.format {
        LinkFormat::Raw => {
            sock.send_to(frame, l.def.remote)?;
        }
        LinkFormat::Vnet => {
            let base = VnetRepr {
                flags: Flags(0),
                network: l.def.network,
                frame_id: l.next_frame_id.fetch_add(1, Relaxed),
                frame_len: 0,
                offset: 0,
            };
            let segs = frag::split(base, frame, l.max_datagram(), scratch)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            for r in segs.ranges() {
                sock.send_to(&scratch[r], l.def.remote)?;
            }
        }
    }
    Ok(())
}

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

const SOURCE: Token = Token(0);
const WAKE: Token = Token(1);

/// Runs `body` whenever `fd` is readable, until stopped. `body` must read
/// until the source would block (edge-triggered readiness).
fn spawn_worker(
    name: String,
    fd: std::os::fd::RawFd,
    mut body: impl FnMut() + Send + 'static,
) -> io::Result<WorkerHandle> {
    let mut poll = Poll::new()?;
    poll.registry().register(&mut SourceFd(&fd), SOURCE, Interest::READABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let join = std::thread::Builder::new().name(name).spawn(move || {
        let mut events = Events::with_capacity(8);
        // Drain anything that arrived before registration.
        body();
        while !stop2.load(Relaxed) {
            if let Err(e) = poll.poll(&mut events, Some(std::time::Duration::from_millis(500))) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("worker poll failed: {e}");
                    return;
                }
            }
            if events.iter().any(|e| e.token() == SOURCE) {
                body();
            }
        }
    })?;
    Ok(WorkerHandle { stop, waker, join: Some(join) })
}

/// Starts the worker that reads the frames interface `iface`'s VM sends.
pub fn spawn_iface_worker(shared: &Arc<Shared>, iface: Arc<IfacePort>) -> io::Result<WorkerHandle> {
    let fd = iface.file.as_raw_fd();
    let mut fw = Forwarder::new(shared.clone());
    let mut buf = vec![0u8; MAX_FRAME];
    let iface_id = iface.id;
    let port = Port::Interface(iface_id);
    let body = move || loop {
        match (&iface.file).read(&mut buf) {
            Ok(n) => {
                iface.rx.add(n);
                let plane = fw.shared.plane.load();
                fw.forward(&plane, port, &buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                fw.report();
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // EIO while the device is down, for instance: count, go on.
                iface.rx.drop_one();
                fw.report();
                return;
            }
        }
    };
    spawn_worker(format!("vnet-if{iface_id}"), fd, body)
}

/// Starts the worker that receives datagrams on the link socket.
pub fn spawn_link_worker(
    shared: &Arc<Shared>,
    sock: Arc<UdpSocket>,
    reasm_cfg: reasm::Config,
) -> io::Result<WorkerHandle> {
    let fd = sock.as_raw_fd();
    let mut fw = Forwarder::new(shared.clone());
    let mut rx = RxState { buf: vec![0u8; 1 << 16], reasm: reasm::Reassembler::new(reasm_cfg) };
    let body = move || loop {
        match sock.recv_from(&mut rx.buf) {
            Ok((n, from)) => {
                let plane = fw.shared.plane.load();
                rx.datagram(&mut fw, &plane, from, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                rx.report(&fw.shared.global);
                fw.report();
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                fw.shared.global.malformed.fetch_add(1, Relaxed);
            }
        }
    };
    spawn_worker("vnet-link-rx".into(), fd, body)
}

struct RxState {
    buf: Vec<u8>,
    reasm: reasm::Reassembler,
}

impl RxState {
    fn datagram(&mut self, fw: &mut Forwarder, plane: &Plane, from: SocketAddr, n: usize) {
        let g = &fw.shared.global;
        let ip = match from.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        let Some(link) = plane.links_by_ip.get(&ip).and_then(|id| plane.links.get(id)) else {
            g.unknown_source.fetch_add(1, Relaxed);
            return;
        };
        let port = Port::Link(link.def.id);
        let data = &self.buf[..n];
        match link.def.format {
            LinkFormat::Raw => {
                link.rx.add(n);
                fw.forward(plane, port, data);
            }
            LinkFormat::Vnet => {
                let Ok(p) = VnetPacket::new_checked(data) else {
                    link.rx.drop_one();
                    g.malformed.fetch_add(1, Relaxed);
                    return;
                };
                let repr = VnetRepr::parse(&p);
                if repr.network != link.def.network || repr.flags.0 != 0 {
                    link.rx.drop_one();
                    g.wrong_network.fetch_add(1, Relaxed);
                    return;
                }
                if repr.is_whole(p.payload().len()) {
                    link.rx.add(p.payload().len());
                    fw.forward(plane, port, p.payload());
                    return;
                }
                let now = fw.shared.now_ns();
                if let reasm::Outcome::Complete(frame) =
                    self.reasm.push(now, u64::from(link.def.id), &repr, p.payload())
                {
                    link.rx.add(frame.len());
                    fw.forward(plane, port, frame);
                }
            }
        }
    }

    fn report(&self, g: &Global) {
        let s = self.reasm.stats();
        g.reasm_fragments.store(s.fragments, Relaxed);
        g.reasm_completed.store(s.completed, Relaxed);
        g.reasm_timed_out.store(s.timed_out, Relaxed);
        g.reasm_evicted.store(s.evicted, Relaxed);
        g.reasm_rejected.store(s.too_large + s.inconsistent + s.too_fragmented, Relaxed);
    }
}
