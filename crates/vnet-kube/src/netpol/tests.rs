use super::*;
use crate::objects;
use serde_json::json;
use std::net::Ipv4Addr;
use vnet_core::policy::isolation::Direction;
use vnet_wire::classify::{Facts, Frag, Icmp, Ip, L3};

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 0, n))
}

/// Pod `name` of `ns` at 10.244.0.`n` with `labels`, and a container port
/// `http` (TCP) numbered 8000 + n.
fn pod(ns: &str, name: &str, n: u8, labels: serde_json::Value) -> Pod {
    objects::pod(&json!({
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": [
            {"name": "http", "containerPort": 8000 + u16::from(n)},
            {"name": "dns", "containerPort": 53, "protocol": "UDP"}
        ]}]},
        "status": {"phase": "Running", "podIP": format!("10.244.0.{n}"), "podIPs": [{"ip": format!("10.244.0.{n}")}]}
    }))
    .unwrap()
}

fn ns(name: &str, labels: serde_json::Value) -> Namespace {
    let mut l = labels;
    l["kubernetes.io/metadata.name"] = json!(name);
    objects::namespace(&json!({"metadata": {"name": name, "labels": l}})).unwrap()
}

fn np(ns: &str, name: &str, spec: serde_json::Value) -> NetworkPolicy {
    objects::network_policy(&json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
}

/// The cluster of these tests: namespaces prod (team: shop) and other;
/// prod: web 1, db 2, cache 3; other: db 4, web 5; a host-network pod 6.
fn cluster() -> (Vec<Pod>, Vec<Namespace>) {
    let mut host = pod("prod", "agent", 6, json!({"app": "db"}));
    host.host_network = true;
    let pods = vec![
        pod("prod", "web", 1, json!({"app": "web"})),
        pod("prod", "db", 2, json!({"app": "db", "tier": "data"})),
        pod("prod", "cache", 3, json!({"app": "cache", "tier": "data"})),
        pod("other", "db", 4, json!({"app": "db"})),
        pod("other", "web", 5, json!({"app": "web"})),
        host,
    ];
    (pods, vec![ns("prod", json!({"team": "shop"})), ns("other", json!({}))])
}

fn run(policies: &[NetworkPolicy]) -> (Isolation, Report) {
    let (pods, nss) = cluster();
    translate(&pods, &nss, policies, Limits::default())
}

fn pkt(s: u8, d: u8, proto: u8, dport: u16) -> Facts {
    Facts {
        src: vnet_wire::MacAddr([2, 0, 0, 0, 0, s]),
        dst: vnet_wire::MacAddr([2, 0, 0, 0, 0, d]),
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

/// Whether a first TCP (or `proto`) packet from pod s to pod d passes.
fn passes(iso: &Isolation, s: u8, d: u8, proto: u8, port: u16) -> bool {
    iso.check(&pkt(s, d, proto, port), 60).is_ok()
}

#[test]
fn default_deny_ingress_isolates_only_the_selected_pods() {
    let (iso, report) = run(&[np("prod", "deny", json!({"podSelector": {"matchLabels": {"app": "db"}}}))]);
    assert!(!passes(&iso, 1, 2, 6, 5432), "prod's db is isolated");
    assert!(passes(&iso, 1, 3, 6, 5432), "positive control: prod's cache is not");
    assert!(passes(&iso, 1, 4, 6, 5432), "nor other's db (another namespace)");
    assert!(passes(&iso, 2, 1, 6, 80), "nor prod's db for egress (policyTypes defaults to Ingress)");
    assert!(!iso.ingress_of.contains_key(&ip(6)), "nor the host-network pod");
    assert_eq!((report.policies, report.isolated_ingress, report.isolated_egress), (1, 1, 0));
    // An empty podSelector: every pod of its namespace, none of another.
    let (iso, _) = run(&[np("prod", "all", json!({"podSelector": {}, "policyTypes": ["Ingress"]}))]);
    assert!(!passes(&iso, 4, 1, 6, 80) && !passes(&iso, 4, 3, 6, 80));
    assert!(passes(&iso, 1, 5, 6, 80), "other's pods are not isolated");
}

#[test]
fn policy_types_default_and_egress_alone() {
    let p = |spec| directions(&np("prod", "p", spec));
    assert_eq!(p(json!({"podSelector": {}})), (true, false));
    assert_eq!(p(json!({"podSelector": {}, "egress": [{}]})), (true, true));
    assert_eq!(p(json!({"podSelector": {}, "egress": []})), (true, false));
    assert_eq!(p(json!({"podSelector": {}, "policyTypes": ["Egress"]})), (false, true));
    assert_eq!(p(json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})), (true, true));
    // Egress deny: web may send nothing, but receives.
    let (iso, _) = run(&[np(
        "prod",
        "no-out",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"]}),
    )]);
    assert!(!passes(&iso, 1, 2, 6, 5432) && !passes(&iso, 1, 4, 17, 53));
    assert!(passes(&iso, 2, 1, 6, 80), "ingress to web is not isolated");
    assert!(passes(&iso, 5, 4, 6, 80), "other's web is not selected");
}

#[test]
fn pod_and_namespace_selectors_and_both_in_one_peer() {
    let spec = |from| json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{"from": from}]});
    // A pod selector alone: the policy's namespace only.
    let (iso, _) = run(&[np("prod", "p", spec(json!([{"podSelector": {"matchLabels": {"app": "web"}}}])))]);
    assert!(passes(&iso, 1, 2, 6, 1), "prod's web");
    assert!(!passes(&iso, 5, 2, 6, 1), "not other's web (issue 66: another namespace's label)");
    // A namespace selector alone: every pod of those namespaces.
    let (iso, _) =
        run(&[np("prod", "p", spec(json!([{"namespaceSelector": {"matchLabels": {"team": "shop"}}}])))]);
    assert!(passes(&iso, 1, 2, 6, 1) && passes(&iso, 3, 2, 6, 1) && !passes(&iso, 5, 2, 6, 1));
    // Both in one peer: web pods of namespaces named other.
    let both = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}},
                       "podSelector": {"matchLabels": {"app": "web"}}}]);
    let (iso, _) = run(&[np("prod", "p", spec(both))]);
    assert!(passes(&iso, 5, 2, 6, 1), "other's web");
    assert!(!passes(&iso, 1, 2, 6, 1) && !passes(&iso, 4, 2, 6, 1), "not prod's web, not other's db");
    // The two as two peers: either.
    let two = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}},
                     {"podSelector": {"matchLabels": {"app": "web"}}}]);
    let (iso, _) = run(&[np("prod", "p", spec(two))]);
    assert!(passes(&iso, 5, 2, 6, 1) && passes(&iso, 4, 2, 6, 1) && passes(&iso, 1, 2, 6, 1));
    assert!(!passes(&iso, 3, 2, 6, 1));
    // An empty namespace selector: every namespace; an empty `from`: everyone.
    let (iso, _) = run(&[np("prod", "p", spec(json!([{"namespaceSelector": {}}])))]);
    assert!(passes(&iso, 4, 2, 6, 1) && passes(&iso, 3, 2, 6, 1));
    assert!(!passes(&iso, 6, 2, 6, 1), "a host-network pod is no pod peer");
    let (iso, _) =
        run(&[np("prod", "p", json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{}]}))]);
    assert!(passes(&iso, 6, 2, 6, 1), "an empty rule allows everyone, any address");
}

