//! What cluster mode reports: membership, the watch revision, the store's
//! health and the last convergence. The [`cluster`](crate::cluster) task
//! writes it; `show cluster` and the metrics read it. Kept apart from the
//! task so the daemon can show it without depending on the task.

use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the store stands, as this host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Health {
    /// Not reached yet since the start.
    #[default]
    Connecting,
    /// Watching.
    Up,
    /// Unreachable (or the session failed): the data path keeps the last
    /// state; the task retries.
    Down,
    /// Refused for good until someone fixes it (a password, a CA, a client
    /// certificate, a permission): vnetd does not report ready; `last_error`
    /// says what to fix. The task still retries, slowly.
    Failed,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Connecting => "connecting",
            Health::Up => "up",
            Health::Down => "down",
            Health::Failed => "failed",
        }
    }
}

/// The last time the host's links and routes were brought to the view.
#[derive(Debug, Clone, Default)]
pub struct Convergence {
    /// Wall clock, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The revision the view was at.
    pub revision: u64,
    /// Store events (or listed keys) it took in.
    pub events: u64,
    /// Lines of the transaction it applied.
    pub lines: usize,
    /// From the first event taken to the transaction applied.
    pub took_us: u64,
}

/// Counters of the cluster task.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub events: u64,
    pub relists: u64,
    pub transactions: u64,
    pub transaction_errors: u64,
    pub store_errors: u64,
    pub leases_lost: u64,
    pub macs_claimed: u64,
    pub macs_released: u64,
    pub announces: u64,
    pub bad_records: u64,
    /// Of those, claims naming a group their host's certificate does not
    /// allow (signed networks).
    pub groups_refused: u64,
    /// Of those, claims the Kubernetes API contradicts (`--kube`).
    pub pods_refused: u64,
    /// Claims not kept waiting for the API: their node had as many
    /// waiting as it may (`--kube`).
    pub pods_waiting_dropped: u64,
    /// Of those, claims of another live host's node gateway MAC or address.
    pub gateway_claims: u64,
    /// This host's own record found changed or deleted by another writer,
    /// and put back.
    pub records_restored: u64,
    /// Local interfaces found with a MAC another live host holds.
    pub conflicts: u64,
    /// Signed policies refused for a serial not above the one held (a
    /// rollback; also in `bad_records`).
    pub stale_policies: u64,
    /// Addresses another host allocated at once, given up (`ipam add`
    /// took the next).
    pub address_races: u64,
    /// `neigh` lines withdrawn when a claim of another host's VM named
    /// their address with another MAC (lines made before the claim
    /// arrived; a later one is refused).
    pub neighbors_withdrawn: u64,
}

/// The report.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub network: String,
    pub host: String,
    pub endpoints: Vec<String>,
    pub health: Health,
    /// When `health` last changed (ms since the epoch).
    pub since_ms: u64,
    pub last_error: Option<String>,
    pub lease: Option<i64>,
    pub ttl_s: u64,
    /// The revision of the last event applied.
    pub revision: u64,
    /// Live hosts, this one included, sorted.
    pub hosts: Vec<String>,
    /// Signed networks: each host's certificate expiry (seconds since the
    /// epoch), by host, for certificates that have one.
    pub expiries: std::collections::BTreeMap<String, u64>,
    /// Signed networks: each linked host's certificate id.
    pub cert_ids: std::collections::BTreeMap<String, String>,
    /// Claims of a held MAC by another host at no higher epoch, seen in
    /// the store: (MAC, holder, claimant).
    pub conflicts: Vec<(vnet_wire::MacAddr, String, String)>,
    /// This host's interfaces whose MAC another live host holds, not
    /// claimed: (MAC, holder, interface).
    pub unclaimed: Vec<(vnet_wire::MacAddr, String, String)>,
    /// Hosts and certificates revoked by the network key.
    pub revoked: (usize, usize),
    /// This host itself is revoked (`vnetctl network revoke`).
    pub revoked_self: bool,
    /// The links the cluster made (named after hosts): not the config
    /// file's to save or delete, and the only ones a host's record may
    /// change; a static link of a host's name stays the configuration's.
    pub links: std::collections::BTreeSet<String>,
    /// MACs in the store; routed to links; published by this host.
    pub macs: usize,
    pub routes: usize,
    pub owned: usize,
    /// Addresses the claims name, answered for at the edge (`neigh`).
    pub neighbors: usize,
    /// Addresses several live claims name, answered for by no host:
    /// (vnet network, address, the MACs that claim it).
    pub address_conflicts: Vec<(u32, std::net::IpAddr, Vec<vnet_wire::MacAddr>)>,
    /// The serial of the network's signed policy enforced, if any.
    pub policy_serial: Option<u64>,
    pub last: Option<Convergence>,
    pub counters: Counters,
    /// Records not taken, by key, with why (the first few hundred; the
    /// `bad_records` counter counts them all).
    pub quarantined: Vec<(String, String)>,
}

