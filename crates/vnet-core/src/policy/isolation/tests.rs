use super::*;
use std::net::Ipv4Addr;
use vnet_wire::classify::Frag;
use vnet_wire::MacAddr;

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 0, n))
}

fn mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, n])
}

/// A first packet from pod `s` to pod `d` (MAC and address by number).
fn pkt(s: u8, d: u8, proto: u8, dport: u16) -> Facts {
    Facts {
        src: mac(s),
        dst: mac(d),
        ether: 0x0800,
        tags: 0,
        l3: L3::Ip(Ip {
            src: ip(s),
            dst: ip(d),
            proto,
            sport: 40000,
            dport,
            frag: Frag::Whole,
            icmp: if proto == 1 { Icmp::Echo { request: true, id: 1 } } else { Icmp::None },
        }),
    }
}

fn allow(peers: Vec<Peer>, ports: Vec<PortMatch>) -> Allow {
    Allow { peers, ports, counters: Arc::default() }
}

fn pods(ns: &[u8]) -> Peer {
    Peer::Addrs(Arc::new(ns.iter().map(|&n| ip(n)).collect()))
}

fn policy(name: &str, ingress: Option<Vec<Allow>>, egress: Option<Vec<Allow>>) -> Policy {
    Policy { name: name.into(), ingress, egress, denied: Arc::default() }
}

/// `policies` with policy i selecting the pods `selects[i]`.
fn set(policies: Vec<Policy>, selects: &[&[u8]]) -> Isolation {
    let mut iso = Isolation::default();
    for (i, (p, sel)) in policies.iter().zip(selects).enumerate() {
        for &n in sel.iter() {
            if p.ingress.is_some() {
                iso.ingress_of.entry(ip(n)).or_default().push(i as u32);
            }
            if p.egress.is_some() {
                iso.egress_of.entry(ip(n)).or_default().push(i as u32);
            }
        }
    }
    iso.policies = policies;
    iso
}

#[test]
fn only_selected_pods_are_isolated_and_only_in_their_policys_directions() {
    // Default deny ingress for pod 2.
    let iso = set(vec![policy("prod/deny", Some(vec![]), None)], &[&[2]]);
    assert_eq!(
        iso.check(&pkt(1, 2, 6, 80), 60),
        Err(Denied { direction: Direction::Ingress, policy: 0 }),
        "the selected pod is isolated for ingress"
    );
    assert_eq!(iso.check(&pkt(1, 3, 6, 80), 60), Ok(()), "positive control: an unselected pod is not");
    assert_eq!(iso.check(&pkt(2, 1, 6, 80), 60), Ok(()), "nor is the selected pod for egress");
    assert_eq!(iso.policies[0].denied.snapshot().drops, 1);
    // Egress only.
    let iso = set(vec![policy("prod/deny-out", None, Some(vec![]))], &[&[2]]);
    assert!(iso.check(&pkt(2, 1, 17, 53), 60).is_err());
    assert_eq!(iso.check(&pkt(1, 2, 17, 53), 60), Ok(()), "ingress to it is not isolated");
}

#[test]
fn a_packet_needs_the_senders_egress_and_the_receivers_ingress() {
    // Pod 1 may send only to pod 2; pod 2 takes only from pod 3.
    let out = policy("a/out", None, Some(vec![allow(vec![pods(&[2])], vec![])]));
    let inn = policy("a/in", Some(vec![allow(vec![pods(&[3])], vec![])]), None);
    let iso = set(vec![out, inn], &[&[1], &[2]]);
    let d = iso.check(&pkt(1, 2, 6, 80), 60).unwrap_err();
    assert_eq!(d, Denied { direction: Direction::Ingress, policy: 1 }, "egress allows, ingress does not");
    assert_eq!(iso.check(&pkt(3, 2, 6, 80), 60), Ok(()), "pod 3 is not egress-isolated, and 2 takes it");
    assert_eq!(iso.check(&pkt(1, 4, 6, 80), 60).unwrap_err().direction, Direction::Egress);
    assert_eq!(
        iso.policies[0].egress.as_ref().unwrap()[0].counters.snapshot().packets,
        1,
        "the rule met once (its packet then denied by 2's ingress)"
    );
}

