//! Services (ClusterIP) to the backends NetworkPolicy judges in their
//! place ([`vnet_core::policy::isolation`]'s `services` and `backends`):
//! each cluster address, protocol and port of a Service, with the
//! addresses and target ports of the endpoints kube-proxy may pick for it
//! (its EndpointSlices' ready endpoints, or when none is ready its serving
//! ones, as kube-proxy falls back to terminating endpoints).
//!
//! A Service port's target port on an endpoint is the number of the
//! EndpointSlice's port of the same name and protocol (the Service port's
//! name; a lone port's is empty): the EndpointSlice controller writes it,
//! a numeric `targetPort` as it is, a named one resolved in each pod (pods
//! whose container ports differ land in different slices).
//!
//! Bounded: at most [`Limits`]' Service ports and backends; a Service
//! past them is left out (named in the [`Report`]): a packet to it is
//! judged as sent (against its cluster address) and its translated second
//! leg as from the translating node's address, which an isolated backend
//! does not take (closed, never open).

use crate::objects::{EndpointSlice, Service};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use std::net::IpAddr;
use vnet_core::policy::isolation::ServicePort;

/// How much one translation of Services may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Cluster address, protocol and port triples.
    pub ports: usize,
    /// Backends, all of them together.
    pub backends: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { ports: 1 << 16, backends: 1 << 20 }
    }
}

/// What a translation of Services did, for `show policy json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub services: usize,
    pub ports: usize,
    pub backends: usize,
    /// Services left out, and why.
    pub left_out: BTreeMap<String, String>,
}

/// The engine's map: each Service port's backends, and every backend.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Map {
    pub services: FxHashMap<ServicePort, Vec<(IpAddr, u16)>>,
    pub backends: FxHashSet<ServicePort>,
}

/// The backends of `svc`'s port `p` on cluster address `ip`, from its
/// `slices`: ready endpoints, or serving ones when none is ready.
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

/// Translates `services` (any order) with their `slices`, within `limits`.
pub fn translate(services: &[Service], slices: &[EndpointSlice], limits: Limits) -> (Map, Report) {
    let mut by_service: FxHashMap<(&str, &str), Vec<&EndpointSlice>> = FxHashMap::default();
    for s in slices.iter().filter(|s| !s.service.is_empty()) {
        by_service.entry((s.namespace.as_str(), s.service.as_str())).or_default().push(s);
    }
    let mut sorted: Vec<&Service> = services.iter().filter(|s| !s.cluster_ips.is_empty()).collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut map = Map::default();
    let mut report = Report::default();
    let none = Vec::new();
    for svc in sorted {
        let slices = by_service.get(&(svc.namespace.as_str(), svc.name.as_str())).unwrap_or(&none);
        let mut entries = Vec::new();
        for ip in &svc.cluster_ips {
            for p in &svc.ports {
                let key = ServicePort { ip: *ip, proto: p.proto, port: p.port };
                entries.push((key, port_backends(*ip, p, slices)));
            }
        }
        let count: usize = entries.iter().map(|(_, b)| b.len()).sum();
        let id = format!("{}/{}", svc.namespace, svc.name);
        if report.ports + entries.len() > limits.ports {
            report.left_out.insert(id, format!("past the limit of {} Service ports", limits.ports));
            continue;
        }
        if report.backends + count > limits.backends {
            report.left_out.insert(id, format!("past the limit of {} backends", limits.backends));
            continue;
        }
        report.services += 1;
        report.ports += entries.len();
        report.backends += count;
        for (key, backends) in entries {
            map.backends.extend(backends.iter().map(|&(ip, port)| ServicePort {
                ip,
                proto: key.proto,
                port,
            }));
            map.services.insert(key, backends);
        }
    }
    (map, report)
}

#[cfg(test)]
mod tests;
