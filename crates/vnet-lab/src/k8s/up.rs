//! `vnet-lab k8s up`: the Kubernetes lab as a cluster to try things on,
//! and the cluster `scripts/k8s-e2e.sh` runs Kubernetes' e2e suite
//! against. Three nodes, vnet applied as a user applies it (its etcd
//! from `vnetctl network init`, a join token on each node, `kubectl apply
//! -f packaging/kubernetes/vnet.yaml`, each node's join approved: see
//! [`super::join`]), CoreDNS as
//! kubeadm deploys it, each waited for; then the lab stays until Ctrl-C or
//! SIGTERM, whose cleanup leaves nothing (the cgroup sweep of
//! [`super::cgroup`], then the lab's namespaces and directory).

use super::{e2e, Kube, COREDNS_MANIFEST};
use crate::{io, Cluster, Error, Lab, Result, Spec};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What `k8s up` brings up.
#[derive(Debug, Clone, Default)]
pub struct UpOpts {
    /// The pods' data path (the conflist's `datapath`): `kernel` (the
    /// manifest's) or `user`.
    pub datapath: Option<String>,
    /// Also build and import the e2e suite's images ([`e2e`]).
    pub e2e_images: bool,
}

/// A running Kubernetes lab. The cluster goes first when it is dropped,
/// then the lab under it.
pub struct Up {
    pub kube: Kube,
    pub lab: Lab,
    /// The e2e images imported, if asked for.
    pub images: Vec<String>,
}

/// The manifest, as the repository has it.
pub fn manifest_path() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/kubernetes/vnet.yaml"))
}

/// Brings the lab up as [`UpOpts`] says and waits until every node and
/// CoreDNS (when `scripts/k8s-build.sh` built it) is Ready.
pub fn up(opts: &UpOpts) -> Result<Up> {
    if let Some(d) = opts.datapath.as_deref().filter(|d| !matches!(*d, "kernel" | "user")) {
        return Err(Error::Other(format!("--datapath {d}: kernel or user")));
    }
    let lab = Lab::up(Spec {
        hosts: 3,
        vms_per_host: 0,
        cluster: Some(Cluster::default()),
        no_vnetd: true,
        ..Spec::default()
    })?;
    let t0 = Instant::now();
    let kube = Kube::start(&lab)?;
    eprintln!("k8s: control plane and 3 nodes registered in {:.1?}", t0.elapsed());
    let images = if opts.e2e_images {
        let t0 = Instant::now();
        let names = e2e::import_images(&kube)?;
        eprintln!("k8s: {} e2e images built and imported in {:.1?}", names.len(), t0.elapsed());
        names
    } else {
        Vec::new()
    };
    super::join::prepare_nodes(&kube)?;
    apply_vnet(&kube, opts.datapath.as_deref())?;
    let t0 = Instant::now();
    super::join::approve_nodes(&kube, Duration::from_secs(90))?;
    wait_nodes_ready(&kube, Duration::from_secs(90))?;
    eprintln!("k8s: every node Ready {:.1?} after kubectl apply", t0.elapsed());
    api_server_reaches_pods(&lab, &kube)?;
    if kube.bin.join("coredns").is_file() {
        let t0 = Instant::now();
        let path = kube.dir.join("coredns.yaml");
        std::fs::write(&path, COREDNS_MANIFEST).map_err(io("writing coredns.yaml"))?;
        kube.kubectl(&["apply", "-f", &path.display().to_string()])?;
        wait_dns_ready(&kube, Duration::from_secs(180))?;
        eprintln!("k8s: CoreDNS Ready in {:.1?}", t0.elapsed());
    }
    Ok(Up { kube, lab, images })
}

/// The pods' subnet, from the manifest's conflist (`"subnet": "..."`).
pub fn pod_subnet(manifest: &str) -> Option<String> {
    let at = manifest.find("\"subnet\": \"")? + "\"subnet\": \"".len();
    let len = manifest[at..].find('"')?;
    Some(manifest[at..at + len].to_string())
}

