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
//! buffer, an iovec per datagram payload, with no reassembly copy.

use crate::codec;
use crate::forward::Forwarder;
use crate::link::Link;
use crate::plane::{Global, Plane};
use crate::secure::{Opened, COOKIE_LEN, RESP_LEN};
use crate::GSO_MAX_SEGS;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{canonical, LinkFormat, RxKey, Transport};
use vnet_core::Port as PortId;
use vnet_wire::reasm;
use vnet_wire::virtio::{self, VirtioNetHdr};
use vnet_wire::vnet::{Flags, VnetPacket, VnetRepr};

/// The receiving socket a datagram came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The `listen udp` socket: `raw` and `vnet` links.
    Udp,
    /// The `listen vxlan` socket.
    Vxlan,
}

/// The receive state of one socket's reader.
pub struct Receiver {
    via: Via,
    reasm: reasm::Reassembler,
    /// A secured link's handshake answer.
    reply: Vec<u8>,
}

impl Receiver {
    pub fn new(via: Via, cfg: reasm::Config) -> Self {
        Receiver { via, reasm: reasm::Reassembler::new(cfg), reply: vec![0u8; RESP_LEN.max(COOKIE_LEN)] }
    }

    /// Takes one receive buffer from `from`: one datagram, or (`gso` not 0)
    /// datagrams of `gso` bytes, the last may be shorter, coalesced by GRO.
    /// `now_ns` is the caller's clock, for reassembly timeouts.
    pub fn receive(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        from: SocketAddr,
        buf: &mut [u8],
        gso: usize,
        now_ns: u64,
    ) {
        let via = self.via;
        let from = SocketAddr::new(canonical(from.ip()), from.port());
        let len = buf.len();
        if gso > 0 && via == Via::Udp && self.whole_frame_batch(fw, plane, from.ip(), buf, gso, now_ns) {
            return;
        }
        if len == 0 {
            // A keepalive (or a stranger's empty datagram).
            self.datagram(fw, plane, via, from, buf, now_ns);
            return;
        }
        let seg = if gso > 0 { gso } else { len.max(1) };
        let mut off = 0;
        while off < len {
            let end = (off + seg).min(len);
            self.datagram(fw, plane, via, from, &mut buf[off..end], now_ns);
            off = end;
        }
    }

