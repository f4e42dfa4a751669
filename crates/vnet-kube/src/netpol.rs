//! NetworkPolicy (networking.k8s.io/v1) to vnet's isolation
//! ([`vnet_core::policy::isolation`]): a pure function of the cluster's
//! pods, namespaces and NetworkPolicies, as the watch holds them.
//!
//! Kubernetes' meaning, kept whole:
//! - a policy selects pods of its own namespace (`podSelector`, `{}`: all
//!   of them); it isolates them for ingress, egress or both as its
//!   `policyTypes` say (left out: `Ingress`, and `Egress` too when it has
//!   `egress` rules); a pod no policy selects is not isolated;
//! - an isolated pod's allowed traffic is the union of the rules of every
//!   policy selecting it in that direction; a rule's peers (`from`, `to`;
//!   left out or empty: everyone) are pods by `podSelector` in the
//!   policy's namespace, by `namespaceSelector` in the selected
//!   namespaces, by both in one peer (those pods of those namespaces), or
//!   an `ipBlock` minus its `except`; its ports (left out or empty: all)
//!   are a protocol (TCP unless said) with a number, a range to `endPort`,
//!   a name (each destination pod's container port of that name and
//!   protocol), or none (every port);
//! - pods on the host's network are neither selected nor peers (their
//!   address is the node's); pods without an address yet, or that ended,
//!   neither.
//!
//! Bounded: at most [`Limits`]' policies, rules and peer addresses; a
//! policy past them, or one that cannot be read (an unknown selector
//! operator, protocol or port), isolates the pods it selects in its
//! directions and allows them nothing (closed, never open), and is named
//! in the [`Report`] with why.

use crate::objects::{
    Labels, Namespace, NetworkPolicy, PeerSpec, Pod, PortRef, PortSpec, RuleSpec, Selector,
};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use vnet_core::policy::isolation::{Allow, Isolation, Peer, PortMatch, Ports};

/// How much one translation may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// NetworkPolicies taken (the rest refused).
    pub policies: usize,
    /// Ingress and egress rules, all policies together.
    pub rules: usize,
    /// Addresses held by the pod peers of all rules together.
    pub peer_addrs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { policies: 4096, rules: 16384, peer_addrs: 1 << 20 }
    }
}

/// Why a policy was not taken whole.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("selector: unknown operator `{0}`")]
    Operator(String),
    #[error("selector: operator `{0}` needs values")]
    NoValues(String),
    #[error("unknown protocol `{0}`")]
    Protocol(String),
    #[error("port {0}: not a port (1-65535)")]
    Port(i64),
    #[error("endPort {0}: not a port at or above `port`")]
    EndPort(i64),
    #[error("endPort with a named port or none")]
    EndPortAlone,
    #[error("ipBlock `{0}`: not a prefix")]
    Block(String),
    #[error("ipBlock with a pod or namespace selector")]
    BlockWithSelector,
    #[error("past the limit of {0} policies")]
    TooManyPolicies(usize),
    #[error("past the limit of {0} rules")]
    TooManyRules(usize),
    #[error("past the limit of {0} peer addresses")]
    TooManyAddrs(usize),
}

/// What a translation did, for `show policy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub policies: usize,
    pub rules: usize,
    pub isolated_ingress: usize,
    pub isolated_egress: usize,
    pub peer_addrs: usize,
    /// Each policy not taken whole, and why (it isolates and allows
    /// nothing).
    pub refused: BTreeMap<String, String>,
}

