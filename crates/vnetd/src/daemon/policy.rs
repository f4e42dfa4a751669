//! The policy the engine enforces: built from the state's `policy`, `rule`
//! and `group` lines (and the groups of interfaces and cluster records, by
//! (network, MAC)) when they change (a route change keeps the set, and
//! the flows it allowed), and shown with each rule's counts
//! (`show policy`, Prometheus `vnet_policy_*`).

use super::Daemon;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{Error, State};
use vnet_core::policy::isolation::LinkLocals;
use vnet_core::policy::PolicySet;
use vnet_engine::policy::Members;

impl Daemon {
    /// The set the engine enforces under `state`: built again, as a new
    /// generation, only when what it is built from changed (the lines, the
    /// cluster's signed policy and groups, the interfaces' groups). With
    /// the kernel path loaded, the set's flows are mirrored in its `flows`
    /// map (kernel::flows): built again once when it loads.
    pub(super) fn policy_of(&mut self, state: &State) -> Arc<PolicySet> {
        let mirror =
            self.kernel.path.as_ref().map(|k| k.flow_mirror() as Arc<dyn vnet_core::policy::FlowMirror>);
        // The state's own lines, with the signed policy over them if any
        // (copied only then, and when built).
        let declared = match &self.cluster.policy {
            Some((_, signed)) => std::borrow::Cow::Owned(merged(&state.policies, signed)),
            None => std::borrow::Cow::Borrowed(&state.policies),
        };
        let groups_gen = self.cluster.groups.1;
        let local = interface_groups(state);
        let iso_gen = self.cluster.isolation.generation;
        let link_locals = self.link_locals_of(state);
        if let Some((lines, g, l, i, ll, built)) = &self.cluster.policy_built {
            if *lines == *declared
                && *g == groups_gen
                && *l == local
                && *i == iso_gen
                && Arc::ptr_eq(ll, &link_locals)
                && built.mirror.is_some() == mirror.is_some()
            {
                return built.clone();
            }
        }
        let old = self.shared.plane.load().policy.clone();
        let generation = old.generation + 1;
        // The cluster's (claims') groups, and the interfaces' own.
        let mut extra = self.cluster.groups.0.clone();
        for (key, gs) in &local {
            extra.entry(*key).or_default().extend(gs.iter().cloned());
        }
        let mut set = vnet_engine::policy::build(&declared, &extra, generation, &old);
        if let Some((network, iso)) = &self.cluster.isolation.current {
            vnet_engine::policy::isolate(&mut set, *network, iso.clone(), link_locals.clone(), &old);
        }
        let built = Arc::new(PolicySet { mirror, ..set });
        self.cluster.policy_built =
            Some((declared.into_owned(), groups_gen, local, iso_gen, link_locals, built.clone()));
        built
    }

    /// The link-local address of each pod of the isolated network and the
    /// address it is judged as ([`vnet_core::policy::Isolation::link_locals`]),
    /// from the engine's `neigh` table under `state` (this node's pods'
    /// lines and the other nodes' claims). Built again only when the table
    /// or the isolation changed; the same `Arc` when what it holds did not.
    fn link_locals_of(&mut self, state: &State) -> Arc<LinkLocals> {
        let Some((network, iso)) = self.cluster.isolation.current.clone() else {
            return Arc::default();
        };
        let neighbors = self.neighbors_of(state);
        let iso_gen = self.cluster.isolation.generation;
        if let Some((n, g, built)) = &self.cluster.link_locals_built {
            if *g == iso_gen && Arc::ptr_eq(n, &neighbors) {
                return built.clone();
            }
        }
        let owned = neighbors.iter().filter(|((n, _), _)| *n == network).map(|((_, ip), mac)| (*ip, *mac));
        let fresh = iso.link_locals(owned);
        let built = match &self.cluster.link_locals_built {
            Some((_, _, old)) if **old == fresh => old.clone(),
            _ => Arc::new(fresh),
        };
        self.cluster.link_locals_built = Some((neighbors, iso_gen, built.clone()));
        built
    }

