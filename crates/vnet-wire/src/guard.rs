//! The IP source guard's reading of a frame: the address a VM's frame
//! claims to come from ([`source`]), and whether a port that owns the
//! addresses of an [`Owned`] set may send it ([`Owned::allows`]).
//!
//! What is read: IPv4's and IPv6's source address and ARP's sender
//! protocol address (an IPv4 ARP: protocol 0x0800, 6-byte hardware and
//! 4-byte protocol addresses, whatever its hardware type, as Linux takes
//! it), under at most [`MAX_TAGS`] VLAN tags. Allowed from any port,
//! whatever it owns: a DHCP client's broadcast (IPv4 from 0.0.0.0, UDP 68
//! to 67, to 255.255.255.255 at the broadcast MAC: a packet from 0.0.0.0
//! to one host is no DHCP client's, and would reach that host past the
//! guard) and from IPv6's unspecified address `::` an MLD report behind a
//! hop-by-hop header (RFC 3810 5.2.13, sent during duplicate address
//! detection). An ARP probe (sender 0.0.0.0) and a neighbour solicitation
//! from `::` (duplicate address detection) pass only for a target address
//! the port owns: a VM probes for its own addresses, not for others'.
//!
//! Neighbour discovery names addresses beyond the source: a neighbour
//! advertisement passes only when its source and its target are the
//! port's (one naming another VM's address would make the neighbours send
//! that VM's traffic to it, or make that VM give up its address); a router
//! advertisement or an ICMPv6 redirect never passes (a guarded port is a
//! VM, not a router); nor does an IPv6 packet with hop limit 255 behind an
//! extension header, which could carry neighbour discovery past the check
//! (RFC 4861 wants 255, an MLD report has 1). Frames of other EtherTypes
//! carry no IP source and pass. An IP or ARP frame cut short, malformed or
//! behind a third tag is unreadable: a guarded port's is dropped (it would
//! otherwise slip past the guard).

use crate::classify::{ETHER_ARP, ETHER_IPV4, ETHER_IPV6, ETHER_QINQ, ETHER_VLAN, MAX_TAGS};
use crate::MacAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a frame says of its source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// No IP source: another EtherType, or an ARP that is not IPv4's.
    None,
    /// One of the exchanges that may come from no address (DHCP's client,
    /// an MLD report from `::`).
    Exempt,
    /// The address it claims to come from.
    Addr(IpAddr),
    /// A probe for an address (an ARP probe, a neighbour solicitation from
    /// `::`): from no address, allowed for a target the port owns.
    Probe(IpAddr),
    /// A neighbour advertisement: from `src`, naming `target` as at the
    /// sender's MAC; both must be the port's.
    Advert { src: IpAddr, target: IpAddr },
    /// What a guarded port never sends: a router advertisement, an ICMPv6
    /// redirect, an IPv6 packet with hop limit 255 behind an extension header.
    Router,
    /// An IP or ARP frame that cannot be read as far as its source.
    Unreadable,
}

const ICMPV6: u8 = 58;
const HOP_BY_HOP: u8 = 0;
const ROUTER_ADVERTISEMENT: u8 = 134;
const NEIGHBOR_SOLICITATION: u8 = 135;
const NEIGHBOR_ADVERTISEMENT: u8 = 136;
const REDIRECT: u8 = 137;
/// The extension headers that may come before ICMPv6: hop-by-hop,
/// routing, fragment, destination options.
const EXTENSIONS: [u8; 4] = [0, 43, 44, 60];
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
        ETHER_IPV4 => ipv4(body, frame.get(..6) == Some(&[0xff; 6][..])),
        ETHER_IPV6 => ipv6(body),
        ETHER_ARP => arp(body),
        _ => Source::None,
    }
}