    /// One datagram.
    fn datagram(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        via: Via,
        from: SocketAddr,
        data: &mut [u8],
        now_ns: u64,
    ) {
        let g = fw.global().clone();
        let (link, frame_at) = match via {
            Via::Udp => (plane.link_for(RxKey::Udp(from.ip())), 0),
            Via::Vxlan => match codec::vxlan::decapsulate(data) {
                Some((vni, _)) => {
                    (plane.link_for(RxKey::Vxlan(from.ip(), vni)), vnet_wire::vxlan::HEADER_LEN)
                }
                None => {
                    g.malformed.fetch_add(1, Relaxed);
                    return;
                }
            },
        };
        let Some(link) = link else {
            g.unknown_source.fetch_add(1, Relaxed);
            return;
        };
        // A secured link hears its peer only in what authenticates.
        if link.secure.is_none() {
            link.alive.heard(now_ns);
            if data.is_empty() {
                link.alive.keepalives_received.fetch_add(1, Relaxed);
                return;
            }
        }
        let port = PortId::Link(link.def.id);
        match link.def.transport {
            Transport::Udp { format: LinkFormat::Raw, .. } => {
                let frame = codec::raw::decapsulate(data);
                link.rx.add(frame.len());
                fw.forward(plane, port, VirtioNetHdr::NONE, frame);
            }
            Transport::Vxlan { .. } => {
                let frame = &mut data[frame_at..];
                link.rx.add(frame.len());
                // A Linux VTEP over a veth may leave the inner checksum to
                // "the device" (CHECKSUM_PARTIAL survives the veth), and its
                // tunnel-GSO packets reach a UDP socket unsegmented: an inner
                // frame larger than the link carries whole is a TCP
                // super-frame, cut at the largest segment that would fit.
                let mss = link.max_whole_frame().saturating_sub(14 + 40).max(536) as u16;
                forward_inferred(fw, plane, port, mss, frame);
            }
            Transport::Udp { format: LinkFormat::Vnet, network, .. } => {
                self.vnet_datagram(fw, plane, link, network, from, data, now_ns, &g)
            }
            // A stream's records and a LAN's frames never arrive as datagrams.
            Transport::Tcp { .. } | Transport::Direct { .. } => {
                g.unknown_source.fetch_add(1, Relaxed);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn vnet_datagram(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        link: &Arc<Link>,
        network: u32,
        from: SocketAddr,
        data: &mut [u8],
        now_ns: u64,
        g: &Global,
    ) {
        let port = PortId::Link(link.def.id);
        // A secured link: verified (and decrypted) in place, or answered,
        // or dropped; what is left is a `vnet` datagram like any other.
        let data: &mut [u8] = match &link.secure {
            None => data,
            Some(sec) => match sec.open(now_ns, from, data, &mut self.reply) {
                Opened::Data(r) => {
                    link.alive.heard(now_ns);
                    if r.is_empty() {
                        link.alive.keepalives_received.fetch_add(1, Relaxed);
                        return;
                    }
                    &mut data[r]
                }
                Opened::Reply(n) => {
                    link.io.send(&[IoSlice::new(&self.reply[..n])], n, 0);
                    return;
                }
                Opened::Nothing => {
                    link.rx.drop_one();
                    return;
                }
            },
        };
        let (repr, hl, plen) = match VnetPacket::new_checked(&*data) {
            Ok(p) => (VnetRepr::parse(&p), p.header_len(), p.payload().len()),
            Err(_) => {
                link.rx.drop_one();
                g.malformed.fetch_add(1, Relaxed);
                return;
            }
        };
        if repr.network != network {
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
                // The segment size the sender's VM used, as well as it can be
                // told: the link MTU less the largest encapsulation and TCP/IP headers.
                let mss = (link.def.mtu as usize)
                    .saturating_sub(vnet_wire::vnet::IPV4_ENCAP_OVERHEAD + 40)
                    .max(536) as u16;
                forward_inferred(fw, plane, port, mss, &mut data[hl..]);
            } else {
                deliver_vnet(fw, plane, port, with_vh, &mut data[hl..]);
            }
            return;
        }
        if let reasm::Outcome::Complete(frame) =
            self.reasm.push(now_ns, u64::from(link.def.id), &repr, &data[hl..])
        {
            link.rx.add(frame.len());
            deliver_vnet(fw, plane, port, with_vh, frame);
        }
    }

    /// The fast path for a GRO batch of `vnet` datagrams that is exactly one
    /// whole frame with its offload header, in order. Returns false, having
    /// delivered nothing, when the batch is anything else or a destination
    /// needs a contiguous frame.
    fn whole_frame_batch(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        from: IpAddr,
        data: &[u8],
        seg: usize,
        now_ns: u64,
    ) -> bool {
        let Some(link) = plane.link_for(RxKey::Udp(from)) else { return false };
        let Transport::Udp { format: LinkFormat::Vnet, network, .. } = link.def.transport else {
            return false;
        };
        if link.secure.is_some() {
            return false; // each datagram verified on its own
        }
        let n = data.len().div_ceil(seg);
        if !(2..=GSO_MAX_SEGS).contains(&n) {
            return false;
        }
        let mut iov = [IoSlice::new(&[]); GSO_MAX_SEGS];
        let mut first: Option<VnetRepr> = None;
        let mut expect = 0usize;
        for (i, d) in data.chunks(seg).enumerate() {
            let Ok(p) = VnetPacket::new_checked(d) else { return false };
            let r = VnetRepr::parse(&p);
            let ok = match first {
                None => r.offset == 0 && r.flags.0 == Flags::VNET_HDR && r.network == network,
                Some(f) => r.frame_id == f.frame_id && r.frame_len == f.frame_len && r.flags == f.flags,
            };
            if !ok || r.offset as usize != expect {
                return false;
            }
            first.get_or_insert(r);
            expect += p.payload().len();
            iov[i] = IoSlice::new(&d[p.header_len()..]);
        }
        match first {
            Some(f) if f.frame_len as usize == expect && expect > virtio::LEN => {}
            _ => return false,
        }
        if !fw.forward_parts(plane, PortId::Link(link.def.id), &iov[..n], expect) {
            return false;
        }
        link.rx.add(expect - virtio::LEN);
        link.alive.heard(now_ns);
        fw.global().rx_whole_batches.fetch_add(1, Relaxed);
        true
    }

    /// Drops partial frames older than the reassembly timeout.
    pub fn expire(&mut self, now_ns: u64) {
        self.reasm.expire(now_ns);
    }

    /// Publishes the reassembly counts.
    pub fn report(&self, g: &Global) {
        let s = self.reasm.stats();
        g.reasm_fragments.store(s.fragments, Relaxed);
        g.reasm_completed.store(s.completed, Relaxed);
        g.reasm_timed_out.store(s.timed_out, Relaxed);
        g.reasm_evicted.store(s.evicted, Relaxed);
        g.reasm_rejected.store(s.rejected(), Relaxed);
    }

    /// Frames being reassembled now.
    pub fn in_progress(&self) -> usize {
        self.reasm.in_progress()
    }
}

/// Delivers a frame taken off a `direct` link's device, with its offload header.
pub fn lan_frame(fw: &mut Forwarder, plane: &Plane, link: &Link, vh: VirtioNetHdr, frame: &mut [u8]) {
    link.rx.add(frame.len());
    fw.forward(plane, PortId::Link(link.def.id), vh, frame);
}

/// Delivers a record taken off link `link`'s stream (`codec::stream`): a
/// frame payload that begins with its `virtio_net_hdr` when `with_vh`.
pub fn stream_record(fw: &mut Forwarder, plane: &Plane, link: &Link, with_vh: bool, payload: &mut [u8]) {
    let len = payload.len() - if with_vh { virtio::LEN.min(payload.len()) } else { 0 };
    link.rx.add(len);
    deliver_vnet(fw, plane, PortId::Link(link.def.id), with_vh, payload);
}

/// Delivers a `vnet` frame payload, which begins with a `virtio_net_hdr`
/// when `with_vh`.
fn deliver_vnet(fw: &mut Forwarder, plane: &Plane, port: PortId, with_vh: bool, bytes: &mut [u8]) {
    if !with_vh {
        fw.forward(plane, port, VirtioNetHdr::NONE, bytes);
        return;
    }
    match VirtioNetHdr::parse(bytes) {
        Some(vh) => fw.forward(plane, port, vh, &mut bytes[virtio::LEN..]),
        None => {
            fw.global().malformed.fetch_add(1, Relaxed);
        }
    }
}

/// Forwards a whole frame that came without an offload header from a
/// sender that may have left checksum and segmentation to the devices: a
/// peer's kernel path (it marks its `vnet` datagrams `WHOLE`) hands frames
/// over as the VM's stack made them, and a Linux VTEP over a veth may leave
/// the inner checksum partial. The header the frame needs is inferred
/// (`offload::infer`, with `mss` 0 for "never a super-frame"), so
/// offload-capable destinations take it as is and the rest get it finished
/// in software. `raw` datagrams come from Palacios hosts, which send
/// finished frames, and are not inspected.
fn forward_inferred(fw: &mut Forwarder, plane: &Plane, port: PortId, mss: u16, frame: &mut [u8]) {
    let vh = vnet_wire::offload::infer(frame, mss).unwrap_or(VirtioNetHdr::NONE);
    fw.forward(plane, port, vh, frame);
}
