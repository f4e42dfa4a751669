use super::*;
use crate::stats::Counters;
use proptest::prelude::*;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

const NET: u32 = 7;

fn mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, n])
}

/// A packet as the tests describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pkt {
    src: u8,
    dst: u8,
    /// The host whose MAC the frame is sent to (its address is `dst`'s).
    l2: u8,
    /// 0: TCP, 1: UDP, 2: ICMP echo request, 3: echo reply, 4: ARP, 5: other EtherType.
    kind: u8,
    sport: u16,
    dport: u16,
    /// 0: whole, 1: first fragment, 2: later fragment (IPv4 id 77).
    frag: u8,
    vlan: bool,
}

fn ip_of(n: u8) -> [u8; 4] {
    [10, 0, 0, n]
}

/// The frame of `p` (host n has MAC ..:n and address 10.0.0.n; it is
/// sent to host `l2`'s MAC).
fn frame(p: &Pkt) -> Vec<u8> {
    let mut f = [mac(p.l2).0, mac(p.src).0].concat();
    if p.vlan {
        f.extend_from_slice(&[0x81, 0, 0, 5]);
    }
    let l4 = |proto: u8| -> Vec<u8> {
        match proto {
            6 => {
                let mut t = vec![0u8; 20];
                t[..2].copy_from_slice(&p.sport.to_be_bytes());
                t[2..4].copy_from_slice(&p.dport.to_be_bytes());
                t
            }
            17 => [p.sport.to_be_bytes(), p.dport.to_be_bytes(), [0, 8], [0, 0]].concat(),
            _ => [[if p.kind == 2 { 8 } else { 0 }, 0, 0, 0], [(p.sport >> 8) as u8, p.sport as u8, 0, 1]]
                .concat(),
        }
    };
    match p.kind {
        0..=3 => {
            let proto = [6u8, 17, 1, 1][usize::from(p.kind)];
            let body = if p.frag == 2 { vec![0xee; 16] } else { l4(proto) };
            let flags: u16 = match p.frag {
                1 => 0x2000,
                2 => 0x0004,
                _ => 0,
            };
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&((20 + body.len()) as u16).to_be_bytes());
            f.extend_from_slice(&[0, 77]);
            f.extend_from_slice(&flags.to_be_bytes());
            f.extend_from_slice(&[64, proto, 0, 0]);
            f.extend_from_slice(&ip_of(p.src));
            f.extend_from_slice(&ip_of(p.dst));
            f.extend_from_slice(&body);
        }
        4 => {
            f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
            f.extend_from_slice(&mac(p.src).0);
            f.extend_from_slice(&ip_of(p.src));
            f.extend_from_slice(&[0; 6]);
            f.extend_from_slice(&ip_of(p.dst));
        }
        _ => {
            f.extend_from_slice(&[0x88, 0xb5]);
            f.extend_from_slice(&[0; 46]);
        }
    }
    f
}

/// A rule as the tests describe it (the reference reads this, not [`Rule`]).
#[derive(Debug, Clone)]
struct R {
    allow: bool,
    /// 0: any, 1: mac n, 2: group n (hosts whose number has bit n), 3: prefix 10.0.0.n/len.
    from: (u8, u8, u8),
    to: (u8, u8, u8),
    ether: Option<u16>,
    proto: Option<u8>,
    ports: Option<(u16, u16)>,
}

fn selector(s: (u8, u8, u8)) -> Selector {
    match s.0 {
        0 => Selector::Any,
        1 => Selector::Mac(mac(s.1)),
        2 => Selector::Group(s.1),
        _ => Selector::Net(IpAddr::V4(Ipv4Addr::from(ip_of(s.1))), s.2),
    }
}

fn set(rules: &[R], default: Action) -> PolicySet {
    let rules = rules
        .iter()
        .enumerate()
        .map(|(i, r)| Rule {
            name: format!("r{i}").into(),
            action: if r.allow { Action::Allow } else { Action::Deny },
            from: selector(r.from),
            to: selector(r.to),
            ether: r.ether,
            proto: r.proto,
            ports: r.ports,
            counters: Arc::default(),
        })
        .collect();
    let net = NetPolicy::new(default, rules);
    // Host n is in group b when bit b of n is set (in this network).
    let groups = (0..16u8).map(|n| ((NET, mac(n)), u64::from(n))).collect();
    PolicySet {
        generation: 1,
        nets: [(NET, net)].into_iter().collect(),
        groups,
        flows: Arc::new(Flows::new(4096)),
        mirror: None,
    }
}

