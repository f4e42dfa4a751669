//! `vnetctl trace`'s dry run against the data path: two simulated hosts,
//! the working pair traced on both (every step passes, and the frame sent
//! for real arrives), then each failure made on purpose (no route, a
//! policy's deny, port security, the IP source guard, a link whose peer is down, a frame too
//! big for a VXLAN link, a wrong network): the trace names the failing
//! step, its object and the reason, the same reason the data path records
//! when the frame is sent for real; and the same trace before the
//! breakage passes (the control). Nothing a trace does is counted.

use std::net::{IpAddr, Ipv4Addr};
use vnet_core::{DropReason, Port};
use vnet_engine::drops::DropRecord;
use vnet_engine::sim::Net;
use vnet_engine::trace::{self, Probe, Proto, Stage, Trace, Verdict};
use vnet_wire::MacAddr;

const M1: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
const M2: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 2]);
const IP1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

const A: &str = "interface vm tap t0 mac 52:54:00:00:00:01 network 7 addresses 10.0.0.1\n\
                 link l udp 10.0.0.2 format vnet network 7\n\
                 route any 52:54:00:00:00:01 -> interface vm\n\
                 route any 52:54:00:00:00:02 -> link l\n\
                 neigh 10.0.0.2 52:54:00:00:00:02 network 7\n";
const B: &str = "interface vm tap t0 mac 52:54:00:00:00:02 network 7\n\
                 link l udp 10.0.0.1 format vnet network 7\n\
                 route any 52:54:00:00:00:02 -> interface vm\n\
                 route any 52:54:00:00:00:01 -> link l\n";

fn pair() -> Net {
    hosts(A, B)
}

fn hosts(a: &str, b: &str) -> Net {
    let mut net = Net::new(71);
    net.add_host("10.0.0.1", a).unwrap();
    net.add_host("10.0.0.2", b).unwrap();
    hear(&mut net);
    net
}

/// Time for keepalives both ways (the daemon's timer ticks): each link
/// hears its peer.
fn hear(net: &mut Net) {
    for _ in 0..15 {
        net.advance(100_000_000);
    }
}

fn id(net: &Net, h: usize, iface: &str) -> u32 {
    net.hosts[h].state.interfaces.values().find(|i| i.name == iface).map(|i| i.id).unwrap()
}

fn link(net: &Net, h: usize, name: &str) -> u32 {
    net.hosts[h].state.link_by_name(name).unwrap().id
}

/// A UDP frame `src -> dst` (MACs) from 10.0.0.1 to 10.0.0.2, port `port`, `len` bytes.
fn udp(src: MacAddr, dst: MacAddr, port: u16, len: usize) -> Vec<u8> {
    trace::probe_frame((src, dst), (IP1.into(), IP2.into()), Proto::Udp(port), len).unwrap()
}

/// The dry run of `frame` on host `h`, from VM `vm`'s interface.
fn from_vm(net: &Net, h: usize, frame: &[u8]) -> Trace {
    let q = trace::arp_request(M1, IP1, IP2);
    let p = Probe {
        ingress: Port::Interface(id(net, h, "vm")),
        frame,
        question: Some(&q),
        said_network: None,
        now_ns: net.now_ns(),
    };
    trace::trace(&net.hosts[h].plane, p)
}

/// The dry run on host `h` of `frame` arriving by link `l`, its datagram
/// saying `network`.
fn from_link(net: &Net, h: usize, frame: &[u8], network: u32) -> Trace {
    let p = Probe {
        ingress: Port::Link(link(net, h, "l")),
        frame,
        question: None,
        said_network: Some(network),
        now_ns: net.now_ns(),
    };
    trace::trace(&net.hosts[h].plane, p)
}

fn stages(t: &Trace) -> Vec<Stage> {
    t.steps.iter().map(|s| s.stage).collect()
}

fn records(net: &Net, h: usize) -> Vec<DropRecord> {
    let mut out = Vec::new();
    for ring in net.hosts[h].global.drops.rings() {
        ring.read_from(0, &mut out);
    }
    out
}

/// The failing step of `t`: its stage, verdict and object.
fn failing(t: &Trace) -> (Stage, Verdict, String) {
    let s = t.failure().unwrap_or_else(|| panic!("nothing fails: {t:#?}"));
    (s.stage, s.verdict, s.object.clone())
}

