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
//! read every [`GATEWAYS_EVERY`] ([`crate::ipam::translators`]), and
//! where the API gives no pod that address: a value in the IPAM alone
//! makes nothing a translator. Readings failed [`FAILED_READINGS`] times
//! in a row drop them all. A Service not translated
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

/// How many readings of the gateways in a row may fail before the last
/// ones are no longer trusted (no translator then: fail closed).
const FAILED_READINGS: u32 = 3;

/// The translators as last read, why the last reading failed, the
/// readings made, those failed in a row, and how many times the last
/// translators were dropped after [`FAILED_READINGS`] failures.
#[derive(Debug, Clone, Default)]
struct Readings {
    gateways: Vec<std::net::IpAddr>,
    last_error: Option<String>,
    readings: u64,
    failed_in_row: u32,
    dropped: u64,
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
            g.readings
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
/// A failed reading leaves the last ones trusted, until
/// [`FAILED_READINGS`] in a row: then none is (fail closed, counted).
fn note(g: &mut Readings, read: Result<Vec<std::net::IpAddr>, String>, changed: &Notify) {
    g.readings += 1;
    match read {
        Ok(a) => {
            g.last_error = None;
            g.failed_in_row = 0;
            if a != g.gateways {
                g.gateways = a;
                changed.notify_one();
            }
        }
        Err(e) => {
            g.failed_in_row = g.failed_in_row.saturating_add(1);
            if g.failed_in_row >= FAILED_READINGS && !g.gateways.is_empty() {
                tracing::warn!(
                    failed = g.failed_in_row,
                    "network policy: the nodes' gateways: {e}; the last ones are no longer trusted"
                );
                g.gateways.clear();
                g.dropped += 1;
                changed.notify_one();
            } else if g.last_error.as_ref() != Some(&e) {
                tracing::warn!(
                    "network policy: the nodes' gateways: {e}; the last ones stay trusted for now"
                );
            }
            g.last_error = Some(e);
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
    // The other nodes' gateways (this node's own is exempt already), none
    // at an address the API gives a pod.
    let gateways = lock(&stores.gateways).clone();
    let (kept, pods_at) = no_pods(&gateways.gateways, &p);
    iso.translators.extend(kept.into_iter().filter(|a| !iso.exempt.contains(a)));
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
            "gateways": gateways.gateways,
            "at_pods_addresses": pods_at,
            "last_error": gateways.last_error,
            "readings": gateways.readings,
            "failed_in_row": gateways.failed_in_row,
            "dropped": gateways.dropped,
        },
    });
    let iso = governed.then_some(iso);
    if let Err(e) = lock(daemon).set_isolation(network, iso, status) {
        tracing::warn!("network policy: not applied: {e}");
    }
}

/// Of the gateways, those at no address the API gives a pod (a node's
/// record naming a pod's address, its own pod's or another's, as its
/// gateway would let that pod past isolation to every Service backend),
/// and those refused.
fn no_pods(gateways: &[std::net::IpAddr], pods: &[Pod]) -> (Vec<std::net::IpAddr>, Vec<std::net::IpAddr>) {
    let at: std::collections::HashSet<std::net::IpAddr> =
        pods.iter().flat_map(|p| p.ips.iter().copied()).collect();
    let (refused, kept): (Vec<_>, Vec<_>) = gateways.iter().copied().partition(|a| at.contains(a));
    if !refused.is_empty() {
        tracing::debug!(?refused, "network policy: a node's gateway at a pod's address is no translator");
    }
    (kept, refused)
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

    /// A node's record names its own pod's address (10.244.0.5) as its
    /// gateway: no translator, the API giving that address to a pod. The
    /// control: the other node's gateway, at no pod's address, is one.
    #[test]
    fn a_gateway_at_a_pods_address_is_no_translator() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let pod = vnet_kube::objects::Pod {
            namespace: "default".into(),
            name: "attacker".into(),
            labels: Default::default(),
            ips: vec![ip("10.244.0.5")],
            host_network: false,
            ports: Vec::new(),
        };
        let gateways = [ip("10.244.0.1"), ip("10.244.0.5")];
        let (kept, refused) = super::no_pods(&gateways, std::slice::from_ref(&pod));
        assert_eq!((kept, refused), (vec![ip("10.244.0.1")], vec![ip("10.244.0.5")]));
        let (kept, _) = super::no_pods(&gateways, &[]);
        assert_eq!(kept, gateways, "no pod there: both");
    }

    /// etcd unreadable: the last gateways stay trusted for two failed
    /// readings (the control), not after the third in a row (fail closed,
    /// counted); a good reading in between starts the count again.
    #[test]
    fn the_gateways_are_dropped_after_three_failed_readings() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let changed = tokio::sync::Notify::new();
        let mut g = super::Readings::default();
        super::note(&mut g, Ok(vec![ip("10.244.0.1")]), &changed);
        for _ in 0..2 {
            super::note(&mut g, Err("etcd down".into()), &changed);
        }
        assert_eq!(g.gateways, [ip("10.244.0.1")], "still trusted after 2");
        super::note(&mut g, Ok(vec![ip("10.244.0.1")]), &changed);
        super::note(&mut g, Err("etcd down".into()), &changed);
        super::note(&mut g, Err("etcd down".into()), &changed);
        assert_eq!(g.gateways, [ip("10.244.0.1")], "the count started again");
        super::note(&mut g, Err("etcd down".into()), &changed);
        assert!(g.gateways.is_empty(), "dropped after 3 in a row");
        assert_eq!((g.failed_in_row, g.dropped, g.readings), (3, 1, 7));
        assert_eq!(g.last_error.as_deref(), Some("etcd down"));
        super::note(&mut g, Ok(vec![ip("10.244.0.1")]), &changed);
        assert_eq!((g.gateways.len(), g.failed_in_row), (1, 0), "read again");
    }
}
