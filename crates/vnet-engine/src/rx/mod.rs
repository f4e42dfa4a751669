//! From datagrams to frames: which link a datagram belongs to, whether it
//! is well formed for that link's kind, reassembly where the kind
//! fragments, then routing with the link as ingress.
//!
//! A datagram is attributed by the socket it came in on ([`Via`]) and its
//! source address (and, for VXLAN, its VNI); anything else is counted in
//! `unknown_source` and dropped. A receive buffer may hold several
//! datagrams of one size coalesced by UDP GRO; when they are exactly one
//! whole `vnet` frame with its offload header, in order (what one GSO send
//! of a peer becomes), the frame goes to its interfaces straight from the
//! buffer, an iovec per datagram payload, with no reassembly copy. On
//! links that carry a frame per datagram (`raw`, VXLAN), consecutive TCP
//! segments of one flow in such a buffer are merged into one TCP GSO
//! frame (`vnet_wire::gro`) and written once, their payloads where they
//! lie.
//!
//! The way in runs one way through this module's files: here (the socket's
//! buffer, attribution, the one-frame kinds), then [`batch`] (a `vnet`
//! GRO batch that is one whole frame), [`vnet`] (a `vnet` datagram alone),
//! [`relay`] (a relayed one's arrival), and [`deliver`] (the frame to the
//! forwarder).

pub mod batch;
pub mod deliver;
pub mod relay;
pub mod vnet;

pub use deliver::{stream_record, Arrival, Cx};

use crate::codec;
use crate::codec::Inbound;
use crate::link::Link;
use crate::plane::Plane;
use crate::GSO_MAX_SEGS;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use vnet_control::canonical;
use vnet_core::DropReason;
use vnet_core::Port as PortId;
use vnet_wire::virtio::{self, VirtioNetHdr};
use vnet_wire::{gro, reasm};

/// The receiving socket a datagram came in on (the `listen` kinds).
pub use vnet_control::Via;

/// The receive buffer after the one being taken, from the same sender,
/// asked for only when the receiver wants it (the first begins a `vnet`
/// frame that does not end in it): the next message of a `recvmmsg` batch
/// already read (`Option<(bytes, GRO segment size)>`), or one more read.
pub trait NextBuf {
    fn next_buf(&mut self) -> Option<(&mut [u8], usize)>;
}

impl NextBuf for Option<(&mut [u8], usize)> {
    fn next_buf(&mut self) -> Option<(&mut [u8], usize)> {
        self.as_mut().map(|(b, g)| (&mut **b, *g))
    }
}

/// The receive state of one socket's reader.
pub struct Receiver {
    via: Via,
    /// The `vnet` links' receive side (reassembly, handshake answers).
    vnet: vnet::Rx,
}

impl Receiver {
    pub fn new(via: Via, cfg: reasm::Config) -> Self {
        Receiver { via, vnet: vnet::Rx::new(cfg) }
    }

    /// Takes one receive buffer from `from`: one datagram, or (`gso` not 0)
    /// datagrams of `gso` bytes, the last may be shorter, coalesced by GRO.
    /// `next` gives the next receive buffer from the same sender, if there
    /// is one, when it is wanted: a `vnet` frame this buffer begins and
    /// that one ends (a frame of more datagrams than one GSO send takes
    /// arrives as two GRO batches) goes on from both, with no reassembly
    /// copy. Returns how many buffers it took: 2, or 1 (this one; the
    /// caller passes what `next` gave on again).
    pub fn receive(
        &mut self,
        cx: &mut Cx<'_>,
        from: SocketAddr,
        buf: &mut [u8],
        gso: usize,
        next: &mut dyn NextBuf,
    ) -> usize {
        let via = self.via;
        let from = SocketAddr::new(canonical(from.ip()), from.port());
        let len = buf.len();
        if gso > 0 && via == Via::Udp {
            let took = self.vnet.whole_frames(cx, from, buf, gso, next);
            if took > 0 {
                return took;
            }
        }
        if gso > 0 && len > gso {
            if let Some((link, at)) = frame_link(cx.plane, via, from, &buf[..gso]) {
                self.coalesced(cx, &link, (at, from), buf, gso);
                return 1;
            }
        }
        if len == 0 {
            // A keepalive (or a stranger's empty datagram).
            self.datagram(cx, from, buf);
            return 1;
        }
        let seg = if gso > 0 { gso } else { len.max(1) };
        let mut off = 0;
        while off < len {
            let end = (off + seg).min(len);
            self.datagram(cx, from, &mut buf[off..end]);
            off = end;
        }
        1
    }

