//! One module per link kind: how a frame becomes datagrams (encapsulation),
//! how a datagram's frame is found again where the kind is that simple
//! (decapsulation; a `vnet` datagram's way in is `crate::rx::vnet`), and
//! the kind's facts ([`Facts`]: its overhead, whether offloads cross it,
//! how its peer is known to be alive, which way in its datagrams take),
//! stated once in the kind's module. The engine's every `match` on a kind
//! is here, one row per kind ([`facts`], [`send`], and [`arrival`] per
//! receiving socket): the rest of the engine asks these.
//!
//! A codec knows nothing of the link above it: it sends through the small
//! context the link builds for each send ([`Tx`]: the datagram senders,
//! the sizes, the session). The I/O is not here either: a link's
//! datagrams go to its [`DatagramTx`].

pub mod direct;
pub mod raw;
pub mod stream;
pub mod vnet;
pub mod vxlan;

use crate::port::DatagramTx;
use crate::port::{Payload, Scratch};
use crate::secure::SecureLink;
use crate::{GSO_MAX_BYTES, GSO_MAX_SEGS};
use std::io::IoSlice;
use std::net::IpAddr;
use std::ops::Range;
use vnet_control::{LinkFormat, RxKey, Security, Transport, Via};
use vnet_wire::frag::FrameIds;
use vnet_wire::offload::Segmented;

/// What a codec sends through, built by the link for one send.
pub struct Tx<'a> {
    /// Where the link's datagrams go: to the peer, or through its relay
    /// while the link relays.
    pub out: &'a dyn DatagramTx,
    /// Straight to the peer's address, never through a relay.
    pub direct: &'a dyn DatagramTx,
    /// The largest UDP payload that crosses the underlay unfragmented now.
    pub max_datagram: usize,
    /// The outer IP and UDP headers' length (0: a LAN has none).
    pub outer_len: usize,
    /// Ids of the frames the link fragments.
    pub frame_ids: &'a FrameIds,
    /// The link's sessions, on a secured link.
    pub secure: Option<&'a SecureLink>,
}

impl Tx<'_> {
    /// [`seal`] with the link's session.
    pub fn seal(&self, buf: &mut [u8], plain: usize) -> Option<usize> {
        seal(self.secure, buf, plain)
    }
}

/// Seals the `plain` bytes laid out after the secured header in `buf` (at
/// 0 on a plain link) with `secure`'s session, and returns the datagram's
/// length: `plain` on a plain link, `None` on a secured link without a
/// session.
pub fn seal(secure: Option<&SecureLink>, buf: &mut [u8], plain: usize) -> Option<usize> {
    match secure {
        None => Some(plain),
        Some(sec) => sec.sealer().and_then(|s| s.seal(sec.mode(), buf, plain)),
    }
}

/// How a link's peer is known to be alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keepalive {
    /// The link sends an empty datagram when idle, and its peer (a vnetd)
    /// does the same.
    Datagrams,
    /// The stream has heartbeats of its own.
    Stream,
    /// The peer sends none (a Palacios host, a kernel VTEP, a LAN): quiet
    /// is not down.
    None,
}

/// A link kind's facts, each stated in the kind's module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Bytes the kind adds to each datagram inside the UDP payload.
    pub overhead: usize,
    /// Whether a frame's offload header crosses the link (else the engine
    /// gives it finished frames only).
    pub offloads: bool,
    /// Whether any frame goes whole, whatever the underlay MTU (a stream).
    pub any_size: bool,
    /// Whether the link searches its path MTU with probes (its peer answers).
    pub probes: bool,
    pub keepalive: Keepalive,
    /// What the way in does with what arrives for the link.
    pub inbound: Inbound,
}

/// The ways in the receive side has (`crate::rx`), one per what a kind's
/// peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// A finished frame per datagram, after the kind's header.
    Frame,
    /// A frame per datagram that may be a TCP super-frame a VTEP left
    /// unsegmented (its offload inferred).
    Inferred,
    /// `vnet` datagrams: opened, checked, reassembled (`crate::rx::vnet`).
    Vnet,
    /// Records on a stream, never datagrams (`crate::rx::stream_record`).
    Stream,
    /// Frames on a device of the link's own, never datagrams.
    Device,
}

