//! The second review's holes, as an attacker meets them, each with its
//! control: an external or load balancer address that shadows a pod or
//! another Service; one Service's keys multiplied past every bound.

use super::*;
use vnet_core::policy::isolation::{Denied, Direction};

/// Service `ns/name` at cluster address 10.96.0.`n`, with `ports`, its
/// `externalIPs` and load balancer addresses `lb`.
fn ext(ns: &str, name: &str, n: u8, ports: serde_json::Value, external: &[&str], lb: &[&str]) -> Service {
    let lb: Vec<_> = lb.iter().map(|a| json!({"ip": a})).collect();
    objects::service(&json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"type": "LoadBalancer", "clusterIP": format!("10.96.0.{n}"),
                 "clusterIPs": [format!("10.96.0.{n}")], "ports": ports, "externalIPs": external},
        "status": {"loadBalancer": {"ingress": lb}}
    }))
    .unwrap()
}

/// `prod/db` (pod 2) isolated for ingress, admitting `web` pods to `http`.
use super::holes::isolation as db_isolated;

/// A tenant's Service with `externalIPs: [db's address]` at db's port,
/// backed by its own open pod (`cache`): with the pods known the address
/// is dropped (counted) and `cache` stays denied at db straight; the
/// control, the pods not given: the key is built and would judge db's
/// port against `cache`. The same Service without backends (a closed key
/// at db's port, denying `web` too) likewise. And the engine's own guard:
/// given such a key anyway, an isolated pod's address is judged as the
/// pod (its control: a pod not isolated is met by the key).
#[test]
fn an_external_address_that_is_a_pods_never_shadows_its_policy() {
    let (pods, namespaces) = cluster();
    let port = json!([{"name": "web", "port": 8002, "targetPort": 8003}]);
    let evil = vec![ext("prod", "evil", 9, port.clone(), &["10.244.0.2"], &["10.244.0.3"])];
    let slices = vec![slice("prod", "evil", &[(3, true, true)], json!([{"name": "web", "port": 8003}]))];
    let shadow = key(ip(2), 8002);
    let (map, report) = translate(&evil, &slices, &[], &pods, Limits::default());
    assert!(!map.services.contains_key(&shadow));
    assert_eq!(report.dropped_addresses["prod/evil"], 2, "{report:?}");
    let mut iso = db_isolated(&pods, &namespaces);
    install(&mut iso, map, &pods);
    let deny = Err(Denied { direction: Direction::Ingress, policy: 0 });
    assert_eq!(iso.check(&packet(ip(3), ip(2), 6, 8002), 60), deny, "cache at db straight: denied");
    assert!(iso.check(&packet(ip(1), ip(2), 6, 8002), 60).is_ok(), "web at db: its policy admits it");
    // The control: the pods not given, the key is built.
    let (open, report) = translate(&evil, &slices, &[], &[], Limits::default());
    assert_eq!(open.services[&shadow], vec![(ip(3), 8003)]);
    assert!(report.dropped_addresses.is_empty());
    // The same Service without backends: a closed key at db's port.
    let (closing, _) = translate(&evil, &[], &[], &pods, Limits::default());
    assert!(closing.closing.iter().all(|c| !c.keys.contains(&shadow)), "{:?}", closing.closing);
    let (closing, _) = translate(&evil, &[], &[], &[], Limits::default());
    assert!(closing.closing.iter().any(|c| c.keys.contains(&shadow)), "the control: closed at db");
    // The engine's guard, given the shadowing map and closed key anyway.
    let mut iso = db_isolated(&pods, &namespaces);
    iso.services = open.services;
    assert_eq!(iso.check(&packet(ip(3), ip(2), 6, 8002), 60), deny, "judged as db, not as the Service");
    iso.closed.insert(shadow, 0);
    assert!(iso.check(&packet(ip(1), ip(2), 6, 8002), 60).is_ok(), "no closed key at an isolated pod");
    iso.services.insert(key(ip(1), 8002), vec![(ip(2), 8002)]);
    assert_eq!(iso.check(&packet(ip(3), ip(1), 6, 8002), 60), deny, "control: web is not isolated");
}