/// The plain reference: first rule that matches by the description, with
/// flows kept in a set, keyed by both ends' hosts (MACs) with the
/// addresses (the source's MAC and address are one host's, the
/// destination's may be two).
struct Reference {
    rules: Vec<R>,
    default: bool,
    flows: HashSet<(u8, u8, u8, u8, u8, u16, u16)>,
    frags: HashSet<(u8, u8, u8, u8, u8)>,
}

impl Reference {
    /// Whether selector `s` matches an end with MAC of host `mac` and
    /// address of host `host` (if it has one).
    fn end_matches(s: (u8, u8, u8), mac: u8, host: u8, has_ip: bool) -> bool {
        match s.0 {
            0 => true,
            1 => s.1 == mac,
            2 => mac >> s.1 & 1 == 1,
            _ => {
                // Plain arithmetic on the last octet (the first three are equal).
                has_ip && (s.2 <= 24 || (host >> (32 - s.2.min(32))) == (s.1 >> (32 - s.2.min(32))))
            }
        }
    }

    fn decide(&mut self, p: &Pkt) -> bool {
        let ip = p.kind <= 3;
        let proto = [6u8, 17, 1, 1, 0, 0][usize::from(p.kind)];
        let (sport, dport) = match p.kind {
            2 => (p.sport, 0),
            3 => (0, p.sport),
            _ if p.frag == 2 => (0, 0),
            _ => (p.sport, p.dport),
        };
        let frag = (p.src, p.l2, p.src, p.dst, proto);
        if ip && p.frag == 2 {
            return self.frags.contains(&frag);
        }
        let key = (p.src, p.l2, p.src, p.dst, proto, sport, dport);
        let reply = (p.l2, p.src, p.dst, p.src, proto, dport, sport);
        if ip && (self.flows.contains(&key) || self.flows.contains(&reply)) {
            if p.frag == 1 {
                self.frags.insert(frag);
            }
            return true;
        }
        let ether = match p.kind {
            0..=3 => 0x0800,
            4 => 0x0806,
            _ => 0x88b5,
        };
        let hit = self.rules.iter().find(|r| {
            Self::end_matches(r.from, p.src, p.src, p.kind <= 4)
                && Self::end_matches(r.to, p.l2, p.dst, p.kind <= 4)
                && r.ether.is_none_or(|e| e == ether)
                && r.proto.is_none_or(|x| ip && x == proto)
                && r.ports.is_none_or(|(lo, hi)| p.kind <= 1 && lo <= p.dport && p.dport <= hi)
        });
        let allow = hit.map_or(self.default, |r| r.allow);
        if allow && ip {
            self.flows.insert(key);
            if p.frag == 1 {
                self.frags.insert(frag);
            }
        }
        allow
    }
}

fn pkt(src: u8, dst: u8, kind: u8, sport: u16, dport: u16) -> Pkt {
    Pkt { src, dst, l2: dst, kind, sport, dport, frag: 0, vlan: false }
}

#[test]
fn the_web_tier_reaches_the_database_on_5432_and_nothing_else_does() {
    // Group 1: hosts 2, 3 (web); group 2: host 4 (database).
    let rules = [
        R {
            allow: true,
            from: (2, 1, 0),
            to: (1, 4, 0),
            ether: None,
            proto: Some(6),
            ports: Some((5432, 5432)),
        },
        R { allow: true, from: (0, 0, 0), to: (0, 0, 0), ether: Some(0x0806), proto: None, ports: None },
    ];
    let p = set(&rules, Action::Deny);
    let d = |x: &Pkt| p.decide(NET, &frame(x));
    assert_eq!(d(&pkt(2, 4, 0, 40000, 5432)).why, Why::Rule(0));
    assert_eq!(d(&pkt(4, 2, 0, 5432, 40000)).why, Why::Reply, "the database answers");
    assert_eq!(d(&pkt(2, 4, 0, 40000, 5432)).why, Why::Established);
    assert_eq!(d(&pkt(4, 2, 0, 5433, 40000)), Verdict { allow: false, why: Why::Default }, "not a reply");
    assert!(!d(&pkt(2, 4, 0, 40000, 22)).allow, "another port");
    assert!(!d(&pkt(1, 4, 0, 40000, 5432)).allow, "host 1 is not in the web group");
    assert!(!d(&pkt(2, 4, 1, 40000, 5432)).allow, "UDP is not TCP");
    assert!(d(&pkt(1, 4, 4, 0, 0)).allow, "ARP by its rule");
    assert!(!d(&pkt(1, 4, 5, 0, 0)).allow, "other EtherTypes: the default");
    assert!(p.decide(8, &frame(&pkt(1, 4, 5, 0, 0))).allow, "another network has no policy");
    let net = &p.nets[&NET];
    assert_eq!(net.rules[0].counters.snapshot().packets, 1);
    assert_eq!((net.rules[1].counters.snapshot().packets, net.rules[1].counters.snapshot().drops), (1, 0));
    assert_eq!(net.default_counters.snapshot().packets, 5);
    assert_eq!(net.default_counters.snapshot().drops, 5);
    assert_eq!(net.stateful.snapshot().packets, 2);
}

