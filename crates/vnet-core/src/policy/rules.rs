//! A network's rules ([`NetPolicy`]): each [`Rule`] matches on a frame's
//! ends ([`Selector`]), its EtherType, IP protocol and destination ports,
//! and allows or denies ([`Action`]); the first that matches decides,
//! else the network's default. What they allow, its ends' NetworkPolicy
//! isolation may still deny ([`Rules`]: the judgement of a packet no
//! flow carries).

use super::isolation::{Isolation, LinkLocals};
use super::prefix::in_prefix;
use super::verdict::{Judge, Judged, Verdict, Why};
use crate::stats::Counters;
use rustc_hash::FxHashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use vnet_wire::classify::{Facts, L3};
use vnet_wire::ip::{PROTO_TCP, PROTO_UDP};
use vnet_wire::MacAddr;

/// What a rule or a default does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Deny,
}

/// One end of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    Any,
    /// Matches no frame.
    Nothing,
    Mac(MacAddr),
    /// A group, by its bit in [`super::PolicySet::groups`]' masks.
    Group(u8),
    /// An IPv4 or IPv6 prefix (ARP's addresses are IPv4's).
    Net(IpAddr, u8),
}

/// A compiled rule.
#[derive(Debug)]
pub struct Rule {
    /// Its name (shared: a flow log's record names it without a copy).
    pub name: Arc<str>,
    pub action: Action,
    pub from: Selector,
    pub to: Selector,
    /// EtherType (under any VLAN tags).
    pub ether: Option<u16>,
    /// IP protocol: matches IPv4 and IPv6 packets only.
    pub proto: Option<u8>,
    /// Destination ports, inclusive: TCP and UDP packets only.
    pub ports: Option<(u16, u16)>,
    /// Packets it decided (denied ones also as `drops`).
    pub counters: Arc<Counters>,
}

/// One network's policy.
#[derive(Debug)]
pub struct NetPolicy {
    pub default: Action,
    pub rules: Vec<Rule>,
    /// Packets the default decided (denied ones also as `drops`).
    pub default_counters: Arc<Counters>,
    /// Packets passed by state: further packets of an allowed flow,
    /// replies, related ICMP errors, later fragments.
    pub stateful: Arc<Counters>,
    /// Packets dropped as unreadable, and later fragments of no allowed first.
    pub unclassifiable: Arc<AtomicU64>,
    pub orphan_fragments: Arc<AtomicU64>,
    /// Kubernetes' NetworkPolicies of the network, met beside the rules
    /// ([`super::isolation`]): a first packet passes when the rules and both its
    /// ends' isolation allow it.
    pub isolation: Option<Arc<Isolation>>,
    /// The pods' IPv6 link-local addresses, judged by the isolation as
    /// their pods' addresses ([`super::isolation`]).
    pub link_locals: Arc<LinkLocals>,
    /// What a flow log calls the default: `(default)`.
    pub default_name: Arc<str>,
}

impl NetPolicy {
    /// A network's policy with every counter at zero.
    pub fn new(default: Action, rules: Vec<Rule>) -> Self {
        NetPolicy {
            default,
            rules,
            default_counters: Arc::default(),
            stateful: Arc::default(),
            unclassifiable: Arc::default(),
            orphan_fragments: Arc::default(),
            isolation: None,
            link_locals: Arc::default(),
            default_name: Arc::from("(default)"),
        }
    }

    /// The same, counting on in `old`'s network-wide counters.
    pub fn counting_as(self, old: &NetPolicy) -> Self {
        NetPolicy {
            default_counters: old.default_counters.clone(),
            stateful: old.stateful.clone(),
            unclassifiable: old.unclassifiable.clone(),
            orphan_fragments: old.orphan_fragments.clone(),
            ..self
        }
    }
}

impl Rule {
    /// Whether the rule matches a frame with facts `f` (whose ends' groups
    /// are `groups`: source's, destination's).
    pub fn matches(&self, f: &Facts, groups: (u64, u64)) -> bool {
        let (src_ip, dst_ip) = match f.l3 {
            L3::Arp { sender, target } => (Some(IpAddr::V4(sender)), Some(IpAddr::V4(target))),
            L3::Ip(ip) => (Some(ip.src), Some(ip.dst)),
            L3::Other => (None, None),
        };
        let end = |s: Selector, mac: MacAddr, g: u64, ip: Option<IpAddr>| match s {
            Selector::Any => true,
            Selector::Nothing => false,
            Selector::Mac(m) => m == mac,
            Selector::Group(bit) => g & 1u64.checked_shl(u32::from(bit)).unwrap_or(0) != 0,
            Selector::Net(n, len) => ip.is_some_and(|ip| in_prefix(ip, n, len)),
        };
        if !end(self.from, f.src, groups.0, src_ip) || !end(self.to, f.dst, groups.1, dst_ip) {
            return false;
        }
        if self.ether.is_some_and(|e| e != f.ether) {
            return false;
        }
        let ip = match f.l3 {
            L3::Ip(ip) => Some(ip),
            _ => None,
        };
        if let Some(p) = self.proto {
            if ip.is_none_or(|ip| ip.proto != p) {
                return false;
            }
        }
        match self.ports {
            None => true,
            Some((lo, hi)) => ip
                .is_some_and(|ip| matches!(ip.proto, PROTO_TCP | PROTO_UDP) && (lo..=hi).contains(&ip.dport)),
        }
    }
}

/// The judgement of one frame of `network` by its rules, then by its
/// ends' isolation ([`Judge`]); `live`: counted in the rules' counters (a
/// dry run counts nothing).
pub struct Rules<'a> {
    pub network: u32,
    pub net: &'a NetPolicy,
    pub facts: &'a Facts,
    /// Each MAC's groups ([`super::PolicySet::groups`]).
    pub groups: &'a FxHashMap<(u32, MacAddr), u64>,
    pub len: usize,
    pub live: bool,
}

impl<'a> Judge<'a> for Rules<'a> {
    fn judge(&mut self) -> Judged<'a> {
        let (net, f, len, live) = (self.net, self.facts, self.len, self.live);
        let group = |mac: MacAddr| self.groups.get(&(self.network, mac)).copied().unwrap_or(0);
        let groups = (group(f.src), group(f.dst));
        let (allow, why, counters, rule) = match net.rules.iter().position(|r| r.matches(f, groups)) {
            Some(i) => {
                let r = &net.rules[i];
                (r.action == Action::Allow, Why::Rule(i), &r.counters, Some(&r.name))
            }
            None => {
                (net.default == Action::Allow, Why::Default, &net.default_counters, Some(&net.default_name))
            }
        };
        if live {
            counters.add(len);
        }
        if !allow {
            if live {
                counters.drop_one();
            }
            return Judged { verdict: Verdict { allow, why }, rule };
        }
        if let Some(iso) = &net.isolation {
            if let Err(d) = iso.check_with(f, &net.link_locals, len, live) {
                return Judged { verdict: Verdict { allow: false, why: Why::Isolated(d) }, rule: None };
            }
        }
        Judged { verdict: Verdict { allow, why }, rule }
    }
}
