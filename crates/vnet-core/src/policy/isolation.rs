//! Isolation as Kubernetes' NetworkPolicy means it (networking.k8s.io/v1),
//! beside a network's own rules: an endpoint (a pod, by its addresses)
//! that a policy selects for ingress is isolated for ingress, and then
//! receives only what one of the ingress rules of the policies selecting
//! it allows; likewise for egress, with the egress rules. An endpoint no
//! policy selects for a direction is not isolated in it: nothing is
//! denied by default. A packet passes when both its sender's egress and
//! its receiver's ingress allow it (each only if isolated), and the
//! network's own rules too ([`super::PolicySet::decide`]).
//!
//! Endpoints are matched by IP address, as Kubernetes does (a Service's
//! backend is a pod address; port security and the IP source guard tie a
//! pod's addresses to its interface). What is not IP (ARP, other
//! EtherTypes) and ICMPv6 other than echo and errors (neighbour and router
//! discovery) is not a NetworkPolicy's: it passes this check. Further
//! packets, replies, later fragments and ICMP errors of an allowed flow
//! pass by state, as for the rules. Packets from or to one of `exempt`'s
//! addresses (the node's own, its address on the pods' LAN included: a
//! pod cannot block its own node, as Kubernetes says) pass this check too.
//!
//! Services: a pod's packet to a Service's address and port
//! ([`Isolation::services`]: its cluster, external and load balancer
//! addresses; at a node's address (one of [`Isolation::nodes`]) its node
//! ports, keyed by the unspecified address of the family; this node's
//! own addresses and the translators are nodes' too) is judged on
//! this first leg, where its true source is known, as if the pod had sent
//! it to each of the Service's backends (its address and target port): it
//! passes only when the sender's egress and every backend's ingress allow
//! it (kube-proxy picks the backend after this check); a Service with no
//! backend is denied. A Service the control plane could not translate
//! (past its bounds, without backends, SCTP) whose destination may be
//! isolated is in [`Isolation::closed`]: denied, counted by the policy it
//! names. A destination that is an isolated pod's address is judged as
//! that pod, never as a Service's (an external address given a pod's
//! would shadow its policy). These come before the node's exemption: a
//! pod reaching a NodePort at its own node's address is judged too. The second leg, from
//! the translating node's address to the backend it picked, passes the
//! check when that address is one of `translators` (the other nodes'
//! addresses on the pods' LAN) and the destination one of `backends` (a
//! Service's backend address, protocol and target port): it was judged at
//! its source.
//!
//! IPv6 link-local addresses: isolation is keyed by the pods' addresses
//! (`status.podIPs`), which never hold a pod's `fe80::` address; without
//! more, a connection to a pod's link-local address (or from it) met no
//! entry and passed an isolated pod's default deny. A [`LinkLocals`] map,
//! built by the control plane from the `neigh` table (each pod's address
//! with its MAC), gives each pod's link-local address (modified EUI-64 of
//! its MAC: the only `fe80::` address the IP source guard lets a guarded
//! port send from) its pod's address, and the check judges it as that
//! address: its ingress and egress entries, its place among a rule's pod
//! peers and named ports. A Service or translator is never a link-local
//! address: those are met as sent.
//!
//! Sans-IO: built by the control plane (vnetd's NetworkPolicy watch),
//! asked by [`super::PolicySet::decide`] for the first packet of a flow.

use super::prefix::in_prefix;
use crate::stats::Counters;
use rustc_hash::{FxHashMap, FxHashSet};
use std::net::IpAddr;
use std::sync::Arc;
use vnet_wire::classify::{Facts, Icmp, Ip, L3};
use vnet_wire::ip::{PROTO_TCP, PROTO_UDP};
use vnet_wire::MacAddr;

/// ICMPv6's protocol number.
const PROTO_ICMPV6: u8 = 58;

/// The other end of a rule's packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Pods' addresses (a pod and a namespace selector's, resolved).
    Addrs(Arc<FxHashSet<IpAddr>>),
    /// An `ipBlock`: a prefix and the prefixes taken out of it.
    Block { net: (IpAddr, u8), except: Vec<(IpAddr, u8)> },
}

impl Peer {
    fn matches(&self, ip: IpAddr) -> bool {
        match self {
            Peer::Addrs(set) => set.contains(&ip),
            Peer::Block { net, except } => {
                in_prefix(ip, net.0, net.1) && !except.iter().any(|&(n, l)| in_prefix(ip, n, l))
            }
        }
    }
}