#[test]
fn icmp_echo_replies_and_errors_about_an_allowed_flow_pass() {
    let rules = [R { allow: true, from: (1, 1, 0), to: (0, 0, 0), ether: None, proto: None, ports: None }];
    let p = set(&rules, Action::Deny);
    let d = |x: &Pkt| p.decide(NET, &frame(x));
    assert_eq!(d(&pkt(1, 2, 2, 9, 0)).why, Why::Rule(0), "an echo request");
    assert_eq!(d(&pkt(2, 1, 3, 9, 0)).why, Why::Reply, "its reply");
    assert!(!d(&pkt(2, 1, 3, 10, 0)).allow, "a reply to no request");
    assert!(!d(&pkt(2, 1, 2, 9, 0)).allow, "a request the other way");
    // Host 2's port unreachable about host 1's UDP datagram 1:5000 -> 2:53.
    assert!(d(&pkt(1, 2, 1, 5000, 53)).allow);
    let mut err = frame(&pkt(2, 1, 2, 0, 0));
    let quoted = &frame(&pkt(1, 2, 1, 5000, 53))[14..];
    err.truncate(14 + 20);
    err.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    err.extend_from_slice(quoted);
    let total = (err.len() - 14) as u16;
    err[16..18].copy_from_slice(&total.to_be_bytes());
    assert_eq!(p.decide(NET, &err).why, Why::Related);
    // The same error about a flow never allowed: the rules (host 2 may not).
    let mut stray = err.clone();
    stray[14 + 28 + 20 + 2..14 + 28 + 20 + 4].copy_from_slice(&54u16.to_be_bytes());
    assert_eq!(p.decide(NET, &stray), Verdict { allow: false, why: Why::Default });
}

#[test]
fn fragments_follow_their_first_and_unreadable_frames_are_dropped() {
    let rules = [R {
        allow: true,
        from: (0, 0, 0),
        to: (0, 0, 0),
        ether: None,
        proto: Some(17),
        ports: Some((53, 53)),
    }];
    let p = set(&rules, Action::Deny);
    let d = |x: &Pkt| p.decide(NET, &frame(x));
    let later = Pkt { frag: 2, ..pkt(1, 2, 1, 0, 0) };
    assert_eq!(d(&later), Verdict { allow: false, why: Why::OrphanFragment }, "before its first");
    assert!(!d(&Pkt { frag: 1, ..pkt(1, 2, 1, 5, 22) }).allow, "a first fragment to another port");
    assert!(!d(&later).allow, "its later fragments too");
    assert_eq!(d(&Pkt { frag: 1, ..pkt(1, 2, 1, 5, 53) }).why, Why::Rule(0));
    assert_eq!(d(&later).why, Why::Fragment);
    // VLAN-tagged: looked through, the same rules.
    assert!(!d(&Pkt { vlan: true, ..pkt(3, 2, 1, 5, 22) }).allow);
    assert!(d(&Pkt { vlan: true, ..pkt(3, 2, 1, 5, 53) }).allow);
    // Three tags: unreadable, dropped.
    let mut f = frame(&pkt(3, 2, 1, 5, 53));
    for _ in 0..3 {
        f.splice(12..12, [0x81, 0, 0, 5]);
    }
    assert_eq!(p.decide(NET, &f), Verdict { allow: false, why: Why::Unclassifiable });
    assert_eq!(p.nets[&NET].unclassifiable.load(Relaxed), 1);
    assert_eq!(p.nets[&NET].orphan_fragments.load(Relaxed), 2);
}

#[test]
fn arp_for_another_address_meets_the_rule_of_that_address() {
    let rules =
        [R { allow: true, from: (0, 0, 0), to: (3, 4, 32), ether: Some(0x0806), proto: None, ports: None }];
    let p = set(&rules, Action::Deny);
    assert!(p.decide(NET, &frame(&pkt(1, 4, 4, 0, 0))).allow);
    assert!(!p.decide(NET, &frame(&pkt(1, 5, 4, 0, 0))).allow, "ARP for 10.0.0.5");
}

