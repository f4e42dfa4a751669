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
//!
//! Service traffic is judged on its first leg: the Services and
//! EndpointSlices watched too give the engine each ClusterIP port's
//! backends ([`vnet_kube::services`]), and the other nodes' gateway
//! addresses are the translators whose second leg to a backend passes:
//! each live host's gateway as its record names it (signed by its claim
//! key in a signed network), kept only where the host holds that address
//! in the IPAM under its gateway owner and MAC, read every
//! [`GATEWAYS_EVERY`] ([`crate::ipam::translators`]): a value in the
//! IPAM alone makes nothing a translator. Until Services and
//! EndpointSlices are listed, Service traffic is judged as sent (and its
//! second leg as from the translating node's address).

use crate::daemon::Daemon;
use serde_json::json;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use vnet_kube::objects::{EndpointSlice, Namespace, NetworkPolicy, Pod, Service};
use vnet_kube::watch::{self, Store};

/// How long a burst of changes is gathered before one translation.
const GATHER: Duration = Duration::from_millis(50);
/// How often the nodes' gateway addresses are read (their records and the
/// IPAM; a node that joins is a translator of Services this long after at
/// most).
pub const GATEWAYS_EVERY: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The three stores the watches keep.
#[derive(Default)]
struct Stores {
    pods: Arc<Mutex<Store<Pod>>>,
    namespaces: Arc<Mutex<Store<Namespace>>>,
    policies: Arc<Mutex<Store<NetworkPolicy>>>,
    services: Arc<Mutex<Store<Service>>>,
    slices: Arc<Mutex<Store<EndpointSlice>>>,
    /// The nodes' gateway addresses, as the last reading gave them
    /// ([`crate::ipam::translators`]), why the last reading failed, and
    /// how many readings were made.
    gateways: Arc<Mutex<Readings>>,
}

/// The translators as last read, why the last reading failed, and the
/// readings made.
type Readings = (Vec<std::net::IpAddr>, Option<String>, u64);

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
/// `ipam`: the cluster session's queue, asked for the nodes' gateways.
pub async fn run(daemon: Arc<Mutex<Daemon>>, network: u32, ipam: crate::ipam::Sender) {
    let stores = Stores::default();
    let changed = Arc::new(Notify::new());
    let api = vnet_kube::Api::in_this_pod;
    tokio::spawn(watch::reflect(api, watch::pods(), stores.pods.clone(), changed.clone()));
    tokio::spawn(watch::reflect(api, watch::namespaces(), stores.namespaces.clone(), changed.clone()));
    tokio::spawn(watch::reflect(api, watch::network_policies(), stores.policies.clone(), changed.clone()));
    tokio::spawn(watch::reflect(api, watch::services(), stores.services.clone(), changed.clone()));
    tokio::spawn(watch::reflect(api, watch::endpoint_slices(), stores.slices.clone(), changed.clone()));
    tokio::spawn(gateways(ipam, stores.gateways.clone(), changed.clone(), daemon.clone()));
    let mut refused = std::collections::BTreeMap::new();
    loop {
        changed.notified().await;
        tokio::time::sleep(GATHER).await;
        translate(&daemon, network, &stores, &mut refused);
    }
}

