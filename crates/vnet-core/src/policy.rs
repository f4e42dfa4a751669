//! Who may talk to whom inside a network: ordered rules with a default,
//! stateful for TCP, UDP and ICMP (sans-IO: frames and the clock come in,
//! verdicts go out).
//!
//! A network's rules are tried in order ([`NetPolicy::rules`], sorted by
//! the control plane: priority, then name); the first that matches
//! decides, and none matching leaves the network's default. A rule
//! matches on the frame's source and destination ([`Selector`]: a MAC,
//! a group of MACs, an IP prefix, anything), its EtherType, IP protocol
//! and destination ports. The source and destination are the frame's
//! own: its source MAC (which port security ties to its interface) and
//! destination MAC, their groups, and its IP (or ARP) addresses.
//!
//! State ([`flows`]): a flow a rule allowed is remembered by both ends'
//! MACs with its addresses, protocol and ports, so its further packets
//! pass without the rules, its replies pass (the reversed key), so do its
//! later fragments and the ICMP errors about it sent between its own two
//! ends. The rules are what any other packet meets: the same addresses
//! and ports sent to another MAC, or from another MAC (another VM's), are
//! a new flow. A change of the rules is a new
//! generation, and every flow is judged afresh.
//!
//! What [`vnet_wire::classify`] cannot read to the end (a third VLAN tag, a
//! ninth IPv6 extension header, a header cut short, a tiny first
//! fragment) is dropped in a network with a policy, and a later fragment
//! whose first was not allowed is dropped: nothing reaches a VM by hiding
//! what it is.

pub mod account;
pub mod flows;
pub mod isolation;
pub mod key;
pub mod prefix;
pub mod rules;
pub mod verdict;

pub use flows::{FlowKey, Flows};
pub use isolation::Isolation;
use key::fragment_key;
pub use key::flow_key;
pub use prefix::in_prefix;
pub use rules::{Action, NetPolicy, Rule, Selector};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
pub use verdict::{FlowMirror, Verdict, Why};
use vnet_wire::classify::{classify, Frag, Icmp, Ip, L3};
use vnet_wire::MacAddr;

/// Whether a judgement counts and remembers (the data path) or changes
/// nothing (a dry run: `vnetctl trace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Live,
    DryRun,
}

/// Every network's policy, as one snapshot.
#[derive(Debug, Default)]
pub struct PolicySet {
    /// Changes with the rules (and the groups): flows start afresh.
    pub generation: u64,
    pub nets: FxHashMap<u32, NetPolicy>,
    /// Each MAC's groups in each network, one bit each: keyed by
    /// (network, MAC), so a MAC's groups in one network say nothing of
    /// a frame in another.
    pub groups: FxHashMap<(u32, MacAddr), u64>,
    pub flows: Arc<Flows>,
    /// Where the flows are also kept, if anywhere ([`FlowMirror`]).
    pub mirror: Option<Arc<dyn FlowMirror>>,
}

/// What a flow log's account of a first packet keeps: the rule that
/// decided it (the default's name for the default; `None`: not known),
/// the verdict, the packet's length.
#[derive(Debug, Clone, Copy)]
struct Logged<'a> {
    rule: Option<&'a Arc<str>>,
    allow: bool,
    len: usize,
}

impl PolicySet {
    /// Whether any network has a policy.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether frames of `network` meet a policy.
    pub fn governs(&self, network: u32) -> bool {
        self.nets.contains_key(&network)
    }

    /// The verdict on `frame` in `network`, counted. Allowed flows are
    /// remembered in [`PolicySet::flows`].
    pub fn decide(&self, network: u32, frame: &[u8]) -> Verdict {
        self.judge(network, frame, Mode::Live)
    }

    /// The verdict [`PolicySet::decide`] would give `frame` now, by the
    /// same code, changing nothing: no counter moves, no flow is
    /// remembered, refreshed or offered to the mirror (`vnetctl trace`).
    pub fn explain(&self, network: u32, frame: &[u8]) -> Verdict {
        self.judge(network, frame, Mode::DryRun)
    }