    /// `--kube-network-policy`: vnet network `network`'s isolation, as
    /// translated from the cluster's NetworkPolicies (`None`: no
    /// NetworkPolicy, the network not governed by them), and what the
    /// watch and the translation say (`show policy`). A new generation of
    /// the policy only when it differs from the one in force.
    pub fn set_isolation(
        &mut self,
        network: u32,
        iso: Option<vnet_core::policy::Isolation>,
        status: Value,
    ) -> Result<(), Error> {
        self.cluster.isolation.status = status;
        let same = match (&self.cluster.isolation.current, &iso) {
            (Some((n, old)), Some(new)) => *n == network && old.same_rules(new),
            (None, None) => true,
            _ => false,
        };
        if same {
            return Ok(());
        }
        let iso = iso.map(|i| match &self.cluster.isolation.current {
            Some((_, old)) => i.counting_as(old),
            None => i,
        });
        self.cluster.isolation.current = iso.map(|i| (network, Arc::new(i)));
        self.cluster.isolation.generation += 1;
        self.apply(&[])
    }

    /// The watch's state alone (before the first translation).
    pub fn set_isolation_status(&mut self, status: Value) {
        self.cluster.isolation.status = status;
    }

    /// The status `show policy` shows of it, to update in place (a part
    /// that changes without a translation).
    pub fn isolation_status_mut(&mut self) -> &mut Value {
        &mut self.cluster.isolation.status
    }

    /// Cluster mode: the groups each MAC of vnet network `network` (the
    /// cluster's) is in by its claim (in a signed network, within what its
    /// holder's certificate allows). They are its groups in that network
    /// only.
    pub fn set_cluster_groups(
        &mut self,
        network: u32,
        groups: BTreeMap<vnet_wire::MacAddr, Vec<String>>,
    ) -> Result<(), Error> {
        let groups: Members = groups.into_iter().map(|(m, gs)| ((network, m), gs)).collect();
        if groups == self.cluster.groups.0 {
            return Ok(());
        }
        self.cluster.groups = (groups, self.cluster.groups.1 + 1);
        self.apply(&[])
    }

    /// Signed cluster mode: an interface of vnet network `network` (the
    /// cluster's) may be only in groups this host's certificate allows
    /// (`allowed`; a claim naming another is quarantined by every other
    /// host). The state held is checked now: vnetd does not start with an
    /// interface its certificate does not allow.
    pub fn set_group_authority(&mut self, network: u32, allowed: Vec<String>) -> Result<(), Error> {
        self.cluster.group_authority = Some((network, allowed));
        self.cluster.check_groups(&self.state, &|_| vnet_control::Pos::default())
    }

    /// Cluster mode: the network's signed policy changed (`None`: none).
    pub fn set_cluster_policy(
        &mut self,
        signed: Option<(u64, Arc<vnet_control::policy::Policies>)>,
    ) -> Result<(), Error> {
        self.cluster.policy = signed;
        self.apply(&[])
    }