/// The API server reaches pods (its proxy to pods and Services, as
/// `kubectl proxy` and the e2e suite use it) as it would from a node of a
/// kubeadm cluster: the switch namespace, where the lab runs it, routes
/// the pods' subnet to node 0, which sends it out of its gateway
/// interface (`vg...`, vnet-cni's `isDefaultGateway`) from its own pod
/// address (masqueraded), so the pod's reply comes back to node 0 in one
/// hop whatever node the pod is on.
fn api_server_reaches_pods(lab: &Lab, kube: &Kube) -> Result<()> {
    let text = std::fs::read_to_string(manifest_path()).map_err(io("reading the manifest"))?;
    let subnet =
        pod_subnet(&text).ok_or_else(|| Error::Other("no subnet in the manifest's conflist".into()))?;
    let node0 = kube.nodes[0].ip.to_string();
    let sw = lab.switch_ns().ok_or_else(|| Error::Other("no switch namespace".into()))?;
    crate::run(&["ip", "netns", "exec", sw, "ip", "route", "replace", &subnet, "via", &node0])?;
    let from = format!("{}/32", lab.etcd_ip());
    let out = kube.nodes[0]
        .command("iptables")
        .args(["-t", "nat", "-A", "POSTROUTING", "-s", &from, "-d", &subnet, "-o", "vg+"])
        .args(["-m", "comment", "--comment", "vnet-lab: the API server to pods", "-j", "MASQUERADE"])
        .output()
        .map_err(io("running iptables"))?;
    if !out.status.success() {
        return Err(Error::Other(format!("iptables on node 0: {}", String::from_utf8_lossy(&out.stderr))));
    }
    Ok(())
}

/// The manifest's text with the pods' data path set to `datapath`.
pub fn manifest_for(text: &str, datapath: Option<&str>) -> Result<String> {
    let anchor = "\"datapath\": \"kernel\"";
    match datapath {
        None | Some("kernel") => Ok(text.to_string()),
        Some(d) if text.contains(anchor) => Ok(text.replace(anchor, &format!("\"datapath\": \"{d}\""))),
        Some(_) => Err(Error::Other(format!("the manifest's conflist has no {anchor} to change"))),
    }
}

/// `kubectl apply -f` the manifest (written to the lab's directory).
fn apply_vnet(kube: &Kube, datapath: Option<&str>) -> Result<()> {
    let text = std::fs::read_to_string(manifest_path()).map_err(io("reading the manifest"))?;
    let path = kube.dir.join("vnet.yaml");
    std::fs::write(&path, manifest_for(&text, datapath)?).map_err(io("writing vnet.yaml"))?;
    kube.kubectl(&["apply", "-f", &path.display().to_string()])?;
    Ok(())
}

/// Waits until every node is `Ready`.
fn wait_nodes_ready(kube: &Kube, within: Duration) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let ready = kube.node_ready()?;
        if ready.len() == kube.nodes.len() && ready.iter().all(|(_, r)| r == "True") {
            return Ok(());
        }
        if t0.elapsed() > within {
            let pods = kube.kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"]).unwrap_or_default();
            return Err(Error::Other(format!("nodes not Ready within {within:?}: {ready:?}\n{pods}")));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until every CoreDNS pod of the Deployment is Ready.
fn wait_dns_ready(kube: &Kube, within: Duration) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let v = kube.get_json(&["-n", "kube-system", "get", "deployment", "coredns"])?;
        let want = v["spec"]["replicas"].as_u64().unwrap_or(1);
        if v["status"]["readyReplicas"].as_u64() == Some(want) {
            return Ok(());
        }
        if t0.elapsed() > within {
            let pods = kube.kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"]).unwrap_or_default();
            return Err(Error::Other(format!("CoreDNS not Ready within {within:?}:\n{pods}")));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The command line that runs `kubectl` against the lab (in the switch
/// namespace, where the API server listens).
pub fn kubectl_line(up: &Up) -> String {
    format!(
        "ip netns exec {} {} --kubeconfig {}",
        up.lab.switch_ns().unwrap_or("?"),
        kubectl_path(up).display(),
        up.kube.dir.join("admin.conf").display()
    )
}

/// The build's `kubectl`, its path without `..`.
pub fn kubectl_path(up: &Up) -> PathBuf {
    let p = up.kube.bin.join("kubectl");
    std::fs::canonicalize(&p).unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_subnet_is_the_conflists() {
        let text = std::fs::read_to_string(manifest_path()).unwrap();
        assert_eq!(pod_subnet(&text).as_deref(), Some("10.244.0.0/16"));
        assert_eq!(pod_subnet("{}"), None);
    }

    #[test]
    fn the_user_path_changes_only_the_conflists_datapath() {
        let text = std::fs::read_to_string(manifest_path()).unwrap();
        assert_eq!(manifest_for(&text, None).unwrap(), text);
        let user = manifest_for(&text, Some("user")).unwrap();
        assert!(user.contains("\"datapath\": \"user\"") && !user.contains("\"datapath\": \"kernel\""));
        assert_eq!(user.len(), text.len() - 2);
        assert!(manifest_for("no conflist", Some("user")).is_err());
    }
}
