//! A relayed datagram's arrival ([`crate::relay`] has the scheme and the
//! wrapping): on the relay, passed on to its destination; on the
//! destination, accepted only from the relay the origin's link names.

use crate::link::Link;
use crate::plane::Plane;
use crate::relay::KEY;
use std::io::IoSlice;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_wire::vnet::Flags;

/// A datagram that came in on `link` flagged `RELAY_TO` or `RELAY_FROM`
/// (`payload`: the key, then the inner datagram). Returns the link the
/// inner datagram is for when this host is its destination (the caller
/// opens it as relayed); passes it on when this host is the relay.
pub fn arrived<'p>(
    plane: &'p Plane,
    fw: &crate::Forwarder,
    link: &Arc<Link>,
    flags: Flags,
    payload: &[u8],
) -> Option<&'p Arc<Link>> {
    let g = fw.global();
    let refuse = || {
        g.relay_refused.fetch_add(1, Relaxed);
        fw.dropped(vnet_core::DropReason::RelayRefused, Some(vnet_core::Port::Link(link.def.id)), &[], None);
        None
    };
    if payload.len() <= KEY {
        return refuse();
    }
    let (key, inner) = payload.split_at(KEY);
    let by_key = || plane.links.values().find(|l| l.secure.as_ref().is_some_and(|s| s.peer()[..] == *key));
    if flags.0 & Flags::RELAY_TO != 0 {
        // We are the relay: on to the destination, naming the origin.
        let (Some(dest), Some(origin)) = (by_key(), link.secure.as_ref().map(|s| s.peer())) else {
            return refuse();
        };
        if !g.relay.load(Relaxed) || Arc::ptr_eq(dest, link) {
            return refuse();
        }
        if dest.wrapped(Flags::RELAY_FROM, &origin, &[IoSlice::new(inner)], inner.len()) {
            g.relayed.fetch_add(1, Relaxed);
        }
        return None;
    }
    // We are the destination: only from the relay the origin's link names.
    let origin = by_key()?;
    let via = origin.relay_link();
    if !via.is_some_and(|v| Arc::ptr_eq(&v, link)) {
        return refuse();
    }
    origin.relayed_rx.fetch_add(1, Relaxed);
    Some(origin)
}
