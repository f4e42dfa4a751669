//! The policy the engine enforces: built from the state's `policy`, `rule`
//! and `group` lines when they change (a route change keeps the set, and
//! the flows it allowed), and shown with each rule's counts
//! (`show policy`, Prometheus `vnet_policy_*`).

use super::*;
use std::sync::atomic::Ordering::Relaxed;
use vnet_core::policy::PolicySet;

impl Daemon {
    /// The set the engine enforces under `state`: built again, as a new
    /// generation, only when its lines changed.
    pub(super) fn policy_of(&mut self, state: &State) -> Arc<PolicySet> {
        if let Some((lines, built)) = &self.policy_built {
            if *lines == state.policies {
                return built.clone();
            }
        }
        let old = self.shared.plane.load().policy.clone();
        let generation = old.generation + 1;
        let none = std::collections::BTreeMap::new();
        let built = Arc::new(vnet_engine::policy::build(&state.policies, &none, generation, &old));
        self.policy_built = Some((state.policies.clone(), built.clone()));
        built
    }

    /// `show policy`: each governed network, its rules in the order they
    /// are tried with what each decided, and what state passed.
    pub(super) fn policy_json(&self) -> Value {
        let plane = self.shared.plane.load();
        let p = &plane.policy;
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
                            "name": r.name,
                            "line": self.state.policies.rules.get(&r.name).map(|d| d.to_line()),
                            "action": r.action,
                            "packets": c.packets,
                            "bytes": c.bytes,
                            "drops": c.drops,
                        })
                    })
                    .collect();
                let d = net.default_counters.snapshot();
                let s = net.stateful.snapshot();
                json!({
                    "network": n,
                    "default": net.default,
                    "rules": rules,
                    "default_packets": d.packets,
                    "default_drops": d.drops,
                    "stateful_packets": s.packets,
                    "unclassifiable": net.unclassifiable.load(Relaxed),
                    "orphan_fragments": net.orphan_fragments.load(Relaxed),
                })
            })
            .collect();
        json!({
            "policy": nets,
            "generation": p.generation,
            "flows": p.flows.live(),
            "flow_slots": p.flows.slots(),
            "flows_evicted": p.flows.evicted.load(Relaxed),
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
            out.push_str(&super::table(&["name", "action", "packets", "drops"], &rows));
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
            let rows = net.rules.iter().map(|r| (r.name.as_str(), &*r.counters));
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