/// The destination ports a rule allows, of one protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// Every port (a `port` left out), and for a protocol without ports,
    /// every packet of it.
    All,
    /// A range, inclusive (`port`, and `endPort`).
    Range(u16, u16),
    /// A named port: its number in each destination pod that has one of
    /// that name and protocol, by the pod's address.
    Named(Arc<FxHashMap<IpAddr, u16>>),
}

/// One `ports` entry of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMatch {
    pub proto: u8,
    pub ports: Ports,
}

impl PortMatch {
    fn matches(&self, ip: &Ip) -> bool {
        if ip.proto != self.proto {
            return false;
        }
        let has_ports = matches!(ip.proto, PROTO_TCP | PROTO_UDP);
        match &self.ports {
            Ports::All => true,
            Ports::Range(lo, hi) => has_ports && (*lo..=*hi).contains(&ip.dport),
            Ports::Named(by_pod) => has_ports && by_pod.get(&ip.dst) == Some(&ip.dport),
        }
    }
}

/// One ingress or egress rule of a policy: what it allows to (egress)
/// or from (ingress) its selected pods.
#[derive(Debug)]
pub struct Allow {
    /// Any of these (none: every peer).
    pub peers: Vec<Peer>,
    /// Any of these (none: every protocol and port).
    pub ports: Vec<PortMatch>,
    /// The first packets it met (allowed here; the other end may still
    /// deny them).
    pub counters: Arc<Counters>,
}

impl Allow {
    /// Whether it allows `ip` with the peer's address `peer`.
    fn matches(&self, peer: IpAddr, ip: &Ip) -> bool {
        (self.peers.is_empty() || self.peers.iter().any(|p| p.matches(peer)))
            && (self.ports.is_empty() || self.ports.iter().any(|p| p.matches(ip)))
    }
}

/// One NetworkPolicy, compiled.
#[derive(Debug)]
pub struct Policy {
    /// `NAMESPACE/NAME`.
    pub name: String,
    /// Its ingress rules, when it isolates its pods for ingress
    /// (`policyTypes`); `Some(vec![])` allows nothing in.
    pub ingress: Option<Vec<Allow>>,
    pub egress: Option<Vec<Allow>>,
    /// First packets it isolated and no rule allowed (counted by the
    /// first policy isolating the pod in that direction).
    pub denied: Arc<Counters>,
}

/// Which of a packet's two checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

/// A network's NetworkPolicies, as the data path asks them.
#[derive(Debug, Default)]
pub struct Isolation {
    pub policies: Vec<Policy>,
    /// Each pod address isolated for ingress: the policies selecting it
    /// for ingress (indices in `policies`).
    pub ingress_of: FxHashMap<IpAddr, Vec<u32>>,
    pub egress_of: FxHashMap<IpAddr, Vec<u32>>,
    /// Addresses whose packets (either way) this check passes: the
    /// node's own.
    pub exempt: FxHashSet<IpAddr>,
    /// Each Service's address, protocol and port: the backends kube-proxy
    /// may pick for it (address, target port), judged in its place.
    pub services: FxHashMap<ServicePort, Vec<(IpAddr, u16)>>,
    /// Every backend of `services` (address, protocol, target port).
    pub backends: FxHashSet<ServicePort>,
    /// The addresses that translate Services (the other nodes' on the
    /// pods' LAN): their packets to a backend in `backends` pass, judged
    /// on their first leg.
    pub translators: FxHashSet<IpAddr>,
    /// The nodes' addresses, where `services`' node port keys (address
    /// unspecified) and `closed`'s apply.
    pub nodes: FxHashSet<IpAddr>,
    /// Services not translated, denied: a cluster address (protocol and
    /// port 0: every packet to it), another address, protocol and port
    /// (SCTP's port 0: vnet reads none), or a node port (the unspecified
    /// address of its family), with the policy in `policies` that counts
    /// what it denied.
    pub closed: FxHashMap<ServicePort, u32>,
}

/// The key of node port `port` (`proto`) for addresses of `ip`'s family.
pub fn node_port(ip: IpAddr, proto: u8, port: u16) -> ServicePort {
    let ip = match ip {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    };
    ServicePort { ip, proto, port }
}

