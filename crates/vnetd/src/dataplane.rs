//! The data path: workers that move frames between interfaces (TAPs and
//! netdevs) and the UDP link sockets.
//!
//! Written by hand because it is the product: no library does Palacios
//! routing over TAPs and UDP with vnet's formats, and the per-frame cost
//! here decides whether vnet is an order of magnitude beyond the classic
//! user-level overlays. What makes it fast:
//!
//! - **64 KB frames end to end.** Interfaces carry a `virtio_net_hdr`
//!   (`IFF_VNET_HDR` with TSO/checksum offloads on TAPs, `PACKET_VNET_HDR`
//!   on packet sockets), so a VM's TCP hands over 64 KB segments with a
//!   partial checksum, and the receiving VM gets them back whole with the
//!   same header: nobody segments or checksums in between.
//! - **UDP GSO and GRO.** A `vnet` link lays a frame out as underlay-sized
//!   datagrams, each with its own 20-byte header, and gives them to the
//!   kernel in one `sendmsg` (`UDP_SEGMENT`) straight from the read buffer
//!   (an iovec per header and chunk: no copy in user space). The receiver
//!   reads them back coalesced (`UDP_GRO`) and reassembles with one copy.
//! - **Destinations that cannot take offloads** (a `raw` link, a device
//!   without the header) get plain frames finished in software once per
//!   frame (`vnet_wire::offload`), after the offload-capable ones were
//!   served from the untouched frame.
//! - **Dispatch modes** ([`Mode`]): a worker sleeps in epoll (`notify`),
//!   keeps polling for a while after the last frame (`poll`), or switches
//!   between the two by frame rate with hysteresis (`adaptive`: up at 10000
//!   frames/s, down at 1000, measured over 10 ms, as in the paper).
//! - **No lock and no allocation per frame.** Each worker owns its route
//!   cache, decision list, buffers and reassembler; routes and ports come in
//!   an immutable [`Plane`] loaded from an [`ArcSwap`] once per batch.
//! - **Outer source port per inner flow** for `vnet` links, from a small
//!   pool of sockets, so underlay RSS/ECMP can spread the flows.

use crate::sys;
use crate::vhost::VhostDev;
use arc_swap::ArcSwap;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use rustc_hash::{FxHashMap, FxHasher};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vnet_control::{LinkDef, LinkFormat, Mode};
use vnet_core::table::Decision;
use vnet_core::{Counters, Port, RouteCache, RouteTable};
use vnet_wire::offload::{complete_checksum, segment_tcp};
use vnet_wire::virtio::{self, VirtioNetHdr};
use vnet_wire::vnet::{Flags, VnetPacket, VnetRepr, HEADER_LEN as VNET_HDR_LEN, MAX_FRAME_LEN};
use vnet_wire::{frag, reasm, EthernetFrame, MacAddr};

/// Largest frame read from an interface or received from a link.
pub const MAX_FRAME: usize = MAX_FRAME_LEN as usize;
/// Read buffer: a `virtio_net_hdr` and a largest frame, with slack.
pub(crate) const BUF: usize = virtio::LEN + MAX_FRAME + 256;
/// Frames a worker handles per wake-up before it looks at its mode and the
/// stop flag again.
const BATCH: usize = 64;
/// Route cache entries per worker.
const CACHE_SLOTS: usize = 4096;
/// Receive ring of a netdev interface, in 256 KB blocks of 3 frames
/// (4 MB, 48 frames of up to 64 KB).
pub const RX_RING_BLOCKS: usize = 16;
/// Socket buffer size asked for on the link sockets.
pub const SOCKET_BUFFER: usize = 8 << 20;
/// Most datagrams in one GSO send, and most payload bytes in one send.
const GSO_MAX_SEGS: usize = 64;
const GSO_MAX_BYTES: usize = 65_000;
/// Most datagrams one frame becomes (a 64 KB frame at the smallest MTU).
const MAX_SEGS: usize = 160;
/// The largest GSO frame vnetd asks the VMs' stacks to build: small enough
/// that the frame, as `vnet` datagrams of a 1500- or 9000-byte underlay, goes
/// out in one GSO send (64 KB payload at most) and comes back in one GRO
/// read, so the receiver can hand it to the TAP without reassembling it.
pub const TAP_GSO_MAX: u32 = 62_000;
/// Sockets in the pool that gives `vnet` links a source port per flow.
pub const TX_POOL: usize = 4;
/// `poll` mode keeps polling this long after the last frame (so traffic as
/// sparse as a ping every 10 ms never waits for a wake-up)...
const POLL_IDLE: Duration = Duration::from_millis(20);
/// ...and `adaptive` mode, once its rate put it in polling, this long (at
/// the rates that got it there, frames come far more often).
const ADAPTIVE_POLL_IDLE: Duration = Duration::from_micros(250);
/// Adaptive dispatch: measuring window and thresholds (frames/s).
const ADAPT_WINDOW: Duration = Duration::from_millis(10);
const ADAPT_UP: u64 = 10_000;
const ADAPT_DOWN: u64 = 1_000;

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

