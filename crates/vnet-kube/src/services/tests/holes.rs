//! The review's holes in NetworkPolicy on Services, as an attacker meets
//! them, each with its control: NodePorts, external and load balancer
//! addresses judged like a cluster address; Services not translated
//! closed where their destination may be isolated; bounds per namespace,
//! taken in turns.

use super::*;
use vnet_core::policy::isolation::{Denied, Direction, Isolation};

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn node(name: &str, addresses: serde_json::Value) -> objects::Node {
    objects::node(&json!({"metadata": {"name": name}, "status": {"addresses": addresses}})).unwrap()
}

/// Nodes `a` (172.16.0.1, this one) and `b` (172.16.0.2, and the
/// external 203.0.113.2).
fn nodes() -> Vec<objects::Node> {
    vec![
        node(
            "a",
            json!([{"type": "InternalIP", "address": "172.16.0.1"}, {"type": "Hostname", "address": "a"}]),
        ),
        node(
            "b",
            json!([{"type": "InternalIP", "address": "172.16.0.2"},
                   {"type": "ExternalIP", "address": "203.0.113.2"},
                   {"type": "InternalDNS", "address": "10.9.9.9"}]),
        ),
    ]
}

/// `prod/db` (pod 2) isolated for ingress, admitting `web` pods to its
/// port `http`.
pub(super) fn isolation(pods: &[objects::Pod], namespaces: &[objects::Namespace]) -> Isolation {
    let policies = vec![np(
        "prod",
        "db",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                            "ports": [{"port": "http"}]}]}),
    )];
    crate::netpol::translate(pods, namespaces, &policies, crate::netpol::Limits::default()).0
}

/// `prod/db`'s Service: NodePort 30080, an external address and a load
/// balancer's, as the API gives a `LoadBalancer` Service.
fn db_service(external: bool) -> Service {
    let mut spec = json!({"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
        "ports": [{"name": "web", "port": 80, "targetPort": "http", "nodePort": 30080}]});
    let mut status = json!({});
    if external {
        spec["externalIPs"] = json!(["192.0.2.10"]);
        status = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}, {"hostname": "lb.example"}]}});
    }
    objects::service(
        &json!({"metadata": {"namespace": "prod", "name": "db"}, "spec": spec, "status": status}),
    )
    .unwrap()
}

/// Node objects give their InternalIP and ExternalIP addresses only.
#[test]
fn a_node_gives_its_internal_and_external_addresses() {
    let n = nodes();
    assert_eq!(n[0].addresses, [v4(172, 16, 0, 1)]);
    assert_eq!(n[1].addresses, [v4(172, 16, 0, 2), v4(203, 0, 113, 2)]);
    assert!(objects::node(&json!({"metadata": {"name": "c"}, "status": {"addresses": 7}})).is_err());
}

/// From a pod, `prod/db`'s Service at another node's address and node
/// port, at this node's own (exempt) address, at its external and load
/// balancer addresses: `prod/cache` is denied by `db`'s policy as through
/// the cluster address, `prod/web` passes. The control: the same Service
/// without the Nodes and external addresses (as before) lets `prod/cache`
/// through, its second leg coming from a translator.
#[test]
fn a_nodeport_external_and_load_balancer_address_is_judged_like_a_cluster_address() {
    let (pods, namespaces) = cluster();
    let slices = vec![slice("prod", "db", &[(2, true, true)], json!([{"name": "web", "port": 8002}]))];
    let mut iso = isolation(&pods, &namespaces);
    iso.exempt.insert(v4(172, 16, 0, 1));
    let translator = v4(10, 244, 0, 250);
    iso.translators.insert(translator);
    let (map, report) = translate(&[db_service(true)], &slices, &nodes(), &pods, Limits::default());
    assert_eq!((report.nodes, report.ports), (3, 4), "{report:?}");
    assert_eq!(install(&mut iso, map, &pods), 0);
    let deny = Err(Denied { direction: Direction::Ingress, policy: 0 });
    for (to, port) in [
        (v4(172, 16, 0, 2), 30080),
        (v4(203, 0, 113, 2), 30080),
        (v4(172, 16, 0, 1), 30080),
        (v4(192, 0, 2, 10), 80),
        (v4(198, 51, 100, 7), 80),
        (cluster_ip(1), 80),
    ] {
        assert_eq!(iso.check(&packet(ip(3), to, 6, port), 60), deny, "prod/cache to {to}:{port}");
        assert_eq!(iso.check(&packet(ip(1), to, 6, port), 60), Ok(()), "prod/web to {to}:{port}");
    }
    assert_eq!(iso.check(&packet(ip(3), translator, 6, 30080), 60), deny, "another node's gateway");
    assert_eq!(iso.check(&packet(ip(3), v4(172, 16, 0, 1), 6, 22), 60), Ok(()), "its node, no node port");
    assert_eq!(iso.check(&packet(ip(3), v4(172, 16, 0, 2), 6, 22), 60), Ok(()), "another node: no pod");
    assert_eq!(iso.check(&packet(translator, ip(2), 6, 8002), 60), Ok(()), "the second leg");
    assert!(iso.check(&packet(translator, ip(2), 6, 22), 60).is_err(), "a translator elsewhere");

    let mut before = isolation(&pods, &namespaces);
    before.translators.insert(translator);
    let (map, _) = translate(&[db_service(false)], &slices, &[], &[], Limits::default());
    install(&mut before, map, &pods);
    for (to, port) in [(v4(172, 16, 0, 2), 30080), (v4(192, 0, 2, 10), 80)] {
        assert_eq!(
            before.check(&packet(ip(3), to, 6, port), 60),
            Ok(()),
            "the hole: prod/cache to {to}:{port}"
        );
    }
    assert_eq!(before.check(&packet(translator, ip(2), 6, 8002), 60), Ok(()), "and its second leg");
}

