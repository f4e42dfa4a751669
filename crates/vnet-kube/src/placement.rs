//! Where each pod runs, as `vnetd --kube` binds the cluster's claims to
//! it (`vnet_cluster::member::PodFacts`): a pod's node (`spec.nodeName`),
//! its addresses, its labels and whether it is being deleted. A pod on
//! the node's network, one not scheduled yet and one that ended
//! (`Succeeded`, `Failed`: its address may be another pod's next) has no
//! address here. Anything malformed is an [`ObjectError`], never a panic.

use crate::objects::{meta, Labels, ObjectError};
use crate::watch::Kind;
use serde::Deserialize;
use std::net::IpAddr;

/// A pod where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName` (empty: not scheduled).
    pub node: String,
    pub labels: Labels,
    /// Its addresses on the pod network (none on the node's network).
    pub ips: Vec<IpAddr>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    node_name: String,
    #[serde(default)]
    host_network: bool,
}

#[derive(Deserialize)]
struct PodIp {
    ip: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Vec<PodIp>,
}

fn shape(e: serde_json::Error) -> ObjectError {
    ObjectError::Shape { kind: "pod", reason: e.to_string() }
}

/// Pods, by where they run.
pub fn pods() -> Kind<Placed> {
    Kind { path: "/api/v1/pods", parse: placed }
}

/// A pod from the API's JSON.
pub fn placed(obj: &serde_json::Value) -> Result<Placed, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() || m.namespace.is_empty() {
        return Err(ObjectError::Unnamed("pod"));
    }
    let spec = match obj.get("spec") {
        Some(s) => Spec::deserialize(s).map_err(shape)?,
        None => Spec::default(),
    };
    let status = match obj.get("status") {
        Some(s) => Status::deserialize(s).map_err(shape)?,
        None => Status::default(),
    };
    let ended = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    let mut ips: Vec<IpAddr> = status.pod_ips.iter().filter_map(|i| i.ip.parse().ok()).collect();
    if ips.is_empty() {
        ips.extend(status.pod_ip.as_deref().and_then(|i| i.parse::<IpAddr>().ok()));
    }
    if ended || spec.host_network || spec.node_name.is_empty() {
        ips.clear();
    }
    let terminating = obj["metadata"].get("deletionTimestamp").is_some_and(|t| !t.is_null());
    Ok(Placed {
        namespace: m.namespace,
        name: m.name,
        node: spec.node_name,
        labels: m.labels,
        ips,
        terminating,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pods_node_addresses_and_deletion_are_read_and_host_network_has_none() {
        let p = |spec: serde_json::Value, status: serde_json::Value, deleting: bool| {
            let mut meta = json!({"name": "web", "namespace": "shop", "labels": {"vnet.dev/group": "web"}});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-12-07T14:00:00Z");
            }
            placed(&json!({"metadata": meta, "spec": spec, "status": status}))
        };
        let running = json!({"phase": "Running", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}, {"ip": "fd00::5"}]});
        let got = p(json!({"nodeName": "n1"}), running.clone(), false).unwrap();
        assert_eq!((got.node.as_str(), got.ips.len(), got.terminating), ("n1", 2, false));
        assert_eq!(got.labels["vnet.dev/group"], "web");
        assert!(p(json!({"nodeName": "n1"}), running.clone(), true).unwrap().terminating);
        assert!(p(json!({"nodeName": "n1", "hostNetwork": true}), running.clone(), false)
            .unwrap()
            .ips
            .is_empty());
        assert!(p(json!({}), running, false).unwrap().ips.is_empty(), "not scheduled");
        let ended = json!({"phase": "Succeeded", "podIP": "10.244.0.5"});
        assert!(p(json!({"nodeName": "n1"}), ended, false).unwrap().ips.is_empty());
        assert!(p(json!({"nodeName": 7}), json!({}), false).is_err(), "a node name that is no string");
        assert!(placed(&json!({"metadata": {"name": "x"}})).is_err(), "no namespace");
    }
}