#[test]
fn prefixes_match_by_their_length_and_family() {
    let n: IpAddr = "10.1.0.0".parse().unwrap();
    assert!(in_prefix("10.1.255.3".parse().unwrap(), n, 16));
    assert!(!in_prefix("10.2.0.3".parse().unwrap(), n, 16));
    assert!(in_prefix("192.0.2.1".parse().unwrap(), n, 0));
    assert!(in_prefix("10.1.0.0".parse().unwrap(), n, 32));
    assert!(!in_prefix("10.1.0.1".parse().unwrap(), n, 32));
    assert!(!in_prefix("fd00::1".parse().unwrap(), n, 0), "another family");
    let six: IpAddr = "fd00:1::".parse().unwrap();
    assert!(in_prefix("fd00:1::9".parse().unwrap(), six, 32));
    assert!(!in_prefix("fd00:2::9".parse().unwrap(), six, 32));
    assert!(in_prefix("fd00:2::9".parse().unwrap(), six, 0));
    assert!(in_prefix("fd00:1::".parse().unwrap(), six, 128));
}

fn arb_sel() -> impl Strategy<Value = (u8, u8, u8)> {
    prop_oneof![
        Just((0u8, 0u8, 0u8)),
        (1..6u8).prop_map(|n| (1, n, 0)),
        (0..3u8).prop_map(|b| (2, b, 0)),
        (1..6u8, 29..=32u8).prop_map(|(n, l)| (3, n, l)),
    ]
}

fn arb_rule() -> impl Strategy<Value = R> {
    (
        any::<bool>(),
        arb_sel(),
        arb_sel(),
        prop::option::weighted(0.2, prop_oneof![Just(0x0800u16), Just(0x0806), Just(0x88b5)]),
        prop::option::weighted(0.4, prop_oneof![Just(6u8), Just(17), Just(1)]),
        prop::option::weighted(0.3, (0..4u16).prop_map(|p| (p, p + 1))),
    )
        .prop_map(|(allow, from, to, ether, proto, ports)| R { allow, from, to, ether, proto, ports })
}

fn arb_pkt() -> impl Strategy<Value = Pkt> {
    // Mostly to the MAC of the destination address's host, now and then
    // to another's (a primed flow, a router).
    let l2 = prop::option::weighted(0.2, 1..6u8);
    (1..6u8, 1..6u8, l2, 0..6u8, 0..4u16, 0..4u16, 0..3u8, any::<bool>()).prop_map(
        |(src, dst, l2, kind, sport, dport, frag, vlan)| {
            let frag = if kind <= 1 { frag } else { 0 };
            Pkt { src, dst, l2: l2.unwrap_or(dst), kind, sport, dport, frag, vlan }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    /// The engine's policy and the plain reference agree on every packet of
    /// a random sequence under random rules, state included.
    #[test]
    fn the_policy_and_a_plain_reference_agree(
        rules in prop::collection::vec(arb_rule(), 0..8),
        default in any::<bool>(),
        pkts in prop::collection::vec(arb_pkt(), 1..40),
    ) {
        let p = set(&rules, if default { Action::Allow } else { Action::Deny });
        let mut r = Reference { rules: rules.clone(), default, flows: HashSet::new(), frags: HashSet::new() };
        for x in &pkts {
            let v = p.decide(NET, &frame(x));
            prop_assert_eq!(v.allow, r.decide(x), "{:?} -> {:?}", x, v);
        }
    }
}

/// A mirror as the kernel path keeps one: the flows offered, and which of
/// them it saw lately (here: every flow offered, until `forget`).
#[derive(Debug, Default)]
struct Kernel {
    offered: std::sync::Mutex<Vec<FlowKey>>,
    fresh: std::sync::Mutex<HashSet<FlowKey>>,
}

impl FlowMirror for Kernel {
    fn fresh(&self, k: &FlowKey) -> bool {
        let f = self.fresh.lock().unwrap();
        f.contains(k) || f.contains(&k.reversed())
    }

    fn offer(&self, k: &FlowKey) -> bool {
        self.offered.lock().unwrap().push(*k);
        self.fresh.lock().unwrap().insert(*k);
        true
    }

    fn known_or<'a>(&self, k: &FlowKey, keep: bool, judge: &mut dyn Judge<'a>) -> Known<'a> {
        if self.fresh(k) {
            return Known::Fresh { kept: keep && self.offer(k) };
        }
        let judged = judge.judge();
        Known::Judged { judged, kept: keep && judged.verdict.allow && self.offer(k) }
    }
}

impl Kernel {
    /// What the eBPF program does with `p`: `Some(true)` when it passes it
    /// by a flow it holds, `None` when it leaves it to the engine (only
    /// whole, untagged IPv4 TCP, UDP and echo packets are looked up).
    fn takes(&self, generation: u64, p: &Pkt) -> Option<bool> {
        if p.vlan || p.frag != 0 || p.kind > 3 {
            return None;
        }
        let f = vnet_wire::classify::classify(&frame(p)).ok()?;
        let L3::Ip(ip) = f.l3 else { return None };
        self.fresh(&flow_key(generation, NET, (f.src, f.dst), &ip)).then_some(true)
    }
}

