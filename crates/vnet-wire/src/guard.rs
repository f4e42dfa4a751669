//! The IP source guard's reading of a frame: the address a VM's frame
//! claims to come from ([`source`]), and whether a port that owns the
//! addresses of an [`Owned`] set may send it ([`Owned::allows`]).
//!
//! What is read: IPv4's and IPv6's source address and ARP's sender
//! protocol address (an IPv4 ARP: protocol 0x0800, 6-byte hardware and
//! 4-byte protocol addresses, whatever its hardware type, as Linux takes
//! it), under at most [`MAX_TAGS`] VLAN tags. Allowed from any port,
//! whatever it owns: a DHCP client's exchange (IPv4 from 0.0.0.0, UDP 68
//! to 67), an ARP probe (sender 0.0.0.0), and from IPv6's unspecified
//! address `::` a neighbour solicitation (duplicate address detection) or
//! an MLD report behind a hop-by-hop header (RFC 3810 5.2.13, sent during
//! it). Frames of other EtherTypes carry no IP source and pass. An IP or
//! ARP frame cut short, malformed or behind a third tag is unreadable: a
//! guarded port's is dropped (it would otherwise slip past the guard).

use crate::classify::{ETHER_ARP, ETHER_IPV4, ETHER_IPV6, ETHER_QINQ, ETHER_VLAN, MAX_TAGS};
use crate::MacAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a frame says of its source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// No IP source: another EtherType, or an ARP that is not IPv4's.
    None,
    /// One of the exchanges that may come from no address (DHCP's client,
    /// an ARP probe, duplicate address detection).
    Exempt,
    /// The address it claims to come from.
    Addr(IpAddr),
    /// An IP or ARP frame that cannot be read as far as its source.
    Unreadable,
}

const IPV6_UNSPECIFIED: [u8; 16] = [0; 16];
const ICMPV6: u8 = 58;
const HOP_BY_HOP: u8 = 0;
const NEIGHBOR_SOLICITATION: u8 = 135;
/// MLDv1 and MLDv2 reports.
const MLD_REPORTS: [u8; 2] = [131, 143];

/// The source address `frame` (from its Ethernet header) claims.
pub fn source(frame: &[u8]) -> Source {
    let be16 = |at: usize| frame.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]));
    let Some(mut ether) = be16(12) else { return Source::Unreadable };
    let mut at = 14;
    for _ in 0..MAX_TAGS {
        if ether != ETHER_VLAN && ether != ETHER_QINQ {
            break;
        }
        let Some(e) = be16(at + 2) else { return Source::Unreadable };
        (ether, at) = (e, at + 4);
    }
    let body = &frame[at.min(frame.len())..];
    match ether {
        ETHER_VLAN | ETHER_QINQ => Source::Unreadable,
        ETHER_IPV4 => ipv4(body),
        ETHER_IPV6 => ipv6(body),
        ETHER_ARP => arp(body),
        _ => Source::None,
    }
}

fn ipv4(b: &[u8]) -> Source {
    let Some(&first) = b.first() else { return Source::Unreadable };
    let hl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || hl < 20 || b.len() < hl {
        return Source::Unreadable;
    }
    let src = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
    // A DHCP client's request (from no address yet): a first or whole
    // packet, UDP from 68 to 67.
    let first_fragment = u16::from_be_bytes([b[6], b[7]]) & 0x1fff == 0;
    if src.is_unspecified() && b[9] == crate::ip::PROTO_UDP && first_fragment {
        if let Some(p) = b.get(hl..hl + 4) {
            if p == [0, 68, 0, 67] {
                return Source::Exempt;
            }
        }
    }
    Source::Addr(IpAddr::V4(src))
}

