//! Services to the backends NetworkPolicy judges in their place
//! ([`vnet_core::policy::isolation`]'s `services`, `backends`, `nodes` and
//! `closed`): each address, protocol and port a pod may reach a Service
//! at (its cluster addresses, its `externalIPs` and load balancer
//! addresses at its ports, and every node's address at its node ports),
//! with the addresses and target ports of the endpoints kube-proxy may
//! pick for it (its EndpointSlices' ready endpoints, or when none is ready
//! its serving ones, as kube-proxy falls back to terminating endpoints).
//!
//! A Service port's target port on an endpoint is the number of the
//! EndpointSlice's port of the same name and protocol (the Service port's
//! name; a lone port's is empty): the EndpointSlice controller writes it,
//! a numeric `targetPort` as it is, a named one resolved in each pod (pods
//! whose container ports differ land in different slices).
//!
//! An external or load balancer address that would shadow something is
//! dropped (counted in [`Report::dropped_addresses`]): a pod's, a cluster
//! address, one no single host has elsewhere (unspecified, loopback,
//! link-local, multicast, broadcast). Two Services at one key: both
//! Services' backends, merged.
//!
//! Bounded: at most [`Limits`]' Service ports and backends, in all and
//! in one namespace, taken in turns (each namespace's first Service, then
//! each one's second, ...), so one namespace cannot starve the others; a
//! Service's keys counted before any is built. A Service not translated
//! (past the bounds, a port without a backend known, an SCTP port: vnet
//! reads no SCTP port) is denied where its destination may be isolated
//! ([`install`]): closed, never open; one left out at its cluster
//! addresses (every port), its other addresses and node ports by port
//! within a bound (past it: an external address whole, a node's not).

use crate::objects::{EndpointSlice, Node, Pod, Service};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use vnet_core::policy::isolation::{node_port, Isolation, Policy, ServicePort};

/// SCTP's protocol number.
const PROTO_SCTP: u8 = 132;

/// How much one translation of Services may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Address, protocol and port triples.
    pub ports: usize,
    /// Backends, all of them together.
    pub backends: usize,
    /// The same, of one namespace's Services.
    pub ns_ports: usize,
    pub ns_backends: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { ports: 1 << 16, backends: 1 << 20, ns_ports: 1 << 12, ns_backends: 1 << 16 }
    }
}

/// What a translation of Services did, for `show policy json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub services: usize,
    pub ports: usize,
    pub backends: usize,
    /// Node addresses (NodePorts are judged at each).
    pub nodes: usize,
    /// Services left out (past the bounds, or with SCTP ports), and why.
    pub left_out: BTreeMap<String, String>,
    /// Services with a port without a backend known.
    pub without_backends: usize,
    /// External and load balancer addresses dropped, by Service: past
    /// [`crate::objects::MAX_EXTERNAL_IPS`], or a pod's, a cluster
    /// address, unspecified, loopback, link-local, multicast.
    pub dropped_addresses: BTreeMap<String, usize>,
    /// Left-out Services' node ports (and ports at a node's address) not
    /// closed: past the bound of what is closed by port.
    pub unclosed_ports: BTreeMap<String, usize>,
}

/// Why a Service (or part of it) is not translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Untranslated {
    /// Past the bounds.
    LeftOut,
    /// A port without a ready or serving backend known (its slices not
    /// seen yet, or none): denied wherever anything is isolated.
    NoBackends,
    /// SCTP ports, whose numbers vnet does not read.
    Sctp,
}

impl Untranslated {
    /// The name of the policy counting what it denies (`show policy`).
    pub fn policy_name(self) -> &'static str {
        match self {
            Untranslated::LeftOut => "(Service left out: past the bounds)",
            Untranslated::NoBackends => "(Service without backends)",
            Untranslated::Sctp => "(Service SCTP port)",
        }
    }
}

/// A Service, or part of it, not translated: denied at `keys` (isolation's
/// `closed` keys) where its destination may be isolated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closing {
    pub namespace: String,
    pub why: Untranslated,
    pub keys: Vec<ServicePort>,
    /// Its backends' addresses, as far as known.
    pub backends: Vec<IpAddr>,
}

/// A Service's key and its backends (address, target port).
type Entry = (ServicePort, Vec<(IpAddr, u16)>);

/// The engine's map: each Service port's backends, and every backend.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Map {
    pub services: FxHashMap<ServicePort, Vec<(IpAddr, u16)>>,
    pub backends: FxHashSet<ServicePort>,
    pub nodes: FxHashSet<IpAddr>,
    /// What was not translated, for [`install`].
    pub closing: Vec<Closing>,
}

