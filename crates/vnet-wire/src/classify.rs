//! What a policy rule can see of a frame ([`classify`]): its MACs, its
//! EtherType under any VLAN tags, ARP's addresses, IP's addresses and
//! protocol under any IPv6 extension headers, the ports, ICMP's echo id or
//! the flow an ICMP error is about, and whether it is a fragment.
//!
//! The rule of this module: what cannot be read to the end is
//! [`Unclassifiable`], never "nothing to match". A frame whose protocol
//! hides behind a third VLAN tag, a ninth IPv6 extension header, a header
//! cut short, or a first fragment too short to hold its ports would
//! otherwise slip past a rule that names that protocol; the policy drops
//! what this module cannot read.

use crate::ip::{PROTO_TCP, PROTO_UDP};
use crate::MacAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const ETHER_IPV4: u16 = 0x0800;
pub const ETHER_ARP: u16 = 0x0806;
pub const ETHER_IPV6: u16 = 0x86dd;
/// 802.1Q and 802.1ad tags: looked through, at most [`MAX_TAGS`].
pub const ETHER_VLAN: u16 = 0x8100;
pub const ETHER_QINQ: u16 = 0x88a8;
pub const MAX_TAGS: usize = 2;
/// IPv6 extension headers looked through before giving up.
pub const MAX_EXT_HEADERS: usize = 8;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_ICMPV6: u8 = 58;

/// Why a frame could not be read to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unclassifiable(pub &'static str);

/// What a frame is, as far as a policy is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub src: MacAddr,
    pub dst: MacAddr,
    /// The EtherType under the VLAN tags.
    pub ether: u16,
    /// VLAN tags looked through.
    pub tags: u8,
    pub l3: L3,
}

/// The network layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    /// Neither IP nor ARP: only MACs and the EtherType to match.
    Other,
    /// ARP (Ethernet and IPv4): sender and target protocol addresses.
    Arp {
        sender: Ipv4Addr,
        target: Ipv4Addr,
    },
    Ip(Ip),
}

/// An IP packet's addresses, protocol (the last header's under the IPv6
/// extension headers) and what follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ip {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    /// TCP or UDP ports (0 for other protocols, and in a later fragment).
    pub sport: u16,
    pub dport: u16,
    pub frag: Frag,
    pub icmp: Icmp,
}

/// Fragmentation, with the packet's identification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frag {
    Whole,
    /// Offset 0, more to come: it carries the ports.
    First {
        id: u32,
    },
    /// Any later fragment: no ports; it follows its first fragment.
    Later {
        id: u32,
    },
}

/// What an ICMP (or ICMPv6) message says, of what a policy tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmp {
    /// Not ICMP, or a message of no other kind here.
    None,
    /// An echo request or reply, with its identifier.
    Echo { request: bool, id: u16 },
    /// An error about a packet `src` sent to `dst` (unreachable, time
    /// exceeded, too big, parameter problem): the flow it belongs to.
    Error { src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16 },
}

fn be16(b: &[u8], at: usize) -> Result<u16, Unclassifiable> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]])).ok_or(Unclassifiable("truncated"))
}

fn v4(b: &[u8], at: usize) -> Result<Ipv4Addr, Unclassifiable> {
    let s = b.get(at..at + 4).ok_or(Unclassifiable("truncated address"))?;
    Ok(Ipv4Addr::new(s[0], s[1], s[2], s[3]))
}

fn v6(b: &[u8], at: usize) -> Result<Ipv6Addr, Unclassifiable> {
    let s: [u8; 16] =
        b.get(at..at + 16).and_then(|s| s.try_into().ok()).ok_or(Unclassifiable("truncated address"))?;
    Ok(Ipv6Addr::from(s))
}