fn ipv6(b: &[u8]) -> Source {
    if b.len() < 40 || b[0] >> 4 != 6 {
        return Source::Unreadable;
    }
    let mut src = [0u8; 16];
    src.copy_from_slice(&b[8..24]);
    if src == IPV6_UNSPECIFIED {
        let exempt = match b[6] {
            ICMPV6 => b.get(40) == Some(&NEIGHBOR_SOLICITATION),
            HOP_BY_HOP => {
                let (next, len) = (b.get(40), b.get(41).map(|l| 8 + 8 * usize::from(*l)));
                next == Some(&ICMPV6)
                    && len.and_then(|l| b.get(40 + l)).is_some_and(|t| MLD_REPORTS.contains(t))
            }
            _ => false,
        };
        if exempt {
            return Source::Exempt;
        }
    }
    Source::Addr(IpAddr::V6(Ipv6Addr::from(src)))
}

fn arp(b: &[u8]) -> Source {
    // Protocol IPv4 with 6-byte hardware and 4-byte protocol addresses:
    // what Linux reads as IPv4's ARP on an Ethernet device.
    if b.len() < 8 || b[2..6] != [8, 0, 6, 4] {
        return Source::None;
    }
    let Some(s) = b.get(14..18) else { return Source::Unreadable };
    let sender = Ipv4Addr::new(s[0], s[1], s[2], s[3]);
    if sender.is_unspecified() {
        return Source::Exempt; // a probe (RFC 5227)
    }
    Source::Addr(IpAddr::V4(sender))
}