/// The backends of `svc`'s port `p` for addresses of `ip`'s family, from
/// its `slices`: ready endpoints, or serving ones when none is ready.
fn port_backends(
    ip: IpAddr,
    p: &crate::objects::ServicePort,
    slices: &[&EndpointSlice],
) -> Vec<(IpAddr, u16)> {
    let pick = |want: fn(&crate::objects::Endpoint) -> bool| {
        let mut out = Vec::new();
        for s in slices {
            let Some(sp) = s.ports.iter().find(|sp| sp.name == p.name && sp.proto == p.proto) else {
                continue;
            };
            for e in s.endpoints.iter().filter(|e| want(e)) {
                out.extend(e.ips.iter().filter(|a| a.is_ipv4() == ip.is_ipv4()).map(|a| (*a, sp.port)));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    };
    let ready = pick(|e| e.ready);
    if ready.is_empty() {
        pick(|e| e.serving)
    } else {
        ready
    }
}

/// The key that closes `k` of `svc`: every packet to a cluster address
/// (no other Service has it), or the address (the unspecified one: a node
/// port), protocol and port (SCTP's: 0, vnet reads none) of another.
fn closed_key(svc: &Service, k: ServicePort) -> ServicePort {
    if svc.cluster_ips.contains(&k.ip) {
        return ServicePort { ip: k.ip, proto: 0, port: 0 };
    }
    ServicePort { port: if k.proto == PROTO_SCTP { 0 } else { k.port }, ..k }
}

/// One Service's keys with their backends (`entries`), and what of it is
/// not translated (SCTP ports; ports without a backend), at its cluster
/// addresses and `external` ones (already checked); each port's backends
/// found once for each family.
fn service_entries(
    svc: &Service,
    external: &[IpAddr],
    slices: &[&EndpointSlice],
) -> (Vec<Entry>, Vec<Closing>) {
    let addrs: Vec<IpAddr> = svc.cluster_ips.iter().chain(external).copied().collect();
    let (mut entries, mut empty, mut sctp) = (Vec::new(), Vec::new(), Vec::new());
    let mut sctp_backends = Vec::new();
    let v4 = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let v6 = IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);
    for p in &svc.ports {
        let (b4, b6) = (port_backends(v4, p, slices), port_backends(v6, p, slices));
        let mut keys: Vec<(ServicePort, IpAddr)> =
            addrs.iter().map(|&ip| (ServicePort { ip, proto: p.proto, port: p.port }, ip)).collect();
        if p.node_port != 0 {
            for ip in &svc.cluster_ips {
                keys.push((node_port(*ip, p.proto, p.node_port), *ip));
            }
        }
        for (key, ip) in keys {
            let backends = if ip.is_ipv4() { &b4 } else { &b6 };
            if p.proto == PROTO_SCTP {
                sctp_backends.extend(backends.iter().map(|b| b.0));
                sctp.push(closed_key(svc, key));
            } else if backends.is_empty() {
                empty.push(closed_key(svc, key));
            } else {
                entries.push((key, backends.clone()));
            }
        }
    }
    let mut closing = Vec::new();
    for (why, mut keys, backends) in
        [(Untranslated::NoBackends, empty, vec![]), (Untranslated::Sctp, sctp, sctp_backends)]
    {
        if !keys.is_empty() {
            keys.sort_unstable();
            keys.dedup();
            closing.push(Closing { namespace: svc.namespace.clone(), why, keys, backends });
        }
    }
    (entries, closing)
}

/// How many keys `svc` makes at its cluster addresses and `external` ones,
/// counted before any is built.
fn key_count(svc: &Service, external: usize) -> usize {
    let per_port = svc.cluster_ips.len().saturating_add(external);
    let node_ports = svc.ports.iter().filter(|p| p.node_port != 0).count();
    svc.ports.len().saturating_mul(per_port).saturating_add(node_ports.saturating_mul(svc.cluster_ips.len()))
}

/// Whether `a` is an address no external or load balancer address may be:
/// one that is not a single host's elsewhere (unspecified, loopback,
/// link-local, multicast, broadcast), a pod's, or a cluster address.
fn refused_external(a: IpAddr, taken: &FxHashSet<IpAddr>) -> bool {
    let special = match a {
        IpAddr::V4(v) => v.is_link_local() || v.is_broadcast(),
        IpAddr::V6(v) => v.segments()[0] & 0xffc0 == 0xfe80,
    };
    special || a.is_unspecified() || a.is_loopback() || a.is_multicast() || taken.contains(&a)
}

/// `services` in turns: each namespace's first (by name), then each
/// one's second, and so on.
fn in_turns(services: &[Service]) -> Vec<&Service> {
    let mut sorted: Vec<&Service> = services.iter().filter(|s| !s.cluster_ips.is_empty()).collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut turn: FxHashMap<&str, usize> = FxHashMap::default();
    let mut ranked: Vec<(usize, &Service)> = sorted
        .into_iter()
        .map(|s| {
            let t = turn.entry(s.namespace.as_str()).or_default();
            *t += 1;
            (*t, s)
        })
        .collect();
    ranked.sort_by(|a, b| (a.0, &a.1.namespace).cmp(&(b.0, &b.1.namespace)));
    ranked.into_iter().map(|(_, s)| s).collect()
}

/// Ports and backends held, in all and by namespace; what Services left
/// out may still close by port.
#[derive(Default)]
struct Held<'a> {
    ports: usize,
    backends: usize,
    closed: usize,
    by_ns: FxHashMap<&'a str, (usize, usize)>,
}

