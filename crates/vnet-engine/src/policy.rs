//! The policy a plane enforces ([`vnet_core::policy::PolicySet`]), built
//! from the state's `policy`, `rule` and `group` lines (and the groups
//! interfaces and, in cluster mode, signed records give MACs, each in its
//! network), and where the data path
//! asks it: every frame of a governed network, once as it leaves its VM's
//! host and once as it reaches the VM's host, so each host keeps the
//! flows of its own VMs (a reply is known where it is judged).

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;
use vnet_control::policy::{Policies, RuleDef, Sel, Verb};
use vnet_core::policy::isolation::LinkLocals;
use vnet_core::policy::{Action, Isolation, NetPolicy, PolicySet, Rule, Selector};
use vnet_wire::MacAddr;

fn action(v: Verb) -> Action {
    match v {
        Verb::Allow => Action::Allow,
        Verb::Deny => Action::Deny,
    }
}

/// Each (network, MAC)'s groups: who is in which group where.
pub type Members = BTreeMap<(u32, MacAddr), Vec<String>>;

/// The set `p` declares, as generation `generation`, with `extra`'s
/// groups (an interface's in its network, a cluster record's in the
/// cluster's) added to the declared members. A `group` line names no
/// network: its MAC is in the group in every governed network. Each rule
/// keeps the counters of its namesake in `old`, and each network its own;
/// the flows table is `old`'s (a new generation starts its flows afresh).
pub fn build(p: &Policies, extra: &Members, generation: u64, old: &PolicySet) -> PolicySet {
    // One bit for each group a rule names, in name order.
    let named: std::collections::BTreeSet<&str> = p.rules.values().flat_map(RuleDef::groups).collect();
    let bit: FxHashMap<&str, u8> = named.iter().take(64).enumerate().map(|(i, g)| (*g, i as u8)).collect();
    let governed = p.networks();
    let mut groups: FxHashMap<(u32, MacAddr), u64> = FxHashMap::default();
    let members = p.groups.iter().flat_map(|(g, macs)| {
        let governed = &governed;
        macs.iter().flat_map(move |m| governed.iter().map(move |n| ((*n, *m), g.as_str())))
    });
    let extra = extra.iter().flat_map(|(k, gs)| gs.iter().map(move |g| (*k, g.as_str())));
    for (key, g) in members.chain(extra) {
        if let Some(&b) = bit.get(g) {
            *groups.entry(key).or_default() |= 1u64 << b;
        }
    }
    let old_rules: FxHashMap<&str, &Arc<vnet_core::Counters>> =
        old.nets.values().flat_map(|n| n.rules.iter().map(|r| (&*r.name, &r.counters))).collect();
    let selector = |s: &Sel| match s {
        Sel::Any => Selector::Any,
        Sel::Mac(m) => Selector::Mac(*m),
        // Past the 64 groups the state holds at most: matches nothing.
        Sel::Group(g) => bit.get(g.as_str()).map_or(Selector::Nothing, |&b| Selector::Group(b)),
        Sel::Net(ip, len) => Selector::Net(*ip, *len),
    };
    let nets = p
        .networks()
        .into_iter()
        .map(|n| {
            let rules = p
                .ordered(n)
                .into_iter()
                .map(|r| Rule {
                    name: r.name.as_str().into(),
                    action: action(r.verb),
                    from: selector(&r.from),
                    to: selector(&r.to),
                    ether: r.ether,
                    proto: r.proto,
                    ports: r.ports,
                    counters: old_rules.get(r.name.as_str()).map(|c| Arc::clone(c)).unwrap_or_default(),
                })
                .collect();
            let default = action(p.defaults.get(&n).copied().unwrap_or(Verb::Allow));
            let net = NetPolicy::new(default, rules);
            let net = match old.nets.get(&n) {
                Some(o) => net.counting_as(o),
                None => net,
            };
            (n, net)
        })
        .collect();
    PolicySet { generation, nets, groups, flows: old.flows.clone(), mirror: old.mirror.clone() }
}

/// Puts `iso` (Kubernetes' NetworkPolicies, translated) on vnet network
/// `network` of `set`, which it governs (allowing by default when it has
/// no policy of its own): a first packet passes when the network's rules
/// and both ends' isolation allow it, the pods' link-local addresses
/// judged as their pods' (`link_locals`, [`Isolation::link_locals`]).
pub fn isolate(
    set: &mut PolicySet,
    network: u32,
    iso: Arc<Isolation>,
    link_locals: Arc<LinkLocals>,
    old: &PolicySet,
) {
    let net = set.nets.entry(network).or_insert_with(|| {
        let n = NetPolicy::new(Action::Allow, Vec::new());
        match old.nets.get(&network) {
            Some(o) => n.counting_as(o),
            None => n,
        }
    });
    net.isolation = Some(iso);
    net.link_locals = link_locals;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(text: &str) -> Policies {
        vnet_control::State::default().apply_all(&vnet_control::parse(text).unwrap()).unwrap().policies
    }

    #[test]
    fn a_built_set_orders_rules_gives_groups_bits_and_keeps_counters_by_name() {
        let p = policies(
            "policy default deny network 3\ngroup web 52:54:00:00:00:02\ngroup unused 52:54:00:00:00:09\n\
             rule b allow network 3 from group web\nrule a deny network 3 priority 200 to group db\n\
             rule c allow network 4\n",
        );
        let mut extra = BTreeMap::new();
        extra.insert((3, MacAddr([0x52, 0x54, 0, 0, 0, 4])), vec!["db".to_string(), "web".to_string()]);
        extra.insert((5, MacAddr([0x52, 0x54, 0, 0, 0, 5])), vec!["db".to_string()]);
        let s = build(&p, &extra, 1, &PolicySet::default());
        let n3 = &s.nets[&3];
        assert_eq!(n3.default, Action::Deny);
        assert_eq!(n3.rules.iter().map(|r| &*r.name).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(n3.rules[0].from, Selector::Group(1), "bits in name order: db 0, web 1");
        assert_eq!(s.nets[&4].default, Action::Allow, "a rule alone governs, allowing by default");
        let m = |n| MacAddr([0x52, 0x54, 0, 0, 0, n]);
        assert_eq!(s.groups[&(3, m(2))], 0b10, "a `group` line: in every governed network");
        assert_eq!(s.groups[&(4, m(2))], 0b10);
        assert_eq!(s.groups[&(3, m(4))], 0b11, "from the cluster's records, in their network");
        assert!(!s.groups.contains_key(&(4, m(4))), "and no other");
        assert_eq!(s.groups[&(5, m(5))], 0b01);
        assert!(!s.groups.contains_key(&(3, m(9))), "a group no rule names");
        n3.rules[0].counters.add(10);
        n3.default_counters.add(5);
        let p2 = policies("policy default deny network 3\nrule b allow network 3\nrule z allow network 3\n");
        let s2 = build(&p2, &BTreeMap::new(), 2, &s);
        assert_eq!(s2.nets[&3].rules[0].counters.snapshot().bytes, 10, "b kept its counters");
        assert_eq!(s2.nets[&3].rules[1].counters.snapshot().bytes, 0);
        assert_eq!(s2.nets[&3].default_counters.snapshot().bytes, 5);
        assert!(Arc::ptr_eq(&s.flows, &s2.flows) && s2.generation == 2);
    }
}
