//! The way in of a `vnet` datagram, once attributed to its link: opened if
//! the link is secured (a handshake answered, a keepalive noted), checked,
//! a control datagram taken (relayed, an endpoint, a path MTU probe), a
//! fragment reassembled, and the frame delivered. How such datagrams are
//! made is `crate::codec::vnet`; the fast path for GRO batches that are
//! one whole frame is [`super::batch`].

use super::deliver::{self, Arrival, Cx};
use crate::link::Link;
use crate::secure::{self, Opened, COOKIE_LEN, RESP_LEN};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_core::Port as PortId;
use vnet_wire::reasm;
use vnet_wire::vnet::{Flags, VnetPacket, VnetRepr};

/// The receive side of `vnet` links, one per socket reader: the
/// reassembly of split frames and the buffer a secured link's handshake
/// answer is written into.
pub struct Rx {
    pub(super) reasm: reasm::Reassembler,
    /// The reassembly counts last added to the global ones: every socket
    /// reader of a host has its own `Rx`, so each adds what it counted
    /// since (a store would keep only the last reader's).
    reported: reasm::Stats,
    /// A secured link's handshake answer.
    reply: Vec<u8>,
}

impl Rx {
    pub fn new(cfg: reasm::Config) -> Self {
        Rx {
            reasm: reasm::Reassembler::new(cfg),
            reported: reasm::Stats::default(),
            reply: vec![0u8; RESP_LEN.max(COOKIE_LEN)],
        }
    }

    /// One datagram of `vnet` link `link` (network `network`): opened if
    /// the link is secured, checked, reassembled if it is a fragment, and
    /// delivered.
    pub(super) fn datagram(
        &mut self,
        cx: &mut Cx<'_>,
        link: &Arc<Link>,
        network: u32,
        at: Arrival,
        data: &mut [u8],
    ) {
        let Some(r) = self.open(cx, link, at, data) else { return };
        self.plain(cx, link, network, at, &mut data[r]);
    }

    /// A secured link's datagram verified (and decrypted) in place: the
    /// range of the `vnet` datagram it carries; or answered (a handshake),
    /// or dropped, or a keepalive: `None`. Any datagram of a plain link is
    /// its own `vnet` datagram.
    pub(super) fn open(
        &mut self,
        cx: &Cx<'_>,
        link: &Arc<Link>,
        at: Arrival,
        data: &mut [u8],
    ) -> Option<std::ops::Range<usize>> {
        let Some(sec) = &link.secure else { return Some(0..data.len()) };
        let at_endpoint = at.relayed || link.sends_to(at.from);
        match sec.open_at(cx.now_ns, at.from, at_endpoint, data, &mut self.reply) {
            Opened::Data(r) => {
                deliver::heard(cx, link, at);
                if r.is_empty() {
                    link.alive.keepalives_received.fetch_add(1, Relaxed);
                    return None;
                }
                Some(r)
            }
            Opened::Reply(n) => {
                // An initiation answered is the peer's and new (IK's
                // `ss`, its timestamp): the link follows it, so the
                // answer goes where the peer is now.
                let answer = [IoSlice::new(&self.reply[..n])];
                if at.relayed {
                    if let Some(r) = link.relay_link() {
                        link.through(&r, &answer, n);
                    }
                    return None;
                }
                if secure::is_response(&self.reply[..n]) && secure::is_initiation(data) {
                    link.authenticated_from(at.from, cx.fw.global());
                }
                link.io.send(&answer, n, 0);
                None
            }
            Opened::Nothing => {
                deliver::refused(cx, link, at);
                None
            }
        }
    }

    /// A `vnet` datagram of `link` (opened, if the link is secured):
    /// checked, reassembled if it is a fragment, and delivered.
    pub(super) fn plain(
        &mut self,
        cx: &mut Cx<'_>,
        link: &Arc<Link>,
        network: u32,
        at: Arrival,
        data: &mut [u8],
    ) {
        let g = cx.fw.global().clone();
        let port = PortId::Link(link.def.id);
        let (repr, hl, plen) = match VnetPacket::new_checked(&*data) {
            Ok(p) => (VnetRepr::parse(&p), p.header_len(), p.payload().len()),
            Err(_) => {
                link.rx.drop_one();
                g.malformed.fetch_add(1, Relaxed);
                cx.fw.dropped(vnet_core::DropReason::Malformed, Some(port), &[], None);
                return;
            }
        };
        if repr.network != network {
            link.rx.drop_one();
            g.wrong_network.fetch_add(1, Relaxed);
            let frame = data.get(hl..).unwrap_or_default();
            cx.fw.dropped(vnet_core::DropReason::WrongNetwork, Some(port), frame, None);
            return;
        }
        if repr.flags.is_control() {
            self.control(cx, link, &repr, &mut data[hl..], at);
            return;
        }
        if repr.flags.0 & Flags::AUTH != 0 {
            link.rx.drop_one();
            g.unsupported_flags.fetch_add(1, Relaxed);
            cx.fw.dropped(vnet_core::DropReason::UnsupportedFlags, Some(port), &[], None);
            return;
        }
        let with_vh = repr.flags.0 & Flags::VNET_HDR != 0;
        if repr.is_whole(plen) {
            link.rx.add(deliver::frame_len(with_vh, plen));
            if repr.flags.0 & Flags::WHOLE != 0 && !with_vh {
                // The segment size the sender's VM used, as well as it can be
                // told: the link MTU less the largest encapsulation and TCP/IP headers.
                let mss = (link.def.mtu as usize)
                    .saturating_sub(vnet_wire::vnet::IPV4_ENCAP_OVERHEAD + 40)
                    .max(536) as u16;
                cx.fw.forward_inferred(cx.plane, port, mss, &mut data[hl..]);
            } else {
                deliver::payload(cx, port, with_vh, &mut data[hl..]);
            }
            return;
        }
        if let reasm::Outcome::Complete(frame) =
            self.reasm.push(cx.now_ns, u64::from(link.def.id), &repr, &data[hl..])
        {
            link.rx.add(deliver::frame_len(with_vh, frame.len()));
            deliver::payload(cx, port, with_vh, frame);
        }
    }