#[test]
fn the_rules_of_every_policy_selecting_a_pod_add_up() {
    let web = policy("a/web", Some(vec![allow(vec![pods(&[1])], vec![])]), None);
    let db = policy("a/db", Some(vec![allow(vec![pods(&[3])], vec![])]), None);
    let iso = set(vec![web, db], &[&[2], &[2]]);
    assert_eq!(iso.check(&pkt(1, 2, 6, 80), 60), Ok(()));
    assert_eq!(iso.check(&pkt(3, 2, 6, 80), 60), Ok(()));
    assert!(iso.check(&pkt(4, 2, 6, 80), 60).is_err());
}

#[test]
fn ports_ranges_named_ports_and_protocols() {
    let named: FxHashMap<IpAddr, u16> = [(ip(2), 8080), (ip(3), 9090)].into_iter().collect();
    let ports = vec![
        PortMatch { proto: 6, ports: Ports::Range(5432, 5432) },
        PortMatch { proto: 6, ports: Ports::Range(6000, 6010) },
        PortMatch { proto: 6, ports: Ports::Named(Arc::new(named)) },
        PortMatch { proto: 17, ports: Ports::All },
    ];
    let iso = set(vec![policy("a/p", Some(vec![allow(vec![], ports)]), None)], &[&[2, 3]]);
    let ok = |s, d, proto, port| iso.check(&pkt(s, d, proto, port), 60).is_ok();
    assert!(ok(1, 2, 6, 5432) && !ok(1, 2, 6, 5433), "one port");
    assert!(ok(1, 2, 6, 6000) && ok(1, 2, 6, 6010) && !ok(1, 2, 6, 6011), "endPort, inclusive");
    assert!(ok(1, 2, 6, 8080) && !ok(1, 2, 6, 9090), "a named port: pod 2's number");
    assert!(ok(1, 3, 6, 9090) && !ok(1, 3, 6, 8080), "and pod 3's");
    assert!(ok(1, 2, 17, 5432), "UDP: every port");
    assert!(ok(1, 2, 17, 7), "UDP with no port: every port");
    assert!(!ok(1, 2, 1, 0), "ICMP is no protocol the rule names");
    // No ports: every protocol, ICMP included.
    let iso = set(vec![policy("a/any", Some(vec![allow(vec![pods(&[1])], vec![])]), None)], &[&[2]]);
    assert!(iso.check(&pkt(1, 2, 1, 0), 60).is_ok());
}

#[test]
fn an_ip_block_takes_its_exceptions_out() {
    let block = Peer::Block {
        net: (IpAddr::V4(Ipv4Addr::new(10, 244, 0, 0)), 24),
        except: vec![(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 0)), 30), (ip(9), 32)],
    };
    let iso = set(vec![policy("a/b", Some(vec![allow(vec![block], vec![])]), None)], &[&[2]]);
    assert!(iso.check(&pkt(5, 2, 6, 1), 60).is_ok(), "in the block");
    assert!(iso.check(&pkt(1, 2, 6, 1), 60).is_err(), "in the first exception");
    assert!(iso.check(&pkt(9, 2, 6, 1), 60).is_err(), "in the second");
}

#[test]
fn what_is_no_network_policys_passes_and_the_nodes_own_port_is_exempt() {
    let mut iso = set(vec![policy("a/deny", Some(vec![]), Some(vec![]))], &[&[2]]);
    let mut arp = pkt(1, 2, 6, 80);
    arp.l3 = L3::Arp { sender: Ipv4Addr::new(10, 244, 0, 1), target: Ipv4Addr::new(10, 244, 0, 2) };
    assert!(iso.check(&arp, 42).is_ok(), "ARP");
    let mut nd = pkt(1, 2, 58, 0);
    if let L3::Ip(ip) = &mut nd.l3 {
        ip.icmp = Icmp::None;
    }
    assert!(iso.check(&nd, 42).is_ok(), "neighbour discovery");
    let mut echo6 = pkt(1, 2, 58, 0);
    if let L3::Ip(ip) = &mut echo6.l3 {
        ip.icmp = Icmp::Echo { request: true, id: 3 };
    }
    assert!(iso.check(&echo6, 42).is_err(), "an ICMPv6 echo is a NetworkPolicy's");
    assert!(iso.check(&pkt(1, 2, 6, 80), 60).is_err(), "control: the node's address not yet exempt");
    iso.exempt.insert(ip(1));
    assert!(iso.check(&pkt(1, 2, 6, 80), 60).is_ok(), "from the node");
    assert!(iso.check(&pkt(2, 1, 6, 80), 60).is_ok(), "to the node");
}