    /// `show policy`: each governed network, its rules in the order they
    /// are tried with what each decided, and what state passed.
    pub(super) fn policy_json(&self) -> Value {
        let plane = self.shared.plane.load();
        let p = &plane.policy;
        // What the kernel path forwarded by known flows.
        let kernel = self.kernel.path.as_ref().map(|k| k.policy_counts()).unwrap_or_default();
        let mut nets: Vec<(&u32, &vnet_core::policy::NetPolicy)> = p.nets.iter().collect();
        nets.sort_by_key(|(n, _)| **n);
        let nets: Vec<Value> = nets
            .into_iter()
            .map(|(n, net)| {
                let rules: Vec<Value> = net
                    .rules
                    .iter()
                    .map(|r| {
                        let c = r.counters.snapshot();
                        json!({
                            "name": &*r.name,
                            "line": self.state.policies.rules.get(&*r.name).map(|d| d.to_line()),
                            "action": r.action,
                            "packets": c.packets,
                            "bytes": c.bytes,
                            "drops": c.drops,
                        })
                    })
                    .collect();
                let d = net.default_counters.snapshot();
                let s = net.stateful.snapshot();
                let (kp, kb) = kernel.get(n).copied().unwrap_or_default();
                json!({
                    "network": n,
                    "default": net.default,
                    "rules": rules,
                    "default_packets": d.packets,
                    "default_drops": d.drops,
                    "stateful_packets": s.packets + kp,
                    "stateful_bytes": s.bytes + kb,
                    "kernel_flow_packets": kp,
                    "unclassifiable": net.unclassifiable.load(Relaxed),
                    "orphan_fragments": net.orphan_fragments.load(Relaxed),
                    "networkpolicies": net.isolation.as_deref().map(|i| isolation_json(i, &net.link_locals)),
                })
            })
            .collect();
        json!({
            "policy": nets,
            "signed_serial": self.cluster.policy.as_ref().map(|(serial, _)| serial),
            "generation": p.generation,
            "flows": p.flows.live(),
            "flow_slots": p.flows.slots(),
            "flows_evicted": p.flows.evicted.load(Relaxed),
            "kernel_flows_written": p.mirror.as_ref().and(self.kernel.path.as_ref()).map(|k| {
                let m = k.flow_mirror();
                json!({"written": m.offered.load(Relaxed), "refused": m.failed.load(Relaxed)})
            }),
            "kernel_clock": p.mirror.as_ref().and(self.kernel.path.as_ref()).and_then(|k| k.policy_clock()),
            "kubernetes": (!self.cluster.isolation.status.is_null()).then(|| self.cluster.isolation.status.clone()),
        })
    }

    /// `show policy` as text.
    pub(super) fn policy_text(&self) -> String {
        let v = self.policy_json();
        let mut out = String::new();
        let nets = v["policy"].as_array().cloned().unwrap_or_default();
        if nets.is_empty() {
            return "no network has a policy\n".to_string();
        }
        for n in &nets {
            out.push_str(&format!(
                "network {} (default {}): {} passed by state, {} unreadable dropped, {} orphan fragments\n",
                n["network"],
                n["default"].as_str().unwrap_or("?"),
                n["stateful_packets"],
                n["unclassifiable"],
                n["orphan_fragments"]
            ));
            let mut rows = n["rules"].as_array().cloned().unwrap_or_default();
            rows.push(json!({
                "name": "(default)",
                "action": n["default"],
                "packets": n["default_packets"],
                "drops": n["default_drops"],
            }));
            out.push_str(&super::show::table(&["name", "action", "packets", "drops"], &rows));
            if n["networkpolicies"].is_object() {
                out.push_str(&networkpolicies_text(&n["networkpolicies"]));
            }
        }
        out.push_str(&format!(
            "flows: {} of {} slots ({} evicted)\n",
            v["flows"], v["flow_slots"], v["flows_evicted"]
        ));
        out
    }

    /// Prometheus: each rule's and default's packets and drops.
    pub(super) fn policy_metrics(&self, out: &mut String) {
        let plane = self.shared.plane.load();
        if plane.policy.is_empty() {
            return;
        }
        out.push_str("# TYPE vnet_policy_packets counter\n# TYPE vnet_policy_drops counter\n");
        for (n, net) in &plane.policy.nets {
            let rows = net.rules.iter().map(|r| (&*r.name, &*r.counters));
            for (rule, c) in rows.chain([("(default)", &*net.default_counters)]) {
                let c = c.snapshot();
                let l = format!("network=\"{n}\",rule=\"{rule}\"");
                out.push_str(&format!(
                    "vnet_policy_packets{{{l}}} {}\nvnet_policy_drops{{{l}}} {}\n",
                    c.packets, c.drops
                ));
            }
        }
    }
}