    /// A datagram of `link` that carries no frame (`payload`: what follows
    /// its header): a relayed datagram (relayed once at most; the inner
    /// datagram opened as the origin's link's own), where the peer sees us
    /// (taken from a secured link only: on a plain one, anyone could claim
    /// it), a path MTU probe or its answer.
    fn control(
        &mut self,
        cx: &mut Cx<'_>,
        link: &Arc<Link>,
        repr: &VnetRepr,
        payload: &mut [u8],
        at: Arrival,
    ) {
        if repr.flags.is_relay() {
            let g = cx.fw.global().clone();
            if at.relayed {
                g.relay_refused.fetch_add(1, Relaxed);
                cx.fw.dropped(
                    vnet_core::DropReason::RelayRefused,
                    Some(vnet_core::Port::Link(link.def.id)),
                    &[],
                    None,
                );
                return;
            }
            let Some(origin) = super::relay::arrived(cx.plane, cx.fw, link, repr.flags, payload) else {
                return;
            };
            let vnet_control::Transport::Udp { network, .. } = origin.def.transport else { return };
            let origin = origin.clone();
            let inner = &mut payload[crate::relay::KEY..];
            self.datagram(cx, &origin, network, Arrival { from: at.from, relayed: true }, inner);
        } else if repr.flags.0 & Flags::ENDPOINT != 0 {
            if link.secure.is_some() && payload.len() >= 18 {
                let mut a = [0u8; 16];
                a.copy_from_slice(&payload[..16]);
                let ip = vnet_control::canonical(std::net::Ipv6Addr::from(a).into());
                let port = u16::from_be_bytes([payload[16], payload[17]]);
                link.seen_as.store(Some(Arc::new(SocketAddr::new(ip, port))));
            }
        } else if repr.flags.0 & Flags::PROBE != 0 {
            link.send_probe(repr.frame_id, repr.frame_len, true);
        } else if let Some(p) = &link.pmtu {
            p.acked(repr.frame_id, cx.now_ns);
        }
    }

    /// Drops partial frames older than the reassembly timeout.
    pub fn expire(&mut self, now_ns: u64) {
        self.reasm.expire(now_ns);
    }

    /// Adds the reassembly counts since the last report to the host's.
    pub fn report(&mut self, g: &crate::Global) {
        let s = self.reasm.stats();
        let was = std::mem::replace(&mut self.reported, s);
        g.reasm_fragments.fetch_add(s.fragments - was.fragments, Relaxed);
        g.reasm_completed.fetch_add(s.completed - was.completed, Relaxed);
        g.reasm_timed_out.fetch_add(s.timed_out - was.timed_out, Relaxed);
        g.reasm_evicted.fetch_add(s.evicted - was.evicted, Relaxed);
        g.reasm_rejected.fetch_add(s.rejected() - was.rejected(), Relaxed);
    }

    /// Frames being reassembled now.
    pub fn in_progress(&self) -> usize {
        self.reasm.in_progress()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Global;

    #[test]
    fn the_reassembly_counts_of_every_socket_reader_add_up_in_the_hosts() {
        // One `Rx` per reader of a link socket group: what each reassembled
        // is the host's, whichever reports last.
        let g = Global::default();
        let mut readers = [Rx::new(reasm::Config::default()), Rx::new(reasm::Config::default())];
        let frame = [7u8; 3000];
        for (k, rx) in readers.iter_mut().enumerate() {
            for off in [0usize, 1500] {
                let repr = VnetRepr {
                    flags: Flags(0),
                    network: 0,
                    frame_id: k as u32,
                    frame_len: 3000,
                    offset: off as u32,
                };
                rx.reasm.push(0, 1, &repr, &frame[off..off + 1500]);
            }
            rx.report(&g);
        }
        readers[0].report(&g);
        assert_eq!((g.reasm_fragments.load(Relaxed), g.reasm_completed.load(Relaxed)), (4, 2));
    }
}