/// Each pod's IPv6 link-local address (`fe80::/10`, from its MAC) and the
/// pod address it is judged as ([`Isolation::link_locals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkLocals(pub FxHashMap<IpAddr, IpAddr>);

impl LinkLocals {
    /// The address `ip` is judged as: its pod's, when it is a pod's
    /// link-local address; else itself (an IPv4 address costs one match).
    #[inline]
    pub fn judged_as(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v) if v.segments()[0] & 0xffc0 == 0xfe80 => self.0.get(&ip).copied().unwrap_or(ip),
            _ => ip,
        }
    }
}

/// A Service's (or a backend's) address, protocol and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePort {
    pub ip: IpAddr,
    pub proto: u8,
    pub port: u16,
}

/// Why the check denied a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    pub direction: Direction,
    /// The policy it is counted by.
    pub policy: usize,
}

impl Isolation {
    /// Whether anything is isolated at all.
    pub fn is_empty(&self) -> bool {
        self.ingress_of.is_empty() && self.egress_of.is_empty()
    }

    /// The check of a first packet (`f`, `len` bytes): both ends'
    /// isolation, counted (the rule that allowed it, or the policy that
    /// denied it).
    pub fn check(&self, f: &Facts, len: usize) -> Result<(), Denied> {
        self.check_with(f, &LinkLocals::default(), len, true)
    }

    /// [`Isolation::check`], counted only when `live` (a dry run's is not),
    /// with the pods' link-local addresses judged as their pods' (`ll`).
    /// A packet to a Service is judged for each of its backends (counted
    /// once for each).
    pub fn check_with(&self, f: &Facts, ll: &LinkLocals, len: usize, live: bool) -> Result<(), Denied> {
        let L3::Ip(ip) = f.l3 else { return Ok(()) };
        if ip.proto == PROTO_ICMPV6 && ip.icmp == Icmp::None {
            return Ok(());
        }
        if self.exempt.contains(&ip.src) {
            return Ok(());
        }
        let ported = matches!(ip.proto, PROTO_TCP | PROTO_UDP);
        let to = ServicePort { ip: ip.dst, proto: ip.proto, port: if ported { ip.dport } else { 0 } };
        // kube-proxy takes a node port at every address of its node: the
        // nodes' own, this node's (exempt) and the others' on the pods'
        // LAN (the translators).
        let at_node = self.nodes.contains(&ip.dst)
            || self.exempt.contains(&ip.dst)
            || self.translators.contains(&ip.dst);
        let node_key = node_port(ip.dst, to.proto, to.port);
        // An isolated pod's address is judged as that pod, never as a
        // Service's key (the control plane drops such external addresses;
        // this holds whatever it was given).
        let pod = self.ingress_of.contains_key(&ip.dst) || self.egress_of.contains_key(&ip.dst);
        let service = if ported && !pod { self.services.get(&to) } else { None };
        let service = service.or_else(|| if ported && at_node { self.services.get(&node_key) } else { None });
        if let Some(backends) = service {
            if backends.is_empty() {
                return Err(Denied { direction: Direction::Ingress, policy: usize::MAX });
            }
            for &(dst, dport) in backends {
                self.judge(&Ip { dst, dport, ..ip }, len, live)?;
            }
            return Ok(());
        }
        let closed = if pod { None } else { self.closed.get(&ServicePort { ip: ip.dst, proto: 0, port: 0 }) };
        let closed = closed.or_else(|| if pod { None } else { self.closed.get(&to) });
        if let Some(&policy) = closed.or_else(|| if at_node { self.closed.get(&node_key) } else { None }) {
            if let Some(p) = self.policies.get(policy as usize).filter(|_| live) {
                p.denied.add(len);
                p.denied.drop_one();
            }
            return Err(Denied { direction: Direction::Ingress, policy: policy as usize });
        }
        if self.exempt.contains(&ip.dst) {
            return Ok(());
        }
        if ported && self.translators.contains(&ip.src) && self.backends.contains(&to) {
            return Ok(());
        }
        let ip = Ip { src: ll.judged_as(ip.src), dst: ll.judged_as(ip.dst), ..ip };
        if self.exempt.contains(&ip.src) || self.exempt.contains(&ip.dst) {
            return Ok(());
        }
        self.judge(&ip, len, live)
    }

