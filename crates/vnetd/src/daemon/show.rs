//! What `show` and the metrics report: the text tables and JSON of the
//! routes, links and interfaces (from their typed views, `views.rs`), the
//! daemon-wide counters, and the Prometheus exposition of all of them.

use super::Daemon;
use serde_json::{json, Value};
use vnet_control::ShowWhat;

/// Columns of the text tables of `show`.
const IFACE_COLS: &[&str] = &[
    "id",
    "name",
    "kind",
    "dev",
    "netns",
    "mac",
    "offload",
    "queues",
    "mode",
    "datapath",
    "state",
    "source_guard",
    "dispatch",
    "mode_switches",
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "tx_drops",
];
const LINK_COLS: &[&str] = &[
    "id",
    "name",
    "kind",
    "state",
    "remote",
    "format",
    "network",
    "mtu",
    // A secured link's: `auth` or `encrypt`, the AEAD in use, and whether
    // its datagrams go `direct`, `punched` (through a NAT), `roamed` or
    // `relayed` (`-` on a link without a key).
    "security",
    "cipher",
    "path",
    "rx_packets",
    "rx_bytes",
    "rx_drops",
    "tx_packets",
    "tx_bytes",
    "tx_drops",
];
const ROUTE_COLS: &[&str] = &["id", "src", "dst", "to", "from", "packets", "bytes", "drops"];

impl Daemon {
    /// The reply body of a `show` command.
    pub fn show(&self, what: ShowWhat, as_json: bool) -> String {
        if what == ShowWhat::Metrics {
            return self.metrics();
        }
        if what == ShowWhat::Matrix {
            return self.show_matrix(as_json);
        }
        if what == ShowWhat::Policy {
            return if as_json { self.policy_json().to_string() } else { self.policy_text() };
        }
        if what == ShowWhat::Cluster {
            let status =
                self.cluster.status.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).clone());
            return match (status, as_json) {
                (Some(s), true) => json!({ "cluster": s.json() }).to_string(),
                (Some(s), false) => s.text(),
                (None, true) => json!({ "cluster": null }).to_string(),
                (None, false) => "not in cluster mode (vnetd --cluster)\n".to_string(),
            };
        }
        if what == ShowWhat::Config {
            return if as_json {
                json!({ "config": self.state.to_config() }).to_string()
            } else {
                self.state.to_config()
            };
        }
        let v = match what {
            ShowWhat::Routes => json!({ "routes": self.routes_json() }),
            ShowWhat::Links => json!({ "links": self.links_json() }),
            ShowWhat::Interfaces => json!({ "interfaces": self.ifaces_json() }),
            ShowWhat::Global => json!({ "global": self.global_json() }),
            _ => json!({
                "routes": self.routes_json(),
                "links": self.links_json(),
                "interfaces": self.ifaces_json(),
                "global": self.global_json(),
            }),
        };
        if as_json {
            return v.to_string();
        }
        let mut out = String::new();
        for (key, cols) in [("interfaces", IFACE_COLS), ("links", LINK_COLS), ("routes", ROUTE_COLS)] {
            if let Some(Value::Array(rows)) = v.get(key) {
                if what == ShowWhat::Stats {
                    out.push_str(&format!("{key}:\n"));
                }
                out.push_str(&table(cols, rows));
            }
        }
        if let Some(Value::Object(g)) = v.get("global") {
            out.push_str("global:\n");
            for (k, v) in g {
                out.push_str(&format!("  {k} {v}\n"));
            }
        }
        out
    }

    /// Every counter of `show stats` (user and kernel path merged) in the
    /// Prometheus text exposition format (version 0.0.4), for `show
    /// metrics` and `vnetd --metrics`. Written out here rather than through
    /// a metrics registry: vnetd already keeps every counter, and the
    /// format is a line per sample.
    pub fn metrics(&self) -> String {
        let mut out = String::new();
        let groups =
            [("interface", self.ifaces_json()), ("link", self.links_json()), ("route", self.routes_json())];
        for (kind, rows) in &groups {
            let label = if *kind == "route" { "id" } else { "name" };
            metric_rows(&mut out, kind, label, rows);
        }
        if let Value::Object(g) = self.global_json() {
            for (k, v) in g {
                if let Some(n) = v.as_u64() {
                    out.push_str(&format!("# TYPE vnet_{k} untyped\nvnet_{k} {n}\n"));
                }
            }
        }
        self.matrix_metrics(&mut out);
        self.policy_metrics(&mut out);
        self.drop_metrics(&mut out);
        if let Some(c) = &self.cluster.status {
            c.lock().unwrap_or_else(|p| p.into_inner()).metrics(&mut out);
        }
        out
    }

    pub(super) fn routes_json(&self) -> Vec<Value> {
        super::views::rows(&self.route_views())
    }

    pub(super) fn links_json(&self) -> Vec<Value> {
        super::views::rows(&self.link_views())
    }

    pub(super) fn ifaces_json(&self) -> Vec<Value> {
        super::views::rows(&self.iface_views())
    }

    fn global_json(&self) -> Value {
        let mut v = self.global_user_json();
        if let Value::Object(m) = &mut v {
            let status = match (&self.kernel.path, &self.kernel.off) {
                (Some(_), _) => "loaded".to_string(),
                (None, Some(r)) => format!("off: {r}"),
                (None, None) => "not requested".to_string(),
            };
            m.insert("kernel_path".into(), status.into());
            m.insert(
                "last_transaction_us".into(),
                (self.last_transaction.0.as_nanos() as f64 / 1000.0).into(),
            );
            m.insert("last_transaction_routes_only".into(), self.last_transaction.1.into());
            if let Some(log) = self.shared.flow_log.get() {
                if let Value::Object(more) = log.stats(&self.shared.plane.load().policy.flows) {
                    m.extend(more);
                }
            }
            if let Some(k) = &self.kernel.path {
                m.insert("kernel_route_entries".into(), k.entries().into());
                m.insert("kernel_route_capacity".into(), k.capacity.into());
                m.insert("kernel_route_overflow".into(), k.overflow.into());
                m.insert("kernel_dest_entries".into(), k.dest_entries().into());
                m.insert("kernel_last_sync_us".into(), (k.last_sync.as_nanos() as f64 / 1000.0).into());
                m.insert("kernel_last_sync_incremental".into(), k.last_sync_incremental.into());
                for (name, n) in k.stats() {
                    m.insert(name.into(), n.into());
                }
            }
        }
        v
    }

    /// `show stats`' global part: the daemon-wide counters
    /// (`vnet_engine::global::Global`, named where they are defined) and the
    /// link worker's dispatch (`link_`-prefixed).
    fn global_user_json(&self) -> Value {
        let g = &self.shared.global;
        let mut v = json!(&**g);
        merge(&mut v, json!(&*g.link_dispatch), "link_");
        merge(
            &mut v,
            json!({
                "route_table_generation": self.generation,
                "link_mode": self.state.listen_mode.word(),
                "link_reader_messages": self.sockets.bound.udp.iter().chain(&self.sockets.bound.vxlan)
                    .flat_map(|b| b.readers.iter().map(|r| r.messages.load(std::sync::atomic::Ordering::Relaxed)))
                    .collect::<Vec<u64>>(),
            }),
            "",
        );
        v
    }
}

