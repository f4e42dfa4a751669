use super::*;
use crate::objects;
use serde_json::json;
use std::net::Ipv4Addr;

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 0, n))
}

fn cluster_ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96, 0, n))
}

fn svc(ns: &str, name: &str, n: u8, ports: serde_json::Value) -> Service {
    objects::service(&json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"type": "ClusterIP", "clusterIP": format!("10.96.0.{n}"),
                 "clusterIPs": [format!("10.96.0.{n}")], "ports": ports}
    }))
    .unwrap()
}

/// A slice of Service `service` with `endpoints` ((pod number, ready,
/// serving)) and `ports`.
fn slice(ns: &str, service: &str, endpoints: &[(u8, bool, bool)], ports: serde_json::Value) -> EndpointSlice {
    let eps: Vec<_> = endpoints
        .iter()
        .map(|&(n, ready, serving)| {
            json!({"addresses": [format!("10.244.0.{n}")],
                   "conditions": {"ready": ready, "serving": serving, "terminating": !ready}})
        })
        .collect();
    objects::endpoint_slice(&json!({
        "metadata": {"namespace": ns, "name": format!("{service}-abcde"),
                     "labels": {objects::SERVICE_NAME: service}},
        "addressType": "IPv4", "endpoints": eps, "ports": ports
    }))
    .unwrap()
}

fn key(ip: IpAddr, port: u16) -> ServicePort {
    ServicePort { ip, proto: 6, port }
}

/// A Service port maps to each endpoint's target port: a numeric
/// `targetPort` (80 -> 8080) and a named one (`http`, 8001 on pod 1 and
/// 8002 on pod 2, two slices as the controller writes them), by the
/// Service port's name; UDP kept apart from TCP.
#[test]
fn a_service_port_maps_to_its_endpoints_target_ports_numeric_and_named() {
    let services = vec![
        svc("prod", "num", 1, json!([{"port": 80, "targetPort": 8080}])),
        svc(
            "prod",
            "named",
            2,
            json!([{"name": "web", "port": 80, "targetPort": "http"},
                   {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}]),
        ),
    ];
    let slices = vec![
        slice("prod", "num", &[(1, true, true), (2, true, true)], json!([{"port": 8080, "protocol": "TCP"}])),
        slice(
            "prod",
            "named",
            &[(1, true, true)],
            json!([{"name": "web", "port": 8001}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
        ),
        slice("prod", "named", &[(2, true, true)], json!([{"name": "web", "port": 8002}])),
    ];
    let (map, report) = translate(&services, &slices, &[], &[], Limits::default());
    assert_eq!(map.services[&key(cluster_ip(1), 80)], vec![(ip(1), 8080), (ip(2), 8080)]);
    assert_eq!(map.services[&key(cluster_ip(2), 80)], vec![(ip(1), 8001), (ip(2), 8002)]);
    let dns = ServicePort { ip: cluster_ip(2), proto: 17, port: 53 };
    assert_eq!(map.services[&dns], vec![(ip(1), 53)]);
    assert!(map.backends.contains(&key(ip(2), 8002)));
    assert!(map.backends.contains(&ServicePort { ip: ip(1), proto: 17, port: 53 }));
    assert!(!map.backends.contains(&key(ip(1), 53)), "UDP's backend is not TCP's");
    assert_eq!((report.services, report.ports, report.backends), (2, 3, 5));
}

/// Ready endpoints only; when none is ready the serving (terminating)
/// ones, as kube-proxy falls back; none at all: not in the map, to be
/// closed. Headless Services are not in the map.
#[test]
fn ready_endpoints_then_serving_ones_and_headless_services_left_out() {
    let ports = json!([{"port": 80, "targetPort": 80}]);
    let mut headless = svc("prod", "headless", 9, ports.clone());
    headless.cluster_ips.clear();
    let parsed = objects::service(&json!({"metadata": {"namespace": "prod", "name": "h"},
        "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": ports.clone()}}))
    .unwrap();
    assert!(parsed.cluster_ips.is_empty(), "a headless Service has no cluster address");
    let services = vec![
        svc("prod", "a", 1, ports.clone()),
        svc("prod", "b", 2, ports.clone()),
        headless,
        svc("prod", "c", 3, ports.clone()),
    ];
    let p = json!([{"port": 80}]);
    let slices = vec![
        slice("prod", "a", &[(1, true, true), (2, false, true)], p.clone()),
        slice("prod", "b", &[(3, false, true), (4, false, false)], p.clone()),
        slice("prod", "headless", &[(5, true, true)], p),
    ];
    let (map, _) = translate(&services, &slices, &[], &[], Limits::default());
    assert_eq!(map.services[&key(cluster_ip(1), 80)], vec![(ip(1), 80)], "ready only");
    assert_eq!(map.services[&key(cluster_ip(2), 80)], vec![(ip(3), 80)], "none ready: serving");
    assert!(!map.services.contains_key(&key(cluster_ip(3), 80)), "no slice: no backend");
    let closing: Vec<_> = map.closing.iter().map(|c| (c.why, c.keys.clone())).collect();
    let whole = ServicePort { ip: cluster_ip(3), proto: 0, port: 0 };
    assert_eq!(closing, [(Untranslated::NoBackends, vec![whole])]);
    assert_eq!(map.services.len(), 2);
    assert!(!map.backends.contains(&key(ip(5), 80)), "a headless Service's endpoint");
}

/// Past the limits a Service is left out whole and named; the ones before
/// it stay.
#[test]
fn a_service_past_the_limits_is_left_out_and_named() {
    let ports = json!([{"port": 80}, {"name": "b", "port": 81}]);
    let services = vec![svc("prod", "a", 1, ports.clone()), svc("prod", "b", 2, ports)];
    let p = json!([{"port": 80}, {"name": "b", "port": 81}]);
    let slices =
        vec![slice("prod", "a", &[(1, true, true)], p.clone()), slice("prod", "b", &[(2, true, true)], p)];
    let (map, report) =
        translate(&services, &slices, &[], &[], Limits { ports: 3, backends: 100, ..Limits::default() });
    assert_eq!(map.services.len(), 2);
    assert!(report.left_out["prod/b"].contains("3 Service ports"), "{report:?}");
    let (map, report) =
        translate(&services, &slices, &[], &[], Limits { ports: 100, backends: 3, ..Limits::default() });
    assert_eq!(map.services.len(), 2);
    assert!(report.left_out["prod/b"].contains("3 backends"), "{report:?}");
    assert!(!map.backends.contains(&key(ip(2), 80)));
}

/// NetworkPolicy and Services together, as the engine judges them: an
/// isolated backend (`prod/db`, admitting `web` pods to its port `http`)
/// takes `prod/web` through its Service and not `prod/cache` (the
/// control); a Service whose two backends are `db` and `cache`, where a
/// policy isolates `cache` and admits no one, takes no one.
#[test]
fn an_isolated_backend_takes_a_service_connection_only_as_its_policy_allows() {
    use vnet_core::policy::isolation::{Denied, Direction};
    let (pods, namespaces) = cluster();
    let policies = vec![
        np(
            "prod",
            "db",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                "ports": [{"port": "http"}]}]}),
        ),
        np("prod", "cache", json!({"podSelector": {"matchLabels": {"app": "cache"}}})),
    ];
    let (mut iso, _) =
        crate::netpol::translate(&pods, &namespaces, &policies, crate::netpol::Limits::default());
    let services = vec![
        svc("prod", "db", 1, json!([{"name": "web", "port": 80, "targetPort": "http"}])),
        svc("prod", "both", 2, json!([{"name": "web", "port": 80, "targetPort": "http"}])),
    ];
    let slices = vec![
        slice("prod", "db", &[(2, true, true)], json!([{"name": "web", "port": 8002}])),
        slice("prod", "both", &[(2, true, true)], json!([{"name": "web", "port": 8002}])),
        slice("prod", "both", &[(3, true, true)], json!([{"name": "web", "port": 8003}])),
    ];
    let (map, _) = translate(&services, &slices, &[], &[], Limits::default());
    iso.services = map.services;
    iso.backends = map.backends;
    let to = |from: u8, n: u8| packet(ip(from), cluster_ip(n), 6, 80);
    assert!(iso.check(&to(1, 1), 60).is_ok(), "prod/web through db's Service");
    assert_eq!(
        iso.check(&to(3, 1), 60),
        Err(Denied { direction: Direction::Ingress, policy: 1 }),
        "prod/cache through db's Service: denied"
    );
    assert_eq!(
        iso.check(&to(1, 2), 60),
        Err(Denied { direction: Direction::Ingress, policy: 0 }),
        "prod/web through a Service whose other backend denies it"
    );
}