fn mirrored(rules: &[R], default: Action) -> (PolicySet, Arc<Kernel>) {
    let k = Arc::new(Kernel::default());
    let m: Arc<dyn FlowMirror> = k.clone();
    (PolicySet { mirror: Some(m), ..set(rules, default) }, k)
}

#[test]
fn a_flow_the_mirror_carried_alone_is_still_known_when_the_engines_entry_idled_out() {
    // Host 2 may reach host 4 on TCP 5432; nothing else is allowed.
    let rule = R {
        allow: true,
        from: (1, 2, 0),
        to: (1, 4, 0),
        ether: None,
        proto: Some(6),
        ports: Some((5432, 5432)),
    };
    let (p, k) = mirrored(&[rule], Action::Deny);
    p.flows.tick(1_000_000_000);
    assert!(p.decide(NET, &frame(&pkt(2, 4, 0, 40000, 5432))).allow);
    let want = flow_key(
        1,
        NET,
        (mac(2), mac(4)),
        &match classify(&frame(&pkt(2, 4, 0, 40000, 5432))).unwrap().l3 {
            L3::Ip(ip) => ip,
            _ => unreachable!(),
        },
    );
    assert_eq!(*k.offered.lock().unwrap(), [want], "the allowed flow offered, once");
    let reply = frame(&pkt(4, 2, 0, 5432, 40000));
    assert_eq!(p.decide(NET, &reply).why, Why::Reply);
    assert_eq!(k.offered.lock().unwrap().len(), 1, "not offered again within its interval");
    // The kernel carried the flow for an hour; the engine saw none of it.
    p.flows.tick(3_601_000_000_000);
    assert_eq!(p.decide(NET, &reply), Verdict { allow: true, why: Why::Established }, "known by the mirror");
    assert_eq!(k.offered.lock().unwrap().len(), 2, "and offered again");
    // Idle on both: the reply is judged by the rules.
    k.fresh.lock().unwrap().clear();
    p.flows.tick(7_201_000_000_000);
    assert_eq!(p.decide(NET, &reply), Verdict { allow: false, why: Why::Default });
    // An ICMP error about a flow only the mirror knows is related to it.
    k.fresh.lock().unwrap().insert(want);
    let mut err = frame(&pkt(4, 2, 2, 0, 0));
    let quote = frame(&pkt(2, 4, 0, 40000, 5432));
    err[34] = 3; // destination unreachable
    err.truncate(42);
    err.extend_from_slice(&quote[14..14 + 28]);
    let total = (err.len() - 14) as u16;
    err[16..18].copy_from_slice(&total.to_be_bytes());
    assert_eq!(p.decide(NET, &err).why, Why::Related);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    /// With a mirror that passes what it holds (the kernel path) taking
    /// some packets first and the engine the rest, the two together decide
    /// as the plain reference does.
    #[test]
    fn the_engine_and_its_mirror_together_agree_with_the_reference(
        rules in prop::collection::vec(arb_rule(), 0..8),
        default in any::<bool>(),
        pkts in prop::collection::vec((arb_pkt(), any::<bool>()), 1..40),
    ) {
        let (p, k) = mirrored(&rules, if default { Action::Allow } else { Action::Deny });
        let mut r = Reference { rules: rules.clone(), default, flows: HashSet::new(), frags: HashSet::new() };
        for (x, kernel_first) in &pkts {
            let by_kernel = if *kernel_first { k.takes(p.generation, x) } else { None };
            let allow = by_kernel.unwrap_or_else(|| p.decide(NET, &frame(x)).allow);
            // The reference's flows must see each packet too.
            prop_assert_eq!(allow, r.decide(x), "{:?} (kernel: {:?})", x, by_kernel);
        }
    }
}

/// Host 1 (client C) may reach host 2 (server S, by its MAC) on TCP 80 and
/// UDP 53; host 4 is the database DB, host 3 another VM.
fn client_to_server() -> PolicySet {
    let to_s = |proto, port| R {
        allow: true,
        from: (1, 1, 0),
        to: (1, 2, 0),
        ether: None,
        proto: Some(proto),
        ports: Some((port, port)),
    };
    set(&[to_s(6, 80), to_s(17, 53)], Action::Deny)
}

