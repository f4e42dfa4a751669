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
//! Service traffic is judged on its first leg: the Services,
//! EndpointSlices and Nodes watched too give the engine each Service
//! address and port's backends (cluster, external and load balancer
//! addresses, node ports at every node's address: [`vnet_kube::services`]),
//! and the other nodes' gateway addresses are the translators whose second
//! leg to a backend passes: each live host's gateway as its record names
//! it (signed by its claim key in a signed network), kept only where the
//! host holds that address in the IPAM under its gateway owner and MAC,
//! read every [`GATEWAYS_EVERY`] ([`crate::ipam::translators`]): a value
//! in the IPAM alone makes nothing a translator. A Service not translated
//! is denied where its destination may be isolated. The first translation
//! is given only once every watch has listed (until then nothing is
//! isolated: no translator is trusted either, the engine has no isolation
//! at all).

use crate::daemon::Daemon;
use serde_json::json;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use vnet_kube::objects::{EndpointSlice, Namespace, NetworkPolicy, Node, Pod, Service};
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
    nodes: Arc<Mutex<Store<Node>>>,
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
    tokio::spawn(watch::reflect(api, watch::nodes(), stores.nodes.clone(), changed.clone()));
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

/// The watches' state for `show policy`, and whether every one has
/// listed once.
fn watches(stores: &Stores) -> (serde_json::Value, bool) {
    let (pods, nss, pols) = (lock(&stores.pods), lock(&stores.namespaces), lock(&stores.policies));
    let (svcs, slices, nodes) = (lock(&stores.services), lock(&stores.slices), lock(&stores.nodes));
    let all = [pods.synced, nss.synced, pols.synced, svcs.synced, slices.synced, nodes.synced];
    let v = json!({
        "pods": store_json(&*pods),
        "namespaces": store_json(&*nss),
        "networkpolicies": store_json(&*pols),
        "services": store_json(&*svcs),
        "endpointslices": store_json(&*slices),
        "nodes": store_json(&*nodes),
    });
    (v, all.iter().all(|s| *s))
}

fn values<T: Clone>(s: &Mutex<Store<T>>) -> Vec<T> {
    lock(s).objects.values().cloned().collect()
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
    let (watches, synced) = watches(stores);
    if !synced {
        lock(daemon).set_isolation_status(watches);
        return;
    }
    let p: Vec<Pod> = values(&stores.pods);
    let n: Vec<Namespace> = values(&stores.namespaces);
    let np: Vec<NetworkPolicy> = values(&stores.policies);
    let (mut iso, report) = vnet_kube::netpol::translate(&p, &n, &np, vnet_kube::netpol::Limits::default());
    let governed = !iso.policies.is_empty();
    let (s, e, nodes): (Vec<Service>, Vec<EndpointSlice>, Vec<Node>) =
        (values(&stores.services), values(&stores.slices), values(&stores.nodes));
    let (map, services) =
        vnet_kube::services::translate(&s, &e, &nodes, &p, vnet_kube::services::Limits::default());
    let closed = vnet_kube::services::install(&mut iso, map, &p);
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
        "services": services,
        "closed_services": closed,
        "translators": {
            "addresses": iso.translators.len(),
            "gateways": gateways.0,
            "last_error": gateways.1,
            "readings": gateways.2,
        },
    });
    let iso = governed.then_some(iso);
    if let Err(e) = lock(daemon).set_isolation(network, iso, status) {
        tracing::warn!("network policy: not applied: {e}");
    }
}

#[cfg(test)]
mod tests {
    /// No translation is given until every watch listed once: with the
    /// Nodes (or any one kind) not listed yet, Services would be judged
    /// without their node ports; all six listed, it is given (the
    /// control).
    #[test]
    fn the_first_translation_waits_for_every_watch() {
        let stores = super::Stores::default();
        let set = |s: &super::Stores, v: bool| {
            super::lock(&s.pods).synced = v;
            super::lock(&s.namespaces).synced = v;
            super::lock(&s.policies).synced = v;
            super::lock(&s.services).synced = v;
            super::lock(&s.slices).synced = v;
        };
        set(&stores, true);
        let (v, synced) = super::watches(&stores);
        assert!(!synced, "the Nodes not listed");
        assert_eq!(v["nodes"]["synced"], false);
        super::lock(&stores.nodes).synced = true;
        assert!(super::watches(&stores).1, "every watch listed");
        super::lock(&stores.slices).synced = false;
        assert!(!super::watches(&stores).1, "the EndpointSlices not listed");
        set(&stores, false);
    }

    #[test]
    fn this_nodes_addresses_are_read() {
        let a = crate::sys::netdev::local_addresses().unwrap();
        assert!(a.contains(&std::net::Ipv4Addr::LOCALHOST.into()), "{a:?}");
    }
}