/// Keeps `into` the nodes' gateway addresses, read from the IPAM every
/// [`GATEWAYS_EVERY`]; `changed` told when they change (the count of
/// readings in `daemon`'s status at once).
async fn gateways(
    ipam: crate::ipam::Sender,
    into: Arc<Mutex<Readings>>,
    changed: Arc<Notify>,
    daemon: Arc<Mutex<Daemon>>,
) {
    use crate::ipam::{Op, Reply, Request};
    // One request at a time: one etcd has not answered yet is waited on
    // (never a queue of them while the session is down).
    let mut pending = None;
    loop {
        let asked = match pending.take() {
            Some(rx) => Ok(rx),
            None => {
                let (reply, rx) = tokio::sync::oneshot::channel();
                match ipam.try_send(Request { op: Op::Gateways, reply }) {
                    Ok(()) => Ok(rx),
                    Err(_) => Err("the cluster session's queue is full or gone".to_string()),
                }
            }
        };
        let read = match asked {
            Err(e) => Err(e),
            Ok(mut rx) => match tokio::time::timeout(GATEWAYS_EVERY, &mut rx).await {
                Ok(Ok(Ok(Reply::Gateways(a)))) => Ok(a),
                Ok(Ok(Ok(_))) => Err("an answer of another kind".into()),
                Ok(Ok(Err(e))) => Err(e.to_string()),
                Ok(Err(_)) => Err("the cluster session dropped the request".into()),
                Err(_) => {
                    pending = Some(rx);
                    Err(format!("etcd did not answer within {GATEWAYS_EVERY:?}"))
                }
            },
        };
        let readings = {
            let mut g = lock(&into);
            note(&mut g, read, &changed);
            g.2
        };
        {
            let mut d = lock(&daemon);
            let status = d.isolation_status_mut();
            if status["translators"].is_object() {
                status["translators"]["readings"] = readings.into();
            }
        }
        if pending.is_none() {
            tokio::time::sleep(GATEWAYS_EVERY).await;
        }
    }
}

/// Keeps a reading of the gateways in `g`; `changed` told of a change.
fn note(g: &mut Readings, read: Result<Vec<std::net::IpAddr>, String>, changed: &Notify) {
    g.2 += 1;
    match read {
        Ok(a) => {
            g.1 = None;
            if a != g.0 {
                g.0 = a;
                changed.notify_one();
            }
        }
        Err(e) => {
            if g.1.as_ref() != Some(&e) {
                tracing::warn!("network policy: the nodes' gateways: {e}; the last ones stay trusted");
            }
            g.1 = Some(e);
        }
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
    let (services, watches) = service_map(stores, watches);
    iso.services = services.0.services;
    iso.backends = services.0.backends;
    match crate::sys::netdev::local_addresses() {
        Ok(a) => iso.exempt.extend(a),
        Err(e) => tracing::warn!("network policy: this node's addresses: {e}"),
    }
    // The other nodes' gateways (this node's own is exempt already).
    let gateways = lock(&stores.gateways).clone();
    iso.translators.extend(gateways.0.iter().copied().filter(|a| !iso.exempt.contains(a)));
    if report.refused != *refused {
        for (policy, why) in &report.refused {
            tracing::warn!(policy, "network policy refused (its pods isolated, nothing allowed): {why}");
        }
        refused.clone_from(&report.refused);
    }
    let status = json!({
        "watches": watches,
        "translation": report,
        "services": services.1,
        "translators": {
            "addresses": iso.translators.len(),
            "gateways": gateways.0,
            "last_error": gateways.1,
            "readings": gateways.2,
        },
    });
    let iso = (!iso.policies.is_empty()).then_some(iso);
    if let Err(e) = lock(daemon).set_isolation(network, iso, status) {
        tracing::warn!("network policy: not applied: {e}");
    }
}

/// The Services' backends (empty until Services and EndpointSlices are
/// listed), and the watches' state with theirs.
fn service_map(
    stores: &Stores,
    mut watches: serde_json::Value,
) -> ((vnet_kube::services::Map, vnet_kube::services::Report), serde_json::Value) {
    let (svcs, slices) = (lock(&stores.services), lock(&stores.slices));
    watches["services"] = store_json(&*svcs);
    watches["endpointslices"] = store_json(&*slices);
    if !(svcs.synced && slices.synced) {
        return (Default::default(), watches);
    }
    let s: Vec<Service> = svcs.objects.values().cloned().collect();
    let e: Vec<EndpointSlice> = slices.objects.values().cloned().collect();
    drop((svcs, slices));
    (vnet_kube::services::translate(&s, &e, vnet_kube::services::Limits::default()), watches)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_nodes_addresses_are_read() {
        let a = crate::sys::netdev::local_addresses().unwrap();
        assert!(a.contains(&std::net::Ipv4Addr::LOCALHOST.into()), "{a:?}");
    }
}