#[test]
fn a_flow_allowed_to_one_mac_admits_nothing_sent_to_another_with_the_same_addresses() {
    let p = client_to_server();
    let d = |x: &Pkt| p.decide(NET, &frame(x));
    // C primes a flow: S's MAC, DB's address (the rule names S's MAC).
    let primed = Pkt { l2: 2, ..pkt(1, 4, 0, 40000, 80) };
    assert_eq!(d(&primed).why, Why::Rule(0));
    assert_eq!(d(&primed).why, Why::Established, "positive control: the flow to S's MAC is known");
    // The same addresses and ports, to DB's MAC: a new flow, denied.
    assert_eq!(d(&pkt(1, 4, 0, 40000, 80)), Verdict { allow: false, why: Why::Default });
    // Nor does DB's reply pass as one.
    assert_eq!(d(&pkt(4, 1, 0, 80, 40000)), Verdict { allow: false, why: Why::Default });
    // S's reply (its MAC, DB's address as the flow's) does.
    let mut from_s = frame(&pkt(4, 1, 0, 80, 40000));
    from_s[6..12].copy_from_slice(&mac(2).0);
    assert_eq!(p.decide(NET, &from_s).why, Why::Reply, "S's MAC: the flow's reply");
    // Fragments too: a first fragment's later ones follow its MACs.
    let first = Pkt { frag: 1, l2: 2, ..pkt(1, 4, 1, 5, 53) };
    assert_eq!(d(&first).why, Why::Rule(1));
    assert_eq!(d(&Pkt { frag: 2, ..first }).why, Why::Fragment);
    assert_eq!(d(&Pkt { frag: 2, l2: 4, ..first }).why, Why::OrphanFragment, "to DB's MAC");
}

#[test]
fn no_other_vm_joins_an_allowed_flow_from_its_own_mac() {
    let p = client_to_server();
    let d = |x: &Pkt| p.decide(NET, &frame(x));
    assert!(d(&pkt(1, 2, 1, 5000, 53)).allow, "C's datagram to S");
    // Host 3 sends S's "reply" to C: S's address and ports, its own MAC
    // (port security ties a source MAC to its interface).
    let mut injected = frame(&pkt(2, 1, 1, 53, 5000));
    injected[6..12].copy_from_slice(&mac(3).0);
    assert_eq!(p.decide(NET, &injected), Verdict { allow: false, why: Why::Default });
    // And into the flow's own direction, as C.
    let mut as_c = frame(&pkt(1, 2, 1, 5000, 53));
    as_c[6..12].copy_from_slice(&mac(3).0);
    assert_eq!(p.decide(NET, &as_c).why, Why::Default, "host 3 is not C: the rules (allowing C only)");
    assert!(!p.decide(NET, &as_c).allow);
    assert_eq!(d(&pkt(2, 1, 1, 53, 5000)).why, Why::Reply, "positive control: S's own reply");
}

/// An ICMP port unreachable in a frame from host `from`'s MAC and address
/// to host 1's, quoting host 1's UDP datagram 5000 -> host 2's 53.
fn unreachable_from(from: u8) -> Vec<u8> {
    let mut err = frame(&pkt(from, 1, 2, 0, 0));
    let quoted = &frame(&pkt(1, 2, 1, 5000, 53))[14..];
    err.truncate(14 + 20);
    err.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    err.extend_from_slice(quoted);
    let total = (err.len() - 14) as u16;
    err[16..18].copy_from_slice(&total.to_be_bytes());
    err
}

#[test]
fn an_icmp_error_is_related_only_between_the_quoted_flows_own_ends() {
    let p = client_to_server();
    assert!(p.decide(NET, &frame(&pkt(1, 2, 1, 5000, 53))).allow, "C's datagram to S");
    // From host 3, about C's flow to S: not related, and the rules deny it.
    assert_eq!(p.decide(NET, &unreachable_from(3)), Verdict { allow: false, why: Why::Default });
    // From host 3 with S's address (its own MAC): no better.
    let mut spoofed = unreachable_from(3);
    spoofed[14 + 12..14 + 16].copy_from_slice(&ip_of(2));
    assert_eq!(p.decide(NET, &spoofed), Verdict { allow: false, why: Why::Default });
    // From S's MAC, to C's MAC, but to another address than the quoted sender's.
    let mut elsewhere = unreachable_from(2);
    elsewhere[14 + 16..14 + 20].copy_from_slice(&ip_of(5));
    assert_eq!(p.decide(NET, &elsewhere), Verdict { allow: false, why: Why::Default });
    // From S's MAC to another VM's MAC with C's address.
    let mut misdelivered = unreachable_from(2);
    misdelivered[..6].copy_from_slice(&mac(5).0);
    assert_eq!(p.decide(NET, &misdelivered), Verdict { allow: false, why: Why::Default });
    // Positive control: the same error from S itself is related.
    assert_eq!(p.decide(NET, &unreachable_from(2)), Verdict { allow: true, why: Why::Related });
    // A router's: C reached host 5's address through host 2's MAC (a
    // router), whose error about it is related.
    assert!(p.decide(NET, &frame(&Pkt { l2: 2, ..pkt(1, 5, 1, 5001, 53) })).allow);
    let mut router = frame(&pkt(2, 1, 2, 0, 0));
    let quoted = &frame(&pkt(1, 5, 1, 5001, 53))[14..];
    router.truncate(14 + 20);
    router.extend_from_slice(&[11, 0, 0, 0, 0, 0, 0, 0]);
    router.extend_from_slice(quoted);
    let total = (router.len() - 14) as u16;
    router[16..18].copy_from_slice(&total.to_be_bytes());
    assert_eq!(p.decide(NET, &router).why, Why::Related, "time exceeded from the router");
}