#[test]
fn counters_follow_a_policy_by_name_into_the_next_set() {
    let old = set(vec![policy("a/p", Some(vec![allow(vec![pods(&[1])], vec![])]), None)], &[&[2]]);
    old.check(&pkt(1, 2, 6, 80), 60).unwrap();
    old.check(&pkt(3, 2, 6, 80), 60).unwrap_err();
    let new = set(
        vec![
            policy("a/q", Some(vec![]), None),
            policy("a/p", Some(vec![allow(vec![pods(&[1, 3])], vec![])]), None),
        ],
        &[&[4], &[2]],
    )
    .counting_as(&old);
    let p = &new.policies[1];
    assert_eq!(p.ingress.as_ref().unwrap()[0].counters.snapshot().packets, 1);
    assert_eq!(p.denied.snapshot().drops, 1);
    assert_eq!(new.policies[0].denied.snapshot().drops, 0);
}

/// Service `10.96.0.N:80/TCP` with `backends` (pod number, target port).
fn service(iso: &mut Isolation, n: u8, backends: &[(u8, u16)]) {
    let sp = |ip, port| ServicePort { ip, proto: 6, port };
    let to = sp(IpAddr::V4(Ipv4Addr::new(10, 96, 0, n)), 80);
    let eps: Vec<(IpAddr, u16)> = backends.iter().map(|&(b, p)| (ip(b), p)).collect();
    iso.backends.extend(eps.iter().map(|&(a, p)| sp(a, p)));
    iso.services.insert(to, eps);
}

/// A first packet from pod `s` to Service `10.96.0.N` port `dport`.
fn to_service(s: u8, n: u8, dport: u16) -> Facts {
    let mut f = pkt(s, 200, 6, dport);
    if let L3::Ip(ip) = &mut f.l3 {
        ip.dst = IpAddr::V4(Ipv4Addr::new(10, 96, 0, n));
    }
    f
}

/// A Service connection is judged on its first leg as if the pod had sent
/// it to the backend's address and target port: an isolated backend whose
/// policy admits pod 1 to port 8080 takes pod 1 through its Service and
/// not pod 3; the same policy on port 9090 (the Service's target port is
/// 8080) takes neither; pod 3 without the Service map reaches the
/// ClusterIP (judged against it: the hole this closes).
#[test]
fn an_isolated_backend_takes_a_service_connection_only_as_its_policy_allows() {
    let ports = |p| vec![PortMatch { proto: 6, ports: Ports::Range(p, p) }];
    let mut iso = set(vec![policy("a/p", Some(vec![allow(vec![pods(&[1])], ports(8080))]), None)], &[&[2]]);
    assert!(iso.check(&to_service(3, 1, 80), 60).is_ok(), "control: no Service map, judged as sent");
    service(&mut iso, 1, &[(2, 8080)]);
    assert!(iso.check(&to_service(1, 1, 80), 60).is_ok(), "pod 1, allowed, through the Service");
    assert_eq!(
        iso.check(&to_service(3, 1, 80), 60),
        Err(Denied { direction: Direction::Ingress, policy: 0 }),
        "pod 3, denied, through the Service"
    );
    assert!(iso.check(&to_service(3, 1, 81), 60).is_ok(), "another port of the address: not the Service's");
    let mut other = set(vec![policy("a/p", Some(vec![allow(vec![pods(&[1])], ports(9090))]), None)], &[&[2]]);
    service(&mut other, 1, &[(2, 8080)]);
    assert!(other.check(&to_service(1, 1, 80), 60).is_err(), "judged at the target port, not the Service's");
}

/// kube-proxy picks the backend after the check: a Service passes only if
/// every backend would take it; one with none is denied (kube-proxy may
/// know a backend vnet does not yet).
/// The sender's egress is judged against the backends, not the ClusterIP.
#[test]
fn a_service_passes_only_when_every_backend_would_take_it() {
    let mut iso = set(
        vec![
            policy("a/open", Some(vec![allow(vec![], vec![])]), None),
            policy("a/closed", Some(vec![]), None),
            policy("a/out", None, Some(vec![allow(vec![pods(&[2])], vec![])])),
        ],
        &[&[2], &[3], &[5]],
    );
    service(&mut iso, 1, &[(2, 8080)]);
    assert!(iso.check(&to_service(1, 1, 80), 60).is_ok(), "control: one backend, which takes it");
    service(&mut iso, 1, &[(2, 8080), (3, 8080)]);
    assert_eq!(
        iso.check(&to_service(1, 1, 80), 60),
        Err(Denied { direction: Direction::Ingress, policy: 1 }),
        "two backends, one of which denies"
    );
    service(&mut iso, 2, &[]);
    assert!(iso.check(&to_service(5, 2, 80), 60).is_err(), "no backend: denied (kube-proxy may know one)");
    service(&mut iso, 3, &[(2, 8080)]);
    assert!(iso.check(&to_service(5, 3, 80), 60).is_ok(), "egress allowed to the backend, not the ClusterIP");
    service(&mut iso, 4, &[(4, 8080)]);
    assert_eq!(
        iso.check(&to_service(5, 4, 80), 60),
        Err(Denied { direction: Direction::Egress, policy: 2 }),
        "egress to a backend it does not allow"
    );
}

