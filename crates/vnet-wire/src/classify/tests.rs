use super::*;

const A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];

/// An Ethernet frame with `tags` VLAN tags over EtherType `ether`.
fn eth(ether: u16, tags: usize, body: &[u8]) -> Vec<u8> {
    let mut f = [B, A].concat();
    for _ in 0..tags {
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
    }
    f.extend_from_slice(&ether.to_be_bytes());
    f.extend_from_slice(body);
    f
}

fn ipv4(proto: u8, flags: u16, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x45, 0, 0, 0, 0x12, 0x34, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    h[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    h[6..8].copy_from_slice(&flags.to_be_bytes());
    h.extend_from_slice(l4);
    h
}

fn ipv6(next: u8, rest: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0, 0, 0, next, 64];
    h[4..6].copy_from_slice(&(rest.len() as u16).to_be_bytes());
    h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    h.extend_from_slice(rest);
    h
}

fn tcp(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t
}

fn ip_of(f: &[u8]) -> Ip {
    match classify(f).unwrap().l3 {
        L3::Ip(ip) => ip,
        l3 => panic!("not IP: {l3:?}"),
    }
}

#[test]
fn tcp_over_ipv4_and_ipv6_gives_addresses_protocol_and_ports() {
    let f = eth(ETHER_IPV4, 0, &ipv4(6, 0, &tcp(40000, 5432)));
    let facts = classify(&f).unwrap();
    assert_eq!((facts.src, facts.dst, facts.ether, facts.tags), (MacAddr(A), MacAddr(B), ETHER_IPV4, 0));
    let ip = ip_of(&f);
    assert_eq!((ip.src, ip.dst), ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()));
    assert_eq!((ip.proto, ip.sport, ip.dport, ip.frag), (6, 40000, 5432, Frag::Whole));
    let f6 = eth(ETHER_IPV6, 0, &ipv6(17, &[0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0]));
    let ip = ip_of(&f6);
    assert_eq!((ip.proto, ip.sport, ip.dport), (17, 12345, 53));
    assert_eq!(ip.dst, "fd00::2".parse::<IpAddr>().unwrap());
}

#[test]
fn vlan_tags_are_looked_through_up_to_two_and_a_third_is_unclassifiable() {
    for tags in 1..=2 {
        let f = eth(ETHER_IPV4, tags, &ipv4(6, 0, &tcp(1, 22)));
        let facts = classify(&f).unwrap();
        assert_eq!((facts.ether, usize::from(facts.tags)), (ETHER_IPV4, tags));
        assert_eq!(ip_of(&f).dport, 22);
    }
    let f = eth(ETHER_IPV4, 3, &ipv4(6, 0, &tcp(1, 22)));
    assert!(classify(&f).is_err());
    // A tag cut short.
    assert!(classify(&eth(ETHER_VLAN, 0, &[0, 7])).is_err());
}