/// External and load balancer addresses that are no host's own: another
/// Service's cluster address, unspecified (a node port's key), loopback,
/// link-local, multicast, broadcast: dropped and counted; the Service at
/// the cluster address keeps its own backends whichever comes first. Two
/// Services at one external address: both backends judged (merged, in
/// either order), never the last one alone.
#[test]
fn external_addresses_no_host_has_or_another_services_are_dropped_and_clashes_merged() {
    let port = json!([{"port": 80}]);
    let bad = ["10.96.0.1", "0.0.0.0", "127.0.0.1", "169.254.1.1", "224.0.0.1", "255.255.255.255"];
    let mut services = vec![
        ext("prod", "a", 1, port.clone(), &["192.0.2.10"], &[]),
        ext("prod", "b", 2, port.clone(), &bad, &["fe80::1", "::", "192.0.2.10"]),
    ];
    let slices = vec![
        slice("prod", "a", &[(1, true, true)], port.clone()),
        slice("prod", "b", &[(2, true, true)], port),
    ];
    for _ in 0..2 {
        let (map, report) = translate(&services, &slices, &[], &[], Limits::default());
        assert_eq!(map.services[&key(cluster_ip(1), 80)], vec![(ip(1), 80)], "a's own backends");
        assert_eq!(report.dropped_addresses["prod/b"], 8, "{report:?}");
        let both = vec![(ip(1), 80), (ip(2), 80)];
        assert_eq!(map.services[&key(v4(192, 0, 2, 10), 80)], both, "merged");
        assert!(!map.services.keys().any(|k| k.ip.is_unspecified() || k.ip.is_loopback()));
        assert_eq!(map.services.len(), 3, "the control: 192.0.2.10 kept, with both cluster addresses");
        services.reverse();
    }
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// `n` TCP ports from 1, each with node port 30000 + its number when
/// `node_ports`.
fn many_ports(n: u16, node_ports: bool) -> serde_json::Value {
    let ports: Vec<_> = (1..=n)
        .map(|p| {
            let mut v = json!({"name": format!("p{p}"), "port": p});
            if node_ports {
                v["nodePort"] = json!(30000 + p);
            }
            v
        })
        .collect();
    json!(ports)
}

/// One Service, 5000 ports and 40 external addresses (16 of each kind
/// read): its keys are counted before any is built, past the namespace's
/// bound it is left out and closed by address (33 keys), not by key (a
/// small one, within the bound of what is closed by port, by port); the
/// control, bounds lifted: 160001 keys, all closed one by one.
#[test]
fn a_service_multiplying_its_keys_is_counted_before_built_and_closed_by_address() {
    let external: Vec<String> = (0..20).map(|i| format!("192.0.2.{i}")).collect();
    let lb: Vec<String> = (0..20).map(|i| format!("198.51.100.{i}")).collect();
    let external: Vec<&str> = external.iter().map(String::as_str).collect();
    let lb: Vec<&str> = lb.iter().map(String::as_str).collect();
    let big = vec![ext("prod", "big", 1, many_ports(5000, false), &external, &lb)];
    assert_eq!((big[0].external_ips.len(), big[0].external_over), (32, 8));
    let (map, report) = translate(&big, &[], &[], &[], Limits::default());
    assert!(report.left_out["prod/big"].contains("in a namespace"), "{report:?}");
    assert_eq!(report.dropped_addresses["prod/big"], 8);
    let keys: usize = map.closing.iter().map(|c| c.keys.len()).sum();
    assert_eq!(keys, 33, "one key for each address");
    let whole = ServicePort { ip: v4(192, 0, 2, 3), proto: 0, port: 0 };
    assert!(map.closing[0].keys.contains(&whole));
    let few = vec![ext("prod", "few", 1, many_ports(2, false), &["192.0.2.1"], &[])];
    let (map, report) = translate(&few, &[], &[], &[], Limits { ns_ports: 1, ..Limits::default() });
    assert!(report.left_out.contains_key("prod/few"));
    let at = |port| ServicePort { ip: v4(192, 0, 2, 1), proto: 6, port };
    let cluster = ServicePort { ip: cluster_ip(1), proto: 0, port: 0 };
    assert_eq!(map.closing[0].keys, [cluster, at(1), at(2)], "within the bound: by port");
    let lifted =
        Limits { ports: usize::MAX, backends: usize::MAX, ns_ports: usize::MAX, ns_backends: usize::MAX };
    let (map, _) = translate(&big, &[], &[], &[], lifted);
    let keys: usize = map.closing.iter().map(|c| c.keys.len()).sum();
    assert_eq!(keys, 5000 * 32 + 1, "the control: every port at every external address");
}

/// A left-out Service's node ports (and its ports at a node's address)
/// are closed one by one only within the bound: past it they are counted
/// as not closed, and what is held stays bounded; the control, within
/// the bound, closes them.
#[test]
fn a_left_out_services_ports_closed_one_by_one_stay_within_a_bound() {
    let node = objects::node(&json!({"metadata": {"name": "a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "172.16.0.1"}]}}))
    .unwrap();
    let big = vec![ext("prod", "big", 1, many_ports(600, true), &["172.16.0.1"], &[])];
    let small = Limits { ports: 1000, ns_ports: 10, ..Limits::default() };
    let (map, report) = translate(&big, &[], std::slice::from_ref(&node), &[], small);
    assert!(report.left_out.contains_key("prod/big"));
    assert_eq!(report.unclosed_ports["prod/big"], 1200, "{report:?}");
    assert_eq!(map.closing[0].keys, [ServicePort { ip: cluster_ip(1), proto: 0, port: 0 }]);
    let roomy = Limits { ports: 2000, ns_ports: 10, ..Limits::default() };
    let (map, report) = translate(&big, &[], &[node], &[], roomy);
    assert!(report.unclosed_ports.is_empty());
    assert_eq!(map.closing[0].keys.len(), 1201, "the control: each node port and port at the node");
}
