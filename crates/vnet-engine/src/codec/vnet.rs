//! `vnet`: vnet's own format (`vnet_wire::vnet`, `docs/wire.md`). A 20-byte
//! header per datagram with the network id, and frames of up to 64 KB split
//! into underlay-sized datagrams that the receiver reassembles; the frame
//! may begin with its `virtio_net_hdr` (flag `VNET_HDR`), so offloads cross
//! the link and nobody segments in between. Datagrams are laid out as an
//! iovec per header and chunk, straight from the frame's buffer, and given
//! to the link's I/O in GSO batches.

use super::gso_batches;
use crate::forward::Forwarder;
use crate::link::Link;
use crate::plane::{Global, Plane};
use crate::port::{copy_in, slices_in, Payload, Scratch};
use crate::secure::{self, Opened, SecureLink, COOKIE_LEN, RESP_LEN};
use crate::{GSO_MAX_SEGS, MAX_SEGS};
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{LinkFormat, RxKey, Transport};
use vnet_core::Port as PortId;
use vnet_wire::virtio::{self, VirtioNetHdr};
use vnet_wire::vnet::{Flags, VnetPacket, VnetRepr, HEADER_LEN, MAX_FRAME_LEN};
use vnet_wire::{frag, reasm};

/// Bytes the format adds to each datagram.
pub const OVERHEAD: usize = HEADER_LEN;

/// Sends a frame as `vnet` datagrams; segments of a finished frame (not
/// given to a port that takes offloads, but possible) go as whole frames.
pub fn send(link: &Link, scratch: &mut Scratch, payload: Payload<'_>, network: u32, flow: u64) -> bool {
    payload.each_frame(|parts, hdr| send_frame(link, scratch, parts, hdr, network, flow))
}