/// The second leg: another node's address (a translator) reaches a
/// Service's backend at its target port, judged at its source; not at
/// another port, nor as an address that is no translator (the control).
#[test]
fn the_second_leg_from_a_translator_to_a_backend_passes() {
    let mut iso = set(vec![policy("a/deny", Some(vec![]), None)], &[&[2]]);
    service(&mut iso, 1, &[(2, 8080)]);
    assert!(iso.check(&pkt(9, 2, 6, 8080), 60).is_err(), "control: not a translator");
    iso.translators.insert(ip(9));
    assert!(iso.check(&pkt(9, 2, 6, 8080), 60).is_ok(), "a translator to a backend");
    assert!(iso.check(&pkt(9, 2, 6, 22), 60).is_err(), "a translator to a port no Service's");
    assert!(iso.check(&pkt(9, 2, 17, 8080), 60).is_err(), "nor another protocol");
    assert!(iso.check(&pkt(2, 9, 6, 8080), 60).is_ok(), "control: to it, pod 2 is not isolated for egress");
}

/// A node port is judged at every node's address, this node's own
/// (exempt) and another node's gateway (a translator) included, before
/// the exemption; a closed key denies and counts. Controls: the node's
/// other ports, and the same address when it is no node's.
#[test]
fn a_node_port_is_judged_at_the_nodes_own_address_and_a_closed_key_counts() {
    let mut iso = set(vec![policy("a/deny", Some(vec![]), None)], &[&[2]]);
    let node = ip(9);
    iso.services.insert(node_port(node, 6, 30080), vec![(ip(2), 8080)]);
    assert!(iso.check(&pkt(1, 9, 6, 30080), 60).is_ok(), "control: not a node's address (yet)");
    iso.nodes.insert(node);
    let denied = Err(Denied { direction: Direction::Ingress, policy: 0 });
    assert_eq!(iso.check(&pkt(1, 9, 6, 30080), 60), denied);
    assert!(iso.check(&pkt(1, 9, 6, 22), 60).is_ok(), "control: the node's other ports");
    iso.exempt.insert(ip(8));
    assert_eq!(iso.check(&pkt(1, 8, 6, 30080), 60), denied, "this node's own address (exempt)");
    assert!(iso.check(&pkt(1, 8, 6, 22), 60).is_ok(), "control: its other ports, exempt");
    iso.translators.insert(ip(7));
    assert_eq!(iso.check(&pkt(1, 7, 6, 30080), 60), denied, "another node's gateway");
    iso.closed.insert(node_port(node, 17, 30053), 0);
    assert!(iso.check(&pkt(1, 9, 17, 30053), 60).is_err(), "a closed node port");
    assert_eq!(iso.policies[0].denied.snapshot().drops, 4);
}

/// A first packet from pod `s`'s IPv6 link-local address to pod `d`'s
/// (each the modified EUI-64 of its MAC, as a pod's kernel makes it and
/// the IP source guard lets it send).
fn ll_pkt(s: u8, d: u8, proto: u8, dport: u16) -> Facts {
    let mut f = pkt(s, d, proto, dport);
    f.ether = 0x86dd;
    if let L3::Ip(ip) = &mut f.l3 {
        ip.src = IpAddr::V6(vnet_wire::guard::link_local(mac(s)));
        ip.dst = IpAddr::V6(vnet_wire::guard::link_local(mac(d)));
    }
    f
}

/// Pods 1 to 4, each address with its MAC (the `neigh` table).
fn owned() -> Vec<(IpAddr, MacAddr)> {
    (1..=4).map(|n| (ip(n), mac(n))).collect()
}