/// A network's NetworkPolicies for `show policy json`: each by its name,
/// the directions it isolates, what each of its rules allowed (first
/// packets) and what it denied.
fn isolation_json(iso: &vnet_core::policy::Isolation, link_locals: &LinkLocals) -> Value {
    let rules = |rs: &Option<Vec<vnet_core::policy::isolation::Allow>>| {
        rs.as_ref().map(|rs| {
            rs.iter()
                .map(|r| {
                    let c = r.counters.snapshot();
                    json!({"peers": r.peers.len(), "ports": r.ports.len(), "packets": c.packets, "bytes": c.bytes})
                })
                .collect::<Vec<_>>()
        })
    };
    let policies: Vec<Value> = iso
        .policies
        .iter()
        .map(|p| {
            let d = p.denied.snapshot();
            json!({"name": p.name, "ingress": rules(&p.ingress), "egress": rules(&p.egress), "denied": d.drops})
        })
        .collect();
    json!({
        "policies": policies,
        "isolated_ingress": iso.ingress_of.len(),
        "isolated_egress": iso.egress_of.len(),
        "exempt": iso.exempt.len(),
        "link_locals": link_locals.0.len(),
    })
}

/// `show policy`'s lines of a network's NetworkPolicies: one row a rule,
/// named `NAMESPACE/NAME ingress|egress N`, and one a policy's denials.
fn networkpolicies_text(v: &Value) -> String {
    let mut rows = Vec::new();
    for p in v["policies"].as_array().into_iter().flatten() {
        for dir in ["ingress", "egress"] {
            for (i, r) in p[dir].as_array().into_iter().flatten().enumerate() {
                let rule = format!("{dir} {i}");
                rows.push(json!({"networkpolicy": p["name"], "rule": rule, "action": "allow", "packets": r["packets"]}));
            }
        }
        let isolates: Vec<&str> = ["ingress", "egress"].into_iter().filter(|d| p[*d].is_array()).collect();
        let rule = format!("(isolated: {})", isolates.join(", "));
        rows.push(
            json!({"networkpolicy": p["name"], "rule": rule, "action": "deny", "packets": p["denied"]}),
        );
    }
    format!(
        "NetworkPolicies: {} pod addresses isolated for ingress, {} for egress\n{}",
        v["isolated_ingress"],
        v["isolated_egress"],
        super::show::table(&["networkpolicy", "rule", "action", "packets"], &rows)
    )
}

/// The groups the state's interfaces put their MACs in (`group G`), in
/// each interface's network.
fn interface_groups(state: &State) -> Members {
    let mut out = Members::new();
    for i in state.interfaces.values().filter(|i| !i.groups.is_empty()) {
        if let Some(m) = i.mac {
            out.entry((i.network, m)).or_default().extend(i.groups.iter().cloned());
        }
    }
    out
}

/// The state's own policy with the cluster's signed one over it: the
/// signed policy's defaults and rules win over namesakes of the state's,
/// and groups are the union of both.
fn merged(
    local: &vnet_control::policy::Policies,
    signed: &vnet_control::policy::Policies,
) -> vnet_control::policy::Policies {
    let mut p = local.clone();
    p.defaults.extend(signed.defaults.iter().map(|(n, v)| (*n, *v)));
    p.rules.extend(signed.rules.iter().map(|(k, r)| (k.clone(), r.clone())));
    for (g, macs) in &signed.groups {
        p.groups.entry(g.clone()).or_default().extend(macs.iter().copied());
    }
    p
}

#[cfg(test)]
mod tests {
    use super::merged;