#[test]
fn a_macs_groups_are_its_groups_in_one_network() {
    // Group 0 may reach anything; mac(1) is in it in network NET only.
    let rule = R { allow: true, from: (2, 0, 0), to: (0, 0, 0), ether: None, proto: None, ports: None };
    let mut p = set(&[rule], Action::Deny);
    let other = NET + 1;
    let net = NetPolicy::new(
        Action::Deny,
        vec![Rule {
            name: "g".into(),
            action: Action::Allow,
            from: Selector::Group(0),
            to: Selector::Any,
            ether: None,
            proto: None,
            ports: None,
            counters: Arc::default(),
        }],
    );
    p.nets.insert(other, net);
    let f = frame(&pkt(1, 2, 5, 0, 0));
    assert!(p.decide(NET, &f).allow, "in the group in its network");
    assert_eq!(p.decide(other, &f), Verdict { allow: false, why: Why::Default }, "not in the other");
    p.groups.insert((other, mac(1)), 1);
    assert!(p.decide(other, &f).allow, "once a member there");
}

/// A network with NetworkPolicies' isolation beside its rules: a first
/// packet needs the rules and the isolation; its reply passes by the
/// flow, though the replier's egress is isolated; a denied one leaves
/// nothing behind; a `deny` rule wins whatever the isolation allows.
#[test]
fn isolation_is_met_beside_the_rules_and_replies_pass_by_the_flow() {
    use isolation::{Allow, Isolation, Peer, Policy};
    let ip = |n: u8| IpAddr::V4(Ipv4Addr::from(ip_of(n)));
    // Host 2 takes only from host 1, and sends nothing of its own.
    let from_1 = Allow {
        peers: vec![Peer::Addrs(Arc::new([ip(1)].into_iter().collect()))],
        ports: vec![],
        counters: Arc::default(),
    };
    let p = Policy {
        name: "prod/db".into(),
        ingress: Some(vec![from_1]),
        egress: Some(vec![]),
        denied: Arc::default(),
    };
    let mut iso = Isolation { policies: vec![p], ..Isolation::default() };
    iso.ingress_of.insert(ip(2), vec![0]);
    iso.egress_of.insert(ip(2), vec![0]);
    let deny_udp =
        R { allow: false, from: (0, 0, 0), to: (0, 0, 0), ether: None, proto: Some(17), ports: None };
    let mut s = set(&[deny_udp], Action::Allow);
    s.nets.get_mut(&NET).unwrap().isolation = Some(Arc::new(iso));
    let d = |p: &Pkt| s.decide(NET, &frame(p));
    assert_eq!(
        d(&pkt(3, 2, 0, 40000, 80)).why,
        Why::Isolated(isolation::Denied { direction: isolation::Direction::Ingress, policy: 0 })
    );
    assert!(!d(&pkt(2, 3, 0, 80, 40000)).allow, "no flow left: 2 may not answer 3, nor send");
    assert_eq!(d(&pkt(1, 2, 0, 40001, 80)).why, Why::Default, "1 to 2: the default and the isolation");
    assert_eq!(d(&pkt(2, 1, 0, 80, 40001)).why, Why::Reply, "2's reply passes by the flow");
    assert!(!d(&pkt(1, 2, 1, 5, 53)).allow, "a deny rule wins");
    assert!(d(&pkt(3, 4, 0, 1, 80)).allow, "hosts no policy selects are not isolated");
    assert!(d(&pkt(3, 2, 4, 0, 0)).allow, "ARP is not a NetworkPolicy's");
}

/// A policy's counters and flows: its rules', default's and state's
/// (packets, drops), unclassifiable, orphan fragments, live flows.
type Footprint = (Vec<(u64, u64)>, (u64, u64), (u64, u64), u64, u64, usize);

