//! Each node its own identity in vnet's store (issue 67), exactly as
//! `docs/QUICKSTART.md` brings a host in and nothing granted by hand:
//!
//! - **The store** ([`super::store`]): `vnetctl network init` on node
//!   0's machine (the admin's, as kubeadm's etcd is the control-plane
//!   node's) and the etcd it configures, run there on node 0's address:
//!   vnet's own etcd, not the lab's (which kube-apiserver uses, with
//!   client certificates).
//! - **A token per node**: `vnetctl network token DIR NODE file ...`,
//!   written where the manifest's `join` init container reads it, the
//!   node's `/var/lib/vnet/join.token` (the admin's `scp`).
//! - **Approval**: the `join` init container runs `vnetctl join`, which
//!   makes the node's key and etcd password on the node and prints the
//!   request's fingerprint (its log); the admin reads it with `kubectl
//!   logs POD -c join` and runs `vnetctl network approve DIR NODE key FP`.
//!   The node's vnetd then logs in as `vnet/NET/NODE`, whose role writes
//!   only that node's keys (`vnet_cluster::layout::host_grants`).

use super::store::Login;
use super::Kube;
use crate::{io, Error, Result};
use std::time::{Duration, Instant};

/// The login node `n` joined with: the `etcd-user` of the `cluster`
/// line `vnetctl join` wrote on the node, and the password file it
/// names (what the node's vnetd logs in with).
pub fn node_login(kube: &Kube, n: usize) -> Result<Login> {
    let store = kube.store()?;
    let dir = kube.nodes[n].dir.join("lib-vnet/join");
    let conf = std::fs::read_to_string(dir.join(format!("{}.conf", store.network)))
        .map_err(io("reading the node's joined configuration"))?;
    let user = conf
        .split_whitespace()
        .skip_while(|w| *w != "etcd-user")
        .nth(1)
        .ok_or_else(|| Error::Other(format!("no etcd-user in the node's configuration: {conf}")))?;
    let pw = std::fs::read_to_string(dir.join(format!("{}.etcd-pw", store.network)))
        .map_err(io("reading the node's etcd password"))?;
    Ok((user.to_string(), pw.trim().to_string()))
}

/// What the admin does before `kubectl apply` (docs/INTEGRATION.md, "Each
/// node its own identity"): the ConfigMap `vnet-network` (the network's
/// name and etcd's address: nothing secret) and a join token on each node
/// at `/var/lib/vnet/join.token`.
pub fn prepare_nodes(kube: &Kube) -> Result<()> {
    let store = kube.store()?;
    kube.kubectl(&[
        "-n",
        "kube-system",
        "create",
        "configmap",
        "vnet-network",
        &format!("--from-literal=network={}", store.network),
        &format!("--from-literal=etcd={}", store.url),
    ])?;
    let dir = store.dir.display().to_string();
    for node in &kube.nodes {
        let lib = node.dir.join("lib-vnet");
        std::fs::create_dir_all(&lib).map_err(io("making the node's /var/lib/vnet"))?;
        let file = lib.join("join.token").display().to_string();
        store.vnetctl(&["network", "token", &dir, &node.name, "file", &file])?;
    }
    Ok(())
}

/// After `kubectl apply`: for each node, the fingerprint its `join` init
/// container printed (`kubectl logs`), and `vnetctl network approve DIR
/// NODE key FP`, as the admin does once the node's screen showed it.
pub fn approve_nodes(kube: &Kube, within: Duration) -> Result<()> {
    let store = kube.store()?;
    let dir = store.dir.display().to_string();
    let mut left: Vec<&str> = kube.nodes.iter().map(|n| n.name.as_str()).collect();
    let (t0, mut last) = (Instant::now(), None);
    while !left.is_empty() {
        let pods = kube.get_json(&["-n", "kube-system", "get", "pods", "-l", "app=vnet"])?;
        for p in pods["items"].as_array().into_iter().flatten() {
            let (Some(pod), Some(node)) = (p["metadata"]["name"].as_str(), p["spec"]["nodeName"].as_str())
            else {
                continue;
            };
            if !left.contains(&node) {
                continue;
            }
            let log = kube.kubectl_output(&["-n", "kube-system", "logs", pod, "-c", "join"])?;
            let log = String::from_utf8_lossy(&log.stdout);
            // (join prints it just before it files the request: until
            // then, approve finds none and is asked again.)
            let Some(fp) = fingerprint(&log) else { continue };
            match store.vnetctl(&["network", "approve", &dir, node, "key", fp]) {
                Ok(_) => left.retain(|n| *n != node),
                Err(e) => last = Some(e),
            }
        }
        if t0.elapsed() > within {
            return Err(Error::Other(format!(
                "{left:?} not approved within {within:?} (last refusal: {last:?})"
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

/// The fingerprint in `vnetctl join`'s line `... key fingerprint FP`.
fn fingerprint(log: &str) -> Option<&str> {
    log.lines().find_map(|l| l.split("key fingerprint ").nth(1)).map(str::trim).filter(|f| !f.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fingerprint_is_read_from_joins_line() {
        let log = "vnetctl join: host n1 at 10.77.0.2, key fingerprint 6f5d1cb8\n\
                   vnetctl join: on the admin host, after comparing it: vnetctl network approve DIR n1 key 6f5d1cb8\n";
        assert_eq!(super::fingerprint(log), Some("6f5d1cb8"));
        assert_eq!(super::fingerprint("vnet join: n1 is in network x\n"), None);
    }
}