/// A local interface as the data path sees it.
#[derive(Debug)]
pub struct IfacePort {
    pub id: u32,
    pub name: String,
    pub dev: String,
    /// The VM's MAC, when known (a TAP's own address, or the `mac` option).
    pub mac: Option<MacAddr>,
    /// One file per queue: the TAP's queues, or one packet socket bound to
    /// the netdev. A read takes one frame from the VM, a write gives one.
    pub queues: Vec<File>,
    /// A netdev's receive ring (`sys::RxRing`), one per queue, when the
    /// kernel gave one: frames from the VM are taken from it instead of
    /// read. Locked by the queue's worker once per batch.
    pub rings: Vec<std::sync::Mutex<sys::RxRing>>,
    /// Reads and writes carry a `virtio_net_hdr` (offloads pass through).
    pub vnet_hdr: bool,
    /// A vhost-user interface: frames go into the guest's rings (and
    /// `queues` is empty; the rings have their own threads).
    pub vhost: Option<Arc<VhostDev>>,
    pub mode: Mode,
    /// Frames from the VM.
    pub rx: Counters,
    /// Frames to the VM.
    pub tx: Counters,
    pub dispatch: Arc<DispatchStats>,
}

impl IfacePort {
    /// Whether frames reach the VM with their offload header as is.
    pub fn takes_offloads(&self) -> bool {
        self.vnet_hdr && self.vhost.as_ref().is_none_or(|v| v.takes_offloads())
    }

    /// Gives the VM one frame, `parts` concatenated: a `virtio_net_hdr` and
    /// the frame if `hdr`, else the plain frame.
    fn write(&self, parts: &[IoSlice<'_>], hdr: bool, touched: &mut Vec<Arc<VhostDev>>) -> bool {
        match &self.vhost {
            Some(v) => {
                let mut all = [IoSlice::new(&[]); GSO_MAX_SEGS + 2];
                let none = VirtioNetHdr::NONE.emit();
                let k = usize::from(!hdr);
                if parts.len() + k > all.len() {
                    return false;
                }
                all[0] = IoSlice::new(&none);
                all[k..k + parts.len()].copy_from_slice(parts);
                let ok = v.deliver(&all[..k + parts.len()]);
                if ok && !touched.iter().any(|t| Arc::ptr_eq(t, v)) {
                    if touched.len() < touched.capacity() {
                        touched.push(v.clone());
                    } else {
                        // More guests in one batch than tracked: no end of
                        // burst for this one, so signal it now.
                        v.end_burst();
                    }
                }
                ok
            }
            None => {
                let want: usize = parts.iter().map(|p| p.len()).sum();
                matches!((&self.queues[0]).write_vectored(parts), Ok(n) if n == want)
            }
        }
    }
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
    /// Set when the kernel refused UDP GSO: send datagram by datagram.
    gso_off: AtomicBool,
}

impl LinkPort {
    pub fn new(def: LinkDef) -> Self {
        LinkPort {
            def,
            rx: Counters::default(),
            tx: Counters::default(),
            next_frame_id: AtomicU32::new(0),
            gso_off: AtomicBool::new(false),
        }
    }