/// The review's hole: isolation is keyed by the pods' addresses, which
/// never hold a pod's `fe80::` address. Pod 2 under a default deny for
/// ingress: pod 3 reaches it on its link-local address without the map
/// (the attack as it was), not with it, neither to the address nor from
/// it; pod 2's own addresses are denied either way (the control that the
/// policy is in force).
#[test]
fn a_pods_link_local_address_is_judged_as_the_pod() {
    let iso = set(vec![policy("a/deny", Some(vec![]), None)], &[&[2]]);
    let ll = iso.link_locals(owned());
    assert_eq!(ll.0.len(), 4);
    assert_eq!(ll.judged_as(IpAddr::V6(vnet_wire::guard::link_local(mac(2)))), ip(2));
    assert_eq!(ll.judged_as(ip(2)), ip(2), "an IPv4 address is itself");
    let denied = Err(Denied { direction: Direction::Ingress, policy: 0 });
    let none = LinkLocals::default();
    assert_eq!(iso.check_with(&pkt(3, 2, 6, 80), &none, 60, true), denied, "control: the policy holds");
    assert!(iso.check_with(&ll_pkt(3, 2, 6, 80), &none, 60, true).is_ok(), "the hole, without the map");
    assert_eq!(iso.check_with(&ll_pkt(3, 2, 6, 80), &ll, 60, true), denied, "to its link-local");
    assert_eq!(iso.check_with(&ll_pkt(3, 2, 17, 53), &ll, 60, true), denied, "UDP too");
    let mut mixed = ll_pkt(3, 2, 6, 80);
    if let L3::Ip(ip) = &mut mixed.l3 {
        ip.src = super::tests::ip(3);
    }
    assert_eq!(iso.check_with(&mixed, &ll, 60, true), denied, "from its IPv4 address to its link-local");
    assert!(iso.check_with(&ll_pkt(3, 4, 6, 80), &ll, 60, true).is_ok(), "control: pod 4 is not isolated");
    assert!(iso.check_with(&ll_pkt(2, 3, 6, 80), &ll, 60, true).is_ok(), "nor pod 2 for egress");
}

/// Judged as the pod, a link-local address is what the pod is: a rule
/// admitting pod 1 to the named port `http` admits it from and to the
/// link-local addresses too, and not pod 3; an egress deny holds on a
/// link-local source (without the map it did not).
#[test]
fn a_link_local_address_meets_the_rules_as_its_pod() {
    let named = Ports::Named(Arc::new([(ip(2), 8080)].into_iter().collect()));
    let http = vec![PortMatch { proto: 6, ports: named }];
    let iso = set(
        vec![
            policy("a/http", Some(vec![allow(vec![pods(&[1])], http)]), None),
            policy("a/no-out", None, Some(vec![])),
        ],
        &[&[2], &[4]],
    );
    let ll = iso.link_locals(owned());
    assert!(iso.check_with(&ll_pkt(1, 2, 6, 8080), &ll, 60, true).is_ok(), "pod 1 to pod 2's http");
    assert!(iso.check_with(&ll_pkt(1, 2, 6, 8081), &ll, 60, true).is_err(), "not another port");
    assert!(iso.check_with(&ll_pkt(3, 2, 6, 8080), &ll, 60, true).is_err(), "nor pod 3");
    let none = LinkLocals::default();
    assert!(iso.check_with(&ll_pkt(4, 1, 6, 80), &none, 60, true).is_ok(), "the hole: pod 4's egress");
    assert_eq!(
        iso.check_with(&ll_pkt(4, 1, 6, 80), &ll, 60, true),
        Err(Denied { direction: Direction::Egress, policy: 1 })
    );
}

/// A MAC owning several addresses (a dual-stack pod's) is judged as its
/// most isolated one, whichever order the table gives them in; an
/// address of no MAC in the table (another `fe80::` one) is itself.
#[test]
fn a_macs_link_local_takes_its_most_isolated_address() {
    let iso = set(vec![policy("a/deny", Some(vec![]), None)], &[&[2]]);
    let v6 = IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 9));
    for owned in [vec![(v6, mac(2)), (ip(2), mac(2))], vec![(ip(2), mac(2)), (v6, mac(2))]] {
        let ll = iso.link_locals(owned);
        assert_eq!(ll.judged_as(IpAddr::V6(vnet_wire::guard::link_local(mac(2)))), ip(2));
    }
    let other = IpAddr::V6(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 7));
    assert_eq!(iso.link_locals(owned()).judged_as(other), other);
}
