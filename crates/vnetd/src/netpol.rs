//! `--kube-network-policy`: Kubernetes' NetworkPolicies enforced on the
//! cluster's network (docs/INTEGRATION.md, "NetworkPolicy"). vnetd, in
//! vnet's DaemonSet, watches the pods, namespaces and NetworkPolicies of
//! the cluster as its service account ([`vnet_kube::watch`]), translates
//! them ([`vnet_kube::netpol`]) with this node's own addresses exempt (a
//! pod cannot block its node), and gives the engine the result
//! ([`Daemon::set_isolation`]), which judges the first packet of every
//! flow by it on both data paths.
//!
//! Every node translates the whole cluster, so each host judges both
//! ends of a packet the same: the sender's egress and the receiver's
//! ingress, wherever each runs. Until the three kinds are listed once
//! nothing is isolated; once they are, an API that cannot be reached
//! leaves the last translation in force. No NetworkPolicy at all leaves
//! the network ungoverned (the kernel path's flows untouched).

use crate::daemon::Daemon;
use serde_json::json;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use vnet_kube::objects::{Namespace, NetworkPolicy, Pod};
use vnet_kube::watch::{self, Store};

/// How long a burst of changes is gathered before one translation.
const GATHER: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The three stores the watches keep.
#[derive(Default)]
struct Stores {
    pods: Arc<Mutex<Store<Pod>>>,
    namespaces: Arc<Mutex<Store<Namespace>>>,
    policies: Arc<Mutex<Store<NetworkPolicy>>>,
}

/// A store's state for `show policy`.
fn store_json<T>(s: &Store<T>) -> serde_json::Value {
    json!({
        "objects": s.objects.len(),
        "synced": s.synced,
        "unreadable": s.bad,
        "refused": s.refused,
        "changes": s.changes,
        "last_error": s.last_error,
    })
}

/// Watches the API and keeps vnet network `network`'s isolation
/// translated, for ever.
pub async fn run(daemon: Arc<Mutex<Daemon>>, network: u32) {
    let stores = Stores::default();
    let changed = Arc::new(Notify::new());
    let api = vnet_kube::Api::in_this_pod;
    tokio::spawn(watch::reflect(api, watch::pods(), stores.pods.clone(), changed.clone()));
    tokio::spawn(watch::reflect(api, watch::namespaces(), stores.namespaces.clone(), changed.clone()));
    tokio::spawn(watch::reflect(api, watch::network_policies(), stores.policies.clone(), changed.clone()));
    let mut refused = std::collections::BTreeMap::new();
    loop {
        changed.notified().await;
        tokio::time::sleep(GATHER).await;
        translate(&daemon, network, &stores, &mut refused);
    }
}

/// One translation of what the stores hold, given to the daemon (once
/// every kind was listed). The policies refused are logged when they
/// change (`refused`: the last translation's).
fn translate(
    daemon: &Mutex<Daemon>,
    network: u32,
    stores: &Stores,
    refused: &mut std::collections::BTreeMap<String, String>,
) {
    let (pods, nss, pols) = (lock(&stores.pods), lock(&stores.namespaces), lock(&stores.policies));
    let watches = json!({
        "pods": store_json(&*pods),
        "namespaces": store_json(&*nss),
        "networkpolicies": store_json(&*pols),
    });
    if !(pods.synced && nss.synced && pols.synced) {
        drop((pods, nss, pols));
        lock(daemon).set_isolation_status(watches);
        return;
    }
    let p: Vec<Pod> = pods.objects.values().cloned().collect();
    let n: Vec<Namespace> = nss.objects.values().cloned().collect();
    let np: Vec<NetworkPolicy> = pols.objects.values().cloned().collect();
    drop((pods, nss, pols));
    let (mut iso, report) = vnet_kube::netpol::translate(&p, &n, &np, vnet_kube::netpol::Limits::default());
    match crate::sys::netdev::local_addresses() {
        Ok(a) => iso.exempt.extend(a),
        Err(e) => tracing::warn!("network policy: this node's addresses: {e}"),
    }
    if report.refused != *refused {
        for (policy, why) in &report.refused {
            tracing::warn!(policy, "network policy refused (its pods isolated, nothing allowed): {why}");
        }
        refused.clone_from(&report.refused);
    }
    let status = json!({"watches": watches, "translation": report});
    let iso = (!iso.policies.is_empty()).then_some(iso);
    if let Err(e) = lock(daemon).set_isolation(network, iso, status) {
        tracing::warn!("network policy: not applied: {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_nodes_addresses_are_read() {
        let a = crate::sys::netdev::local_addresses().unwrap();
        assert!(a.contains(&std::net::Ipv4Addr::LOCALHOST.into()), "{a:?}");
    }
}