impl<'a> Held<'a> {
    /// Whether `ports` and `backends` for namespace `ns` stay within
    /// `limits`, or which bound they pass.
    fn check(&self, ns: &str, ports: usize, backends: usize, limits: Limits) -> Result<(), String> {
        let n = self.by_ns.get(ns).copied().unwrap_or_default();
        if n.0.saturating_add(ports) > limits.ns_ports {
            return Err(format!("past the limit of {} Service ports in a namespace", limits.ns_ports));
        }
        if n.1.saturating_add(backends) > limits.ns_backends {
            return Err(format!("past the limit of {} backends in a namespace", limits.ns_backends));
        }
        if self.ports.saturating_add(ports) > limits.ports {
            return Err(format!("past the limit of {} Service ports", limits.ports));
        }
        if self.backends.saturating_add(backends) > limits.backends {
            return Err(format!("past the limit of {} backends", limits.backends));
        }
        Ok(())
    }

    /// Takes `ports` and `backends` for namespace `ns` within `limits`, or
    /// says which bound it passes.
    fn take(&mut self, ns: &'a str, ports: usize, backends: usize, limits: Limits) -> Result<(), String> {
        self.check(ns, ports, backends, limits)?;
        let n = self.by_ns.entry(ns).or_default();
        *n = (n.0 + ports, n.1 + backends);
        self.ports += ports;
        self.backends += backends;
        Ok(())
    }
}

/// Translates `services` (any order) with their `slices`, the `nodes`'
/// addresses and the `pods` (whose addresses no Service's external or load
/// balancer address may take), within `limits`.
pub fn translate(
    services: &[Service],
    slices: &[EndpointSlice],
    nodes: &[Node],
    pods: &[Pod],
    limits: Limits,
) -> (Map, Report) {
    let mut by_service: FxHashMap<(&str, &str), Vec<&EndpointSlice>> = FxHashMap::default();
    for s in slices.iter().filter(|s| !s.service.is_empty()) {
        by_service.entry((s.namespace.as_str(), s.service.as_str())).or_default().push(s);
    }
    let mut map =
        Map { nodes: nodes.iter().flat_map(|n| n.addresses.iter().copied()).collect(), ..Map::default() };
    let mut report = Report { nodes: map.nodes.len(), ..Report::default() };
    // What no external or load balancer address may be: a pod's (a host
    // network pod's is its node's), a cluster address.
    let mut taken: FxHashSet<IpAddr> =
        pods.iter().filter(|p| !p.host_network).flat_map(|p| p.ips.iter().copied()).collect();
    taken.extend(services.iter().flat_map(|s| s.cluster_ips.iter().copied()));
    let mut held = Held { closed: limits.ports, ..Held::default() };
    let none = Vec::new();
    for svc in in_turns(services) {
        let id = format!("{}/{}", svc.namespace, svc.name);
        let external: Vec<IpAddr> =
            svc.external_ips.iter().copied().filter(|&a| !refused_external(a, &taken)).collect();
        let dropped = svc.external_over + (svc.external_ips.len() - external.len());
        if dropped > 0 {
            report.dropped_addresses.insert(id.clone(), dropped);
        }
        let keys = key_count(svc, external.len());
        if let Err(why) = held.check(&svc.namespace, keys, 0, limits) {
            leave_out(&mut map, &mut report, &mut held, (svc, &external), (id, why), Vec::new());
            continue;
        }
        let slices = by_service.get(&(svc.namespace.as_str(), svc.name.as_str())).unwrap_or(&none);
        let (entries, closing) = service_entries(svc, &external, slices);
        let count: usize = entries.iter().map(|(_, b)| b.len()).sum();
        if let Err(why) = held.take(&svc.namespace, keys, count, limits) {
            let backends = entries.iter().flat_map(|(_, b)| b.iter().map(|b| b.0)).collect();
            leave_out(&mut map, &mut report, &mut held, (svc, &external), (id, why), backends);
            continue;
        }
        for c in &closing {
            match c.why {
                Untranslated::Sctp => {
                    report.left_out.insert(id.clone(), "SCTP ports (vnet reads no SCTP port)".into());
                }
                _ => report.without_backends += 1,
            }
        }
        map.closing.extend(closing);
        report.services += 1;
        report.ports += entries.len();
        report.backends += count;
        for (key, backends) in entries {
            map.backends.extend(backends.iter().map(|&(ip, port)| ServicePort {
                ip,
                proto: key.proto,
                port,
            }));
            // Two Services at one key (external addresses): every backend
            // of both must admit, whichever came first.
            let held = map.services.entry(key).or_default();
            held.extend(backends);
            held.sort_unstable();
            held.dedup();
        }
    }
    (map, report)
}

