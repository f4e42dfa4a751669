//! `show drops` and the drops' counters in `show metrics`: the history
//! (`crate::drops`) gathered, named by the daemon's state and rendered.

use super::Daemon;
use crate::drops::{entry_json, entry_text, Clocks, Names};
use serde_json::{json, Value};
use std::fmt::Write as _;
use vnet_control::drops::DropsQuery;
use vnet_core::{DropReason, Port};
use vnet_engine::drops::Denial;

impl Names for Daemon {
    fn port(&self, p: Port) -> Option<String> {
        match p {
            Port::Interface(id) => self.state.interfaces.get(&id).map(|i| i.name.clone()),
            Port::Link(id) => self.state.links.get(&id).map(|l| l.name.clone()),
        }
    }

    fn ifindex(&self, i: u32) -> Option<String> {
        let served = self.kernel.ifaces.iter().find(|(_, k)| k.ifindex == i);
        served.and_then(|(id, _)| self.port(Port::Interface(*id))).or_else(|| Some(format!("ifindex {i}")))
    }

    fn rule(&self, p: Option<Port>, d: Denial) -> String {
        match d {
            Denial::Default => "default".into(),
            Denial::Unclassifiable => "unclassifiable".into(),
            Denial::OrphanFragment => "orphan_fragment".into(),
            Denial::NetworkPolicy { policy, egress } => {
                let plane = self.shared.plane.load();
                let net = p.map_or(0, |p| plane.network_of(p));
                let iso = plane.policy.nets.get(&net).and_then(|n| n.isolation.clone());
                let name = iso.as_ref().and_then(|i| i.policies.get(policy as usize)).map(|p| p.name.clone());
                let dir = if egress { "egress" } else { "ingress" };
                format!("networkpolicy {} ({dir})", name.unwrap_or_else(|| format!("#{policy}")))
            }
            Denial::Rule { index, generation } => {
                let plane = self.shared.plane.load();
                let net = p.map_or(0, |p| plane.network_of(p));
                let rule = plane.policy.nets.get(&net).and_then(|n| n.rules.get(index as usize));
                match rule {
                    Some(r) if plane.policy.generation as u32 == generation => r.name.to_string(),
                    _ => format!("#{index} (of a policy since replaced)"),
                }
            }
        }
    }
}

impl Daemon {
    /// `show drops [N] [since SEQ] [json]`: gathers what is new, then the
    /// newest drops. A query with `since` is a monitor's poll: it keeps
    /// the kernel program sending events ([`crate::drops::WATCH_LEASE`]).
    pub fn show_drops(&self, q: DropsQuery) -> String {
        let kernel = self.kernel.path.as_ref().map(|k| k.drops());
        let clocks = Clocks {
            wall_ns: crate::shared::wall_ns(),
            engine_ns: self.shared.now_ns(),
            mono_ns: crate::sys::bpf::monotonic_ns(),
        };
        let rings = self.shared.global.drops.rings();
        let mut log = self.shared.drop_log.lock().unwrap_or_else(|p| p.into_inner());
        if q.since.is_some() {
            if let Err(e) = log.watch(kernel.clone(), std::time::Instant::now()) {
                tracing::warn!("drop events: could not start the kernel program's: {e}");
            }
        }
        log.gather(&rings, kernel.as_ref(), clocks);
        let drops: Vec<Value> =
            log.last(q.last as usize, q.since).iter().map(|e| entry_json(e, self)).collect();
        let (next, lost) = (log.next_seq(), log.lost);
        drop(log);
        let counts = self.drop_counts();
        if q.json {
            return json!({ "drops": drops, "next": next, "lost": lost, "reasons": counts }).to_string();
        }
        let mut out = String::new();
        if q.since.is_none() {
            out.push_str("drops by reason (user, kernel):\n");
            for (reason, v) in counts.as_object().into_iter().flatten() {
                let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
                let _ = writeln!(out, "  {reason:<20} {:>10} {:>10}", n("user"), n("kernel"));
            }
            let _ = writeln!(out, "last {} of the drops recorded ({lost} overwritten unread):", drops.len());
        }
        for d in &drops {
            out.push_str(&entry_text(d));
            out.push('\n');
        }
        out
    }

    /// `show flows [N] [since SEQ] [json]`: the flow log's newest records
    /// (none, saying why, without `--flow-log`).
    pub fn show_flows(&self, q: vnet_control::flows::FlowsQuery) -> String {
        match self.shared.flow_log.get() {
            Some(log) => log.show(q),
            None if q.json => json!({ "flows": [], "next": 0, "enabled": false }).to_string(),
            None => "no flow log: vnetd runs without --flow-log (start it with --flow-log PATH, or - for standard output)\n".into(),
        }
    }

    /// Drops by reason on each path: `{"no_route": {"user": N, "kernel": M}, ...}`,
    /// every reason listed (the kernel's from its `S_*` counters).
    pub(super) fn drop_counts(&self) -> Value {
        let mut kernel = [0u64; DropReason::COUNT];
        if let Some(k) = &self.kernel.path {
            for (i, (_, n)) in k.stats().into_iter().enumerate() {
                if let Some(r) = crate::kernel::drops::reason_of(i as u32) {
                    kernel[r as usize] += n;
                }
            }
        }
        let mut m = serde_json::Map::new();
        for (r, n) in self.shared.global.drops.counts() {
            m.insert(r.name().into(), json!({ "user": n, "kernel": kernel[r as usize] }));
        }
        Value::Object(m)
    }

    /// `vnet_drops_total{path,reason}` for `show metrics`, every reason on
    /// the user path and, when it is loaded, on the kernel path.
    pub(super) fn drop_metrics(&self, out: &mut String) {
        out.push_str("# HELP vnet_drops_total Frames dropped, by data path and reason.\n");
        out.push_str("# TYPE vnet_drops_total counter\n");
        let counts = self.drop_counts();
        for path in ["user", "kernel"] {
            if path == "kernel" && self.kernel.path.is_none() {
                continue;
            }
            for r in DropReason::ALL {
                let n = counts[r.name()][path].as_u64().unwrap_or(0);
                let _ = writeln!(out, "vnet_drops_total{{path=\"{path}\",reason=\"{}\"}} {n}", r.name());
            }
        }
        let log = self.shared.drop_log.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "# TYPE vnet_drop_records_lost counter\nvnet_drop_records_lost {}", log.lost);
    }
}