/// What a policy's counters and flows say, to see that a dry run moved none.
fn footprint(p: &PolicySet) -> Footprint {
    let net = &p.nets[&NET];
    let snap = |c: &Counters| {
        let s = c.snapshot();
        (s.packets, s.drops)
    };
    (
        net.rules.iter().map(|r| snap(&r.counters)).collect(),
        snap(&net.default_counters),
        snap(&net.stateful),
        net.unclassifiable.load(Relaxed),
        net.orphan_fragments.load(Relaxed),
        p.flows.live(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    /// `explain` (vnetctl trace's dry run) gives the verdict `decide` then
    /// gives, for every packet of a random sequence, and moves no counter
    /// and remembers no flow.
    #[test]
    fn a_dry_run_gives_the_verdict_the_data_path_gives_and_changes_nothing(
        rules in prop::collection::vec(arb_rule(), 0..8),
        default in any::<bool>(),
        pkts in prop::collection::vec(arb_pkt(), 1..40),
    ) {
        let p = set(&rules, if default { Action::Allow } else { Action::Deny });
        for x in &pkts {
            let before = footprint(&p);
            let dry = p.explain(NET, &frame(x));
            prop_assert_eq!(footprint(&p), before, "a dry run of {:?} changed the policy's state", x);
            let v = p.decide(NET, &frame(x));
            prop_assert_eq!(dry, v, "{:?}", x);
        }
    }
}

#[test]
fn a_dry_run_names_the_rule_and_a_flow_that_would_carry_the_packet() {
    let rules = [R { allow: true, from: (1, 2, 0), to: (0, 0, 0), ether: None, proto: Some(6), ports: None }];
    let p = set(&rules, Action::Deny);
    let (req, reply) = (pkt(2, 4, 0, 40000, 80), pkt(4, 2, 0, 80, 40000));
    assert_eq!(p.explain(NET, &frame(&req)), Verdict { allow: true, why: Why::Rule(0) });
    assert_eq!(p.explain(NET, &frame(&reply)), Verdict { allow: false, why: Why::Default }, "no flow yet");
    assert!(p.decide(NET, &frame(&req)).allow);
    assert_eq!(
        p.explain(NET, &frame(&reply)),
        Verdict { allow: true, why: Why::Reply },
        "the flow carries it"
    );
    assert_eq!(p.explain(NET, &frame(&req)), Verdict { allow: true, why: Why::Established });
    assert_eq!(p.explain(8, &frame(&req)), Verdict { allow: true, why: Why::NoPolicy });
}

#[test]
fn a_logging_table_gives_one_record_per_flow_with_its_rule_and_bytes_each_way() {
    let rules = [
        R {
            allow: true,
            from: (1, 2, 0),
            to: (1, 4, 0),
            ether: None,
            proto: Some(6),
            ports: Some((5432, 5432)),
        },
        R {
            allow: false,
            from: (0, 0, 0),
            to: (0, 0, 0),
            ether: None,
            proto: Some(6),
            ports: Some((22, 22)),
        },
    ];
    let (mut p, kernel) = mirrored(&rules, Action::Deny);
    p.flows = Arc::new(Flows::logging(4096, 64));
    p.flows.tick(1_000_000_000);
    let (req, rep) = (frame(&pkt(2, 4, 0, 40000, 5432)), frame(&pkt(4, 2, 0, 5432, 40000)));
    for _ in 0..3 {
        assert!(p.decide(NET, &req).allow && p.decide(NET, &rep).allow);
    }
    let ssh = frame(&pkt(2, 4, 0, 40001, 22));
    assert!(!p.decide(NET, &ssh).allow && !p.decide(NET, &ssh).allow, "a retried SYN: one denied flow");
    let mut out = Vec::new();
    p.flows.sweep(10, 60, &mut |r| out.push(r));
    assert!(out.is_empty(), "not idle yet");
    p.flows.tick(12_000_000_000);
    p.flows.sweep(10, 60, &mut |r| out.push(r));
    out.sort_by_key(|r| r.opened.allow);
    assert_eq!(out.len(), 2, "{out:?}");
    let (denied, allowed) = (&out[0], &out[1]);
    assert_eq!(allowed.opened.rule.as_deref(), Some("r0"));
    assert_eq!(
        (allowed.opened.key.sport, allowed.opened.key.dport),
        (40000, 5432),
        "as its first packet went"
    );
    assert_eq!(allowed.packets, [3, 3]);
    assert_eq!(allowed.bytes, [3 * req.len() as u64, 3 * rep.len() as u64]);
    assert!(allowed.mirrored && !kernel.offered.lock().unwrap().is_empty(), "the mirror kept it");
    assert_eq!((denied.opened.rule.as_deref(), denied.opened.allow), (Some("r1"), false));
    assert_eq!((denied.packets, denied.bytes), ([2, 0], [2 * ssh.len() as u64, 0]));
    assert_eq!(p.flows.overflow(), 0);
    // Without a log (the control): the same traffic accounts nothing.
    let plain = set(&rules, Action::Deny);
    plain.decide(NET, &req);
    plain.flows.sweep(0, 0, &mut |r| panic!("no log: {r:?}"));
}
