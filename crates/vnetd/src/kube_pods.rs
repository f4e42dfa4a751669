//! `--kube`: the cluster's claims bound to the Kubernetes API's pods
//! (docs/INTEGRATION.md, "Each node its own identity"). vnetd, in vnet's
//! DaemonSet, watches the cluster's pods as its service account
//! ([`vnet_kube::placement`]: each pod's node, addresses, labels) and
//! gives the cluster task what the API says ([`PodFacts`]): another
//! node's claim counts only for a pod the API schedules to that node, and
//! a pod's groups are its labels' (`--kube-group-label`, in its
//! namespace: `groupScope: namespace`), whatever the claim names
//! ([`vnet_cluster::member`]'s `pods`).
//!
//! Until the pods are listed once, other nodes' claims naming an address
//! wait; an API that cannot be reached leaves the last view in force.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use vnet_cluster::member::{PodFacts, PodPlace};
use vnet_kube::placement::Placed;
use vnet_kube::watch::Store;

/// What the API says of the pods, as the cluster task receives it (none:
/// not listed yet).
pub type Receiver = watch::Receiver<Option<Arc<PodFacts>>>;
pub type Sender = watch::Sender<Option<Arc<PodFacts>>>;

/// How long a burst of changes is gathered before the facts are made.
const GATHER: Duration = Duration::from_millis(50);

/// The channel between the watch and the cluster task.
pub fn channel() -> (Sender, Receiver) {
    watch::channel(None)
}

/// A pod's groups: the values of its labels named by `keys`, each as
/// `NAMESPACE.VALUE` (what vnet-cni's `groupLabels` makes under
/// `groupScope: namespace`); a value that makes no group name is none.
pub fn groups(p: &Placed, keys: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for k in keys {
        let Some(v) = p.labels.get(k) else { continue };
        let g = format!("{}.{v}", p.namespace);
        let name =
            vnet_control::request::Name::new(v).is_ok() && vnet_control::request::Name::new(&g).is_ok();
        if name && !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// The facts of the pods a store holds (those with addresses).
pub fn facts<'a>(pods: impl IntoIterator<Item = &'a Placed>, keys: &[String]) -> PodFacts {
    PodFacts::new(pods.into_iter().filter(|p| !p.ips.is_empty()).map(|p| PodPlace {
        pod: format!("{}/{}", p.namespace, p.name),
        node: p.node.clone(),
        ips: p.ips.clone(),
        groups: groups(p, keys),
        terminating: p.terminating,
    }))
}

/// Watches the API's pods and sends their facts on every change, for ever.
pub async fn run(keys: Vec<String>, tx: Sender) {
    let store: Arc<Mutex<Store<Placed>>> = Arc::default();
    let changed = Arc::new(Notify::new());
    let api = vnet_kube::Api::in_this_pod;
    tokio::spawn(vnet_kube::watch::reflect(
        api,
        vnet_kube::placement::pods(),
        store.clone(),
        changed.clone(),
    ));
    let mut said = None;
    loop {
        changed.notified().await;
        tokio::time::sleep(GATHER).await;
        let made = {
            let s = store.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if s.last_error != said {
                if let Some(e) = &s.last_error {
                    tracing::warn!("kube: the pods' watch: {e}; the last view of them stays in force");
                }
                said.clone_from(&s.last_error);
            }
            s.synced.then(|| facts(s.objects.values(), &keys))
        };
        if let Some(f) = made {
            tx.send_if_modified(|held| {
                let news = held.as_deref() != Some(&f);
                if news {
                    *held = Some(Arc::new(f));
                }
                news
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(ns: &str, labels: &[(&str, &str)], ips: &[&str]) -> Placed {
        Placed {
            namespace: ns.into(),
            name: "p".into(),
            node: "n1".into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            terminating: false,
        }
    }

    /// A pod's groups are its namespace's, as vnet-cni's `groupScope:
    /// namespace` makes them: `db` in `prod` is `prod.db`; a label the
    /// keys do not name is none, and a value that is no group name too.
    #[test]
    fn a_pods_groups_are_its_named_labels_in_its_namespace() {
        let keys = vec!["vnet.dev/group".to_string(), "tier".to_string()];
        let p = placed("prod", &[("vnet.dev/group", "db"), ("tier", "db"), ("app", "x")], &["10.244.0.2"]);
        assert_eq!(groups(&p, &keys), ["prod.db"]);
        let p = placed("prod", &[("vnet.dev/group", "1st"), ("tier", "back")], &["10.244.0.2"]);
        assert_eq!(groups(&p, &keys), ["prod.back"]);
        assert!(groups(&p, &[]).is_empty(), "no keys, no groups");
        let f = facts([&placed("a", &[], &["10.244.0.2"]), &placed("b", &[], &[])], &keys);
        assert_eq!(f.len(), 1, "a pod without an address is no fact");
        assert_eq!(f.pod_at("10.244.0.2".parse().unwrap()).map(|p| p.node.as_str()), Some("n1"));
    }
}