#[test]
fn ipv6_extension_headers_are_walked_to_the_transport_header() {
    // Hop-by-hop (8 bytes), destination options (16), then TCP.
    let mut ext = vec![60, 0, 1, 4, 0, 0, 0, 0];
    ext.extend_from_slice(&[6, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    ext.extend_from_slice(&tcp(1000, 22));
    let ip = ip_of(&eth(ETHER_IPV6, 0, &ipv6(0, &ext)));
    assert_eq!((ip.proto, ip.dport), (6, 22));
    // Nine hop-by-hop headers: more than are looked through.
    let mut many = Vec::new();
    for _ in 0..9 {
        many.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    }
    many.extend_from_slice(&tcp(1, 22));
    assert!(classify(&eth(ETHER_IPV6, 0, &ipv6(0, &many))).is_err());
    // A header whose length runs past the packet.
    assert!(classify(&eth(ETHER_IPV6, 0, &ipv6(0, &[6, 200, 0, 0, 0, 0, 0, 0]))).is_err());
    // AH then UDP.
    let mut ah = vec![17, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    ah.extend_from_slice(&[0, 7, 0, 9, 0, 8, 0, 0]);
    let ip = ip_of(&eth(ETHER_IPV6, 0, &ipv6(51, &ah)));
    assert_eq!((ip.proto, ip.sport, ip.dport), (17, 7, 9));
}

#[test]
fn fragments_first_carry_ports_later_ones_carry_their_id() {
    let first = ip_of(&eth(ETHER_IPV4, 0, &ipv4(17, 0x2000, &[0, 1, 0, 2, 0, 8, 0, 0])));
    assert_eq!((first.frag, first.dport), (Frag::First { id: 0x1234 }, 2));
    let later = ip_of(&eth(ETHER_IPV4, 0, &ipv4(17, 0x0003, &[0, 1, 0, 99, 0, 8, 0, 0])));
    assert_eq!((later.frag, later.sport, later.dport), (Frag::Later { id: 0x1234 }, 0, 0));
    // A tiny first fragment: the TCP header cut before its flags.
    assert!(classify(&eth(ETHER_IPV4, 0, &ipv4(6, 0x2000, &tcp(1, 22)[..12]))).is_err());
    // IPv6: a fragment header, first then later.
    let mut fh = vec![6, 0, 0, 1, 0, 0, 0, 9];
    fh.extend_from_slice(&tcp(5, 22));
    let ip = ip_of(&eth(ETHER_IPV6, 0, &ipv6(44, &fh)));
    assert_eq!((ip.frag, ip.proto, ip.dport), (Frag::First { id: 9 }, 6, 22));
    let fh = [6, 0, 0, 0x18, 0, 0, 0, 9, 0xde, 0xad, 0xbe, 0xef];
    let ip = ip_of(&eth(ETHER_IPV6, 0, &ipv6(44, &fh)));
    assert_eq!((ip.frag, ip.proto, ip.dport), (Frag::Later { id: 9 }, 6, 0));
}

#[test]
fn icmp_echo_and_errors_name_their_flow() {
    let echo = ip_of(&eth(ETHER_IPV4, 0, &ipv4(1, 0, &[8, 0, 0, 0, 0x0a, 0x0b, 0, 1])));
    assert_eq!(echo.icmp, Icmp::Echo { request: true, id: 0x0a0b });
    let reply = ip_of(&eth(ETHER_IPV6, 0, &ipv6(58, &[129, 0, 0, 0, 0, 5, 0, 1])));
    assert_eq!(reply.icmp, Icmp::Echo { request: false, id: 5 });
    // Port unreachable quoting a UDP datagram 10.0.0.2:7 -> 10.0.0.1:9.
    let mut quoted = ipv4(17, 0, &[0, 7, 0, 9, 0, 8, 0, 0]);
    quoted[12..20].copy_from_slice(&[10, 0, 0, 2, 10, 0, 0, 1]);
    let err =
        ip_of(&eth(ETHER_IPV4, 0, &ipv4(1, 0, &[[3, 3, 0, 0, 0, 0, 0, 0].as_slice(), &quoted].concat())));
    let (s, d) = ("10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap());
    assert_eq!(err.icmp, Icmp::Error { src: s, dst: d, proto: 17, sport: 7, dport: 9 });
    // An error quoting nothing readable.
    assert!(classify(&eth(ETHER_IPV4, 0, &ipv4(1, 0, &[3, 3, 0, 0, 0, 0, 0, 0, 0x45]))).is_err());
    // Other ICMP: nothing tracked.
    let other = ip_of(&eth(ETHER_IPV4, 0, &ipv4(1, 0, &[13, 0, 0, 0, 0, 0, 0, 0])));
    assert_eq!(other.icmp, Icmp::None);
}

#[test]
fn arp_gives_its_addresses_and_other_ethertypes_their_type() {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
    a.extend_from_slice(&A);
    a.extend_from_slice(&[10, 0, 0, 1]);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&[10, 0, 0, 9]);
    let f = classify(&eth(ETHER_ARP, 0, &a)).unwrap();
    assert_eq!(f.l3, L3::Arp { sender: Ipv4Addr::new(10, 0, 0, 1), target: Ipv4Addr::new(10, 0, 0, 9) });
    assert!(classify(&eth(ETHER_ARP, 0, &a[..27])).is_err());
    let lldp = classify(&eth(0x88cc, 0, &[0; 46])).unwrap();
    assert_eq!((lldp.ether, lldp.l3), (0x88cc, L3::Other));
}

#[test]
fn malformed_headers_are_unclassifiable_never_a_panic() {
    assert!(classify(&[0u8; 13]).is_err());
    let mut bad = ipv4(6, 0, &tcp(1, 2));
    bad[0] = 0x44; // IHL 4
    assert!(classify(&eth(ETHER_IPV4, 0, &bad)).is_err());
    let mut short = ipv4(6, 0, &tcp(1, 2));
    short[2..4].copy_from_slice(&10u16.to_be_bytes()); // total under the header
    assert!(classify(&eth(ETHER_IPV4, 0, &short)).is_err());
    // Padding past the packet is not read as its transport header.
    let mut padded = ipv4(6, 0, &[]);
    padded.extend_from_slice(&tcp(1, 22));
    assert!(classify(&eth(ETHER_IPV4, 0, &padded)).is_err());
    // Every prefix of a good frame: an answer, never a panic.
    let f = eth(ETHER_IPV6, 1, &ipv6(0, &[[6, 0, 0, 0, 0, 0, 0, 0].as_slice(), &tcp(1, 2)].concat()));
    for n in 0..f.len() {
        let _ = classify(&f[..n]);
    }
}