#[test]
fn match_expressions() {
    let sel = |op: &str, values: serde_json::Value| json!({"podSelector": {"matchExpressions": [{"key": "tier", "operator": op, "values": values}]}});
    let isolated = |spec| {
        let (iso, r) = run(&[np("prod", "p", spec)]);
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        let mut v: Vec<u8> = (1..=3).filter(|&n| iso.ingress_of.contains_key(&ip(n))).collect();
        v.sort();
        v
    };
    assert_eq!(isolated(sel("In", json!(["data"]))), [2, 3]);
    assert_eq!(isolated(sel("NotIn", json!(["data"]))), [1]);
    assert_eq!(isolated(sel("Exists", json!([]))), [2, 3]);
    assert_eq!(isolated(sel("DoesNotExist", json!([]))), [1]);
    let (iso, r) = run(&[np("prod", "p", sel("Near", json!(["x"])))]);
    assert_eq!(r.refused["prod/p"], "selector: unknown operator `Near`");
    assert!(iso.ingress_of.is_empty(), "a selector that cannot be read selects nothing");
}

#[test]
fn ports_numbers_end_port_named_ports_and_protocols() {
    let spec = |ports| json!({"podSelector": {}, "ingress": [{"ports": ports}]});
    let (iso, r) = run(&[np(
        "prod",
        "p",
        spec(json!([{"port": 5432}, {"protocol": "TCP", "port": 6000, "endPort": 6010}, {"port": "http"},
                    {"protocol": "UDP", "port": "dns"}])),
    )]);
    assert!(r.refused.is_empty(), "{:?}", r.refused);
    assert!(passes(&iso, 4, 2, 6, 5432) && !passes(&iso, 4, 2, 6, 5431), "a number, TCP by default");
    assert!(!passes(&iso, 4, 2, 17, 5432), "not UDP");
    assert!(passes(&iso, 4, 2, 6, 6000) && passes(&iso, 4, 2, 6, 6010) && !passes(&iso, 4, 2, 6, 6011));
    assert!(passes(&iso, 4, 2, 6, 8002) && !passes(&iso, 4, 2, 6, 8001), "`http` is 8002 in pod 2");
    assert!(passes(&iso, 4, 1, 6, 8001) && !passes(&iso, 4, 1, 6, 8002), "and 8001 in pod 1");
    assert!(passes(&iso, 4, 1, 17, 53) && !passes(&iso, 4, 1, 6, 53), "`dns` is UDP's");
    assert!(!passes(&iso, 4, 1, 1, 0), "no ICMP");
    // A protocol with no port: all its ports.
    let (iso, _) = run(&[np("prod", "p", spec(json!([{"protocol": "UDP"}])))]);
    assert!(passes(&iso, 4, 1, 17, 9999) && !passes(&iso, 4, 1, 6, 9999));
    // Egress named ports are the peer's (the destination's).
    let (iso, _) = run(&[np(
        "prod",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{"ports": [{"port": "http"}]}]}),
    )]);
    assert!(passes(&iso, 1, 4, 6, 8004) && !passes(&iso, 1, 4, 6, 8001));
    for (bad, why) in [
        (json!([{"port": 70000}]), "port 70000: not a port (1-65535)"),
        (json!([{"port": 10, "endPort": 5}]), "endPort 5: not a port at or above `port`"),
        (json!([{"port": "http", "endPort": 9000}]), "endPort with a named port or none"),
        (json!([{"protocol": "ICMP"}]), "unknown protocol `ICMP`"),
    ] {
        let (iso, r) = run(&[np("prod", "p", spec(bad))]);
        assert_eq!(r.refused["prod/p"], why);
        assert!(!passes(&iso, 4, 2, 6, 10) && !passes(&iso, 4, 2, 6, 5432), "closed: {why}");
    }
}