/// Reads `frame` (from its Ethernet header) as far as a policy needs.
pub fn classify(frame: &[u8]) -> Result<Facts, Unclassifiable> {
    if frame.len() < 14 {
        return Err(Unclassifiable("shorter than an Ethernet header"));
    }
    let mac = |at: usize| {
        MacAddr([frame[at], frame[at + 1], frame[at + 2], frame[at + 3], frame[at + 4], frame[at + 5]])
    };
    let (mut ether, mut at, mut tags) = (be16(frame, 12)?, 14, 0u8);
    while ether == ETHER_VLAN || ether == ETHER_QINQ {
        if usize::from(tags) == MAX_TAGS {
            return Err(Unclassifiable("more VLAN tags than looked through"));
        }
        ether = be16(frame, at + 2)?;
        at += 4;
        tags += 1;
    }
    let body = &frame[at..];
    let l3 = match ether {
        ETHER_ARP => arp(body)?,
        ETHER_IPV4 => L3::Ip(ipv4(body)?),
        ETHER_IPV6 => L3::Ip(ipv6(body)?),
        _ => L3::Other,
    };
    Ok(Facts { src: mac(6), dst: mac(0), ether, tags, l3 })
}

fn arp(b: &[u8]) -> Result<L3, Unclassifiable> {
    // Ethernet (1) and IPv4 (0x0800), 6 and 4: what an IPv4 host sends.
    if b.len() < 28 || b[..6] != [0, 1, 8, 0, 6, 4] {
        return Err(Unclassifiable("ARP other than Ethernet and IPv4"));
    }
    Ok(L3::Arp { sender: v4(b, 14)?, target: v4(b, 24)? })
}

fn ipv4(b: &[u8]) -> Result<Ip, Unclassifiable> {
    let first = *b.first().ok_or(Unclassifiable("truncated IPv4 header"))?;
    let hl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || hl < 20 || b.len() < hl {
        return Err(Unclassifiable("malformed IPv4 header"));
    }
    let total = usize::from(be16(b, 2)?);
    if total < hl {
        return Err(Unclassifiable("IPv4 total length under its header"));
    }
    // A frame may be padded past the packet (and a GSO super-frame's
    // length is the frame's): the packet ends at the nearer.
    let end = total.min(b.len());
    let (src, dst, proto) = (IpAddr::V4(v4(b, 12)?), IpAddr::V4(v4(b, 16)?), b[9]);
    let id = u32::from(be16(b, 4)?);
    let flags = be16(b, 6)?;
    let (more, offset) = (flags & 0x2000 != 0, flags & 0x1fff);
    let frag = match (offset, more) {
        (0, false) => Frag::Whole,
        (0, true) => Frag::First { id },
        _ => Frag::Later { id },
    };
    transport(src, dst, proto, frag, &b[hl..end])
}

fn ipv6(b: &[u8]) -> Result<Ip, Unclassifiable> {
    if b.len() < 40 || b[0] >> 4 != 6 {
        return Err(Unclassifiable("malformed IPv6 header"));
    }
    let end = (40 + usize::from(be16(b, 4)?)).min(b.len());
    let b = &b[..end];
    let (src, dst) = (IpAddr::V6(v6(b, 8)?), IpAddr::V6(v6(b, 24)?));
    let (mut next, mut at, mut frag) = (b[6], 40usize, Frag::Whole);
    for _ in 0..=MAX_EXT_HEADERS {
        let len = match next {
            // Hop-by-hop, routing, destination options: 8 + 8 x length.
            0 | 43 | 60 => {
                8 + 8 * usize::from(*b.get(at + 1).ok_or(Unclassifiable("truncated extension header"))?)
            }
            // Authentication header: (length + 2) x 4.
            51 => 4 * (usize::from(*b.get(at + 1).ok_or(Unclassifiable("truncated extension header"))?) + 2),
            44 => {
                let f = b.get(at..at + 8).ok_or(Unclassifiable("truncated fragment header"))?;
                let (offset, more) = (u16::from_be_bytes([f[2], f[3]]) >> 3, f[3] & 1 != 0);
                let id = u32::from_be_bytes([f[4], f[5], f[6], f[7]]);
                frag = match (offset, more) {
                    (0, false) => Frag::Whole, // an atomic fragment
                    (0, true) => Frag::First { id },
                    _ => Frag::Later { id },
                };
                8
            }
            proto => {
                let l4 = b.get(at..).ok_or(Unclassifiable("extension headers past the packet"))?;
                return transport(src, dst, proto, frag, l4);
            }
        };
        next = *b.get(at).ok_or(Unclassifiable("truncated extension header"))?;
        at += len;
        if matches!(frag, Frag::Later { .. }) {
            // What follows is the middle of another packet's payload.
            return Ok(Ip { src, dst, proto: next, sport: 0, dport: 0, frag, icmp: Icmp::None });
        }
    }
    Err(Unclassifiable("more IPv6 extension headers than looked through"))
}

