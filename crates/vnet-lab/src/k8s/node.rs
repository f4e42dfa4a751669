//! A node's programs: the holder of its namespaces, its containerd, its
//! kubelet and its kube-proxy, each started (again) with its configuration.

use super::{
    cgroup, cleanup_interrupted, node_name, nodes, tail, Kube, Node, DNS_IP, PAUSE_IMAGE, SERVICE_CIDR,
};
use crate::process::{on_signal, reap_killed, spawn_logged};
use crate::{io, Error, Lab, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The node directories bound over the machine's (lab directory name,
/// path on the node).
const NODE_DIRS: [(&str, &str); 10] = [
    ("cni-conf", "/etc/cni/net.d"),
    ("cni-bin", "/opt/cni/bin"),
    ("run-vnet", "/run/vnet"),
    ("lib-vnet", "/var/lib/vnet"),
    ("kubelet", "/var/lib/kubelet"),
    ("lib-cni", "/var/lib/cni"),
    ("log-pods", "/var/log/pods"),
    ("log-containers", "/var/log/containers"),
    ("netns", "/run/netns"),
    ("run-containerd", "/run/containerd"),
];

/// The holder's script: `$1` the node's directory, `$2` its name.
const HOLDER: &str = "set -e; d=$1; hostname \"$2\"; shift 2; \
                      for p in $NODE_DIRS; do mkdir -p \"$d/${p%%:*}\" \"${p#*:}\"; \
                      mount --bind \"$d/${p%%:*}\" \"${p#*:}\"; done; \
                      mount -t bpf bpf /sys/fs/bpf; echo ready > \"$d/holder.ready\"; \
                      exec sleep 2147483647";

impl Kube {
    pub(super) fn start_node(&self, lab: &Lab, h: usize) -> Result<Node> {
        let host = &lab.hosts[h];
        let name = node_name(lab, h);
        let dir = self.dir.join(format!("h{h}"));
        let dirs: Vec<String> = NODE_DIRS.iter().map(|(a, b)| format!("{a}:{b}")).collect();
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", host.ns))
            .args(["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", HOLDER, "sh"])
            .arg(&dir)
            .arg(&name)
            .env("NODE_DIRS", dirs.join(" "));
        // The node's cgroups first, and known to the signal cleanup before
        // anything joins them.
        nodes().push((dir.clone(), name.clone()));
        on_signal(cleanup_interrupted);
        cgroup::make(&name)?;
        let holder = spawn_logged(cgroup::join(&cmd, &name), &dir.join("holder.log"), "holder")?;
        let mut node =
            Node { name, ip: host.underlay_ip, dir, holder, containerd: None, kubelet: None, proxy: None };
        let t0 = Instant::now();
        while !node.dir.join("holder.ready").exists() {
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(Error::Other(format!(
                    "node {h}'s namespaces: {}",
                    tail(&node.dir.join("holder.log"))
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.start_containerd(&mut node)?;
        self.start_kubelet(&mut node)?;
        self.start_proxy(&mut node)?;
        Ok(node)
    }

    /// Node `n` rebooted, as a power cut and a boot do it. The cut: every
    /// process of the node killed at once (its cgroup tree frozen and
    /// killed: the kubelet, containerd, kube-proxy, the shims, every pod's
    /// containers, vnetd among them), and with its last process its mount
    /// namespace goes, so its `/sys/fs/bpf` (every pin) and the pods'
    /// network namespaces (their veths) go too. What a boot starts without:
    /// `/run` (`/run/vnet`, `/run/containerd`, `/run/netns`, containerd's
    /// state), every network device but `boot_links` (the node's own as the
    /// lab made them; vnet's go), each one's clsact qdisc (TC programs),
    /// and the iptables, ip6tables and nftables rules. What it keeps, its disk:
    /// `/var/lib/kubelet`, containerd's root (its pods' records),
    /// `/var/lib/vnet`, `/var/lib/cni`, the CNI directories. Then the node
    /// boots as it first started: its namespaces, containerd (waited for
    /// until it answers), the kubelet and kube-proxy. Not reset, as the
    /// lab host's network namespace stays: its sysctls, conntrack entries,
    /// policy routing rules, the iptables chains' policies, and the
    /// addresses and routes of `boot_links`. Node 0 is refused: the lab's
    /// own rule there (`k8s up`'s masquerade for the API server) would go.
    pub fn reboot(&mut self, lab: &Lab, n: usize, boot_links: &[String]) -> Result<()> {
        if n == 0 {
            return Err(Error::Other("node 0 carries the lab's own rules: reboot another".into()));
        }
        let name = self.nodes[n].name.clone();
        let kept = cgroup::sweep(&name);
        if !kept.is_empty() {
            return Err(Error::Other(format!("{name}'s power cut left {kept:?}")));
        }
        let node = &mut self.nodes[n];
        for c in [node.proxy.take(), node.kubelet.take(), node.containerd.take()].into_iter().flatten() {
            reap_killed(c);
        }
        let _ = node.holder.kill();
        let _ = node.holder.wait();
        let dir = node.dir.clone();
        nodes().retain(|(d, _)| *d != dir);
        for d in ["run-vnet", "run-containerd", "netns", "containerd/state"] {
            let p = dir.join(d);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(io(format!("clearing {}", p.display())))?;
            }
        }
        std::fs::remove_file(dir.join("holder.ready")).map_err(io("removing holder.ready"))?;
        let ns = &lab.hosts[n].ns;
        for link in lab.ns_link_names(ns)? {
            let link = link.as_str();
            if link == "lo" || boot_links.iter().any(|b| b == link) {
                let _ = Command::new("tc").args(["-n", ns, "qdisc", "del", "dev", link, "clsact"]).output();
            } else {
                let out = Command::new("ip")
                    .args(["-n", ns, "link", "del", link])
                    .output()
                    .map_err(io("running ip link del"))?;
                // A veth's peer may have gone with the one before it, a
                // pod's with its namespace meanwhile.
                let err = String::from_utf8_lossy(&out.stderr);
                let gone = err.contains("Cannot find device") || err.contains("No such device");
                if !out.status.success() && !gone {
                    return Err(Error::Other(format!("{name}: ip link del {link}: {out:?}")));
                }
            }
        }
        // kube-proxy's nftables mode keeps a table of its own.
        if Path::new(NFT).exists() {
            let out = Command::new("ip").args(["netns", "exec", ns, "nft", "flush", "ruleset"]).output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                return Err(Error::Other(format!("{name}: nft flush ruleset: {out:?}")));
            }
        }
        for tool in ["iptables", "ip6tables"] {
            for table in ["filter", "nat", "mangle", "raw"] {
                for op in ["-F", "-X"] {
                    let out = Command::new("ip")
                        .args(["netns", "exec", ns, tool, "-w", "-t", table, op])
                        .output()
                        .map_err(io(format!("running {tool}")))?;
                    if !out.status.success() {
                        return Err(Error::Other(format!("{name}: {tool} -t {table} {op}: {out:?}")));
                    }
                }
            }
        }
        self.nodes[n] = self.start_node(lab, n)?;
        Ok(())
    }

    /// Starts (again) `node`'s containerd and waits until it answers.
    pub(super) fn start_containerd(&self, node: &mut Node) -> Result<()> {
        let conf = node.dir.join("containerd.toml");
        let mut runc = PathBuf::from("/usr/sbin/runc");
        if std::env::var_os("VNET_K8S_RUNC_DEBUG").is_some() {
            // runc's debug log of every call, in the node's directory.
            runc = node.dir.join("runc-debug");
            let script = format!(
                "#!/bin/bash\na=()\nwhile [ $# -gt 0 ]; do if [ \"$1\" = --log ]; then a+=(--log {}/runc.log); shift 2; \
                 else a+=(\"$1\"); shift; fi; done\nexec /usr/sbin/runc --debug \"${{a[@]}}\"\n",
                node.dir.display()
            );
            std::fs::write(&runc, script).map_err(io("writing runc-debug"))?;
            std::fs::set_permissions(&runc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .map_err(io("writing runc-debug"))?;
        }
        std::fs::write(&conf, containerd_toml(&node.dir, &runc)).map_err(io("writing containerd.toml"))?;
        let mut cmd = node.command(self.bin.join("containerd"));
        cmd.arg("--config").arg(&conf).env("PATH", path_with(&self.bin));
        node.containerd = Some(spawn_logged(
            cgroup::join(&cmd, &node.name),
            &node.dir.join("containerd.log"),
            "containerd",
        )?);
        let t0 = Instant::now();
        loop {
            let out = self.crictl(node, &["info"])?;
            if out.status.success() {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(Error::Other(format!(
                    "{}'s containerd did not answer: {}",
                    node.name,
                    tail(&node.dir.join("containerd.log"))
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts (again) `node`'s kubelet.
    pub(super) fn start_kubelet(&self, node: &mut Node) -> Result<()> {
        cgroup::make(&node.name)?;
        let conf = node.dir.join("kubelet.yaml");
        std::fs::write(&conf, kubelet_yaml(node)).map_err(io("writing kubelet.yaml"))?;
        let mut cmd = node.command(self.bin.join("kubelet"));
        cmd.arg(format!("--config={}", conf.display()))
            .arg(format!("--kubeconfig={}", node.dir.join("kubelet.conf").display()))
            .arg(format!("--hostname-override={}", node.name))
            .arg(format!("--node-ip={}", node.ip))
            .env("PATH", path_with(&self.bin));
        node.kubelet =
            Some(spawn_logged(cgroup::join(&cmd, &node.name), &node.dir.join("kubelet.log"), "kubelet")?);
        Ok(())
    }

    /// Starts `node`'s kube-proxy (iptables, or nftables: [`proxy_mode`]; in the node's network
    /// namespace), so that Services answer there as on any node: the
    /// `kubernetes` Service (KUBERNETES_SERVICE_HOST in every pod) reaches
    /// the apiserver. The node's route to the service network goes to the
    /// switch (a node's default route would carry it); kube-proxy's DNAT
    /// rewrites it before it leaves.
    pub(super) fn start_proxy(&self, node: &mut Node) -> Result<()> {
        let via = self.api_ip.to_string();
        let out = node
            .command("ip")
            .args(["route", "replace", SERVICE_CIDR, "via", &via])
            .output()
            .map_err(io("running ip route"))?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "{}: ip route replace {SERVICE_CIDR} via {via}: {}",
                node.name,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let mut cmd = node.command(self.bin.join("kube-proxy"));
        cmd.arg(format!("--kubeconfig={}", self.dir.join("kube-proxy.conf").display()))
            .arg(format!("--hostname-override={}", node.name))
            .arg(format!("--proxy-mode={}", proxy_mode()?))
            .arg("--conntrack-max-per-core=0")
            .args(["--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256"])
            .env("PATH", path_with(&self.bin));
        node.proxy = Some(spawn_logged(
            cgroup::join(&cmd, &node.name),
            &node.dir.join("kube-proxy.log"),
            "kube-proxy",
        )?);
        Ok(())
    }
}

/// Debian's `nft` (the `nftables` package).
const NFT: &str = "/usr/sbin/nft";

/// kube-proxy's mode: `iptables` (kubeadm's default), or what
/// `VNET_K8S_PROXY_MODE` says: `iptables` or `nftables` (which needs the
/// `nft` program, Debian's `nftables`).
pub fn proxy_mode() -> Result<&'static str> {
    match std::env::var("VNET_K8S_PROXY_MODE").as_deref() {
        Err(_) | Ok("" | "iptables") => Ok("iptables"),
        Ok("nftables") if Path::new(NFT).exists() => Ok("nftables"),
        Ok("nftables") => Err(Error::Other(
            "VNET_K8S_PROXY_MODE=nftables needs /usr/sbin/nft (apt install nftables)".into(),
        )),
        Ok(other) => {
            Err(Error::Other(format!("VNET_K8S_PROXY_MODE: expected iptables or nftables, found `{other}`")))
        }
    }
}

fn path_with(bin: &Path) -> String {
    format!("{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", bin.display())
}

/// A node's containerd configuration: its own root, state and sockets,
/// CNI from the node's standard directories (and Debian's
/// containernetworking-plugins, `/usr/lib/cni`, for the `loopback` plugin
/// containerd's CRI runs in every pod, as a node's package would), runc (Debian's) with cgroupfs,
/// and the lab's pause image as the sandbox image. OOM scores no lower
/// than containerd's own: this machine withholds CAP_SYS_RESOURCE, so a
/// sandbox's -998 is refused (runc's "failed to update oom_score_adj").
fn containerd_toml(dir: &Path, runc: &Path) -> String {
    let d = dir.display();
    let runc = runc.display();
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
"#
    )
}

/// A node's kubelet configuration: the containerd socket, cgroupfs under
/// a cgroup root of the node's own (three kubelets on one machine),
/// cgroup v1 allowed (this machine's hierarchy), clients authenticated
/// as kubeadm sets it (the API's CA, and bearer tokens by a TokenReview)
/// and authorized by the API server (`Webhook`: a SubjectAccessReview per
/// request; the API server's own `kubectl exec` and logs come as
/// `kubernetes-admin`), a serving certificate of the lab's CA.
fn kubelet_yaml(node: &Node) -> String {
    let d = node.dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{ip}"
port: 10250
readOnlyPort: 0
healthzBindAddress: "127.0.0.1"
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{d}/ca.pem"}}
authorization: {{mode: Webhook}}
tlsCertFile: "{d}/kubelet-server.pem"
tlsPrivateKeyFile: "{d}/kubelet-server.key"
containerRuntimeEndpoint: "unix://{d}/containerd.sock"
cgroupDriver: cgroupfs
cgroupRoot: "/{name}"
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
resolvConf: /etc/resolv.conf
clusterDNS: ["{dns}"]
clusterDomain: cluster.local
serializeImagePulls: false
evictionHard: {{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}}
maxPods: 110
oomScoreAdj: 0
"#,
        ip = node.ip,
        name = node.name,
        dns = DNS_IP,
    )
}