    /// A GRO batch of datagrams of `gso` bytes from `from` on `link`, a
    /// link with a frame per datagram at offset `at`: runs of one TCP
    /// flow's consecutive segments go to their destination as one TCP GSO
    /// frame each (if it takes offloads); every other datagram alone.
    fn coalesced(
        &mut self,
        cx: &mut Cx<'_>,
        link: &Link,
        (at, from): (usize, SocketAddr),
        buf: &mut [u8],
        gso: usize,
    ) {
        let port = PortId::Link(link.def.id);
        let n = buf.len().div_ceil(gso);
        let len = buf.len();
        let chunk = |i: usize| i * gso..((i + 1) * gso).min(len);
        let mut head = [0u8; gro::HEAD_MAX];
        let mut i = 0;
        while i < n {
            let frames = (i..n).map(|k| buf.get(chunk(k).start + at..chunk(k).end).unwrap_or_default());
            let run = gro::coalesce(frames, &mut head);
            if (2..=GSO_MAX_SEGS).contains(&run.frames) {
                let mut iov = [IoSlice::new(&[]); GSO_MAX_SEGS + 1];
                iov[0] = IoSlice::new(&head[..run.head_len]);
                let mut total = run.head_len;
                for (j, k) in (i..i + run.frames).enumerate() {
                    let p = &buf[chunk(k).start + at + run.payload_at..chunk(k).end];
                    total += p.len();
                    iov[j + 1] = IoSlice::new(p);
                }
                if cx.fw.forward_parts(cx.plane, port, &iov[..=run.frames], total) {
                    link.rx.add(total - virtio::LEN);
                    link.alive.heard(cx.now_ns);
                    let g = cx.fw.global();
                    g.rx_gro_frames.fetch_add(1, Relaxed);
                    g.rx_gro_segments.fetch_add(run.frames as u64, Relaxed);
                    i += run.frames;
                    continue;
                }
            }
            let r = chunk(i);
            self.datagram(cx, from, &mut buf[r]);
            i += 1;
        }
    }

    /// One datagram.
    fn datagram(&mut self, cx: &mut Cx<'_>, from: SocketAddr, data: &mut [u8]) {
        let g = cx.fw.global().clone();
        let Some((key, frame_at)) = codec::arrival(self.via, from.ip(), data) else {
            g.malformed.fetch_add(1, Relaxed);
            cx.fw.dropped(DropReason::Malformed, None, &[], None);
            return;
        };
        // A secured link's peer may have moved (roaming): a candidate by the
        // session its datagram names, moved only once the datagram opens.
        let link = cx.plane.link_for(key).or_else(|| {
            (self.via == Via::Udp).then(|| cx.plane.roaming_link(&g, from.ip(), data, cx.now_ns)).flatten()
        });
        let Some(link) = link else {
            g.unknown_source.fetch_add(1, Relaxed);
            cx.fw.dropped(DropReason::UnknownSource, None, &[], None);
            return;
        };
        // A secured link hears its peer only in what authenticates.
        if link.secure.is_none() {
            link.alive.heard(cx.now_ns);
            if data.is_empty() {
                link.alive.keepalives_received.fetch_add(1, Relaxed);
                return;
            }
        }
        let port = PortId::Link(link.def.id);
        match link.facts().inbound {
            Inbound::Frame => deliver::frame(cx, link, VirtioNetHdr::NONE, &mut data[frame_at..]),
            Inbound::Inferred => {
                let frame = &mut data[frame_at..];
                link.rx.add(frame.len());
                // A Linux VTEP over a veth may leave the inner checksum to
                // "the device" (CHECKSUM_PARTIAL survives the veth), and its
                // tunnel-GSO packets reach a UDP socket unsegmented: an inner
                // frame larger than the link carries whole is a TCP
                // super-frame, cut at the largest segment that would fit.
                let mss = link.max_whole_frame().saturating_sub(14 + 40).max(536) as u16;
                cx.fw.forward_inferred(cx.plane, port, mss, frame);
            }
            Inbound::Vnet => {
                let network = link.def.network();
                self.vnet.datagram(cx, link, network, Arrival { from, relayed: false }, data)
            }
            // A stream's records and a LAN's frames never arrive as datagrams.
            Inbound::Stream | Inbound::Device => {
                g.unknown_source.fetch_add(1, Relaxed);
                cx.fw.dropped(DropReason::UnknownSource, Some(port), &[], None);
            }
        }
    }

    /// Drops partial frames older than the reassembly timeout.
    pub fn expire(&mut self, now_ns: u64) {
        self.vnet.expire(now_ns);
    }

    /// Adds the reassembly counts since the last report to the host's.
    pub fn report(&mut self, g: &crate::Global) {
        self.vnet.report(g);
    }

    /// Frames being reassembled now.
    pub fn in_progress(&self) -> usize {
        self.vnet.in_progress()
    }
}

/// The link of a datagram that carries one frame (a `raw` link's, or a
/// VXLAN one's), and where the frame starts in it; `None` for anything
/// else (a `vnet` link's, or nobody's: the datagram path counts those).
fn frame_link(
    plane: &Plane,
    via: Via,
    from: SocketAddr,
    first: &[u8],
) -> Option<(std::sync::Arc<Link>, usize)> {
    let (key, at) = codec::arrival(via, from.ip(), first)?;
    let link = plane.link_for(key)?;
    matches!(link.facts().inbound, Inbound::Frame | Inbound::Inferred).then(|| (link.clone(), at))
}