    /// The largest UDP payload that crosses the underlay unfragmented.
    fn max_datagram(&self) -> usize {
        let ip = if self.def.remote.is_ipv4() { 20 } else { 40 };
        (self.def.mtu as usize).saturating_sub(ip + 8)
    }
}

/// Daemon-wide counters of what no single port accounts for.
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
    /// `vnet` datagrams with a flag this vnetd does not handle (AUTH).
    pub unsupported_flags: AtomicU64,
    /// Reassembly, as last reported by the link worker.
    pub reasm_fragments: AtomicU64,
    pub reasm_completed: AtomicU64,
    pub reasm_timed_out: AtomicU64,
    pub reasm_evicted: AtomicU64,
    pub reasm_rejected: AtomicU64,
    /// Route cache totals over all workers.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Frames delivered from a GRO batch without reassembly.
    pub rx_whole_batches: AtomicU64,
    /// `recvmmsg` calls on the link socket that returned messages, and the
    /// messages they returned (their ratio is the receive batching).
    pub link_recv_calls: AtomicU64,
    pub link_recv_messages: AtomicU64,
    /// Offloaded frames finished in software for a plain destination.
    pub sw_segmented: AtomicU64,
    pub sw_checksummed: AtomicU64,
    /// Offloaded frames whose headers could not be finished (dropped).
    pub offload_errors: AtomicU64,
    /// Interfaces or links where the kernel refused an offload.
    pub offload_refused: AtomicU64,
    pub gso_fallbacks: AtomicU64,
    /// The link worker's dispatch.
    pub link_dispatch: Arc<DispatchStats>,
}

/// What every worker reads: an immutable snapshot of routes and ports.
#[derive(Default)]
pub struct Plane {
    pub table: RouteTable,
    pub ifaces: FxHashMap<u32, Arc<IfacePort>>,
    pub links: FxHashMap<u32, Arc<LinkPort>>,
    /// Links by peer IP, to attribute arriving datagrams.
    pub links_by_ip: FxHashMap<IpAddr, u32>,
    /// The socket links are received on (and `raw` links sent from).
    pub socket: Option<Arc<UdpSocket>>,
    /// Sockets `vnet` links send from, one chosen per inner flow.
    pub tx_pool: Vec<Arc<UdpSocket>>,
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

/// A frame finished for plain destinations.
#[derive(Clone, Copy)]
enum Finished {
    /// Not offloaded, or its checksum completed in place.
    Whole,
    /// Segmented into `Forwarder::seg_ranges` of `Forwarder::seg_buf`.
    Segments,
    /// Could not be finished: plain destinations drop it.
    Failed,
}

/// Per-worker forwarding state: nothing here is shared or allocated per frame.
pub(crate) struct Forwarder {
    shared: Arc<Shared>,
    cache: RouteCache,
    decisions: Vec<Decision>,
    /// `vnet` headers of the datagrams of one frame.
    hdrs: Vec<[u8; VNET_HDR_LEN]>,
    /// Software segments of one GSO frame.
    seg_buf: Vec<u8>,
    seg_ranges: Vec<std::ops::Range<usize>>,
    cache_reported: (u64, u64),
    /// vhost-user interfaces given frames in this batch (signalled at its end).
    touched: Vec<Arc<VhostDev>>,
}

impl Forwarder {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Forwarder {
            shared,
            cache: RouteCache::new(CACHE_SLOTS),
            decisions: Vec::with_capacity(64),
            hdrs: vec![[0u8; VNET_HDR_LEN]; MAX_SEGS],
            // A 64 KB frame split at a small MSS repeats its headers often.
            seg_buf: vec![0u8; 4 * BUF],
            seg_ranges: Vec::with_capacity(2048),
            cache_reported: (0, 0),
            touched: Vec::with_capacity(16),
        }
    }

