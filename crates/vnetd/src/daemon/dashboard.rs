//! The dashboard's document (`GET /api/state.json` on the metrics
//! listener, `crate::web`): what `show` already reports, in one JSON
//! object the page draws. Nothing here is new state: the links, routes and
//! interfaces are their `show ... json` rows (`views.rs`), the matrix is
//! `show matrix json`'s, the drops `show drops json`'s reasons, the denies
//! `show policy json`'s rules; the hosts are the cluster's view of the
//! store (cluster mode) or this host and its links' peers (static).

use super::Daemon;
use serde_json::{json, Value};

/// The document's layout version (the page checks it).
pub const DASHBOARD_VERSION: u64 = 1;

impl Daemon {
    /// The dashboard's document: this host, the hosts it knows, its links
    /// (each to the peer it is named after), its interfaces (its VMs), its
    /// routes (which MACs each link reaches), the traffic matrix, drops by
    /// reason and policy denies by rule.
    pub fn dashboard_state(&self) -> Value {
        let cluster =
            self.cluster.status.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).clone());
        let host = cluster.as_ref().map_or_else(|| "this host".to_string(), |c| c.host.clone());
        let links = self.links_json();
        let mut hosts: Vec<String> = cluster.as_ref().map(|c| c.hosts.clone()).unwrap_or_default();
        if !hosts.contains(&host) {
            hosts.insert(0, host.clone());
        }
        // A link's peer is the host it is named after (cluster links are);
        // a static link's peer is a host of that name.
        for l in &links {
            if let Some(name) = l["name"].as_str() {
                if !hosts.iter().any(|h| h == name) {
                    hosts.push(name.to_string());
                }
            }
        }
        json!({
            "version": DASHBOARD_VERSION,
            "time_ms": crate::membership::now_ms(),
            "host": host,
            "mode": if cluster.is_some() { "cluster" } else { "static" },
            "cluster": cluster.map(|c| json!({
                "network": c.network,
                "store": c.health.as_str(),
                "revision": c.revision,
            })),
            "hosts": hosts,
            "links": links,
            "interfaces": self.ifaces_json(),
            "routes": self.routes_json(),
            "matrix": self.matrix_json()["matrix"].take(),
            "drops": self.drop_counts(),
            "denies": denies(&self.policy_json()),
        })
    }
}

/// Policy denies by rule, from `show policy json`: each rule that denies
/// or dropped, each network's default, each NetworkPolicy's denials.
fn denies(policy: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for n in policy["policy"].as_array().into_iter().flatten() {
        let net = &n["network"];
        for r in n["rules"].as_array().into_iter().flatten() {
            if r["action"] == "deny" || r["drops"].as_u64().unwrap_or(0) > 0 {
                out.push(
                    json!({"network": net, "rule": r["name"], "action": r["action"], "drops": r["drops"]}),
                );
            }
        }
        out.push(
            json!({"network": net, "rule": "(default)", "action": n["default"], "drops": n["default_drops"]}),
        );
        for p in n["networkpolicies"]["policies"].as_array().into_iter().flatten() {
            let rule = format!("networkpolicy {}", p["name"].as_str().unwrap_or("?"));
            out.push(json!({"network": net, "rule": rule, "action": "deny", "drops": p["denied"]}));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document holds every part the page draws, each as `show` has it.
    #[test]
    fn the_document_is_what_show_reports() {
        let mut d = Daemon::default();
        let text = "listen udp 127.0.0.1:0\nlink h2 udp 127.0.0.2\nroute any 52:54:00:00:00:02 -> link h2\n\
                    policy default allow\nrule web deny proto tcp port 80\n";
        d.apply(&vnet_control::parse(text).unwrap()).unwrap();
        let s = d.dashboard_state();
        assert_eq!(s["version"], DASHBOARD_VERSION);
        assert_eq!(s["mode"], "static");
        assert_eq!(s["hosts"], json!(["this host", "h2"]), "this host and its link's peer");
        assert_eq!(s["links"][0]["name"], "h2");
        assert_eq!(s["links"][0]["remote"], "127.0.0.2:9000");
        assert_eq!(s["routes"][0]["to"], "link h2");
        assert!(s["interfaces"].as_array().unwrap().is_empty());
        assert!(s["matrix"]["pairs"].is_array(), "{}", s["matrix"]);
        assert_eq!(s["drops"]["no_route"], json!({"user": 0, "kernel": 0}));
        let rules: Vec<&str> =
            s["denies"].as_array().unwrap().iter().map(|r| r["rule"].as_str().unwrap()).collect();
        assert_eq!(rules, ["web", "(default)"], "{}", s["denies"]);
    }

    /// The metric names (families) of Prometheus text: samples' and `# TYPE` lines'.
    fn families(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE ").or((!l.starts_with('#')).then_some(l)))
            .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_string())
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// Every `vnet_...` name in a Grafana dashboard's queries (`expr`,
    /// `query`, `definition`, at any depth).
    fn referenced(v: &Value, key: &str, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::String(s) if ["expr", "query", "definition"].contains(&key) => {
                let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
                for (i, _) in s.match_indices("vnet_") {
                    if i == 0 || !ident(s[..i].chars().next_back().unwrap_or(' ')) {
                        let end = s[i..].find(|c: char| !ident(c)).map_or(s.len(), |e| i + e);
                        out.insert(s[i..end].to_string());
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| referenced(x, key, out)),
            Value::Object(m) => m.iter().for_each(|(k, x)| referenced(x, k, out)),
            _ => {}
        }
    }

    /// `packaging/grafana/vnet.json` names only metrics vnetd exports:
    /// every family of `show metrics` with a link, a route and a policy,
    /// the cluster's (`membership::Status`), and the interfaces' traffic
    /// (`views::Traffic`, whose fields the interface rows carry).
    #[test]
    fn grafana_dashboard_names_only_exported_metrics() {
        let mut d = Daemon::default();
        let text = "listen udp 127.0.0.1:0\nlink h2 udp 127.0.0.2\nroute any any -> link h2\n\
                    policy default allow\nrule web deny proto tcp port 80\n";
        d.apply(&vnet_control::parse(text).unwrap()).unwrap();
        let mut out = d.metrics();
        crate::membership::Status::default().metrics(&mut out);
        let mut exported = families(&out);
        let traffic = serde_json::to_value(super::super::views::Traffic::default()).unwrap();
        exported.extend(traffic.as_object().unwrap().keys().map(|k| format!("vnet_interface_{k}")));
        let missing = |dashboard: &Value| {
            let mut names = std::collections::BTreeSet::new();
            referenced(dashboard, "", &mut names);
            (names.len(), names.into_iter().filter(|n| !exported.contains(n)).collect::<Vec<_>>())
        };
        let dashboard: Value =
            serde_json::from_str(include_str!("../../../../packaging/grafana/vnet.json")).unwrap();
        let (n, unknown) = missing(&dashboard);
        assert!(unknown.is_empty(), "not exported by vnetd: {unknown:?}");
        assert!(n >= 15, "the dashboard names {n} metrics");
        // The control: a query naming a metric vnetd does not export is found.
        let mut probe = dashboard.clone();
        probe["panels"][1]["targets"][0]["expr"] = "rate(vnet_link_tx_bytez[5m]) + vnet_link_up".into();
        assert_eq!(missing(&probe).1, ["vnet_link_tx_bytez"]);
    }
}