fn send_frame(
    link: &Link,
    scratch: &mut Scratch,
    parts: &[IoSlice<'_>],
    hdr: bool,
    network: u32,
    flow: u64,
) -> bool {
    let total_in: usize = parts.iter().map(|p| p.len()).sum();
    // An all-zero header says nothing: leave it out (and the flag unset).
    let skip = if hdr && header_is_none(parts) { virtio::LEN } else { 0 };
    let with_vh = hdr && skip == 0;
    let total = total_in - skip;
    if let Some(sec) = &link.secure {
        let flags = Flags(if with_vh { Flags::VNET_HDR } else { 0 });
        return send_sealed(link, sec, scratch, parts, skip..skip + total, flags, network, flow);
    }
    let dgram = link.max_datagram();
    if total > MAX_FRAME_LEN as usize + virtio::LEN || dgram <= HEADER_LEN {
        return false;
    }
    let n = frag::count(total, dgram);
    if n > MAX_SEGS || n > scratch.vnet_hdrs.len() {
        return false;
    }
    let base = VnetRepr {
        flags: Flags(if with_vh { Flags::VNET_HDR } else { 0 }),
        network,
        frame_id: link.frame_ids.next(),
        frame_len: total as u32,
        offset: 0,
    };
    for (i, h) in scratch.vnet_hdrs[..n].iter_mut().enumerate() {
        let offset = frag::chunk(i, total, dgram).start as u32;
        let _ = VnetRepr { offset, ..base }.emit(h);
    }
    let mut iov = [IoSlice::new(&[]); 4 * GSO_MAX_SEGS];
    for batch in gso_batches(n, dgram) {
        let mut k = 0;
        for i in batch {
            let r = frag::chunk(i, total, dgram);
            if k >= iov.len() {
                return false;
            }
            iov[k] = IoSlice::new(&scratch.vnet_hdrs[i]);
            k += 1;
            if !slices_in(parts, r.start + skip..r.end + skip, &mut iov, &mut k) {
                return false;
            }
        }
        if !link.out(&iov[..k], dgram, flow) {
            return false;
        }
    }
    true
}

/// A frame (bytes `frame` of `parts`) over a secured link: each `vnet`
/// datagram is laid out after its secured header in the scratch buffer,
/// sealed in place, and the datagrams go out in GSO batches (all but the
/// last are the same size). Without a session the frame is dropped
/// (counted in the link's `no_session`) while the handshake runs.
#[allow(clippy::too_many_arguments)]
fn send_sealed(
    link: &Link,
    sec: &SecureLink,
    scratch: &mut Scratch,
    parts: &[IoSlice<'_>],
    frame: std::ops::Range<usize>,
    flags: Flags,
    network: u32,
    flow: u64,
) -> bool {
    let total = frame.len();
    // The plain `vnet` datagram each secured one carries.
    let dgram = link.max_datagram().saturating_sub(secure::OVERHEAD);
    if total > MAX_FRAME_LEN as usize + virtio::LEN || dgram <= HEADER_LEN {
        return false;
    }
    let n = frag::count(total, dgram);
    if n > MAX_SEGS {
        return false;
    }
    let Some(session) = sec.sealer() else { return false };
    let base =
        VnetRepr { flags, network, frame_id: link.frame_ids.next(), frame_len: total as u32, offset: 0 };
    let out = &mut scratch.sealed;
    let mut pos = 0;
    for i in 0..n {
        let r = frag::chunk(i, total, dgram);
        let plain = HEADER_LEN + r.len();
        let at = pos + secure::DATA_HEADER;
        if out.len() < at + plain + secure::TAG {
            return false;
        }
        let _ = VnetRepr { offset: r.start as u32, ..base }.emit(&mut out[at..]);
        let bytes = frame.start + r.start..frame.start + r.end;
        if !copy_in(parts, bytes, &mut out[at + HEADER_LEN..at + plain]) {
            return false;
        }
        let Some(m) = session.seal(sec.mode(), &mut out[pos..], plain) else { return false };
        pos += m;
    }
    let seg = dgram + secure::OVERHEAD;
    gso_batches(n, seg)
        .all(|b| link.out(&[IoSlice::new(&out[b.start * seg..(b.end * seg).min(pos)])], seg, flow))
}

/// A secured datagram of `link` verified from `from`: the peer is alive,
/// and (unless it came through a relay) heard directly, and followed if it
/// moved.
fn heard(g: &Arc<Global>, link: &Link, from: SocketAddr, now_ns: u64, relayed: bool) {
    link.alive.heard(now_ns);
    if !relayed {
        link.heard_direct.store(now_ns.saturating_add(1), Relaxed);
        link.authenticated_from(from, g);
    }
}

/// A datagram of secured `link` that did not verify (or was a replay):
/// dropped, and counted as a refused roam when it came from an address the
/// link does not send to.
fn refused(g: &Global, link: &Link, from: SocketAddr, relayed: bool) {
    link.rx.drop_one();
    if !relayed && link.endpoint().is_some_and(|e| e.ip() != from.ip()) {
        g.roams_refused.fetch_add(1, Relaxed);
    }
}

/// On a secured link, the data datagrams a GRO batch begins with, opened
/// together ([`SecureLink::open_run`]) and counted as `Rx::open`
/// counts each: `out[i]`, datagram `i`'s `vnet` datagram (`None`:
/// dropped, or a keepalive). The link hears its peer once for the run.
/// Returns how many datagrams it took (0 on a plain link).
#[allow(clippy::too_many_arguments)]
fn open_run(
    g: &Arc<Global>,
    link: &Arc<Link>,
    from: SocketAddr,
    data: &mut [u8],
    seg: usize,
    now_ns: u64,
    out: &mut [Option<std::ops::Range<usize>>; GSO_MAX_SEGS],
) -> usize {
    let Some(sec) = &link.secure else { return 0 };
    let n = sec.open_run(data, seg, out);
    let mut any = false;
    for r in &mut out[..n] {
        match r {
            Some(x) => {
                any = true;
                if std::ops::Range::is_empty(x) {
                    link.alive.keepalives_received.fetch_add(1, Relaxed);
                    *r = None;
                }
            }
            None => refused(g, link, from, false),
        }
    }
    if any {
        heard(g, link, from, now_ns, false);
    }
    n
}

/// Sends a path MTU probe of IP size `size` (`ack`: the answer to the
/// peer's probe `id` of that size, no padding), sealed on a secured link.
/// A probe is sent from the link's timer, not per frame: its buffer is
/// allocated; an answer's is on the stack.
pub fn send_probe(link: &Link, id: u32, size: u32, ack: bool) -> bool {
    let Transport::Udp { network, .. } = link.def.transport else { return false };
    let flags = Flags(if ack { Flags::PROBE_ACK } else { Flags::PROBE });
    let repr = VnetRepr { flags, network, frame_id: id, frame_len: size, offset: 0 };
    let over = link.secure.as_ref().map_or(0, |_| secure::OVERHEAD);
    let plain = if ack {
        HEADER_LEN
    } else {
        (size as usize).saturating_sub(link.outer_len() + over).max(HEADER_LEN)
    };
    let mut small = [0u8; secure::OVERHEAD + HEADER_LEN];
    let mut big = Vec::new();
    let buf: &mut [u8] = if ack {
        &mut small
    } else {
        big.resize(over + plain, 0);
        &mut big
    };
    let at = if over > 0 { secure::DATA_HEADER } else { 0 };
    if repr.emit(&mut buf[at..]).is_none() {
        return false;
    }
    let Some(n) = link.seal(buf, plain) else { return false };
    link.out(&[IoSlice::new(&buf[..n])], n, 0)
}

/// Tells the peer where this link sees it (a `vnet` datagram flagged
/// `ENDPOINT`, sealed on a secured link): its endpoint now.
pub fn send_endpoint(link: &Link) -> bool {
    let (Some(e), Transport::Udp { network, .. }) = (link.endpoint(), link.def.transport) else {
        return false;
    };
    let repr = VnetRepr { flags: Flags(Flags::ENDPOINT), network, frame_id: 0, frame_len: 0, offset: 0 };
    let over = link.secure.as_ref().map_or(0, |_| secure::OVERHEAD);
    let at = if over > 0 { secure::DATA_HEADER } else { 0 };
    let plain = HEADER_LEN + 18;
    let mut buf = [0u8; secure::OVERHEAD + HEADER_LEN + 18];
    if repr.emit(&mut buf[at..]).is_none() {
        return false;
    }
    let ip = match e.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    buf[at + HEADER_LEN..at + HEADER_LEN + 16].copy_from_slice(&ip.octets());
    buf[at + HEADER_LEN + 16..at + plain].copy_from_slice(&e.port().to_be_bytes());
    let Some(n) = link.seal(&mut buf, plain) else { return false };
    link.io.send(&[IoSlice::new(&buf[..n])], n, 0)
}

/// Whether the `virtio_net_hdr` at the front of `parts` is all zeros.
fn header_is_none(parts: &[IoSlice<'_>]) -> bool {
    let mut left = virtio::LEN;
    for p in parts {
        let take = p.len().min(left);
        if p[..take].iter().any(|&b| b != 0) {
            return false;
        }
        left -= take;
        if left == 0 {
            return true;
        }
    }
    false
}

/// Where and when a datagram arrived, and whether through a relay.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    from: SocketAddr,
    now_ns: u64,
    relayed: bool,
}

/// The receive side of `vnet` links, one per socket reader: the
/// reassembly of split frames and the buffer a secured link's handshake
/// answer is written into. `crate::rx` attributes a datagram to its link;
/// what a `vnet` datagram then goes through is here, beside how it is made.
pub struct Rx {
    reasm: reasm::Reassembler,
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

    /// One datagram of `vnet` link `link` (network `network`) from `from`:
    /// opened if the link is secured, checked, reassembled if it is a
    /// fragment, and delivered. `relayed`: it came through a relay
    /// ([`crate::relay`]): it moves no link, and answers go back that way.
    #[allow(clippy::too_many_arguments)]
    pub fn datagram(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        link: &Arc<Link>,
        network: u32,
        from: SocketAddr,
        data: &mut [u8],
        now_ns: u64,
        relayed: bool,
    ) {
        let Some(r) = self.open(fw.global(), link, from, data, now_ns, relayed) else { return };
        self.plain(fw, plane, link, network, Arrival { from, now_ns, relayed }, &mut data[r]);
    }

    /// A secured link's datagram verified (and decrypted) in place: the
    /// range of the `vnet` datagram it carries; or answered (a handshake),
    /// or dropped, or a keepalive: `None`. Any datagram of a plain link is
    /// its own `vnet` datagram.
    fn open(
        &mut self,
        g: &Arc<Global>,
        link: &Arc<Link>,
        from: SocketAddr,
        data: &mut [u8],
        now_ns: u64,
        relayed: bool,
    ) -> Option<std::ops::Range<usize>> {
        let Some(sec) = &link.secure else { return Some(0..data.len()) };
        let at_endpoint = relayed || link.sends_to(from);
        match sec.open_at(now_ns, from, at_endpoint, data, &mut self.reply) {
            Opened::Data(r) => {
                heard(g, link, from, now_ns, relayed);
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
                if relayed {
                    if let Some(r) = link.relay_link() {
                        link.through(&r, &answer, n);
                    }
                    return None;
                }
                if secure::is_response(&self.reply[..n]) && secure::is_initiation(data) {
                    link.authenticated_from(from, g);
                }
                link.io.send(&answer, n, 0);
                None
            }
            Opened::Nothing => {
                refused(g, link, from, relayed);
                None
            }
        }
    }

    /// A `vnet` datagram of `link` (opened, if the link is secured):
    /// checked, reassembled if it is a fragment, and delivered.
    fn plain(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        link: &Arc<Link>,
        network: u32,
        at: Arrival,
        data: &mut [u8],
    ) {
        let g = fw.global().clone();
        let port = PortId::Link(link.def.id);
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
        if repr.flags.is_control() {
            self.control(fw, plane, link, &repr, &mut data[hl..], at);
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
                fw.forward_inferred(plane, port, mss, &mut data[hl..]);
            } else {
                deliver(fw, plane, port, with_vh, &mut data[hl..]);
            }
            return;
        }
        if let reasm::Outcome::Complete(frame) =
            self.reasm.push(at.now_ns, u64::from(link.def.id), &repr, &data[hl..])
        {
            link.rx.add(frame.len());
            deliver(fw, plane, port, with_vh, frame);
        }
    }

    /// A datagram of `link` that carries no frame (`payload`: what follows
    /// its header): a relayed datagram (relayed once at most; the inner
    /// datagram opened as the origin's link's own), where the peer sees us
    /// (taken from a secured link only: on a plain one, anyone could claim
    /// it), a path MTU probe or its answer.
    fn control(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        link: &Arc<Link>,
        repr: &VnetRepr,
        payload: &mut [u8],
        at: Arrival,
    ) {
        let g = fw.global().clone();
        if repr.flags.is_relay() {
            if at.relayed {
                g.relay_refused.fetch_add(1, Relaxed);
                return;
            }
            let Some(origin) = crate::relay::arrived(plane, &g, link, repr.flags, payload) else { return };
            let Transport::Udp { network, .. } = origin.def.transport else { return };
            let origin = origin.clone();
            let inner = &mut payload[crate::relay::KEY..];
            self.datagram(fw, plane, &origin, network, at.from, inner, at.now_ns, true);
        } else if repr.flags.0 & Flags::ENDPOINT != 0 {
            if link.secure.is_some() && payload.len() >= 18 {
                let mut a = [0u8; 16];
                a.copy_from_slice(&payload[..16]);
                let ip = vnet_control::canonical(std::net::Ipv6Addr::from(a).into());
                let port = u16::from_be_bytes([payload[16], payload[17]]);
                link.seen_as.store(Some(Arc::new(SocketAddr::new(ip, port))));
            }
        } else if repr.flags.0 & Flags::PROBE != 0 {
            send_probe(link, repr.frame_id, repr.frame_len, true);
        } else if let Some(p) = &link.pmtu {
            p.acked(repr.frame_id, at.now_ns);
        }
    }

    /// The fast path for GRO batches of `vnet` datagrams that make one
    /// whole frame with its offload header, in order: `first` alone (what
    /// one GSO send of a peer becomes), or `first` and the next receive
    /// buffer from the same peer, asked of `next` only then (a frame of more datagrams than one
    /// GSO send takes, such as the 45 of a 65000-byte frame over a
    /// 1500-byte underlay, comes as two). The frame is written to its
    /// destination from the pieces where they lie, with no reassembly copy.
    /// A secured link's datagrams are opened in place first, one pass over
    /// each batch; if they are not such a frame then, each goes on alone.
    /// Returns how many buffers it took: 0 (nothing done: a plain link's
    /// batch is anything else, or a destination needs a contiguous frame),
    /// 1 or 2.
    #[allow(clippy::too_many_arguments)]
    pub fn whole_frames(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        from: SocketAddr,
        first: &mut [u8],
        seg: usize,
        next: &mut dyn crate::rx::NextBuf,
        now_ns: u64,
    ) -> usize {
        let Some(link) = plane.link_for(RxKey::Udp(from.ip())) else { return 0 };
        let Transport::Udp { format: LinkFormat::Vnet, network, .. } = link.def.transport else {
            return 0;
        };
        let n = first.len().div_ceil(seg);
        if !(2..=GSO_MAX_SEGS).contains(&n) {
            return 0;
        }
        let secure = link.secure.is_some();
        let mut a = [(0, 0); GSO_MAX_SEGS];
        let ka = self.pieces(fw, link, from, first, seg, now_ns, &mut a);
        let mut run = Run::new();
        let begun = ka == n && run.extend(first, &a[..ka], network);
        let at = Arrival { from, now_ns, relayed: false };
        if begun && run.complete() {
            if self.deliver_run(fw, plane, link, &run, now_ns) {
                return 1;
            }
        } else if let Some((second, seg2)) = if begun { next.next_buf() } else { None } {
            let seg2 = if seg2 > 0 { seg2 } else { second.len() };
            let nb = second.len().div_ceil(seg2.max(1));
            if (1..=GSO_MAX_SEGS).contains(&nb) {
                let mut b = [(0, 0); GSO_MAX_SEGS];
                let kb = self.pieces(fw, link, from, second, seg2, now_ns, &mut b);
                if kb == nb
                    && run.extend(second, &b[..kb], network)
                    && run.complete()
                    && self.deliver_run(fw, plane, link, &run, now_ns)
                {
                    fw.global().rx_whole_pairs.fetch_add(1, Relaxed);
                    return 2;
                }
                if secure {
                    // Both opened in place: neither can be opened again.
                    self.each_plain(fw, plane, link, network, at, first, &a[..ka]);
                    self.each_plain(fw, plane, link, network, at, second, &b[..kb]);
                    return 2;
                }
            }
        }
        if !secure {
            return 0;
        }
        self.each_plain(fw, plane, link, network, at, first, &a[..ka]);
        1
    }

    /// Takes the `vnet` datagrams at `ranges` of `data` one by one.
    #[allow(clippy::too_many_arguments)]
    fn each_plain(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        link: &Arc<Link>,
        network: u32,
        at: Arrival,
        data: &mut [u8],
        ranges: &[(usize, usize)],
    ) {
        for &(x, y) in ranges {
            self.plain(fw, plane, link, network, at, &mut data[x..y]);
        }
    }

    /// The `vnet` datagrams of a GRO batch of `seg`-byte datagrams, as
    /// ranges of `data` into `out`: each datagram, or on a secured link what
    /// it opened to in place (those that do not open are left out).
    /// Returns how many.
    #[allow(clippy::too_many_arguments)]
    fn pieces(
        &mut self,
        fw: &Forwarder,
        link: &Arc<Link>,
        from: SocketAddr,
        data: &mut [u8],
        seg: usize,
        now_ns: u64,
        out: &mut [(usize, usize); GSO_MAX_SEGS],
    ) -> usize {
        let mut opened = [const { None }; GSO_MAX_SEGS];
        let run = open_run(fw.global(), link, from, data, seg, now_ns, &mut opened);
        let mut k = 0;
        for (i, d) in data.chunks_mut(seg).enumerate().take(GSO_MAX_SEGS) {
            let r = if i < run {
                match opened[i].take() {
                    Some(r) => r,
                    None => continue,
                }
            } else {
                match link.secure {
                    Some(_) => match self.open(fw.global(), link, from, d, now_ns, false) {
                        Some(r) => r,
                        None => continue,
                    },
                    None => 0..d.len(),
                }
            };
            out[k] = (i * seg + r.start, i * seg + r.end);
            k += 1;
        }
        k
    }

    /// Delivers a whole frame `run` of `link` to its destination; false
    /// (nothing done) if a destination needs a contiguous frame.
    fn deliver_run(
        &mut self,
        fw: &mut Forwarder,
        plane: &Plane,
        link: &Link,
        run: &Run<'_>,
        now_ns: u64,
    ) -> bool {
        if !fw.forward_parts(plane, PortId::Link(link.def.id), &run.iov[..run.n], run.len) {
            return false;
        }
        link.rx.add(run.len - virtio::LEN);
        link.alive.heard(now_ns);
        fw.global().rx_whole_batches.fetch_add(1, Relaxed);
        true
    }

    /// Drops partial frames older than the reassembly timeout.
    pub fn expire(&mut self, now_ns: u64) {
        self.reasm.expire(now_ns);
    }

    /// Adds the reassembly counts since the last report to the host's.
    pub fn report(&mut self, g: &Global) {
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

/// The `vnet` datagrams of one frame with its offload header, in order,
/// gathered from one or two GRO batches: an iovec per datagram payload.
struct Run<'a> {
    iov: [IoSlice<'a>; 2 * GSO_MAX_SEGS],
    n: usize,
    /// The first datagram's header, which every other must match.
    first: Option<VnetRepr>,
    /// The frame's bytes so far, and the offset the next datagram must have.
    len: usize,
}

impl<'a> Run<'a> {
    fn new() -> Self {
        Run { iov: [IoSlice::new(&[]); 2 * GSO_MAX_SEGS], n: 0, first: None, len: 0 }
    }

    /// Adds the datagrams at `ranges` of `data`; false if one is not the
    /// frame's next (the run is then of no use).
    fn extend(&mut self, data: &'a [u8], ranges: &[(usize, usize)], network: u32) -> bool {
        for &(x, y) in ranges {
            let d = &data[x..y];
            let Ok(p) = VnetPacket::new_checked(d) else { return false };
            let r = VnetRepr::parse(&p);
            let ok = match self.first {
                None => r.offset == 0 && r.flags.0 == Flags::VNET_HDR && r.network == network,
                Some(f) => r.frame_id == f.frame_id && r.frame_len == f.frame_len && r.flags == f.flags,
            };
            if !ok || r.offset as usize != self.len || self.n == self.iov.len() {
                return false;
            }
            self.first.get_or_insert(r);
            self.len += p.payload().len();
            self.iov[self.n] = IoSlice::new(&d[p.header_len()..]);
            self.n += 1;
        }
        true
    }

    /// The datagrams make the whole frame.
    fn complete(&self) -> bool {
        self.first.is_some_and(|f| f.frame_len as usize == self.len) && self.len > virtio::LEN
    }
}

/// Delivers a `vnet` frame payload, which begins with a `virtio_net_hdr`
/// when `with_vh`.
pub fn deliver(fw: &mut Forwarder, plane: &Plane, port: PortId, with_vh: bool, bytes: &mut [u8]) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_wire::vnet::{Flags, VnetRepr};

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