/// Sends `frame` from host `h`'s VM for real; the reasons host `at` recorded since.
fn sent(net: &mut Net, h: usize, frame: &[u8], at: usize) -> Vec<DropReason> {
    let before = records(net, at).len();
    net.send(h, "vm", frame);
    net.run(1000);
    records(net, at)[before..].iter().map(|r| r.reason).collect()
}

#[test]
fn the_working_pair_passes_every_step_on_both_hosts_and_the_frame_sent_arrives() {
    let mut net = pair();
    let f = udp(M1, M2, 80, 100);
    let a = from_vm(&net, 0, &f);
    use Stage::*;
    assert_eq!(stages(&a), [Arrival, Source, Policy, Neighbour, Route, Link, Mtu], "{a:#?}");
    assert!(a.failure().is_none(), "{a:#?}");
    assert_eq!(a.exits, [Port::Link(link(&net, 0, "l"))]);
    assert!(a.steps[1].detail.contains("locked to 52:54:00:00:00:01"), "{:?}", a.steps[1]);
    assert!(a.steps[1].detail.contains("owns 10.0.0.1"), "{:?}", a.steps[1]);
    assert!(a.steps[3].detail.contains("10.0.0.2 is at 52:54:00:00:00:02"), "{:?}", a.steps[3]);
    assert_eq!(a.steps[4].object, "route any 52:54:00:00:00:02 -> link l");
    assert!(
        a.steps[5].detail.contains("vnet 7") && a.steps[5].detail.contains("peer up"),
        "{:?}",
        a.steps[5]
    );
    let b = from_link(&net, 1, &f, 7);
    assert_eq!(stages(&b), [Arrival, Source, Policy, Route, Deliver], "{b:#?}");
    assert!(b.failure().is_none(), "{b:#?}");
    assert_eq!(b.exits, [Port::Interface(id(&net, 1, "vm"))]);
    // Nothing was sent, counted or recorded by the traces; the frame sent arrives.
    assert_eq!(net.hosts[0].plane.links[&link(&net, 0, "l")].tx.snapshot().packets, 0);
    assert!(records(&net, 0).is_empty() && records(&net, 1).is_empty());
    assert!(sent(&mut net, 0, &f, 1).is_empty());
    assert_eq!(net.take(1, "vm").len(), 1);
}

#[test]
fn no_route_port_security_and_a_policys_deny_are_named_as_the_data_path_records_them() {
    let mut net = pair();
    // No route: to a MAC no route names. The control: B's MAC.
    assert!(from_vm(&net, 0, &udp(M1, M2, 80, 100)).failure().is_none());
    let stray = MacAddr([2, 0, 0, 0, 0, 9]);
    let t = from_vm(&net, 0, &udp(M1, stray, 80, 100));
    assert_eq!(failing(&t), (Stage::Route, Verdict::Drop(DropReason::NoRoute), stray.to_string()));
    assert_eq!(sent(&mut net, 0, &udp(M1, stray, 80, 100), 0), [DropReason::NoRoute]);

    // Port security: another source MAC than the interface's.
    let spoofed = MacAddr([2, 0, 0, 0, 0, 7]);
    let t = from_vm(&net, 0, &udp(spoofed, M2, 80, 100));
    assert_eq!(failing(&t), (Stage::Source, Verdict::Drop(DropReason::SpoofedSourceMac), "vm".into()));
    assert_eq!(sent(&mut net, 0, &udp(spoofed, M2, 80, 100), 0), [DropReason::SpoofedSourceMac]);

    // The IP source guard: the VM owns 10.0.0.1, not 10.0.0.9.
    let other =
        trace::probe_frame((M1, M2), (Ipv4Addr::new(10, 0, 0, 9).into(), IP2.into()), Proto::Udp(80), 100);
    let other = other.unwrap();
    let t = from_vm(&net, 0, &other);
    assert_eq!(failing(&t), (Stage::Source, Verdict::Drop(DropReason::SpoofedSourceIp), "vm".into()));
    assert!(t.steps[1].detail.contains("owns 10.0.0.1"), "{:?}", t.steps[1]);
    assert_eq!(sent(&mut net, 0, &other, 0), [DropReason::SpoofedSourceIp]);

    // A policy's deny, by its rule's name; the control: the port it allows.
    net.apply(0, "policy default allow network 7\nrule no-dns deny network 7 proto udp port 53\n").unwrap();
    let allowed = from_vm(&net, 0, &udp(M1, M2, 80, 100));
    assert!(allowed.failure().is_none(), "{allowed:#?}");
    assert!(allowed.steps[2].detail.contains("default allows"), "{:?}", allowed.steps[2]);
    let t = from_vm(&net, 0, &udp(M1, M2, 53, 100));
    assert_eq!(failing(&t), (Stage::Policy, Verdict::Drop(DropReason::PolicyDenied), "no-dns".into()));
    let rules = &net.hosts[0].plane.policy.nets[&7].rules;
    assert_eq!(rules[0].counters.snapshot().packets, 0, "a trace counts nothing");
    assert_eq!(sent(&mut net, 0, &udp(M1, M2, 53, 100), 0), [DropReason::PolicyDenied]);
}