/// Whether `labels` meet `sel`.
pub fn selects(sel: &Selector, labels: &Labels) -> Result<bool, Refused> {
    if !sel.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return Ok(false);
    }
    for r in &sel.match_expressions {
        let have = labels.get(&r.key);
        let ok = match r.operator.as_str() {
            "In" | "NotIn" if r.values.is_empty() => return Err(Refused::NoValues(r.operator.clone())),
            "In" => have.is_some_and(|v| r.values.contains(v)),
            "NotIn" => !have.is_some_and(|v| r.values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            op => return Err(Refused::Operator(op.to_string())),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn prefix(s: &str) -> Result<(IpAddr, u8), Refused> {
    let bad = || Refused::Block(s.to_string());
    let (a, l) = s.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = a.parse().map_err(|_| bad())?;
    let len: u8 = l.parse().map_err(|_| bad())?;
    if len > if ip.is_ipv4() { 32 } else { 128 } {
        return Err(bad());
    }
    // Kubernetes takes host bits in a CIDR (validation only warns): the
    // prefix is what it means.
    let net = match ip {
        IpAddr::V4(v) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            IpAddr::V4((u32::from(v) & m).into())
        }
        IpAddr::V6(v) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            IpAddr::V6((u128::from(v) & m).into())
        }
    };
    Ok((net, len))
}

/// The cluster as the watch holds it, and what is built from it.
struct Ctx<'a> {
    pods: &'a [Pod],
    namespaces: FxHashMap<&'a str, &'a Labels>,
    /// Each (name, protocol)'s numbers by pod address, shared.
    named: FxHashMap<(String, u8), Arc<FxHashMap<IpAddr, u16>>>,
    limits: Limits,
    rules: usize,
    addrs: usize,
}

impl Ctx<'_> {
    /// Pods that can be selected or be peers: not on the host's network,
    /// with an address.
    fn policy_pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.iter().filter(|p| !p.host_network && !p.ips.is_empty())
    }

    fn peer(&mut self, ns: &str, p: &PeerSpec) -> Result<Peer, Refused> {
        if let Some(b) = &p.ip_block {
            if p.pod_selector.is_some() || p.namespace_selector.is_some() {
                return Err(Refused::BlockWithSelector);
            }
            let except = b.except.iter().map(|e| prefix(e)).collect::<Result<_, _>>()?;
            return Ok(Peer::Block { net: prefix(&b.cidr)?, except });
        }
        let all = Selector::default();
        let pod_sel = p.pod_selector.as_ref().unwrap_or(&all);
        let mut set = FxHashSet::default();
        for pod in self.policy_pods() {
            let in_ns = match &p.namespace_selector {
                None => pod.namespace == ns,
                Some(s) => match self.namespaces.get(pod.namespace.as_str()) {
                    Some(labels) => selects(s, labels)?,
                    None => false,
                },
            };
            if in_ns && selects(pod_sel, &pod.labels)? {
                set.extend(pod.ips.iter().copied());
            }
        }
        self.addrs += set.len();
        if self.addrs > self.limits.peer_addrs {
            return Err(Refused::TooManyAddrs(self.limits.peer_addrs));
        }
        Ok(Peer::Addrs(Arc::new(set)))
    }

    fn port(&mut self, p: &PortSpec) -> Result<PortMatch, Refused> {
        let proto = crate::objects::protocol(p.protocol.as_deref())
            .ok_or_else(|| Refused::Protocol(p.protocol.clone().unwrap_or_default()))?;
        let number = |n: i64| u16::try_from(n).ok().filter(|&n| n > 0).ok_or(Refused::Port(n));
        let ports = match (&p.port, p.end_port) {
            (None, None) => Ports::All,
            (Some(PortRef::Number(n)), end) => {
                let lo = number(*n)?;
                let hi = match end {
                    None => lo,
                    Some(e) => number(e).ok().filter(|&e| e >= lo).ok_or(Refused::EndPort(e))?,
                };
                Ports::Range(lo, hi)
            }
            (Some(PortRef::Name(name)), None) => {
                let key = (name.clone(), proto);
                if !self.named.contains_key(&key) {
                    let map: FxHashMap<IpAddr, u16> = self
                        .policy_pods()
                        .flat_map(|pod| {
                            let port = pod.ports.iter().find(|np| np.name == *name && np.proto == proto);
                            port.map(|np| pod.ips.iter().map(move |ip| (*ip, np.port)))
                        })
                        .flatten()
                        .collect();
                    self.named.insert(key.clone(), Arc::new(map));
                }
                Ports::Named(self.named[&key].clone())
            }
            (_, Some(_)) => return Err(Refused::EndPortAlone),
        };
        Ok(PortMatch { proto, ports })
    }

    fn rules(&mut self, ns: &str, specs: &[RuleSpec]) -> Result<Vec<Allow>, Refused> {
        let mut out = Vec::with_capacity(specs.len());
        for r in specs {
            self.rules += 1;
            if self.rules > self.limits.rules {
                return Err(Refused::TooManyRules(self.limits.rules));
            }
            let peers = r.peers.iter().flatten().map(|p| self.peer(ns, p)).collect::<Result<_, _>>()?;
            let ports = r.ports.iter().flatten().map(|p| self.port(p)).collect::<Result<_, _>>()?;
            out.push(Allow { peers, ports, counters: Arc::default() });
        }
        Ok(out)
    }
}