#[test]
fn ip_blocks_with_except() {
    let (iso, r) = run(&[np(
        "prod",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.0/24", "except": ["10.244.0.4/31", "10.244.0.2/32"]}}]}]}),
    )]);
    assert!(r.refused.is_empty());
    assert!(passes(&iso, 1, 3, 6, 1), "in the block");
    assert!(!passes(&iso, 1, 2, 6, 1) && !passes(&iso, 1, 4, 6, 1) && !passes(&iso, 1, 5, 6, 1), "excepted");
    let (_, r) = run(&[np(
        "prod",
        "p",
        json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.0.0"}}]}]}),
    )]);
    assert_eq!(r.refused["prod/p"], "ipBlock `10.244.0.0`: not a prefix");
}

#[test]
fn every_policy_selecting_a_pod_adds_its_rules_and_each_direction_is_its_own() {
    let (iso, r) = run(&[
        np("prod", "deny-all", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})),
        np(
            "prod",
            "web-to-db",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]}]}),
        ),
        np(
            "prod",
            "web-out",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]}),
        ),
    ]);
    assert_eq!((r.policies, r.rules), (3, 2));
    assert!(passes(&iso, 1, 2, 6, 5432), "web's egress and db's ingress both allow");
    assert!(!passes(&iso, 1, 2, 6, 5433), "db's ingress does not");
    assert!(!passes(&iso, 1, 3, 6, 5432), "web's egress does not reach cache");
    let d = iso.check(&pkt(2, 1, 6, 80), 60).unwrap_err();
    assert_eq!((d.direction, iso.policies[d.policy].name.as_str()), (Direction::Egress, "prod/deny-all"));
    assert!(passes(&iso, 4, 5, 6, 80), "another namespace's pods are not isolated");
}

#[test]
fn the_limits_refuse_closed_and_say_so() {
    let deny = |name: &str| {
        np("prod", name, json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{}]}))
    };
    let (pods, nss) = cluster();
    let limits = Limits { policies: 1, ..Limits::default() };
    let (iso, r) = translate(&pods, &nss, &[deny("a"), deny("b")], limits);
    assert_eq!(r.refused["prod/b"], "past the limit of 1 policies");
    assert!(passes(&iso, 1, 2, 6, 1), "a allows everyone in");
    let (iso, r) = translate(&pods, &nss, &[deny("b")], Limits { rules: 0, ..Limits::default() });
    assert_eq!(r.refused["prod/b"], "past the limit of 0 rules");
    assert!(!passes(&iso, 1, 2, 6, 1), "closed: the pods it selects are isolated, nothing allowed");
    let from_web = np(
        "prod",
        "c",
        json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
    );
    let (_, r) = translate(&pods, &nss, &[from_web], Limits { peer_addrs: 2, ..Limits::default() });
    assert_eq!(r.refused["prod/c"], "past the limit of 2 peer addresses");
}

#[test]
fn malformed_objects_are_errors_not_panics() {
    assert!(objects::pod(&json!({"metadata": {"name": "x"}})).is_err(), "no namespace");
    assert!(objects::pod(
        &json!({"metadata": {"namespace": "a", "name": "x"}, "spec": {"hostNetwork": "yes"}})
    )
    .is_err());
    assert!(objects::network_policy(
        &json!({"metadata": {"namespace": "a", "name": "x"}, "spec": {"ingress": 3}})
    )
    .is_err());
    assert!(objects::network_policy(&json!([1, 2])).is_err());
    let ended = objects::pod(&json!({"metadata": {"namespace": "a", "name": "x"},
        "status": {"phase": "Succeeded", "podIP": "10.244.0.9"}}))
    .unwrap();
    assert!(ended.ips.is_empty(), "an ended pod's address may be another's");
}