#[test]
fn a_link_down_a_frame_too_big_for_vxlan_and_a_wrong_network_are_named() {
    let mut net = pair();
    let f = udp(M1, M2, 80, 100);
    // A link whose peer is down: nothing heard for 3.5 s.
    net.cut("10.0.0.1", "10.0.0.2", true);
    net.cut("10.0.0.2", "10.0.0.1", true);
    for _ in 0..50 {
        net.advance(100_000_000);
    }
    let t = from_vm(&net, 0, &f);
    assert_eq!(failing(&t), (Stage::Link, Verdict::LinkDown, "l".into()));
    assert!(t.steps.last().unwrap().detail.contains("peer down"), "{t:#?}");
    net.cut("10.0.0.1", "10.0.0.2", false);
    net.cut("10.0.0.2", "10.0.0.1", false);
    hear(&mut net);
    assert!(from_vm(&net, 0, &f).failure().is_none(), "up again");

    // A wrong network: B's link says network 8 where A's datagrams say 7.
    // The control: the same trace on the pair as it was.
    assert!(from_link(&net, 1, &f, 7).failure().is_none());
    let mut net = hosts(A, &B.replace("format vnet network 7", "format vnet network 8"));
    let t = from_link(&net, 1, &f, 7);
    assert_eq!(failing(&t), (Stage::Arrival, Verdict::Drop(DropReason::WrongNetwork), "l".into()));
    assert!(t.steps[0].detail.contains("says network 7; this link is network 8"), "{:?}", t.steps[0]);
    assert_eq!(sent(&mut net, 0, &f, 1), [DropReason::WrongNetwork]);

    // A frame too big for a VXLAN link (1500-byte underlay): 1464 bytes
    // fit (the control), 1465 do not.
    let vxlan = |c: &str| {
        c.replace(" network 7", "").replace("udp 10.0.0.2 format vnet", "vxlan 10.0.0.2 vni 7 mtu 1500")
    };
    let mut net = hosts(&vxlan(A), &vxlan(B));
    let t = from_vm(&net, 0, &udp(M1, M2, 80, 1464));
    assert!(t.steps.iter().all(|s| s.stage == Stage::Link || s.verdict.passes()), "{t:#?}");
    let big = udp(M1, M2, 80, 1465);
    let t = from_vm(&net, 0, &big);
    let mtu = t.steps.iter().find(|s| s.stage == Stage::Mtu).unwrap();
    assert_eq!((mtu.verdict, mtu.object.as_str()), (Verdict::Drop(DropReason::MtuExceeded), "l"));
    assert!(mtu.detail.contains("at most 1464 bytes"), "{mtu:?}");
    assert_eq!(sent(&mut net, 0, &big, 0), [DropReason::MtuExceeded]);
}

#[test]
fn a_probe_frame_is_what_the_rules_read() {
    let f = udp(M1, M2, 53, 300);
    assert_eq!(f.len(), 300);
    let c = vnet_wire::classify::classify(&f).unwrap();
    let vnet_wire::classify::L3::Ip(ip) = c.l3 else { panic!("{c:?}") };
    assert_eq!((c.src, c.dst, ip.proto, ip.dport), (M1, M2, 17, 53));
    assert_eq!((ip.src, ip.dst), (IpAddr::V4(IP1), IpAddr::V4(IP2)));
    let v6 = trace::probe_frame(
        (M1, M2),
        ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()),
        Proto::Tcp(22),
        0,
    )
    .unwrap();
    let c = vnet_wire::classify::classify(&v6).unwrap();
    let vnet_wire::classify::L3::Ip(ip) = c.l3 else { panic!("{c:?}") };
    assert_eq!((ip.proto, ip.dport), (6, 22));
    assert!(trace::probe_frame((M1, M2), (IP1.into(), "fd00::2".parse().unwrap()), Proto::Icmp, 0).is_none());
    assert!(vnet_wire::neigh::question(&trace::arp_request(M1, IP1, IP2)).is_some());
}