/// The transport header `l4` of a packet (none in a later fragment).
fn transport(src: IpAddr, dst: IpAddr, proto: u8, frag: Frag, l4: &[u8]) -> Result<Ip, Unclassifiable> {
    let mut ip = Ip { src, dst, proto, sport: 0, dport: 0, frag, icmp: Icmp::None };
    if matches!(frag, Frag::Later { .. }) {
        return Ok(ip);
    }
    match proto {
        PROTO_TCP | PROTO_UDP => {
            // A first fragment must carry its ports (and a TCP one its flags:
            // RFC 1858's tiny fragments are refused, as routers do).
            let need = if proto == PROTO_TCP { 16 } else { 8 };
            if l4.len() < need {
                return Err(Unclassifiable("transport header cut short"));
            }
            (ip.sport, ip.dport) = (be16(l4, 0)?, be16(l4, 2)?);
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            if l4.len() < 8 {
                return Err(Unclassifiable("ICMP header cut short"));
            }
            ip.icmp = icmp(proto, l4)?;
        }
        _ => {}
    }
    Ok(ip)
}

fn icmp(proto: u8, m: &[u8]) -> Result<Icmp, Unclassifiable> {
    let id = be16(m, 4)?;
    Ok(match (proto, m[0]) {
        (PROTO_ICMP, 8) | (PROTO_ICMPV6, 128) => Icmp::Echo { request: true, id },
        (PROTO_ICMP, 0) | (PROTO_ICMPV6, 129) => Icmp::Echo { request: false, id },
        (PROTO_ICMP, 3 | 4 | 5 | 11 | 12) | (PROTO_ICMPV6, 1..=4) => error_about(&m[8..])?,
        _ => Icmp::None,
    })
}

/// The flow of the packet an ICMP error quotes (its header and at least
/// 8 bytes of what followed, as RFC 792 and 4443 require).
fn error_about(q: &[u8]) -> Result<Icmp, Unclassifiable> {
    let (src, dst, proto, l4) = match q.first().map(|v| v >> 4) {
        Some(4) => {
            let hl = usize::from(q[0] & 0x0f) * 4;
            if hl < 20 || q.len() < hl {
                return Err(Unclassifiable("ICMP error quoting a malformed header"));
            }
            (IpAddr::V4(v4(q, 12)?), IpAddr::V4(v4(q, 16)?), q[9], &q[hl..])
        }
        Some(6) if q.len() >= 40 => (IpAddr::V6(v6(q, 8)?), IpAddr::V6(v6(q, 24)?), q[6], &q[40..]),
        _ => return Err(Unclassifiable("ICMP error quoting no IP header")),
    };
    let (sport, dport) = match proto {
        PROTO_TCP | PROTO_UDP => (be16(l4, 0)?, be16(l4, 2)?),
        // A quoted echo request: its id, as the request's flow keys it.
        PROTO_ICMP | PROTO_ICMPV6 => (be16(l4, 4)?, 0),
        _ => (0, 0),
    };
    Ok(Icmp::Error { src, dst, proto, sport, dport })
}

#[cfg(test)]
mod tests;
