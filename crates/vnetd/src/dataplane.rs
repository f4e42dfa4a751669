//! The data path's threads: workers that wait on their sources (interface
//! queues, netdev receive rings, the link sockets), read frames and
//! datagrams in batches, and hand them to the sans-IO engine
//! (`vnet_engine`), which routes them and sends them out through the ports'
//! own I/O (the `iface` and `link` modules).
//!
//! What makes it fast, beside the engine's offload handling:
//!
//! - **Batches.** A worker reads each source until it is empty or a batch
//!   is done; link sockets are read with `recvmmsg` (16 messages a call,
//!   buffers allocated once) and `UDP_GRO`, netdevs through a
//!   `TPACKET_V2` ring (no system call per frame).
//! - **Dispatch modes** (`vnet_engine::Dispatcher`): a worker sleeps in
//!   epoll only when none of its sources wants to keep polling.
//! - **No lock and no allocation per frame.** Each worker owns its
//!   forwarder, buffers and receiver; routes and ports come in an immutable
//!   `Plane` loaded from an `ArcSwap` once per batch.

use crate::iface::{Attached, Reader};
use crate::sys;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use std::io::{self, Read};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vnet_control::Mode;
use vnet_core::Port;
use vnet_engine::{DispatchStats, Dispatcher, Forwarder, Receiver, Via};
use vnet_wire::reasm;
use vnet_wire::virtio::{self, VirtioNetHdr};

use crate::shared::Shared;
use vnet_engine::BUF;