    /// A NetworkPolicy's isolation (one isolating `prod/deny` and one
    /// rule of `prod/allow`), as the watch's translation gives it.
    fn isolation() -> vnet_core::policy::Isolation {
        use vnet_core::policy::isolation::{Allow, Isolation, Policy};
        let ip: std::net::IpAddr = "10.244.0.2".parse().unwrap();
        let allow = Allow { peers: vec![], ports: vec![], counters: Default::default() };
        let mut iso = Isolation {
            policies: vec![
                Policy {
                    name: "prod/allow".into(),
                    ingress: Some(vec![allow]),
                    egress: None,
                    denied: Default::default(),
                },
                Policy {
                    name: "prod/deny".into(),
                    ingress: Some(vec![]),
                    egress: None,
                    denied: Default::default(),
                },
            ],
            ..Isolation::default()
        };
        iso.ingress_of.insert(ip, vec![0, 1]);
        iso
    }

    /// `--kube-network-policy`: the translation governs its network (and
    /// only while a NetworkPolicy exists), a translation that changed
    /// nothing is no new generation, and `show policy` names each rule's
    /// NetworkPolicy.
    #[test]
    fn network_policies_govern_their_network_and_show_policy_names_them() {
        let mut d = super::Daemon::default();
        // Loopback, any port: the default listen address (0.0.0.0:9000)
        // may be taken on the machine that runs the tests.
        d.apply(&vnet_control::parse("listen udp 127.0.0.1:0").unwrap()).unwrap();
        d.set_isolation(7, Some(isolation()), serde_json::json!({"translation": {"policies": 2}})).unwrap();
        let p = d.shared.plane.load().policy.clone();
        assert!(p.governs(7) && !p.governs(0), "the cluster's network only");
        let text = d.show(vnet_control::ShowWhat::Policy, false);
        assert!(
            text.contains("NetworkPolicies: 1 pod addresses isolated for ingress, 0 for egress"),
            "{text}"
        );
        assert!(
            text.contains("prod/allow") && text.contains("ingress 0") && text.contains("allow"),
            "{text}"
        );
        assert!(text.contains("prod/deny") && text.contains("(isolated: ingress)"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&d.show(vnet_control::ShowWhat::Policy, true)).unwrap();
        assert_eq!(json["policy"][0]["networkpolicies"]["policies"][1]["name"], "prod/deny");
        assert_eq!(json["kubernetes"]["translation"]["policies"], 2);
        let generation = p.generation;
        d.set_isolation(7, Some(isolation()), serde_json::Value::Null).unwrap();
        assert_eq!(d.shared.plane.load().policy.generation, generation, "the same translation");
        d.set_isolation(7, None, serde_json::Value::Null).unwrap();
        assert!(!d.shared.plane.load().policy.governs(7), "no NetworkPolicy left");
        assert_eq!(d.show(vnet_control::ShowWhat::Policy, false), "no network has a policy\n");
    }

    /// An Ethernet frame of a TCP SYN from `src` (MAC) to `dst`, IPv6
    /// between the two MACs' link-local addresses.
    fn link_local_syn(src: vnet_wire::MacAddr, dst: vnet_wire::MacAddr) -> Vec<u8> {
        let mut f = Vec::with_capacity(74);
        f.extend_from_slice(&dst.0);
        f.extend_from_slice(&src.0);
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 20, 6, 64]);
        f.extend_from_slice(&vnet_wire::guard::link_local(src).octets());
        f.extend_from_slice(&vnet_wire::guard::link_local(dst).octets());
        // Ports 40000 to 8080, sequence 1, no ack, data offset 5, SYN.
        f.extend_from_slice(&[
            0x9c, 0x40, 0x1f, 0x90, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
        ]);
        f
    }

    /// The review's hole, through the daemon: pod 10.244.0.2 isolated for
    /// ingress (`prod/deny`) in network 7; a SYN from another pod's
    /// link-local address to its link-local address passed while the
    /// isolation knew only pod addresses. The daemon judges each pod's
    /// link-local as the pod its `neigh` line names, built again when the
    /// lines change (the line arriving after the translation, as another
    /// node's claim may): denied once the line is there, passed before it
    /// (the control), and to a pod not isolated (the positive control).
    #[test]
    fn a_pods_link_local_address_is_isolated_as_its_neigh_line_names_it() {
        use vnet_core::policy::isolation::{Isolation, Policy};
        let mut d = super::Daemon::default();
        d.apply(&vnet_control::parse("listen udp 127.0.0.1:0").unwrap()).unwrap();
        let mut iso = Isolation {
            policies: vec![Policy {
                name: "prod/deny".into(),
                ingress: Some(vec![]),
                egress: None,
                denied: Default::default(),
            }],
            ..Isolation::default()
        };
        iso.ingress_of.insert("10.244.0.2".parse().unwrap(), vec![0]);
        d.set_isolation(7, Some(iso), serde_json::Value::Null).unwrap();
        let mac = |n: u8| vnet_wire::MacAddr([2, 0, 0, 0, 0, n]);
        let syn = link_local_syn(mac(3), mac(2));
        let decide = |d: &super::Daemon, f: &[u8]| d.shared.plane.load().policy.explain(7, f).allow;
        assert!(decide(&d, &syn), "control: no neigh line names the pod's MAC yet");
        let lines = "neigh 10.244.0.2 02:00:00:00:00:02 network 7
neigh 10.244.0.3 02:00:00:00:00:03 network 7
";
        d.apply(&vnet_control::parse(lines).unwrap()).unwrap();
        assert!(!decide(&d, &syn), "to the isolated pod's link-local address");
        assert!(decide(&d, &link_local_syn(mac(2), mac(3))), "positive control: to pod 3, not isolated");
        let json: serde_json::Value =
            serde_json::from_str(&d.show(vnet_control::ShowWhat::Policy, true)).unwrap();
        assert_eq!(json["policy"][0]["networkpolicies"]["link_locals"], 2);
    }

    fn policies(text: &str) -> vnet_control::policy::Policies {
        vnet_control::State::default().apply_all(&vnet_control::parse(text).unwrap()).unwrap().policies
    }

    #[test]
    fn an_interfaces_groups_hold_its_mac() {
        let text = "interface a tap ta mac 52:54:00:00:00:01 group web group blue\n\
                    interface b tap tb mac 52:54:00:00:00:02\n\
                    interface c tap tc mac 52:54:00:00:00:03 network 4 group db\n";
        let state = vnet_control::State::default().apply_all(&vnet_control::parse(text).unwrap()).unwrap();
        let g = super::interface_groups(&state);
        let a: vnet_wire::MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let c: vnet_wire::MacAddr = "52:54:00:00:00:03".parse().unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[&(0, a)], ["web", "blue"]);
        assert_eq!(g[&(4, c)], ["db"], "in its interface's network");
        assert!(
            state.to_config().contains("mac 52:54:00:00:00:01 mode adaptive queues 1 group web group blue"),
            "{}",
            state.to_config()
        );
        let refused = |t: &str| vnet_control::parse(t).unwrap_err().to_string();
        assert!(refused("interface c tap tc group web").contains("`group` without `mac`"));
        assert!(refused("interface c tap tc mac 52:54:00:00:00:03 group web group web")
            .contains("a second `group`"));
    }

    #[test]
    fn the_signed_policy_wins_over_namesakes_and_groups_are_joined() {
        let local = policies(
            "policy default allow\ngroup web 52:54:00:00:00:01\nrule a allow proto tcp\nrule b deny proto udp\n",
        );
        let signed = policies("policy default deny\ngroup web 52:54:00:00:00:02\nrule a deny proto tcp\n");
        let m = merged(&local, &signed);
        assert_eq!(m.defaults[&0], vnet_control::policy::Verb::Deny);
        assert_eq!(m.rules["a"].verb, vnet_control::policy::Verb::Deny, "the signed rule a");
        assert!(m.rules.contains_key("b"), "the local rule b stays");
        assert_eq!(m.groups["web"].len(), 2);
    }
}