    /// Routes one frame that arrived on `ingress` and delivers it. `vh` is
    /// its offload header (`NONE` for a plain frame).
    pub(crate) fn forward(&mut self, plane: &Plane, ingress: Port, vh: VirtioNetHdr, frame: &mut [u8]) {
        let g = &self.shared.global;
        let Ok(eth) = EthernetFrame::new_checked(&*frame) else {
            g.malformed.fetch_add(1, Relaxed);
            return;
        };
        self.cache.lookup(&plane.table, ingress, eth.src(), eth.dst(), &mut self.decisions);
        if self.decisions.is_empty() {
            g.no_route.fetch_add(1, Relaxed);
            return;
        }
        let len = frame.len();
        let mut finished = None;
        // Offload-capable destinations first, from the untouched frame; then
        // the plain ones, from a frame finished once.
        for plain_pass in [false, true] {
            for i in 0..self.decisions.len() {
                let (port, ri) = self.decisions[i];
                let delivered = match port {
                    Port::Interface(id) => {
                        let Some(ifc) = plane.ifaces.get(&id) else { continue };
                        let offloads = ifc.takes_offloads();
                        if offloads == plain_pass {
                            continue;
                        }
                        let ok = if offloads {
                            let h = vh.emit();
                            ifc.write(&[IoSlice::new(&h), IoSlice::new(frame)], true, &mut self.touched)
                        } else {
                            let f = *finished.get_or_insert_with(|| self.finish(&vh, frame));
                            self.write_plain(ifc, f, frame)
                        };
                        count(&ifc.tx, ok, len);
                        ok
                    }
                    Port::Link(id) => {
                        let (Some(l), Some(sock)) = (plane.links.get(&id), &plane.socket) else { continue };
                        let raw = l.def.format == LinkFormat::Raw;
                        if raw != plain_pass {
                            continue;
                        }
                        let ok = if raw {
                            let f = *finished.get_or_insert_with(|| self.finish(&vh, frame));
                            self.send_raw(l, sock, f, frame)
                        } else {
                            let s = pick(&plane.tx_pool, frame).unwrap_or(sock);
                            self.send_vnet(l, s, &vh, frame)
                        };
                        count(&l.tx, ok, len);
                        ok
                    }
                };
                if let Some(r) = plane.table.route(ri) {
                    count(&r.counters, delivered, len);
                }
            }
        }
    }

    /// Makes `frame` plain for destinations without offloads.
    fn finish(&mut self, vh: &VirtioNetHdr, frame: &mut [u8]) -> Finished {
        let g = &self.shared.global;
        if !vh.needs_finishing() {
            return Finished::Whole;
        }
        let (done, result, counter) = if vh.is_gso() {
            (
                Finished::Segments,
                segment_tcp(frame, vh, &mut self.seg_buf, &mut self.seg_ranges),
                &g.sw_segmented,
            )
        } else {
            (Finished::Whole, complete_checksum(frame, vh), &g.sw_checksummed)
        };
        match result {
            Ok(()) => {
                counter.fetch_add(1, Relaxed);
                done
            }
            Err(_) => {
                g.offload_errors.fetch_add(1, Relaxed);
                Finished::Failed
            }
        }
    }

    fn write_plain(&mut self, ifc: &IfacePort, f: Finished, frame: &[u8]) -> bool {
        let touched = &mut self.touched;
        let mut w = |b: &[u8]| ifc.write(&[IoSlice::new(b)], false, touched);
        match f {
            Finished::Whole => w(frame),
            Finished::Segments => self.seg_ranges.iter().all(|r| w(&self.seg_buf[r.clone()])),
            Finished::Failed => false,
        }
    }

    /// Sends plain frames as raw datagrams (Palacios format).
    fn send_raw(&self, l: &LinkPort, sock: &UdpSocket, f: Finished, frame: &[u8]) -> bool {
        match f {
            Finished::Whole => sys::send_segments(sock, &l.def.remote, &[IoSlice::new(frame)], 0).is_ok(),
            Finished::Segments => {
                // Equal-sized segments (but the last): batches of one GSO send each.
                let seg = self.seg_ranges.first().map_or(1, |r| r.len()).max(1);
                let per = (GSO_MAX_BYTES / seg).clamp(1, GSO_MAX_SEGS);
                let mut iov = [IoSlice::new(&[]); GSO_MAX_SEGS];
                self.seg_ranges.chunks(per).all(|batch| {
                    for (k, r) in batch.iter().enumerate() {
                        iov[k] = IoSlice::new(&self.seg_buf[r.clone()]);
                    }
                    send_batch(l, sock, &iov[..batch.len()], seg, &self.shared.global)
                })
            }
            Finished::Failed => false,
        }
    }