/// The directions `policyTypes` isolate in: (ingress, egress).
pub fn directions(p: &NetworkPolicy) -> (bool, bool) {
    match &p.spec.policy_types {
        Some(t) => (t.iter().any(|t| t == "Ingress"), t.iter().any(|t| t == "Egress")),
        None => (true, p.spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}

/// Translates the cluster's NetworkPolicies (`policies`, any order) for
/// its `pods` and `namespaces`, within `limits`.
pub fn translate(
    pods: &[Pod],
    namespaces: &[Namespace],
    policies: &[NetworkPolicy],
    limits: Limits,
) -> (Isolation, Report) {
    let mut sorted: Vec<&NetworkPolicy> = policies.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut cx = Ctx {
        pods,
        namespaces: namespaces.iter().map(|n| (n.name.as_str(), &n.labels)).collect(),
        named: FxHashMap::default(),
        limits,
        rules: 0,
        addrs: 0,
    };
    let mut iso = Isolation::default();
    let mut report = Report::default();
    for (i, p) in sorted.into_iter().enumerate() {
        let (ingress, egress) = directions(p);
        let mut built = if i >= limits.policies {
            Err(Refused::TooManyPolicies(limits.policies))
        } else {
            let ns = p.namespace.as_str();
            let inn =
                if ingress { Some(cx.rules(ns, p.spec.ingress.as_deref().unwrap_or(&[]))) } else { None };
            let out = if egress { Some(cx.rules(ns, p.spec.egress.as_deref().unwrap_or(&[]))) } else { None };
            match (inn.transpose(), out.transpose()) {
                (Ok(a), Ok(b)) => Ok((a, b)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        };
        // The pods it selects: its namespace's, by its selector.
        let mut selected = Vec::new();
        for pod in cx.policy_pods().filter(|pod| pod.namespace == p.namespace) {
            match selects(&p.spec.pod_selector, &pod.labels) {
                Ok(true) => selected.extend(pod.ips.iter().copied()),
                Ok(false) => {}
                Err(e) => {
                    built = Err(e);
                    // Closed: a selector that cannot be read selects nothing
                    // (it cannot say whom to isolate).
                    selected.clear();
                    break;
                }
            }
        }
        let (inn, out) = built.unwrap_or_else(|e| {
            report.refused.insert(p.id(), e.to_string());
            (ingress.then(Vec::new), egress.then(Vec::new))
        });
        let index = iso.policies.len() as u32;
        for ip in &selected {
            if inn.is_some() {
                iso.ingress_of.entry(*ip).or_default().push(index);
            }
            if out.is_some() {
                iso.egress_of.entry(*ip).or_default().push(index);
            }
        }
        report.rules += inn.as_ref().map_or(0, Vec::len) + out.as_ref().map_or(0, Vec::len);
        iso.policies.push(vnet_core::policy::isolation::Policy {
            name: p.id(),
            ingress: inn,
            egress: out,
            denied: Arc::default(),
        });
    }
    report.policies = iso.policies.len();
    report.isolated_ingress = iso.ingress_of.len();
    report.isolated_egress = iso.egress_of.len();
    report.peer_addrs = cx.addrs;
    (iso, report)
}

#[cfg(test)]
mod tests;