/// The IPv6 link-local address a host derives from `mac` (modified
/// EUI-64, RFC 4291 appendix A).
pub fn link_local(mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

/// The addresses a port owns, sorted: the ones its VM may send from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned(Box<[IpAddr]>);

impl Owned {
    pub fn new(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut v: Vec<IpAddr> = addrs.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Owned(v.into_boxed_slice())
    }

    pub fn contains(&self, a: &IpAddr) -> bool {
        self.0.binary_search(a).is_ok()
    }

    pub fn addrs(&self) -> &[IpAddr] {
        &self.0
    }

    /// Whether a port owning these addresses may send `frame` (no
    /// allocation: a binary search at most).
    #[inline]
    pub fn allows(&self, frame: &[u8]) -> bool {
        match source(frame) {
            Source::None | Source::Exempt => true,
            Source::Addr(a) => self.contains(&a),
            Source::Unreadable => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);

    fn eth(ether: u16, tags: usize) -> Vec<u8> {
        let mut f = [vec![2; 6], MAC.0.to_vec()].concat();
        for _ in 0..tags {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&ether.to_be_bytes());
        f
    }

    fn v4(src: [u8; 4], proto: u8, ports: [u16; 2]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, proto, 0, 0];
        h.extend_from_slice(&src);
        h.extend_from_slice(&[10, 0, 0, 9]);
        h.extend_from_slice(&ports[0].to_be_bytes());
        h.extend_from_slice(&ports[1].to_be_bytes());
        h.extend_from_slice(&[0, 8, 0, 0]);
        h
    }

    fn v6(src: Ipv6Addr, next: u8, rest: &[u8]) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0, 0, rest.len() as u8, next, 255];
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&"ff02::1".parse::<Ipv6Addr>().unwrap().octets());
        h.extend_from_slice(rest);
        h
    }

    fn arp(sender: [u8; 4], hw: u16) -> Vec<u8> {
        let mut a = hw.to_be_bytes().to_vec();
        a.extend_from_slice(&[8, 0, 6, 4, 0, 1]);
        a.extend_from_slice(&MAC.0);
        a.extend_from_slice(&sender);
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&[10, 0, 0, 9]);
        a
    }

    #[test]
    fn the_source_is_read_under_tags_and_the_exceptions_are_only_what_they_say() {
        let owned = Owned::new([IpAddr::from([10, 0, 0, 1]), IpAddr::V6(link_local(MAC))]);
        let case = |f: Vec<u8>| (source(&f), owned.allows(&f));
        let a = |o: [u8; 4]| Source::Addr(IpAddr::from(o));
        assert_eq!(case([eth(0x0800, 0), v4([10, 0, 0, 1], 17, [5, 6])].concat()), (a([10, 0, 0, 1]), true));
        assert_eq!(case([eth(0x0800, 0), v4([10, 0, 0, 2], 17, [5, 6])].concat()), (a([10, 0, 0, 2]), false));
        assert_eq!(case([eth(0x0800, 2), v4([10, 0, 0, 2], 6, [5, 6])].concat()), (a([10, 0, 0, 2]), false));
        let three = [eth(0x0800, 3), v4([10, 0, 0, 1], 6, [5, 6])].concat();
        assert_eq!(case(three), (Source::Unreadable, false), "a third tag");
        // DHCP's client from no address; nothing else from it.
        assert_eq!(case([eth(0x0800, 0), v4([0; 4], 17, [68, 67])].concat()), (Source::Exempt, true));
        assert_eq!(case([eth(0x0800, 0), v4([0; 4], 17, [68, 68])].concat()), (a([0; 4]), false));
        assert_eq!(case([eth(0x0800, 0), v4([0; 4], 6, [68, 67])].concat()), (a([0; 4]), false));
        // ARP: the sender; a probe; any hardware type Linux reads as IPv4's.
        assert_eq!(case([eth(0x0806, 0), arp([10, 0, 0, 2], 1)].concat()), (a([10, 0, 0, 2]), false));
        assert_eq!(case([eth(0x0806, 0), arp([10, 0, 0, 2], 6)].concat()), (a([10, 0, 0, 2]), false));
        assert_eq!(case([eth(0x0806, 1), arp([10, 0, 0, 1], 1)].concat()), (a([10, 0, 0, 1]), true));
        assert_eq!(case([eth(0x0806, 0), arp([0; 4], 1)].concat()), (Source::Exempt, true));
        // IPv6: the link-local of its MAC; DAD and MLD from ::, nothing else.
        let ll = IpAddr::V6(link_local(MAC));
        assert_eq!(ll.to_string(), "fe80::5054:ff:fe12:3456");
        assert_eq!(
            case([eth(0x86dd, 0), v6(link_local(MAC), 17, &[0; 8])].concat()),
            (Source::Addr(ll), true)
        );
        let other: Ipv6Addr = "fe80::1".parse().unwrap();
        assert!(!case([eth(0x86dd, 0), v6(other, 17, &[0; 8])].concat()).1);
        let ns = [eth(0x86dd, 0), v6(Ipv6Addr::UNSPECIFIED, 58, &[135, 0, 0, 0])].concat();
        assert_eq!(case(ns), (Source::Exempt, true));
        let mld = [eth(0x86dd, 0), v6(Ipv6Addr::UNSPECIFIED, 0, &[58, 0, 5, 2, 0, 0, 1, 0, 143, 0])].concat();
        assert_eq!(case(mld), (Source::Exempt, true));
        let echo = [eth(0x86dd, 0), v6(Ipv6Addr::UNSPECIFIED, 58, &[128, 0, 0, 0])].concat();
        assert_eq!(case(echo), (Source::Addr(IpAddr::V6(Ipv6Addr::UNSPECIFIED)), false));
        // Cut short: unreadable, never "no source".
        let short = [eth(0x0800, 0), v4([10, 0, 0, 1], 17, [5, 6])[..12].to_vec()].concat();
        assert_eq!(case(short), (Source::Unreadable, false));
        assert_eq!(case([eth(0x86dd, 0), vec![0x60; 20]].concat()), (Source::Unreadable, false));
        assert_eq!(case(eth(0x8100, 0)), (Source::Unreadable, false));
        assert_eq!(case(vec![0; 10]), (Source::Unreadable, false));
        // Other EtherTypes carry no IP source.
        assert_eq!(case([eth(0x88b5, 0), vec![0; 40]].concat()), (Source::None, true));
    }
}