    /// Each pod's link-local address (the modified EUI-64 of its MAC) and
    /// the address it is judged as, from `owned`: each address with the
    /// MAC that owns it (the network's `neigh` table: vnet-cni's lines
    /// for its pods, the cluster's claims for the other nodes'). A MAC
    /// that owns several addresses (a dual-stack pod's, isolated alike) is
    /// judged as one of those isolated both ways, else for ingress, else
    /// for egress, else any: the lowest of the first kind it has, so
    /// never as an address that is not isolated while one of its own is.
    pub fn link_locals(&self, owned: impl IntoIterator<Item = (IpAddr, MacAddr)>) -> LinkLocals {
        let rank = |ip: &IpAddr| {
            let level = match (self.ingress_of.contains_key(ip), self.egress_of.contains_key(ip)) {
                (true, true) => 0,
                (true, false) => 1,
                (false, true) => 2,
                (false, false) => 3,
            };
            (level, *ip)
        };
        let mut best: FxHashMap<MacAddr, IpAddr> = FxHashMap::default();
        for (ip, mac) in owned {
            let e = best.entry(mac).or_insert(ip);
            if rank(&ip) < rank(e) {
                *e = ip;
            }
        }
        LinkLocals(
            best.into_iter().map(|(mac, ip)| (IpAddr::V6(vnet_wire::guard::link_local(mac)), ip)).collect(),
        )
    }

    /// The sender's egress, then the receiver's ingress.
    fn judge(&self, ip: &Ip, len: usize, live: bool) -> Result<(), Denied> {
        for (direction, own, peer) in
            [(Direction::Egress, ip.src, ip.dst), (Direction::Ingress, ip.dst, ip.src)]
        {
            let of = if direction == Direction::Egress { &self.egress_of } else { &self.ingress_of };
            let Some(selecting) = of.get(&own) else { continue };
            let rules = |i: &u32| {
                let p = self.policies.get(*i as usize)?;
                if direction == Direction::Egress {
                    p.egress.as_ref()
                } else {
                    p.ingress.as_ref()
                }
            };
            match selecting.iter().filter_map(rules).flatten().find(|a| a.matches(peer, ip)) {
                Some(a) if live => a.counters.add(len),
                Some(_) => {}
                None => {
                    let policy = selecting.first().map_or(0, |&i| i as usize);
                    if let Some(p) = self.policies.get(policy).filter(|_| live) {
                        p.denied.add(len);
                        p.denied.drop_one();
                    }
                    return Err(Denied { direction, policy });
                }
            }
        }
        Ok(())
    }

    /// Whether `o` isolates and allows exactly what `self` does (counters
    /// aside): a translation that changed nothing is no new generation.
    pub fn same_rules(&self, o: &Isolation) -> bool {
        let rules = |a: &Option<Vec<Allow>>, b: &Option<Vec<Allow>>| match (a, b) {
            (Some(a), Some(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.peers == y.peers && x.ports == y.ports)
            }
            (None, None) => true,
            _ => false,
        };
        self.policies.len() == o.policies.len()
            && self.policies.iter().zip(&o.policies).all(|(a, b)| {
                a.name == b.name && rules(&a.ingress, &b.ingress) && rules(&a.egress, &b.egress)
            })
            && self.ingress_of == o.ingress_of
            && self.egress_of == o.egress_of
            && self.exempt == o.exempt
            && self.services == o.services
            && self.backends == o.backends
            && self.translators == o.translators
            && self.nodes == o.nodes
            && self.closed == o.closed
    }

    /// The same, counting on in `old`'s counters: each policy's by its
    /// name, each rule's by its place in its policy.
    pub fn counting_as(mut self, old: &Isolation) -> Self {
        let by_name: FxHashMap<&str, &Policy> = old.policies.iter().map(|p| (p.name.as_str(), p)).collect();
        for p in &mut self.policies {
            let Some(o) = by_name.get(p.name.as_str()) else { continue };
            p.denied = o.denied.clone();
            for (new, old) in [(&mut p.ingress, &o.ingress), (&mut p.egress, &o.egress)] {
                if let (Some(new), Some(old)) = (new, old) {
                    for (a, b) in new.iter_mut().zip(old) {
                        a.counters = b.counters.clone();
                    }
                }
            }
        }
        self
    }
}

#[cfg(test)]
mod tests;