/// Frames a worker handles per wake-up before it looks at its mode and the
/// stop flag again.
const BATCH: usize = 64;
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
        // The last look found nothing and the worker polled on (yielded)
        // rather than sleep: what the next look finds, polling caught.
        let mut polled = false;
        while !stop2.load(Relaxed) {
            let (mut total, mut more) = (0, false);
            let now = Instant::now();
            for (s, d) in sources.iter_mut().zip(ds.iter_mut()) {
                let n = (s.body)();
                total += n;
                if polled && n > 0 {
                    s.stats.polled_frames.fetch_add(n as u64, Relaxed);
                }
                // A source stops short of a batch only when it is empty.
                more |= n >= BATCH;
                if d.record(n, now) {
                    s.stats.switches.fetch_add(1, Relaxed);
                    s.stats.polling.store(d.polling() as u8, Relaxed);
                }
            }
            polled = false;
            if more {
                continue; // a batch was full: more may be waiting
            }
            if ds.iter().any(|d| d.keep_polling(now)) {
                if total > 0 {
                    continue; // look again at once
                }
                sources.iter().for_each(|s| {
                    s.stats.polls.fetch_add(1, Relaxed);
                });
                polled = true;
                if !yield_uncontended() {
                    let now = Instant::now();
                    ds.iter_mut().for_each(|d| d.contended(now));
                    sources.iter().for_each(|s| {
                        s.stats.contended.fetch_add(1, Relaxed);
                    });
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

/// Gives the CPU to any other thread that wants it, between two looks of a
/// polling worker; false when one did and kept it for
/// [`vnet_engine::CONTENDED`] or more (the worker should then sleep).
pub fn yield_uncontended() -> bool {
    let t = Instant::now();
    std::thread::yield_now();
    t.elapsed() < vnet_engine::CONTENDED
}

/// The source that reads the frames interface `att`'s VM sends on queue
/// `q`: from the queue's receive ring where it has one, else by `read`.
pub fn iface_source(shared: &Arc<Shared>, att: &Attached, q: usize) -> Option<Source> {
    let reader = att.dev.reader(q)?;
    let port = Port::Interface(att.iface.id);
    Some(frame_source(shared, port, reader, att.dev.vnet_hdr(), att.def.mode, att.dispatch.clone()))
}

/// The source that reads the frames arriving at `ingress` (an interface's
/// VM, or a `direct` link's LAN) from `reader`, each with its
/// `virtio_net_hdr` when `vnet_hdr`.
pub fn frame_source(
    shared: &Arc<Shared>,
    ingress: Port,
    reader: Reader,
    vnet_hdr: bool,
    mode: Mode,
    stats: Arc<DispatchStats>,
) -> Source {
    let fd = reader.fd();
    let mut fw = shared.forwarder();
    let shared = shared.clone();
    let mut buf = vec![0u8; BUF];
    let body = move || {
        let plane = shared.plane.load();
        let rx = match ingress {
            Port::Interface(id) => plane.ifaces.get(&id).map(|i| &i.rx),
            Port::Link(id) => plane.links.get(&id).map(|l| &l.rx),
        };
        let Some(rx) = rx else { return 0 };
        let mut n = 0;
        // One frame as read: `[virtio_net_hdr] frame`.
        let take = |fw: &mut Forwarder, bytes: &mut [u8]| {
            let (vh, frame) = if vnet_hdr {
                match VirtioNetHdr::parse(bytes) {
                    Some(vh) => (vh, &mut bytes[virtio::LEN..]),
                    None => {
                        rx.drop_one();
                        return;
                    }
                }
            } else {
                (VirtioNetHdr::NONE, bytes)
            };
            rx.add(frame.len());
            fw.forward(&plane, ingress, vh, frame);
        };
        match &reader {
            Reader::Ring(_, ring) => {
                let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
                while n < BATCH {
                    let Some(f) = ring.take_frame() else { break };
                    n += 1;
                    if f.truncated {
                        rx.drop_one();
                        continue;
                    }
                    take(&mut fw, &mut *f.data);
                }
            }
            Reader::File(_) | Reader::Packet(_) => {
                while n < BATCH {
                    let got = match &reader {
                        Reader::Packet(sock) => {
                            sys::recv_packet(sock, &mut buf, if vnet_hdr { virtio::LEN } else { 0 })
                        }
                        Reader::File(file) | Reader::Ring(file, _) => {
                            (&**file).read(&mut buf).map(|len| 0..len)
                        }
                    };
                    match got {
                        Ok(r) => {
                            n += 1;
                            take(&mut fw, &mut buf[r]);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            // EIO while the device is down, for instance: count, go on.
                            rx.drop_one();
                            break;
                        }
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

/// The source that receives datagrams on a link socket: the `listen udp`
/// one (`via` `Udp`) or the `listen vxlan` one.
pub fn link_source(
    shared: &Arc<Shared>,
    sock: Arc<UdpSocket>,
    via: Via,
    mode: Mode,
    reasm_cfg: reasm::Config,
) -> Source {
    let fd = sock.as_raw_fd();
    let mut fw = shared.forwarder();
    let shared = shared.clone();
    let mut batch = sys::RecvBatch::new();
    let mut rx = Receiver::new(via, reasm_cfg);
    let mut expired_at = 0u64;
    let stats = shared.global.link_dispatch.clone();
    let body = move || {
        let plane = shared.plane.load();
        let g = &shared.global;
        let mut n = 0;
        while n < BATCH {
            let got = match batch.recv(&*sock) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    g.malformed.fetch_add(1, Relaxed);
                    break;
                }
            };
            n += got;
            g.link_recv_calls.fetch_add(1, Relaxed);
            g.link_recv_messages.fetch_add(got as u64, Relaxed);
            let now = shared.now_ns();
            for i in 0..got {
                let (buf, from, gso) = batch.message(i);
                let Some(from) = from else {
                    g.malformed.fetch_add(1, Relaxed);
                    continue;
                };
                rx.receive(&mut fw, &plane, from, buf, gso as usize, now);
            }
            if got < sys::RECV_BATCH {
                break; // the socket is empty
            }
        }
        // Partial frames time out even when nothing more comes (the worker
        // calls this at least every 100 ms).
        let now = shared.now_ns();
        if n > 0 || now.saturating_sub(expired_at) >= EXPIRE_EVERY_NS {
            if rx.in_progress() > 0 {
                rx.expire(now);
            }
            expired_at = now;
            rx.report(g);
        }
        if n > 0 {
            fw.report();
        }
        n
    };
    Source { fd, mode, stats, body: Box::new(body) }
}

/// How often an idle link socket's reader looks for timed-out partial frames.
const EXPIRE_EVERY_NS: u64 = 100_000_000;
