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
pub use key::flow_key;
pub use prefix::in_prefix;
pub use rules::{Action, NetPolicy, Rule, Rules, Selector};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
pub use verdict::{FlowMirror, Judge, Judged, Known, Verdict, Why};
use vnet_wire::classify::{classify, L3};
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
    /// An IP packet meets the flows first ([`Flows::judge`]), which ask
    /// the rules when they know no flow of it; anything else, the rules.
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
        let mut rules = Rules { network, net, facts: &f, groups: &self.groups, len, live };
        let L3::Ip(ip) = f.l3 else { return rules.judge().verdict };
        let p = flows::Packet {
            generation: self.generation,
            network,
            macs: (f.src, f.dst),
            ip: &ip,
            len,
            live,
            stateful: &net.stateful,
            orphan_fragments: &net.orphan_fragments,
        };
        self.flows.judge(&p, self.mirror.as_deref(), &mut rules)
    }
}

#[cfg(test)]
mod tests;