/// Pods `prod/web` 1, `prod/db` 2, `prod/cache` 3, each with its container
/// port `http` numbered 8000 + its number.
fn cluster() -> (Vec<objects::Pod>, Vec<objects::Namespace>) {
    let pod = |name: &str, n: u8| {
        objects::pod(&json!({
            "metadata": {"namespace": "prod", "name": name, "labels": {"app": name}},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8000 + u16::from(n)}]}]},
            "status": {"phase": "Running", "podIPs": [{"ip": format!("10.244.0.{n}")}]}
        }))
        .unwrap()
    };
    let ns = objects::namespace(&json!({"metadata": {"name": "prod"}})).unwrap();
    (vec![pod("web", 1), pod("db", 2), pod("cache", 3)], vec![ns])
}

fn np(ns: &str, name: &str, spec: serde_json::Value) -> objects::NetworkPolicy {
    objects::network_policy(&json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
}

/// A first TCP packet from `src` to `dst` port `dport`.
fn packet(src: IpAddr, dst: IpAddr, proto: u8, dport: u16) -> vnet_wire::classify::Facts {
    use vnet_wire::classify::{Facts, Frag, Icmp, Ip, L3};
    Facts {
        src: vnet_wire::MacAddr([2, 0, 0, 0, 0, 1]),
        dst: vnet_wire::MacAddr([2, 0, 0, 0, 0, 2]),
        ether: 0x0800,
        tags: 0,
        l3: L3::Ip(Ip { src, dst, proto, sport: 40000, dport, frag: Frag::Whole, icmp: Icmp::None }),
    }
}

mod extips;
mod holes;