    /// Sends `[vh] frame` as `vnet` datagrams: one header per datagram,
    /// chunks taken straight from `frame`, in GSO batches.
    fn send_vnet(&mut self, l: &LinkPort, sock: &UdpSocket, vh: &VirtioNetHdr, frame: &[u8]) -> bool {
        let vhb = vh.emit();
        let with_vh = *vh != VirtioNetHdr::NONE;
        let pre: &[u8] = if with_vh { &vhb } else { &[] };
        let total = pre.len() + frame.len();
        let dgram = l.max_datagram();
        if total > MAX_FRAME_LEN as usize + virtio::LEN || dgram <= VNET_HDR_LEN {
            return false;
        }
        let n = frag::count(total, dgram);
        if n > MAX_SEGS {
            return false;
        }
        let base = VnetRepr {
            flags: Flags(if with_vh { Flags::VNET_HDR } else { 0 }),
            network: l.def.network,
            frame_id: l.next_frame_id.fetch_add(1, Relaxed),
            frame_len: total as u32,
            offset: 0,
        };
        for (i, h) in self.hdrs[..n].iter_mut().enumerate() {
            let offset = frag::chunk(i, total, dgram).start as u32;
            let _ = VnetRepr { offset, ..base }.emit(h);
        }
        let per = (GSO_MAX_BYTES / dgram).clamp(1, GSO_MAX_SEGS);
        let mut iov = [IoSlice::new(&[]); 3 * GSO_MAX_SEGS];
        let mut first = 0;
        while first < n {
            let last = (first + per).min(n);
            let mut k = 0;
            for i in first..last {
                let std::ops::Range { start: s, end: e } = frag::chunk(i, total, dgram);
                iov[k] = IoSlice::new(&self.hdrs[i]);
                k += 1;
                if s < pre.len() {
                    iov[k] = IoSlice::new(&pre[s..e.min(pre.len())]);
                    k += 1;
                }
                if e > pre.len() {
                    iov[k] = IoSlice::new(&frame[s.max(pre.len()) - pre.len()..e - pre.len()]);
                    k += 1;
                }
            }
            if !send_batch(l, sock, &iov[..k], dgram, &self.shared.global) {
                return false;
            }
            first = last;
        }
        true
    }

    /// Delivers a frame given as pieces (`[virtio_net_hdr] frame`, `total`
    /// bytes) if every destination is an interface that takes offload
    /// headers; otherwise delivers nothing and returns false.
    fn forward_parts(&mut self, plane: &Plane, ingress: Port, parts: &[IoSlice<'_>], total: usize) -> bool {
        let Some(eth) = parts.first().and_then(|p| p.get(virtio::LEN..)) else { return false };
        let Ok(eth) = EthernetFrame::new_checked(eth) else { return false };
        self.cache.lookup(&plane.table, ingress, eth.src(), eth.dst(), &mut self.decisions);
        let capable = |&(p, _): &Decision| match p {
            Port::Interface(id) => plane.ifaces.get(&id).is_some_and(|i| i.takes_offloads()),
            Port::Link(_) => false,
        };
        if self.decisions.is_empty() || !self.decisions.iter().all(capable) {
            return false;
        }
        let len = total - virtio::LEN;
        for &(port, ri) in &self.decisions {
            let Port::Interface(id) = port else { continue };
            let Some(ifc) = plane.ifaces.get(&id) else { continue };
            let ok = ifc.write(parts, true, &mut self.touched);
            count(&ifc.tx, ok, len);
            if let Some(r) = plane.table.route(ri) {
                count(&r.counters, ok, len);
            }
        }
        true
    }

    /// Publishes this worker's cache counts into the global totals.
    pub(crate) fn report(&mut self) {
        for v in self.touched.drain(..) {
            v.end_burst();
        }
        let s = self.cache.stats();
        let g = &self.shared.global;
        g.cache_hits.fetch_add(s.hits - self.cache_reported.0, Relaxed);
        g.cache_misses.fetch_add(s.misses - self.cache_reported.1, Relaxed);
        self.cache_reported = (s.hits, s.misses);
    }
}

/// Sends the datagrams in `iov` (each `seg` bytes but the last) to the link:
/// one GSO `sendmsg`, or one per datagram where the kernel refuses GSO.
fn send_batch(l: &LinkPort, sock: &UdpSocket, iov: &[IoSlice<'_>], seg: usize, g: &Global) -> bool {
    let total: usize = iov.iter().map(|s| s.len()).sum();
    if total <= seg || !l.gso_off.load(Relaxed) {
        let segment = if total > seg { seg as u16 } else { 0 };
        match sys::send_segments(sock, &l.def.remote, iov, segment) {
            Ok(_) => return true,
            Err(e)
                if segment > 0
                    && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)) =>
            {
                l.gso_off.store(true, Relaxed);
                g.gso_fallbacks.fetch_add(1, Relaxed);
                tracing::warn!(link = %l.def.name, "UDP GSO refused ({e}); sending datagram by datagram");
            }
            Err(_) => return false,
        }
    }
    // One datagram at a time: regroup the slices into datagrams of `seg` bytes.
    let mut one = [IoSlice::new(&[]); 8];
    let (mut k, mut have) = (0, 0);
    for s in iov {
        let mut rest: &[u8] = s;
        while !rest.is_empty() {
            let take = rest.len().min(seg - have);
            if k == one.len() {
                return false;
            }
            one[k] = IoSlice::new(&rest[..take]);
            k += 1;
            have += take;
            rest = &rest[take..];
            if have == seg {
                if sys::send_segments(sock, &l.def.remote, &one[..k], 0).is_err() {
                    return false;
                }
                (k, have) = (0, 0);
            }
        }
    }
    k == 0 || sys::send_segments(sock, &l.def.remote, &one[..k], 0).is_ok()
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

/// A hash of the inner flow: MACs, IP addresses, protocol and ports, never
/// fields that change per packet (so a flow keeps its outer port and order).
pub(crate) fn flow_hash(f: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    f.get(..14).hash(&mut h);
    match f.get(12..14) {
        Some([0x08, 0x00]) if f.len() >= 34 => {
            f[23].hash(&mut h);
            f[26..34].hash(&mut h);
            let l4 = 14 + (f[14] & 0x0f) as usize * 4;
            if matches!(f[23], 6 | 17) {
                f.get(l4..l4 + 4).hash(&mut h);
            }
        }
        Some([0x86, 0xdd]) if f.len() >= 54 => {
            f[20].hash(&mut h);
            f[22..54].hash(&mut h);
            if matches!(f[20], 6 | 17) {
                f.get(54..58).hash(&mut h);
            }
        }
        _ => {}
    }
    h.finish()
}

fn pick<'a>(pool: &'a [Arc<UdpSocket>], frame: &[u8]) -> Option<&'a UdpSocket> {
    if pool.is_empty() {
        return None;
    }
    Some(&pool[(flow_hash(frame) % pool.len() as u64) as usize])
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