/// `broadcast_mac`: the frame is to the broadcast MAC.
fn ipv4(b: &[u8], broadcast_mac: bool) -> Source {
    let Some(&first) = b.first() else { return Source::Unreadable };
    let hl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || hl < 20 || b.len() < hl {
        return Source::Unreadable;
    }
    let src = Ipv4Addr::new(b[12], b[13], b[14], b[15]);
    // A DHCP client's request (from no address yet): a first or whole
    // packet, UDP from 68 to 67, broadcast (255.255.255.255, the
    // broadcast MAC).
    let first_fragment = u16::from_be_bytes([b[6], b[7]]) & 0x1fff == 0;
    let to_all = broadcast_mac && b[16..20] == [255; 4];
    if src.is_unspecified() && to_all && b[9] == crate::ip::PROTO_UDP && first_fragment {
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
    let src = Ipv6Addr::from(src);
    let (next, hop_limit) = (b[6], b[7]);
    if next == ICMPV6 {
        if let Some(nd) = neighbor_discovery(src, b) {
            return nd;
        }
    } else if hop_limit == 255 && EXTENSIONS.contains(&next) {
        return Source::Router;
    }
    if src.is_unspecified() && next == HOP_BY_HOP {
        let (next, len) = (b.get(40), b.get(41).map(|l| 8 + 8 * usize::from(*l)));
        if next == Some(&ICMPV6) && len.and_then(|l| b.get(40 + l)).is_some_and(|t| MLD_REPORTS.contains(t)) {
            return Source::Exempt;
        }
    }
    Source::Addr(IpAddr::V6(src))
}

/// What an ICMPv6 message right behind the IPv6 header `b` says, where
/// it names more than its source (neighbour and router discovery); None
/// for the rest, judged by their source.
fn neighbor_discovery(src: Ipv6Addr, b: &[u8]) -> Option<Source> {
    let kind = *b.get(40)?;
    let target =
        || b.get(48..64).and_then(|t| <[u8; 16]>::try_from(t).ok()).map(|t| IpAddr::V6(Ipv6Addr::from(t)));
    Some(match kind {
        ROUTER_ADVERTISEMENT | REDIRECT => Source::Router,
        NEIGHBOR_SOLICITATION if src.is_unspecified() => target().map_or(Source::Unreadable, Source::Probe),
        NEIGHBOR_ADVERTISEMENT => {
            target().map_or(Source::Unreadable, |target| Source::Advert { src: IpAddr::V6(src), target })
        }
        _ => return None,
    })
}

fn arp(b: &[u8]) -> Source {
    // Protocol IPv4 with 6-byte hardware and 4-byte protocol addresses:
    // what Linux reads as IPv4's ARP on an Ethernet device.
    if b.len() < 8 || b[2..6] != [8, 0, 6, 4] {
        return Source::None;
    }
    let Some(s) = b.get(14..28) else { return Source::Unreadable };
    let sender = Ipv4Addr::new(s[0], s[1], s[2], s[3]);
    if sender.is_unspecified() {
        // A probe (RFC 5227), for its target.
        return Source::Probe(IpAddr::V4(Ipv4Addr::new(s[10], s[11], s[12], s[13])));
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
            Source::Addr(a) | Source::Probe(a) => self.contains(&a),
            Source::Advert { src, target } => self.contains(&src) && self.contains(&target),
            Source::Router | Source::Unreadable => false,
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
        arp_for(sender, hw, [10, 0, 0, 9])
    }

    fn arp_for(sender: [u8; 4], hw: u16, target: [u8; 4]) -> Vec<u8> {
        let mut a = hw.to_be_bytes().to_vec();
        a.extend_from_slice(&[8, 0, 6, 4, 0, 1]);
        a.extend_from_slice(&MAC.0);
        a.extend_from_slice(&sender);
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&target);
        a
    }

    /// An ICMPv6 neighbour discovery message of `kind` from `src` for
    /// `target` (with a link-layer address option).
    fn nd(kind: u8, src: Ipv6Addr, target: &str) -> Vec<u8> {
        let mut m = vec![kind, 0, 0, 0, 0x20, 0, 0, 0];
        m.extend_from_slice(&target.parse::<Ipv6Addr>().unwrap().octets());
        m.extend_from_slice(&[2, 1]);
        m.extend_from_slice(&MAC.0);
        [eth(0x86dd, 0), v6(src, 58, &m)].concat()
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
        // DHCP's client from no address, broadcast; nothing else from it:
        // not to one host's MAC or address (which would reach that host,
        // past the guard), nor other ports or protocols.
        let from_none = |tags: usize, mac: [u8; 6], dst: [u8; 4], proto: u8, ports: [u16; 2]| {
            let mut f = [eth(0x0800, tags), v4([0; 4], proto, ports)].concat();
            f[..6].copy_from_slice(&mac);
            let ip = 14 + 4 * tags;
            f[ip + 16..ip + 20].copy_from_slice(&dst);
            f
        };
        let (all, one) = (([0xff; 6], [255; 4]), ([2; 6], [10, 0, 0, 9]));
        assert_eq!(case(from_none(0, all.0, all.1, 17, [68, 67])), (Source::Exempt, true));
        assert_eq!(case(from_none(1, all.0, all.1, 17, [68, 67])), (Source::Exempt, true));
        for (mac, dst, proto, ports) in [
            (one.0, one.1, 17, [68, 67]),
            (one.0, all.1, 17, [68, 67]),
            (all.0, one.1, 17, [68, 67]),
            (all.0, all.1, 17, [68, 68]),
            (all.0, all.1, 6, [68, 67]),
        ] {
            let f = from_none(0, mac, dst, proto, ports);
            assert_eq!(case(f), (a([0; 4]), false), "to {mac:?} {dst:?}, proto {proto}, ports {ports:?}");
        }
        // ARP: the sender; a probe; any hardware type Linux reads as IPv4's.
        assert_eq!(case([eth(0x0806, 0), arp([10, 0, 0, 2], 1)].concat()), (a([10, 0, 0, 2]), false));
        assert_eq!(case([eth(0x0806, 0), arp([10, 0, 0, 2], 6)].concat()), (a([10, 0, 0, 2]), false));
        assert_eq!(case([eth(0x0806, 1), arp([10, 0, 0, 1], 1)].concat()), (a([10, 0, 0, 1]), true));
        let probe = |t: [u8; 4]| Source::Probe(IpAddr::from(t));
        assert_eq!(
            case([eth(0x0806, 0), arp_for([0; 4], 1, [10, 0, 0, 1])].concat()),
            (probe([10, 0, 0, 1]), true)
        );
        // IPv6: the link-local of its MAC; DAD and MLD from ::, nothing else.
        let ll = IpAddr::V6(link_local(MAC));
        assert_eq!(ll.to_string(), "fe80::5054:ff:fe12:3456");
        assert_eq!(
            case([eth(0x86dd, 0), v6(link_local(MAC), 17, &[0; 8])].concat()),
            (Source::Addr(ll), true)
        );
        let other: Ipv6Addr = "fe80::1".parse().unwrap();
        assert!(!case([eth(0x86dd, 0), v6(other, 17, &[0; 8])].concat()).1);
        let ns = nd(135, Ipv6Addr::UNSPECIFIED, "fe80::5054:ff:fe12:3456");
        assert_eq!(case(ns), (Source::Probe(ll), true));
        let mut mld =
            [eth(0x86dd, 0), v6(Ipv6Addr::UNSPECIFIED, 0, &[58, 0, 5, 2, 0, 0, 1, 0, 143, 0])].concat();
        mld[14 + 7] = 1; // its hop limit
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

    #[test]
    fn neighbour_and_router_discovery_name_only_the_ports_own_addresses() {
        let victim = "fd00::2";
        let owned = Owned::new([
            IpAddr::from([10, 0, 0, 1]),
            "fd00::1".parse().unwrap(),
            IpAddr::V6(link_local(MAC)),
        ]);
        let case = |f: Vec<u8>| (source(&f), owned.allows(&f));
        let (ll, own6) = (link_local(MAC), "fd00::1".parse::<Ipv6Addr>().unwrap());
        let ip6 = |s: &str| IpAddr::V6(s.parse().unwrap());
        // A neighbour advertisement for its own address (from its own
        // link-local or global address) passes; for another's it is dropped.
        for (src, target, ok) in [
            (ll, "fd00::1", true),
            (own6, "fd00::1", true),
            (ll, "fe80::5054:ff:fe12:3456", true),
            (ll, victim, false),
            (own6, "fe80::1", false),
        ] {
            let advert = Source::Advert { src: IpAddr::V6(src), target: ip6(target) };
            assert_eq!(case(nd(136, src, target)), (advert, ok), "NA from {src} for {target}");
        }
        // Nor from a source it does not own, for its own target.
        assert!(!case(nd(136, "fe80::1".parse().unwrap(), "fd00::1")).1);
        // Cut short before its target: unreadable.
        let mut short = nd(136, ll, "fd00::1");
        short.truncate(14 + 40 + 20);
        assert_eq!(case(short), (Source::Unreadable, false));
        // Duplicate address detection: from ::, for its own address only.
        assert_eq!(case(nd(135, Ipv6Addr::UNSPECIFIED, "fd00::1")), (Source::Probe(ip6("fd00::1")), true));
        assert_eq!(case(nd(135, Ipv6Addr::UNSPECIFIED, victim)), (Source::Probe(ip6(victim)), false));
        // A solicitation from its own address may ask for anyone (address
        // resolution); from another's, not.
        assert_eq!(case(nd(135, ll, victim)), (Source::Addr(IpAddr::V6(ll)), true));
        assert!(!case(nd(135, "fe80::1".parse().unwrap(), "fd00::1")).1);
        // A router solicitation is judged by its source.
        assert_eq!(case(nd(133, ll, "::")), (Source::Addr(IpAddr::V6(ll)), true));
        // Router advertisements and redirects: never, even from its own address.
        assert_eq!(case(nd(134, ll, "::")), (Source::Router, false));
        assert_eq!(case(nd(137, ll, victim)), (Source::Router, false));
        // Neighbour discovery behind an extension header (hop limit 255):
        // dropped; the same header with another hop limit is judged by source.
        let mut hidden = [eth(0x86dd, 0), v6(ll, 60, &[58, 0, 1, 4, 0, 0, 0, 0, 136, 0])].concat();
        assert_eq!(case(hidden.clone()), (Source::Router, false));
        hidden[14 + 7] = 64;
        assert_eq!(case(hidden), (Source::Addr(IpAddr::V6(ll)), true));
        // ARP: a probe (from 0.0.0.0) for its own address passes, for
        // another's not; a reply or gratuitous ARP is judged by its sender.
        assert!(case([eth(0x0806, 0), arp_for([0; 4], 1, [10, 0, 0, 1])].concat()).1, "a probe for its own");
        let foreign = case([eth(0x0806, 0), arp_for([0; 4], 1, [10, 0, 0, 2])].concat());
        assert_eq!(foreign, (Source::Probe(IpAddr::from([10, 0, 0, 2])), false));
        assert!(case([eth(0x0806, 0), arp_for([10, 0, 0, 1], 1, [10, 0, 0, 1])].concat()).1, "gratuitous");
        assert!(!case([eth(0x0806, 0), arp_for([10, 0, 0, 2], 1, [10, 0, 0, 1])].concat()).1);
        let cut = [eth(0x0806, 0), arp_for([0; 4], 1, [10, 0, 0, 1])[..20].to_vec()].concat();
        assert_eq!(case(cut), (Source::Unreadable, false));
    }
}
