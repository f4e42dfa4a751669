//! The data path's sources, what the workers (`crate::workers`) read: the
//! interface queues, netdev receive rings and link sockets, each read in
//! batches and handed to the sans-IO engine (`vnet_engine`), which routes
//! the frames and sends them out through the ports' own I/O (the `iface`
//! and `link` modules).
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
use crate::link::udp::Reader as SocketReader;
use crate::sys;
use std::io::{self, Read};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::Mode;
use vnet_core::Port;
use vnet_engine::rx::Cx;
use vnet_engine::{DispatchStats, Forwarder, Receiver, Via};
use vnet_wire::reasm;
use vnet_wire::virtio::{self, VirtioNetHdr};

use crate::shared::Shared;
use crate::workers::{Source, BATCH};
use vnet_engine::BUF;

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

/// The source that receives datagrams on a socket of a listening group:
/// `listen udp`'s (`via` `Udp`) or `listen vxlan`'s.
pub fn link_source(
    shared: &Arc<Shared>,
    reader: &SocketReader,
    via: Via,
    mode: Mode,
    reasm_cfg: reasm::Config,
) -> Source {
    let (sock, read) = (reader.sock.clone(), reader.messages.clone());
    let fd = sock.as_raw_fd();
    let mut fw = shared.forwarder();
    let shared = shared.clone();
    let mut batch = sys::RecvBatch::new();
    let mut spare = sys::RecvBatch::with_slots(1);
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
            read.fetch_add(got as u64, Relaxed);
            let cx = &mut Cx { fw: &mut fw, plane: &plane, now_ns: shared.now_ns() };
            let mut i = 0;
            while i < got {
                let ((buf, from, gso), next) = batch.message_and_next(i, got);
                let Some(from) = from else {
                    g.malformed.fetch_add(1, Relaxed);
                    i += 1;
                    continue;
                };
                // The next message, from the same sender, may end a frame
                // this one begins; after the last one, one more read may
                // bring it (the first part often comes alone: the worker
                // keeps up with the peer).
                let (took, extra) = match next {
                    Some(m) => {
                        let mut m = (m.1 == Some(from)).then_some((m.0, m.2 as usize));
                        (rx.receive(cx, from, buf, gso as usize, &mut m), false)
                    }
                    None => {
                        let mut more = ReadMore { one: &mut spare, sock: &sock, from, read: None };
                        let took = rx.receive(cx, from, buf, gso as usize, &mut more);
                        (took, more.read == Some(true))
                    }
                };
                i += took;
                if extra {
                    n += 1;
                    read.fetch_add(1, Relaxed);
                    g.link_recv_calls.fetch_add(1, Relaxed);
                    g.link_recv_messages.fetch_add(1, Relaxed);
                }
                // One more read that did not end the frame: on its own.
                if extra && took < 2 {
                    match spare.message(0) {
                        (buf, Some(from), gso) => {
                            rx.receive(cx, from, buf, gso as usize, &mut None);
                        }
                        (_, None, _) => {
                            g.malformed.fetch_add(1, Relaxed);
                        }
                    }
                }
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

/// One more read from a link socket after the last message of a batch, for
/// the receiver when that message begins a frame (`NextBuf`): the message
/// read, if it is from `from`; whatever it is, it stays in `one` for the
/// caller.
struct ReadMore<'a> {
    one: &'a mut sys::RecvBatch,
    sock: &'a UdpSocket,
    from: std::net::SocketAddr,
    /// Not tried yet (`None`), or whether the read brought a message.
    read: Option<bool>,
}

impl vnet_engine::rx::NextBuf for ReadMore<'_> {
    fn next_buf(&mut self) -> Option<(&mut [u8], usize)> {
        let (one, sock) = (&mut *self.one, self.sock);
        if !*self.read.get_or_insert_with(|| matches!(one.recv(sock), Ok(1))) {
            return None;
        }
        let (buf, from, gso) = self.one.message(0);
        (from == Some(self.from)).then_some((buf, gso as usize))
    }
}

/// How often an idle link socket's reader looks for timed-out partial frames.
const EXPIRE_EVERY_NS: u64 = 100_000_000;