const WAKE: Token = Token(0);

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

/// One thing a worker reads from: an interface queue or the link socket.
pub struct Source {
    fd: std::os::fd::RawFd,
    mode: Mode,
    stats: Arc<DispatchStats>,
    /// Handles up to a batch of frames; returns how many it handled.
    body: Box<dyn FnMut() -> usize + Send>,
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
        while !stop2.load(Relaxed) {
            let mut total = 0;
            let now = Instant::now();
            for (s, d) in sources.iter_mut().zip(ds.iter_mut()) {
                let n = (s.body)();
                total += n;
                if d.record(n, now) {
                    s.stats.switches.fetch_add(1, Relaxed);
                    s.stats.polling.store(d.polling() as u8, Relaxed);
                }
            }
            if total > 0 {
                continue; // more may be waiting: read until empty
            }
            if ds.iter().any(|d| d.keep_polling(now)) {
                std::thread::yield_now();
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

/// The source that reads the frames interface `iface`'s VM sends on queue `q`:
/// from the queue's receive ring where it has one, else by `read`.
pub fn iface_source(shared: &Arc<Shared>, iface: Arc<IfacePort>, q: usize) -> Source {
    let fd = iface.queues[q].as_raw_fd();
    let mut fw = Forwarder::new(shared.clone());
    let mut buf = vec![0u8; BUF];
    let port = Port::Interface(iface.id);
    let (mode, stats) = (iface.mode, iface.dispatch.clone());
    let body = move || {
        let plane = fw.shared.plane.load();
        let mut n = 0;
        // One frame as read: `[virtio_net_hdr] frame`.
        let take = |fw: &mut Forwarder, bytes: &mut [u8]| {
            let (vh, frame) = if iface.vnet_hdr {
                match VirtioNetHdr::parse(bytes) {
                    Some(vh) => (vh, &mut bytes[virtio::LEN..]),
                    None => {
                        iface.rx.drop_one();
                        return;
                    }
                }
            } else {
                (VirtioNetHdr::NONE, bytes)
            };
            iface.rx.add(frame.len());
            fw.forward(&plane, port, vh, frame);
        };
        if let Some(ring) = iface.rings.get(q) {
            let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
            while n < BATCH {
                let Some(f) = ring.take_frame() else { break };
                n += 1;
                if f.truncated {
                    iface.rx.drop_one();
                    continue;
                }
                take(&mut fw, &mut *f.data);
            }
        } else {
            let file = &iface.queues[q];
            while n < BATCH {
                match (&*file).read(&mut buf) {
                    Ok(len) => {
                        n += 1;
                        take(&mut fw, &mut buf[..len]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // EIO while the device is down, for instance: count, go on.
                        iface.rx.drop_one();
                        break;
                    }
                }
            }
        }
        if n > 0 {
            fw.report();
        }
        n
    };
    Source { fd, mode, stats, body: Box::new(body) }
}

/// The source that receives datagrams on the link socket.
pub fn link_source(
    shared: &Arc<Shared>,
    sock: Arc<UdpSocket>,
    mode: Mode,
    reasm_cfg: reasm::Config,
) -> Source {
    let fd = sock.as_raw_fd();
    let mut fw = Forwarder::new(shared.clone());
    let mut batch = sys::RecvBatch::new();
    let mut rx = RxState { reasm: reasm::Reassembler::new(reasm_cfg) };
    let stats = shared.global.link_dispatch.clone();
    let body = move || {
        let plane = fw.shared.plane.load();
        let mut n = 0;
        while n < BATCH {
            let got = match batch.recv(&*sock) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    fw.shared.global.malformed.fetch_add(1, Relaxed);
                    break;
                }
            };
            n += got;
            fw.shared.global.link_recv_calls.fetch_add(1, Relaxed);
            fw.shared.global.link_recv_messages.fetch_add(got as u64, Relaxed);
            for i in 0..got {
                let (buf, from, gso) = batch.message(i);
                let Some(from) = from else {
                    fw.shared.global.malformed.fetch_add(1, Relaxed);
                    continue;
                };
                let len = buf.len();
                if gso > 0 && rx.whole_frame_batch(&mut fw, &plane, from, buf, gso as usize) {
                    continue;
                }
                let seg = if gso > 0 { gso as usize } else { len.max(1) };
                let mut off = 0;
                while off < len {
                    let end = (off + seg).min(len);
                    rx.datagram(&mut fw, &plane, from, &mut buf[off..end]);
                    off = end;
                }
            }
            if got < sys::RECV_BATCH {
                break; // the socket is empty
            }
        }
        if n > 0 {
            rx.report(&fw.shared.global);
            fw.report();
        }
        n
    };
    Source { fd, mode, stats, body: Box::new(body) }
}

struct RxState {
    reasm: reasm::Reassembler,
}

/// Delivers a `vnet` frame payload, which begins with a `virtio_net_hdr`
/// when `with_vh`.
fn deliver_vnet(fw: &mut Forwarder, plane: &Plane, port: Port, with_vh: bool, bytes: &mut [u8]) {
    if !with_vh {
        fw.forward(plane, port, VirtioNetHdr::NONE, bytes);
        return;
    }
    match VirtioNetHdr::parse(bytes) {
        Some(vh) => fw.forward(plane, port, vh, &mut bytes[virtio::LEN..]),
        None => {
            fw.shared.global.malformed.fetch_add(1, Relaxed);
        }
    }
}

/// Forwards a whole frame that came without an offload header from a
/// sender that may have left checksum and segmentation to the devices (a
/// peer's kernel path, which marks its datagrams `WHOLE`, hands frames over
/// as the VM's stack made them, and a veth underlay carries them
/// unsegmented): the header it needs is inferred from the frame
/// (`offload::infer`), so offload-capable destinations take it as is and
/// the rest get it finished in software. `raw` datagrams carry no such
/// mark, and Palacios peers always send finished frames, so they are not
/// inspected (the kernel path does not send `raw`).
fn forward_inferred(fw: &mut Forwarder, plane: &Plane, port: Port, link: &LinkPort, frame: &mut [u8]) {
    // The segment size the sender's VM used, as well as it can be told: the
    // link MTU less the largest encapsulation and TCP/IP headers.
    let mss =
        (link.def.mtu as usize).saturating_sub(vnet_wire::vnet::IPV4_ENCAP_OVERHEAD + 40).max(536) as u16;
    let vh = vnet_wire::offload::infer(frame, mss).unwrap_or(VirtioNetHdr::NONE);
    fw.forward(plane, port, vh, frame);
}

/// The link a datagram from `from` belongs to.
fn link_of(plane: &Plane, from: SocketAddr) -> Option<&Arc<LinkPort>> {
    let ip = match from.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    plane.links_by_ip.get(&ip).and_then(|id| plane.links.get(id))
}

impl RxState {
    /// The fast path for a GRO batch of `vnet` datagrams that is exactly one
    /// whole frame with its offload header, in order (what one GSO send of
    /// a peer's vnetd becomes): the frame goes to its interfaces straight
    /// from the receive buffer, one iovec per datagram payload, with no
    /// reassembly copy. Returns false, having delivered nothing, when the
    /// batch is anything else or a destination needs a contiguous frame; the
    /// caller then takes the datagrams one by one.
    fn whole_frame_batch(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        from: SocketAddr,
        data: &[u8],
        seg: usize,
    ) -> bool {
        let Some(link) = link_of(plane, from) else { return false };
        let n = data.len().div_ceil(seg);
        if link.def.format != LinkFormat::Vnet || !(2..=GSO_MAX_SEGS).contains(&n) {
            return false;
        }
        let mut iov = [IoSlice::new(&[]); GSO_MAX_SEGS];
        let mut first: Option<VnetRepr> = None;
        let mut expect = 0usize;
        for (i, d) in data.chunks(seg).enumerate() {
            let Ok(p) = VnetPacket::new_checked(d) else { return false };
            let r = VnetRepr::parse(&p);
            let ok = match first {
                None => r.offset == 0 && r.flags.0 == Flags::VNET_HDR && r.network == link.def.network,
                Some(f) => r.frame_id == f.frame_id && r.frame_len == f.frame_len && r.flags == f.flags,
            };
            if !ok || r.offset as usize != expect {
                return false;
            }
            first.get_or_insert(r);
            expect += p.payload().len();
            let hl = p.header_len();
            iov[i] = IoSlice::new(&d[hl..]);
        }
        match first {
            Some(f) if f.frame_len as usize == expect => {}
            _ => return false,
        }
        if !fw.forward_parts(plane, Port::Link(link.def.id), &iov[..n], expect) {
            return false;
        }
        link.rx.add(expect - virtio::LEN);
        fw.shared.global.rx_whole_batches.fetch_add(1, Relaxed);
        true
    }

    fn datagram(&mut self, fw: &mut Forwarder, plane: &Plane, from: SocketAddr, data: &mut [u8]) {
        let g = &fw.shared.global;
        let Some(link) = link_of(plane, from) else {
            g.unknown_source.fetch_add(1, Relaxed);
            return;
        };
        let port = Port::Link(link.def.id);
        match link.def.format {
            LinkFormat::Raw => {
                link.rx.add(data.len());
                fw.forward(plane, port, VirtioNetHdr::NONE, data);
            }
            LinkFormat::Vnet => {
                let (repr, hl, plen) = match VnetPacket::new_checked(&*data) {
                    Ok(p) => (VnetRepr::parse(&p), p.header_len(), p.payload().len()),
                    Err(_) => {
                        link.rx.drop_one();
                        g.malformed.fetch_add(1, Relaxed);
                        return;
                    }
                };
                if repr.network != link.def.network {
                    link.rx.drop_one();
                    g.wrong_network.fetch_add(1, Relaxed);
                    return;
                }
                if repr.flags.0 & Flags::AUTH != 0 {
                    link.rx.drop_one();
                    g.unsupported_flags.fetch_add(1, Relaxed);
                    return;
                }
                let with_vh = repr.flags.0 & Flags::VNET_HDR != 0;
                if repr.is_whole(plen) {
                    link.rx.add(plen);
                    if repr.flags.0 & Flags::WHOLE != 0 && !with_vh {
                        forward_inferred(fw, plane, port, link, &mut data[hl..]);
                    } else {
                        deliver_vnet(fw, plane, port, with_vh, &mut data[hl..]);
                    }
                    return;
                }
                let now = fw.shared.now_ns();
                if let reasm::Outcome::Complete(frame) =
                    self.reasm.push(now, u64::from(link.def.id), &repr, &data[hl..])
                {
                    link.rx.add(frame.len());
                    deliver_vnet(fw, plane, port, with_vh, frame);
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

    #[test]
    fn flow_hash_ignores_per_packet_fields() {
        let mut a = vec![0u8; 60];
        a[12] = 0x08;
        a[14] = 0x45;
        a[23] = 6;
        a[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        a[34..38].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        let mut b = a.clone();
        b[18] = 0x77; // IP id
        b[38] = 0x55; // TCP seq
        assert_eq!(flow_hash(&a), flow_hash(&b));
        b[35] = 0x41; // another source port
        assert_ne!(flow_hash(&a), flow_hash(&b));
        let _ = flow_hash(&a[..5]);
    }
}