    /// The one judgement both [`PolicySet::decide`] and
    /// [`PolicySet::explain`] make; `mode` says whether it leaves traces.
    fn judge(&self, network: u32, frame: &[u8], mode: Mode) -> Verdict {
        let live = mode == Mode::Live;
        let Some(net) = self.nets.get(&network) else { return Verdict { allow: true, why: Why::NoPolicy } };
        let f = match classify(frame) {
            Ok(f) => f,
            Err(_) => {
                if live {
                    net.unclassifiable.fetch_add(1, Relaxed);
                }
                return Verdict { allow: false, why: Why::Unclassifiable };
            }
        };
        let len = frame.len();
        let macs = (f.src, f.dst);
        if let L3::Ip(ip) = f.l3 {
            if let Some(v) = self.by_state(network, net, macs, &ip, (len, mode)) {
                return v;
            }
        }
        let groups = (self.groups_of(network, f.src), self.groups_of(network, f.dst));
        let (allow, why, counters, rule) = match net.rules.iter().position(|r| r.matches(&f, groups)) {
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
        let logged = |allowed| Logged { rule, allow: allowed, len };
        if !allow {
            if live {
                counters.drop_one();
                self.log_denied(network, macs, &f.l3, logged(false));
            }
            return Verdict { allow, why };
        }
        if let Some(iso) = &net.isolation {
            if let Err(d) = iso.check_with(&f, len, live) {
                if live {
                    self.log_denied(network, macs, &f.l3, Logged { rule: None, ..logged(false) });
                }
                return Verdict { allow: false, why: Why::Isolated(d) };
            }
        }
        if let (L3::Ip(ip), true) = (f.l3, live) {
            self.remember(network, macs, &ip, logged(true));
        }
        Verdict { allow, why }
    }

    /// A denied IP packet, in the flow log's denied flows.
    fn log_denied(&self, network: u32, macs: (MacAddr, MacAddr), l3: &L3, l: Logged<'_>) {
        if let (true, L3::Ip(ip)) = (self.flows.logs(), l3) {
            let k = flow_key(self.generation, network, macs, ip);
            self.flows.deny(&k, l.rule, l.len);
        }
    }

    fn groups_of(&self, network: u32, mac: MacAddr) -> u64 {
        self.groups.get(&(network, mac)).copied().unwrap_or(0)
    }

    /// A verdict from the flows (None: the rules decide). `macs`: the
    /// frame's source and destination MACs; `len`: its length. A dry run
    /// looks the flows up without refreshing, inserting or counting.
    fn by_state(
        &self,
        network: u32,
        net: &NetPolicy,
        macs: (MacAddr, MacAddr),
        ip: &Ip,
        (len, mode): (usize, Mode),
    ) -> Option<Verdict> {
        let live = mode == Mode::Live;
        let g = self.generation;
        let flows = &self.flows;
        let hit = |k: &FlowKey| if live { flows.hit_slot(k) } else { flows.find(k) };
        let why = if let Frag::Later { id } = ip.frag {
            if hit(&fragment_key(g, network, macs, ip, id)).is_none() {
                if live {
                    net.orphan_fragments.fetch_add(1, Relaxed);
                }
                return Some(Verdict { allow: false, why: Why::OrphanFragment });
            }
            Why::Fragment
        } else if let Icmp::Error { src, dst, proto, sport, dport } = ip.icmp {
            // Related only between the quoted flow's own ends: the error
            // comes from the quoted packet's far end (its MAC) and goes to
            // its sender (MAC and address). A third VM's error about a
            // known flow meets the rules.
            let about = FlowKey {
                generation: g,
                network,
                src_mac: macs.1,
                dst_mac: macs.0,
                src,
                dst,
                proto,
                sport,
                dport,
                id: 0,
                fragment: false,
            };
            if ip.dst != src
                || !(hit(&about).is_some() || hit(&about.reversed()).is_some() || self.mirrored(&about))
            {
                return None;
            }
            Why::Related
        } else {
            let k = flow_key(g, network, macs, ip);
            let (why, slot, known) = if let Some(s) = hit(&k) {
                (Why::Established, Some(s), k)
            } else if let Some(s) = hit(&k.reversed()) {
                (Why::Reply, Some(s), k.reversed())
            } else if self.mirrored(&k) {
                // A flow the mirror carried alone: known here again (its
                // account opens with no rule: the rules did not see it).
                let s = live.then(|| {
                    let s = flows.insert(&k);
                    flows.open(s, account::Opened { key: k, rule: None, allow: true });
                    s
                });
                (Why::Established, s, k)
            } else {
                return None;
            };
            if let (Some(slot), true) = (slot, live) {
                let dir = if why == Why::Reply { account::Dir::Reverse } else { account::Dir::Forward };
                flows.count(slot, dir, len);
                self.offer(slot, &known);
            }
            why
        };
        if !live {
            return Some(Verdict { allow: true, why });
        }
        if let Frag::First { id } = ip.frag {
            flows.insert(&fragment_key(g, network, macs, ip, id));
        }
        net.stateful.add(len);
        Some(Verdict { allow: true, why })
    }

    /// Remembers an allowed packet's flow (and its later fragments), and
    /// opens its account.
    fn remember(&self, network: u32, macs: (MacAddr, MacAddr), ip: &Ip, l: Logged<'_>) {
        let g = self.generation;
        if let Frag::First { id } = ip.frag {
            self.flows.insert(&fragment_key(g, network, macs, ip, id));
        }
        // An ICMP error opens no flow of its own; everything else does.
        if !matches!(ip.icmp, Icmp::Error { .. }) {
            let k = flow_key(g, network, macs, ip);
            let slot = self.flows.insert(&k);
            self.flows.open(slot, account::Opened { key: k, rule: l.rule.cloned(), allow: l.allow });
            self.flows.count(slot, account::Dir::Forward, l.len);
            self.offer(slot, &k);
        }
    }

    /// Whether the mirror knows `k` (or its reply).
    fn mirrored(&self, k: &FlowKey) -> bool {
        self.mirror.as_ref().is_some_and(|m| m.fresh(k))
    }

    /// Offers the mirror flow `k` (in `slot`) when it is due.
    fn offer(&self, slot: usize, k: &FlowKey) {
        if let Some(m) = &self.mirror {
            if self.flows.due(slot) && m.offer(k) {
                self.flows.mirrored(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests;