/// Leaves `svc` (with its checked `external` addresses) out, named `id`
/// (`why`): closed at each of its cluster addresses whole, at its external
/// addresses and node ports by port as long as what is closed by port
/// stays within the budget (`held.closed`). Past it, an external address
/// is closed whole, but a node's (and the node ports) is not closed:
/// counted in `report.unclosed_ports`.
fn leave_out(
    map: &mut Map,
    report: &mut Report,
    held: &mut Held<'_>,
    (svc, external): (&Service, &[IpAddr]),
    (id, why): (String, String),
    backends: Vec<IpAddr>,
) {
    let port = |p: &crate::objects::ServicePort| if p.proto == PROTO_SCTP { 0 } else { p.port };
    let whole = |ip| ServicePort { ip, proto: 0, port: 0 };
    let mut keys: Vec<ServicePort> = svc.cluster_ips.iter().map(|&ip| whole(ip)).collect();
    let mut by_port: Vec<ServicePort> = Vec::new();
    for &ip in external {
        by_port.extend(svc.ports.iter().map(|p| ServicePort { ip, proto: p.proto, port: port(p) }));
    }
    for p in svc.ports.iter().filter(|p| p.node_port != 0) {
        by_port.extend(svc.cluster_ips.iter().map(|ip| node_port(*ip, p.proto, p.node_port)));
    }
    by_port.sort_unstable();
    by_port.dedup();
    if by_port.len() <= held.closed {
        held.closed -= by_port.len();
        keys.extend(by_port);
    } else {
        keys.extend(external.iter().filter(|a| !map.nodes.contains(a)).map(|&ip| whole(ip)));
        let unclosed = by_port.iter().filter(|k| k.ip.is_unspecified() || map.nodes.contains(&k.ip)).count();
        if unclosed > 0 {
            report.unclosed_ports.insert(id.clone(), unclosed);
        }
    }
    keys.sort_unstable();
    keys.dedup();
    map.closing.push(Closing {
        namespace: svc.namespace.clone(),
        why: Untranslated::LeftOut,
        keys,
        backends,
    });
    report.left_out.insert(id, why);
}

/// Puts `map` into `iso` (translated from `pods`, whose NetworkPolicies
/// it holds): the Services, and the ones not translated closed where
/// their destination may be isolated for ingress (one of their backends
/// known, or any pod of their namespace; a port without a backend
/// wherever anything is), each reason counted by a policy of its own
/// ([`Untranslated::policy_name`]). Returns how many were closed.
pub fn install(iso: &mut Isolation, map: Map, pods: &[Pod]) -> usize {
    iso.services = map.services;
    iso.backends = map.backends;
    iso.nodes = map.nodes;
    if iso.is_empty() {
        return 0;
    }
    let isolated: FxHashSet<&str> = pods
        .iter()
        .filter(|p| p.ips.iter().any(|a| iso.ingress_of.contains_key(a)))
        .map(|p| p.namespace.as_str())
        .collect();
    let mut by_why: BTreeMap<Untranslated, u32> = BTreeMap::new();
    let mut closed = 0;
    for c in map.closing {
        let close = c.why == Untranslated::NoBackends
            || isolated.contains(c.namespace.as_str())
            || c.backends.iter().any(|b| iso.ingress_of.contains_key(b));
        if !close {
            continue;
        }
        let policy = *by_why.entry(c.why).or_insert_with(|| {
            iso.policies.push(Policy {
                name: c.why.policy_name().to_string(),
                ingress: Some(Vec::new()),
                egress: None,
                denied: Arc::default(),
            });
            u32::try_from(iso.policies.len() - 1).unwrap_or(u32::MAX)
        });
        closed += 1;
        for k in c.keys {
            iso.closed.entry(k).or_insert(policy);
        }
    }
    closed
}

#[cfg(test)]
mod tests;