/// Pods `prod/web` 1, `prod/db` 2, `prod/cache` 3 and `other/x` 4.
fn two_namespaces() -> (Vec<objects::Pod>, Vec<objects::Namespace>) {
    let (mut pods, mut namespaces) = cluster();
    pods.push(
        objects::pod(&json!({"metadata": {"namespace": "other", "name": "x", "labels": {"app": "x"}},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.0.4"}]}}))
        .unwrap(),
    );
    namespaces.push(objects::namespace(&json!({"metadata": {"name": "other"}})).unwrap());
    (pods, namespaces)
}

/// The policy that denied `r`, by name.
fn by(iso: &Isolation, r: Result<(), Denied>) -> String {
    match r {
        Ok(()) => "passed".into(),
        Err(d) => iso.policies.get(d.policy).map_or_else(|| format!("#{}", d.policy), |p| p.name.clone()),
    }
}

/// A Service past the bounds whose backend is isolated is denied (to
/// every client: nothing says which it admits), counted by a policy of
/// its own; one whose destination is not isolated passes (the control).
/// Without the closing, the isolated one passes: the hole.
#[test]
fn a_service_left_out_is_denied_where_its_destination_is_isolated() {
    let (pods, namespaces) = two_namespaces();
    let services = vec![
        svc("prod", "db", 1, json!([{"name": "web", "port": 80, "targetPort": "http"}])),
        svc("other", "x", 3, json!([{"port": 80}])),
    ];
    let slices = vec![
        slice("prod", "db", &[(2, true, true)], json!([{"name": "web", "port": 8002}])),
        slice("other", "x", &[(4, true, true)], json!([{"port": 80}])),
    ];
    let none = Limits { ports: 0, ..Limits::default() };
    let (map, report) = translate(&services, &slices, &[], &[], none);
    assert_eq!(report.left_out.len(), 2, "{report:?}");
    let mut iso = isolation(&pods, &namespaces);
    assert_eq!(install(&mut iso, map, &pods), 1);
    let r = iso.check(&packet(ip(3), cluster_ip(1), 6, 80), 60);
    assert_eq!(by(&iso, r), Untranslated::LeftOut.policy_name());
    let r = iso.check(&packet(ip(1), cluster_ip(1), 6, 80), 60);
    assert_eq!(by(&iso, r), Untranslated::LeftOut.policy_name(), "closed to web too");
    assert_eq!(iso.policies[1].denied.snapshot().drops, 2, "counted");
    assert_eq!(iso.check(&packet(ip(3), cluster_ip(3), 6, 80), 60), Ok(()), "other/x: not isolated");

    iso.closed.clear();
    assert_eq!(iso.check(&packet(ip(3), cluster_ip(1), 6, 80), 60), Ok(()), "the hole without it");
}

/// A Service without a backend known (no slice seen yet) is denied, its
/// namespace isolated or not; an SCTP port whose backend is isolated is
/// denied, the same Service's TCP port judged as any (web passes, cache
/// does not). Controls: the same with its slice; without the closing.
#[test]
fn a_service_without_backends_and_an_sctp_port_are_denied() {
    let (pods, namespaces) = two_namespaces();
    let services = vec![
        svc("other", "none", 4, json!([{"port": 80}])),
        svc(
            "prod",
            "mixed",
            5,
            json!([{"name": "web", "port": 80, "targetPort": "http"},
                   {"name": "s", "port": 9, "protocol": "SCTP"}]),
        ),
    ];
    let mut slices = vec![slice(
        "prod",
        "mixed",
        &[(2, true, true)],
        json!([{"name": "web", "port": 8002}, {"name": "s", "port": 9, "protocol": "SCTP"}]),
    )];
    let (map, report) = translate(&services, &slices, &[], &[], Limits::default());
    assert_eq!(report.without_backends, 1, "{report:?}");
    assert!(report.left_out["prod/mixed"].contains("SCTP"), "{report:?}");
    let mut iso = isolation(&pods, &namespaces);
    assert_eq!(install(&mut iso, map, &pods), 2);
    let r = iso.check(&packet(ip(1), cluster_ip(4), 6, 80), 60);
    assert_eq!(by(&iso, r), Untranslated::NoBackends.policy_name());
    let r = iso.check(&packet(ip(1), cluster_ip(5), 132, 0), 60);
    assert_eq!(by(&iso, r), Untranslated::Sctp.policy_name());
    assert_eq!(iso.check(&packet(ip(1), cluster_ip(5), 6, 80), 60), Ok(()), "web to the TCP port");
    assert_eq!(by(&iso, iso.check(&packet(ip(3), cluster_ip(5), 6, 80), 60)), "prod/db");

    iso.closed.clear();
    assert_eq!(iso.check(&packet(ip(1), cluster_ip(4), 6, 80), 60), Ok(()), "no backend: the hole");
    assert_eq!(iso.check(&packet(ip(1), cluster_ip(5), 132, 0), 60), Ok(()), "SCTP: the hole");

    slices.push(slice("other", "none", &[(4, true, true)], json!([{"port": 80}])));
    let (map, _) = translate(&services, &slices, &[], &[], Limits::default());
    let mut iso = isolation(&pods, &namespaces);
    install(&mut iso, map, &pods);
    assert_eq!(iso.check(&packet(ip(1), cluster_ip(4), 6, 80), 60), Ok(()), "its slice seen");
}

/// One namespace's many Services take its share and no more: in turns,
/// namespace `zzz`'s one Service is in before `aaa`'s second; under a
/// bound per namespace, `aaa` holds that many and `zzz` is in.
#[test]
fn one_namespace_cannot_starve_the_others() {
    let mut services: Vec<Service> =
        (0..5).map(|i| svc("aaa", &format!("a{i}"), 10 + i, json!([{"port": 80}]))).collect();
    services.push(svc("zzz", "z0", 20, json!([{"port": 80}])));
    let mut slices: Vec<EndpointSlice> =
        (0..5).map(|i| slice("aaa", &format!("a{i}"), &[(1, true, true)], json!([{"port": 80}]))).collect();
    slices.push(slice("zzz", "z0", &[(2, true, true)], json!([{"port": 80}])));
    let z0 = key(cluster_ip(20), 80);

    let total = Limits { ports: 3, backends: 100, ns_ports: 100, ns_backends: 100 };
    let (map, report) = translate(&services, &slices, &[], &[], total);
    assert!(map.services.contains_key(&z0), "{report:?}");
    assert!(map.services.contains_key(&key(cluster_ip(11), 80)), "aaa/a1, in its turn");
    assert_eq!(report.left_out.keys().collect::<Vec<_>>(), ["aaa/a2", "aaa/a3", "aaa/a4"]);

    let per_ns = Limits { ports: 100, backends: 100, ns_ports: 2, ns_backends: 100 };
    let (map, report) = translate(&services, &slices, &[], &[], per_ns);
    assert!(map.services.contains_key(&z0));
    assert_eq!(report.left_out.len(), 3);
    assert!(report.left_out["aaa/a4"].contains("2 Service ports in a namespace"), "{report:?}");
}