/// The ARP request before the frame meets the policy as the data path
/// takes it: a policy that allows the frame but not ARP stops the flow at
/// the request (the trace says so, and the data path drops the request);
/// the control: with a rule for ARP the same trace passes.
#[test]
fn an_arp_request_the_policy_denies_is_where_the_trace_stops() {
    let mut net = pair();
    net.apply(0, "policy default deny network 7\nrule web allow network 7 proto udp port 80\n").unwrap();
    let t = from_vm(&net, 0, &udp(M1, M2, 80, 100));
    assert_eq!(
        failing(&t),
        (Stage::Policy, Verdict::Drop(DropReason::PolicyDenied), "default".into()),
        "{t:#?}"
    );
    let s = t.failure().unwrap();
    assert!(s.detail.starts_with("the ARP request before it: "), "{s:?}");
    assert!(!stages(&t).contains(&Stage::Neighbour) && !stages(&t).contains(&Stage::Route), "{t:#?}");
    let q = trace::arp_request(M1, IP1, IP2);
    assert_eq!(sent(&mut net, 0, &q, 0), [DropReason::PolicyDenied], "the data path drops the request");
    net.apply(0, "rule arp allow network 7 ether arp\n").unwrap();
    let t = from_vm(&net, 0, &udp(M1, M2, 80, 100));
    assert!(t.failure().is_none(), "{t:#?}");
    assert!(stages(&t).contains(&Stage::Neighbour));
}

/// IPv6: the neighbour solicitation before the frame is the neighbour
/// step, as the ARP request is for IPv4: answered at the edge by a `neigh`
/// line (and the data path answers that same solicitation in place, with
/// the owner's advertisement), or flooded without one (the control); a
/// policy that allows the frame but not ICMPv6 stops at the solicitation.
#[test]
fn an_ipv6_trace_shows_the_neighbour_solicitation_answered_at_the_edge_or_flooded() {
    let (s6, d6): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
        ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    let a6 = A.replace("addresses 10.0.0.1", "addresses fd00::1").replace("neigh 10.0.0.2", "neigh fd00::2");
    let f = trace::probe_frame((M1, M2), (s6.into(), d6.into()), Proto::Udp(80), 100).unwrap();
    let q = vnet_wire::neigh::solicitation(M1, s6, d6);
    let run = |net: &Net| {
        let p = Probe {
            ingress: Port::Interface(id(net, 0, "vm")),
            frame: &f,
            question: Some(&q),
            said_network: None,
            now_ns: net.now_ns(),
        };
        trace::trace(&net.hosts[0].plane, p)
    };
    let mut net = hosts(&a6, B);
    let t = run(&net);
    use Stage::*;
    assert_eq!(stages(&t), [Arrival, Source, Policy, Neighbour, Route, Link, Mtu], "{t:#?}");
    assert!(t.failure().is_none(), "{t:#?}");
    let n = &t.steps[3];
    assert_eq!(n.object, "fd00::2");
    assert!(n.detail.contains("answered here: fd00::2 is at 52:54:00:00:00:02"), "{n:?}");
    // The data path: the same solicitation comes back as the owner's advertisement.
    net.send(0, "vm", &q);
    net.run(1000);
    let back = net.take(0, "vm");
    assert_eq!(back.len(), 1, "answered at the edge");
    assert_eq!((back[0].frame[54], &back[0].frame[6..12]), (136, &M2.0[..]), "a neighbour advertisement");

    // The control: without the `neigh` line it is flooded.
    let net = hosts(&a6.replace("neigh fd00::2 52:54:00:00:00:02 network 7\n", ""), B);
    let t = run(&net);
    let n = t.steps.iter().find(|s| s.stage == Neighbour).unwrap();
    assert!(n.detail.contains("fd00::2 is in no neigh line") && n.detail.contains("flooded"), "{n:?}");

    // A policy allowing UDP 80 but not ICMPv6: the solicitation is denied.
    let mut net = hosts(&a6, B);
    net.apply(0, "policy default deny network 7\nrule web allow network 7 proto udp port 80\n").unwrap();
    let t = run(&net);
    assert_eq!(failing(&t), (Policy, Verdict::Drop(DropReason::PolicyDenied), "default".into()), "{t:#?}");
    assert!(t.failure().unwrap().detail.starts_with("the neighbour solicitation before it: "), "{t:#?}");
    assert!(vnet_wire::neigh::question(&q).is_some(), "the question the edge reads");
}