/// Certificates with fewer days left than this are counted as expiring
/// (`vnet_cluster_certificates_expiring_30d`).
pub const EXPIRING_DAYS: i64 = 30;

/// Whole days from now until `not_after` (seconds since the epoch);
/// negative once it has passed.
pub fn days_left(not_after: u64) -> i64 {
    (not_after as i64 - (now_ms() / 1000) as i64).div_euclid(86_400)
}

/// The report, shared between the task and the daemon.
pub type Shared = Arc<Mutex<Status>>;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What `show cluster` and the log say of a host the network's admin
/// revoked: what happened, and that only the admin can undo it.
pub fn revoked_text(network: &str) -> String {
    format!(
        "this host was revoked by the network's admin (`vnetctl network revoke`): the other hosts of \
         network {network} refuse its links and the store no longer lets it in; only the admin can take \
         it back (a new token, `vnetctl join`, and `network approve ... replace`); \
         `systemctl disable --now vnetd@{network}` stops it trying"
    )
}

impl Status {
    /// Moves to `health` (and stamps the time if it changed).
    pub fn set_health(&mut self, health: Health, error: Option<String>) {
        if self.health != health {
            self.since_ms = now_ms();
        }
        self.health = health;
        if error.is_some() {
            self.last_error = error;
        }
    }