/// Adds `more`'s fields to the object `v`, each name behind `prefix`.
fn merge(v: &mut Value, more: Value, prefix: &str) {
    if let (Value::Object(m), Value::Object(more)) = (v, more) {
        for (k, x) in more {
            m.insert(format!("{prefix}{k}"), x);
        }
    }
}

/// One Prometheus family per numeric field of `rows`, a sample per row
/// labelled by its `label` field: `vnet_<kind>_<field>{<kind>="..."} N`.
fn metric_rows(out: &mut String, kind: &str, label: &str, rows: &[Value]) {
    let mut fields: Vec<&str> = Vec::new();
    for r in rows {
        if let Value::Object(m) = r {
            for (k, v) in m {
                if v.is_u64() && k != "id" && !fields.contains(&k.as_str()) {
                    fields.push(k);
                }
            }
        }
    }
    for f in fields {
        out.push_str(&format!("# TYPE vnet_{kind}_{f} untyped\n"));
        for r in rows {
            let (Some(n), Some(l)) = (r[f].as_u64(), r.get(label)) else { continue };
            let l = match l {
                Value::String(s) => s.replace('\\', "\\\\").replace('"', "\\\""),
                other => other.to_string(),
            };
            out.push_str(&format!("vnet_{kind}_{f}{{{kind}=\"{l}\"}} {n}\n"));
        }
    }
}

/// Renders `rows` (JSON objects) as an aligned text table of `cols`.
pub(super) fn table(cols: &[&str], rows: &[Value]) -> String {
    let cell = |r: &Value, c: &str| match r.get(c) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "-".into(),
    };
    let mut widths: Vec<usize> = cols.iter().map(|c| c.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(cols) {
            *w = (*w).max(cell(r, c).len());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(cols.iter().map(|c| c.to_string()).collect());
    for r in rows {
        out.push_str(&line(cols.iter().map(|c| cell(r, c)).collect()));
    }
    out
}