/// The facts of the kind `transport` names: one lookup.
pub fn facts(transport: &Transport) -> Facts {
    match *transport {
        Transport::Udp { format: LinkFormat::Raw, .. } => raw::FACTS,
        Transport::Udp { format: LinkFormat::Vnet, security: Security::None, .. } => vnet::FACTS,
        Transport::Udp { format: LinkFormat::Vnet, .. } => vnet::SECURED,
        Transport::Vxlan { .. } => vxlan::FACTS,
        Transport::Tcp { .. } => stream::FACTS,
        Transport::Direct { .. } => direct::FACTS,
    }
}

/// Sends `payload` as `transport`'s datagrams through `tx` (`flow`: the
/// inner flow's hash, for the kinds that send from a pool of ports).
pub fn send(
    transport: &Transport,
    tx: &Tx<'_>,
    scratch: &mut Scratch,
    payload: Payload<'_>,
    flow: impl FnOnce() -> u64,
) -> Result<bool, vxlan::TooBig> {
    Ok(match *transport {
        Transport::Udp { format: LinkFormat::Raw, .. } => raw::send(tx, payload, 0),
        Transport::Udp { format: LinkFormat::Vnet, network, .. } => {
            vnet::send(tx, scratch, payload, network, flow())
        }
        Transport::Vxlan { vni, .. } => return vxlan::send(tx, payload, vni, flow()),
        Transport::Tcp { .. } => stream::send(tx, payload, 0),
        Transport::Direct { .. } => direct::send(tx, payload, 0),
    })
}

/// The key of the link a datagram that came in on socket `via` from `ip`
/// belongs to, and where its frame starts; `None` for one that socket's
/// kind refuses (a VXLAN header Linux would drop).
pub fn arrival(via: Via, ip: IpAddr, data: &[u8]) -> Option<(RxKey, usize)> {
    match via {
        Via::Udp => Some((RxKey::Addr(Via::Udp, ip, 0), 0)),
        Via::Vxlan => vxlan::arrival(ip, data),
        // A stream's records never arrive as datagrams.
        Via::Tcp => None,
    }
}

/// Calls `f` with `head` in front of `parts` as one list of slices (on the
/// stack); false if the frame has more pieces than that list holds.
pub(crate) fn with_head(head: &[u8], parts: &[IoSlice<'_>], f: impl FnOnce(&[IoSlice<'_>]) -> bool) -> bool {
    let mut iov = [IoSlice::new(&[]); 8];
    if parts.len() >= iov.len() {
        return false;
    }
    iov[0] = IoSlice::new(head);
    iov[1..=parts.len()].copy_from_slice(parts);
    f(&iov[..=parts.len()])
}

/// How many datagrams of `seg` bytes one GSO send takes.
fn gso_per(seg: usize) -> usize {
    (GSO_MAX_BYTES / seg.max(1)).clamp(1, GSO_MAX_SEGS)
}

/// The datagrams `0..n` of `seg` bytes each, as the index ranges of one GSO
/// send each.
pub(crate) fn gso_batches(n: usize, seg: usize) -> impl Iterator<Item = Range<usize>> {
    let per = gso_per(seg);
    (0..n).step_by(per).map(move |first| first..(first + per).min(n))
}

/// Sends the segments of a finished super-frame, each as one datagram with
/// `prefix` (an encapsulation header, possibly empty) in front, its
/// headers and its payload as they lie: equal-sized datagrams in batches of
/// one GSO send each.
pub(crate) fn send_segments(to: &dyn DatagramTx, segs: Segmented<'_>, prefix: &[u8], flow: u64) -> bool {
    let seg = prefix.len() + segs.seg_len().max(1);
    let mut iov = [IoSlice::new(&[]); 3 * GSO_MAX_SEGS];
    let n = segs.count();
    gso_batches(n, seg).all(|batch| {
        let mut k = 0;
        for i in batch {
            let (h, p) = segs.segment(i);
            if !prefix.is_empty() {
                iov[k] = IoSlice::new(prefix);
                k += 1;
            }
            iov[k] = IoSlice::new(h);
            iov[k + 1] = IoSlice::new(p);
            k += 2;
        }
        to.send(&iov[..k], seg, flow)
    })
}