    pub fn json(&self) -> Value {
        let c = &self.counters;
        // Apart from the rest: one json! of both passes serde_json's macro
        // recursion limit.
        let counters = json!({
        "events": c.events,
        "relists": c.relists,
        "transactions": c.transactions,
        "transaction_errors": c.transaction_errors,
        "store_errors": c.store_errors,
        "leases_lost": c.leases_lost,
        "macs_claimed": c.macs_claimed,
        "macs_released": c.macs_released,
        "announces": c.announces,
        "bad_records": c.bad_records,
        "groups_refused": c.groups_refused,
        "pods_refused": c.pods_refused,
        "pods_waiting_dropped": c.pods_waiting_dropped,
        "gateway_claims": c.gateway_claims,
        "records_restored": c.records_restored,
        "conflicts": c.conflicts,
        "stale_policies": c.stale_policies,
        "address_races": c.address_races,
        "neighbors_withdrawn": c.neighbors_withdrawn,
        });
        json!({
            "network": self.network,
            "host": self.host,
            "endpoints": self.endpoints,
            "store": self.health.as_str(),
            "store_since_ms": self.since_ms,
            "last_error": self.last_error,
            "lease": self.lease.map(|l| format!("{l:x}")),
            "ttl_s": self.ttl_s,
            "revision": self.revision,
            "hosts": self.hosts,
            "certificates": self.expiries.iter().map(|(h, t)| json!({
                "host": h, "not_after": t, "days_left": days_left(*t), "id": self.cert_ids.get(h),
            })).collect::<Vec<_>>(),
            "conflicts": self.conflicts().map(|(mac, holder, claimant, iface)| json!({
                "mac": mac.to_string(), "holder": holder, "claimant": claimant, "interface": iface,
            })).collect::<Vec<_>>(),
            "revoked": {"hosts": self.revoked.0, "certificates": self.revoked.1},
            "revoked_self": self.revoked_self,
            "macs": self.macs,
            "routes": self.routes,
            "owned": self.owned,
            "neighbors": self.neighbors,
            "address_conflicts": self.address_conflicts.iter().map(|(net, ip, macs)| json!({
                "network": net, "address": ip.to_string(),
                "macs": macs.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "policy_serial": self.policy_serial,
            "quarantined": self.quarantined.iter().map(|(k, why)| json!({"key": k, "why": why})).collect::<Vec<_>>(),
            "last_convergence": self.last.as_ref().map(|l| json!({
                "at_ms": l.at_ms,
                "revision": l.revision,
                "events": l.events,
                "lines": l.lines,
                "took_us": l.took_us,
            })),
            "counters": counters,
        })
    }

    /// `show cluster`, for people.
    pub fn text(&self) -> String {
        let now = now_ms();
        let ago = |ms: u64| format!("{:.1} s ago", now.saturating_sub(ms) as f64 / 1000.0);
        let mut s = format!(
            "network {} host {} store {} ({}) since {}\n",
            self.network,
            self.host,
            self.health.as_str(),
            self.endpoints.join(","),
            ago(self.since_ms)
        );
        if self.revoked_self {
            s.push_str(&format!("{}\n", revoked_text(&self.network)));
        }
        if let Some(e) = &self.last_error {
            s.push_str(&format!("last error: {e}\n"));
        }
        s.push_str(&format!(
            "revision {} lease {} ttl {} s\nhosts {}: {}\nmacs {} routed {} owned {} addresses {}\n",
            self.revision,
            self.lease.map_or("none".to_string(), |l| format!("{l:x}")),
            self.ttl_s,
            self.hosts.len(),
            self.hosts.join(" "),
            self.macs,
            self.routes,
            self.owned,
            self.neighbors
        ));
        if !self.expiries.is_empty() {
            let each: Vec<String> =
                self.expiries.iter().map(|(h, t)| format!("{h} {}", days_left(*t))).collect();
            s.push_str(&format!("certificates, days left: {}\n", each.join(", ")));
        }
        if self.revoked != (0, 0) {
            s.push_str(&format!("revoked: {} hosts, {} certificates\n", self.revoked.0, self.revoked.1));
        }
        if let Some(serial) = self.policy_serial {
            s.push_str(&format!("policy: signed, serial {serial}\n"));
        }
        for (net, ip, macs) in &self.address_conflicts {
            let macs: Vec<String> = macs.iter().map(|m| m.to_string()).collect();
            s.push_str(&format!(
                "address conflict: {ip} (network {net}) claimed by {}: answered by no host\n",
                macs.join(", ")
            ));
        }
        for (mac, holder, claimant, iface) in self.conflicts() {
            let iface =
                iface.map(|i| format!(" (interface {i} here: not claimed, not routed)")).unwrap_or_default();
            s.push_str(&format!("conflict {mac}: held by {holder}, claimed by {claimant}{iface}\n"));
        }
        match &self.last {
            Some(l) => s.push_str(&format!(
                "last convergence {}: revision {}, {} events, {} lines, {} us\n",
                ago(l.at_ms),
                l.revision,
                l.events,
                l.lines,
                l.took_us
            )),
            None => s.push_str("last convergence: none yet\n"),
        }
        let c = &self.counters;
        s.push_str(&format!(
            "events {} relists {} transactions {} transaction_errors {} store_errors {} leases_lost {} \
             macs_claimed {} macs_released {} announces {} bad_records {} groups_refused {} pods_refused {} pods_waiting_dropped {} records_restored {} \
             stale_policies {} neighbors_withdrawn {} gateway_claims {}\n",
            c.events,
            c.relists,
            c.transactions,
            c.transaction_errors,
            c.store_errors,
            c.leases_lost,
            c.macs_claimed,
            c.macs_released,
            c.announces,
            c.bad_records,
            c.groups_refused,
            c.pods_refused,
            c.pods_waiting_dropped,
            c.records_restored,
            c.stale_policies,
            c.neighbors_withdrawn,
            c.gateway_claims
        ));
        for (k, why) in &self.quarantined {
            s.push_str(&format!("quarantined {k}: {why}\n"));
        }
        s
    }

    /// Every conflict known here: MACs this host's interfaces could not
    /// claim, then claims seen in the store: (MAC, holder, claimant,
    /// this host's interface).
    pub fn conflicts(&self) -> impl Iterator<Item = (vnet_wire::MacAddr, &str, &str, Option<&str>)> {
        let local = self.unclaimed.iter().map(|(m, h, i)| {
            (*m, if h.is_empty() { "another host" } else { h.as_str() }, self.host.as_str(), Some(i.as_str()))
        });
        let seen = self
            .conflicts
            .iter()
            .filter(|(m, ..)| !self.unclaimed.iter().any(|(u, ..)| u == m))
            .map(|(m, h, c)| (*m, h.as_str(), c.as_str(), None));
        local.chain(seen)
    }

    /// The report's numbers in the Prometheus text format.
    pub fn metrics(&self, out: &mut String) {
        let mut gauge = |name: &str, v: u64| {
            out.push_str(&format!("# TYPE vnet_cluster_{name} gauge\nvnet_cluster_{name} {v}\n"));
        };
        gauge("store_up", u64::from(self.health == Health::Up));
        gauge("revision", self.revision);
        gauge("hosts", self.hosts.len() as u64);
        gauge("macs", self.macs as u64);
        gauge("routes", self.routes as u64);
        gauge("neighbors", self.neighbors as u64);
        gauge("owned_macs", self.owned as u64);
        gauge("quarantined_records", self.quarantined.len() as u64);
        let soon = self.expiries.values().filter(|&&t| days_left(t) < EXPIRING_DAYS).count();
        gauge("certificates_expiring_30d", soon as u64);
        gauge("mac_conflicts", self.conflicts().count() as u64);
        gauge("address_conflicts", self.address_conflicts.len() as u64);
        gauge("revoked_hosts", self.revoked.0 as u64);
        gauge("revoked_certificates", self.revoked.1 as u64);
        gauge("last_convergence_ms", self.last.as_ref().map_or(0, |l| l.at_ms));
        gauge("last_convergence_us", self.last.as_ref().map_or(0, |l| l.took_us));
        let c = &self.counters;
        for (name, v) in [
            ("events_total", c.events),
            ("relists_total", c.relists),
            ("transactions_total", c.transactions),
            ("transaction_errors_total", c.transaction_errors),
            ("store_errors_total", c.store_errors),
            ("leases_lost_total", c.leases_lost),
            ("macs_claimed_total", c.macs_claimed),
            ("macs_released_total", c.macs_released),
            ("announces_total", c.announces),
            ("bad_records_total", c.bad_records),
            ("groups_refused_total", c.groups_refused),
            ("pods_refused_total", c.pods_refused),
            ("pods_waiting_dropped_total", c.pods_waiting_dropped),
            ("gateway_claims_refused_total", c.gateway_claims),
            ("records_restored_total", c.records_restored),
            ("mac_conflicts_total", c.conflicts),
            ("stale_policies_total", c.stale_policies),
            ("address_races_total", c.address_races),
            ("neighbors_withdrawn_total", c.neighbors_withdrawn),
        ] {
            out.push_str(&format!("# TYPE vnet_cluster_{name} counter\nvnet_cluster_{name} {v}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_reads_the_same_in_text_json_and_metrics() {
        let mut s = Status { network: "lab".into(), host: "h1".into(), revision: 42, ..Default::default() };
        s.hosts = vec!["h1".into(), "h2".into()];
        s.quarantined = vec![("/vnet/lab/hosts/x".into(), "`public_key` is not a key".into())];
        s.set_health(Health::Down, Some("connection refused".into()));
        s.set_health(Health::Up, None);
        s.last = Some(Convergence { at_ms: now_ms(), revision: 42, events: 3, lines: 2, took_us: 150 });
        s.counters.groups_refused = 2;
        s.counters.pods_refused = 3;
        s.counters.pods_waiting_dropped = 4;
        s.counters.gateway_claims = 5;
        let j = s.json();
        assert_eq!(j["counters"]["groups_refused"], 2);
        assert_eq!(j["store"], "up");
        assert_eq!(j["revision"], 42);
        assert_eq!(j["last_error"], "connection refused", "the last error stays visible");
        assert_eq!(j["last_convergence"]["took_us"], 150);
        let t = s.text();
        assert!(t.contains("store up") && t.contains("hosts 2: h1 h2") && t.contains("150 us"), "{t}");
        assert!(t.contains("quarantined /vnet/lab/hosts/x: `public_key` is not a key"), "{t}");
        assert!(t.contains(" groups_refused 2 pods_refused 3 pods_waiting_dropped 4 "), "{t}");
        assert_eq!(j["counters"]["pods_waiting_dropped"], 4);
        assert_eq!(j["counters"]["pods_refused"], 3);
        assert_eq!(j["quarantined"][0]["key"], "/vnet/lab/hosts/x");
        let now = now_ms() / 1000;
        s.expiries =
            [("h1".to_string(), now + 100 * 86_400 + 60), ("h2".to_string(), now + 10 * 86_400 + 60)].into();
        let t = s.text();
        assert!(t.contains("certificates, days left: h1 100, h2 10"), "{t}");
        assert_eq!(s.json()["certificates"][1]["days_left"], 10);
        let mut m = String::new();
        s.metrics(&mut m);
        assert!(m.contains("vnet_cluster_store_up 1\n") && m.contains("vnet_cluster_revision 42\n"), "{m}");
        assert!(m.contains("vnet_cluster_quarantined_records 1\n"), "{m}");
        assert!(m.contains("vnet_cluster_groups_refused_total 2\n"), "{m}");
        assert!(m.contains("vnet_cluster_pods_refused_total 3\n"), "{m}");
        assert!(m.contains("vnet_cluster_pods_waiting_dropped_total 4\n"), "{m}");
        assert!(m.contains("vnet_cluster_gateway_claims_refused_total 5\n"), "{m}");
        assert!(t.contains(" gateway_claims 5\n") && j["counters"]["gateway_claims"] == 5, "{t}");
        assert!(m.contains("vnet_cluster_certificates_expiring_30d 1\n"), "{m}");
        assert!(m.contains("vnet_cluster_mac_conflicts 0\n"), "{m}");
        let mac: vnet_wire::MacAddr = "52:54:00:00:00:09".parse().unwrap();
        s.unclaimed = vec![(mac, "h2".into(), "vm9".into())];
        s.conflicts = vec![(mac, "h2".into(), "h1".into())];
        let t = s.text();
        assert!(
            t.contains("conflict 52:54:00:00:00:09: held by h2, claimed by h1 (interface vm9 here: not claimed, not routed)"),
            "{t}"
        );
        assert_eq!(t.matches("conflict 52").count(), 1, "once, not twice: {t}");
        assert_eq!(s.json()["conflicts"][0]["holder"], "h2");
        // A revoked host says so, and who can undo it (the control: not revoked, not said).
        assert!(!t.contains("revoked by"), "{t}");
        s.revoked_self = true;
        let t = s.text();
        assert!(
            t.contains("this host was revoked by the network's admin") && t.contains("only the admin"),
            "{t}"
        );
        assert_eq!(s.json()["revoked_self"], true);
        let mut m = String::new();
        s.metrics(&mut m);
        assert!(m.contains("vnet_cluster_mac_conflicts 1\n"), "{m}");
    }
}
