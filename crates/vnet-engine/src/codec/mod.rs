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
mod kind;
pub mod raw;
pub mod stream;
mod tx;
pub mod vnet;
pub mod vxlan;

pub use kind::{Facts, Inbound, Keepalive};
pub(crate) use tx::{gso_batches, send_segments, with_head};
pub use tx::{seal, Tx};

use crate::port::{Payload, Scratch};
use std::net::IpAddr;
use vnet_control::{LinkFormat, RxKey, Security, Transport, Via};

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
