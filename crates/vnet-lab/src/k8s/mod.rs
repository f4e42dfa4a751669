//! The Kubernetes lab: a control plane and three nodes on the lab's
//! underlay, run from the programs `scripts/k8s-build.sh` builds
//! (Kubernetes and containerd from the Go module proxy; runc is Debian's),
//! with no registry: images are made here ([`image`]) and imported into
//! each node's containerd.
//!
//! - **Control plane**, in the switch namespace beside the lab's etcd:
//!   kube-apiserver on the lab's etcd over TLS (with the client
//!   certificate of etcd's `root`, a user the lab's etcd knows), on
//!   `https://ETCD_IP:6443`; kube-controller-manager and kube-scheduler.
//!   Certificates from a CA of the lab's own ([`crate::pki`]): the
//!   apiserver's, `kubernetes-admin` in `system:masters` (what `kubectl`
//!   runs as), the controller manager's, the scheduler's and each node's
//!   (`system:node:NAME` in `system:nodes`, for the Node authorizer).
//! - **A node** per lab host: a holder process entered into the host's
//!   network namespace with a mount and a UTS namespace of its own (host
//!   name: the node's name), where the directories a node's programs and
//!   the manifest's hostPath volumes use are the node's own directories of
//!   the lab (`/etc/cni/net.d`, `/opt/cni/bin`, `/run/vnet`,
//!   `/var/lib/vnet`, `/var/lib/kubelet`, `/var/lib/cni`, `/var/log/pods`,
//!   `/var/log/containers`, `/run/netns`, `/run/containerd`) and
//!   `/sys/fs/bpf` a bpffs of its own. Its containerd (own root, state and
//!   socket) and kubelet (own cgroup root, `/NAME`, cgroupfs driver) run
//!   there (`nsenter -t HOLDER`), so three nodes share one machine as
//!   three machines would not notice.
//!
//! - **vnet's store**: its own etcd, made by `vnetctl network init` on
//!   node 0 as an admin makes one; each node joins it with its own token,
//!   key and etcd user ([`join`]).
//!
//! Everything a node runs is in its cgroup tree `/NAME` ([`cgroup`]).
//! Dropping a [`Kube`] stops the kubelets, removes every pod sandbox
//! through its containerd (`crictl rmp -fa`: CNI `DEL` for each, and the
//! shims exit), stops the containerds, ends the holders (their mounts go
//! with them), kills what is left in each node's tree (frozen while it is
//! listed) and removes the tree, then stops the control plane. A Ctrl-C or
//! SIGTERM first kills the lab's own processes (so no containerd or
//! kubelet starts anything more), then sweeps the trees the same way.

mod cgroup;
pub mod e2e;
pub mod image;
pub mod join;
mod node;
pub mod store;
pub mod up;

use crate::process::{spawn_logged, stop_child};
use crate::{io, pki, Error, Lab, Result};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The service network (the apiserver's `kubernetes` service takes its
/// first address).
const SERVICE_CIDR: &str = "10.96.0.0/16";
const SERVICE_IP: &str = "10.96.0.1";
/// The `kube-dns` Service's address (the kubelets' `clusterDNS`), kubeadm's
/// for its default service network: the tenth.
pub const DNS_IP: &str = "10.96.0.10";
/// CoreDNS's image, built from `target/k8s/bin/coredns` when
/// `scripts/k8s-build.sh` built it.
pub const COREDNS_IMAGE: &str = "localhost/coredns:v1.13.1";
/// CoreDNS's objects, as kubeadm makes them (`coredns.yaml`).
pub const COREDNS_MANIFEST: &str = include_str!("coredns.yaml");

/// Where `scripts/k8s-build.sh` puts the programs.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("VNET_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/k8s/bin"))
}

/// What the Kubernetes lab needs and this machine lacks, if anything.
pub fn unavailable() -> Option<String> {
    let bin = bin_dir();
    for p in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "kubectl",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "crictl",
        "portmap",
    ] {
        if !bin.join(p).is_file() {
            return Some(format!("{} missing: run scripts/k8s-build.sh", bin.join(p).display()));
        }
    }
    for p in [
        "/usr/sbin/runc",
        "/usr/sbin/iptables",
        "/bin/busybox",
        "/usr/bin/nsenter",
        "/usr/bin/unshare",
        "/usr/bin/gcc",
        "/usr/lib/cni/loopback",
    ] {
        if !Path::new(p).exists() {
            return Some(format!(
                "{p} missing: install runc, iptables, busybox-static, util-linux, gcc, containernetworking-plugins"
            ));
        }
    }
    None
}

/// One node: a lab host's namespace with a containerd and a kubelet.
pub struct Node {
    pub name: String,
    pub ip: IpAddr,
    pub dir: PathBuf,
    holder: Child,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    proxy: Option<Child>,
}

impl Node {
    /// containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// A command entered into the node's namespaces (network, mount, UTS).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg("-t").arg(self.holder.id().to_string()).args(["-n", "-m", "-u", "--"]).arg(program);
        c
    }
}

/// The control plane and nodes of a Kubernetes lab on a [`Lab`].
pub struct Kube {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub nodes: Vec<Node>,
    /// The switch namespace, where the control plane runs.
    sw: String,
    pub api: String,
    api_ip: IpAddr,
    control: Vec<Child>,
    /// vnet's etcd and the admin's directory ([`store`]).
    store: Option<store::Store>,
}

/// A kubeconfig for `user`'s certificate files.
fn kubeconfig(api: &str, user: &pki::HostFiles) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {api}\n    \
         certificate-authority: {}\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    \
         client-key: {}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: u}}\ncurrent-context: lab\n",
        user.ca.display(),
        user.cert.display(),
        user.key.display()
    )
}

impl Kube {
    /// Starts the control plane on `lab`'s etcd (a secured cluster lab)
    /// and a node on each of its hosts, with the lab's images imported,
    /// and vnet's own etcd as `vnetctl network init` makes it, on node 0
    /// ([`store::Store`]: each node joins it with its own credentials, [`join`]);
    /// waits until every node is registered.
    pub fn start(lab: &Lab) -> Result<Kube> {
        let mut kube = Kube::start_without_store(lab)?;
        let (store, etcd) =
            store::Store::start(lab, kube.dir.join("vnet-admin"), &kube.dir.join("vnet-etcd.log"))?;
        kube.control.push(etcd);
        kube.store = Some(store);
        Ok(kube)
    }

    /// [`Kube::start`] without vnet's etcd (the caller makes it as an admin
    /// would: `docs/INTEGRATION.md`'s walkthrough), its images imported and
    /// its nodes registered.
    pub fn start_without_store(lab: &Lab) -> Result<Kube> {
        if let Some(why) = unavailable() {
            return Err(Error::Other(why));
        }
        let sw =
            lab.switch_ns().ok_or_else(|| Error::Other("the Kubernetes lab needs a cluster lab".into()))?;
        let dir = lab.dir.join("k8s");
        std::fs::create_dir_all(&dir).map_err(io("making the k8s directory"))?;
        let api_ip = lab.etcd_ip();
        let mut kube = Kube {
            api: format!("https://{api_ip}:6443"),
            api_ip,
            dir,
            bin: bin_dir(),
            nodes: Vec::new(),
            sw: sw.to_string(),
            control: Vec::new(),
            store: None,
        };
        kube.start_control_plane(lab, api_ip)?;
        for h in 0..lab.hosts.len() {
            let node = kube.start_node(lab, h)?;
            kube.nodes.push(node);
        }
        kube.import_images()?;
        kube.wait_nodes_registered(Duration::from_secs(90))?;
        Ok(kube)
    }

    /// vnet's etcd and the admin's directory ([`store`]).
    pub fn store(&self) -> Result<&store::Store> {
        self.store.as_ref().ok_or_else(|| Error::Other("the lab's vnet store is not started".into()))
    }

    fn start_control_plane(&mut self, lab: &Lab, api_ip: IpAddr) -> Result<()> {
        let ca = pki::Ca::new(&format!("{} kubernetes CA", lab.prefix))?;
        let d = &self.dir;
        let sans: Vec<String> = [
            api_ip.to_string(),
            SERVICE_IP.into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
        ]
        .into();
        let server = ca.issue(d, "apiserver", "kube-apiserver", &[], &sans)?;
        let admin = ca.issue(d, "admin", "kubernetes-admin", &["system:masters"], &[])?;
        let kcm = ca.issue(d, "kcm", "system:kube-controller-manager", &[], &[])?;
        let sched = ca.issue(d, "scheduler", "system:kube-scheduler", &[], &[])?;
        let proxy = ca.issue(d, "kube-proxy", "system:kube-proxy", &[], &[])?;
        // The service accounts' signing key: any key pair's private half.
        let sa = ca.issue(d, "sa", "service-accounts", &[], &[])?;
        for (name, user) in [("admin", &admin), ("kcm", &kcm), ("scheduler", &sched), ("kube-proxy", &proxy)]
        {
            std::fs::write(d.join(format!("{name}.conf")), kubeconfig(&self.api, user))
                .map_err(io("writing a kubeconfig"))?;
        }
        let f = |n: &str| lab.dir.join(n).display().to_string();
        let mut cmd = self.in_switch("kube-apiserver");
        cmd.args([
            format!("--etcd-servers={}", lab.etcd_url()),
            format!("--etcd-cafile={}", f("etcd-ca.pem")),
            format!("--etcd-certfile={}", f("root.pem")),
            format!("--etcd-keyfile={}", f("root.key")),
            format!("--bind-address={api_ip}"),
            format!("--advertise-address={api_ip}"),
            "--secure-port=6443".into(),
            format!("--tls-cert-file={}", server.cert.display()),
            format!("--tls-private-key-file={}", server.key.display()),
            format!("--client-ca-file={}", server.ca.display()),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", sa.cert.display()),
            format!("--service-account-signing-key-file={}", sa.key.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=Node,RBAC".into(),
            "--allow-privileged=true".into(),
            "--kubelet-preferred-address-types=InternalIP".into(),
            format!("--kubelet-client-certificate={}", admin.cert.display()),
            format!("--kubelet-client-key={}", admin.key.display()),
        ]);
        self.control.push(spawn_logged(cmd, &d.join("kube-apiserver.log"), "kube-apiserver")?);
        let t0 = Instant::now();
        while self.kubectl(&["get", "--raw=/readyz"]).is_err() {
            let exited = self.control.last_mut().and_then(|c| c.try_wait().ok().flatten());
            if t0.elapsed() > Duration::from_secs(90) || exited.is_some() {
                return Err(Error::Other(format!(
                    "kube-apiserver not ready within 90 s: {}",
                    tail(&d.join("kube-apiserver.log"))
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let mut cmd = self.in_switch("kube-controller-manager");
        cmd.args([
            format!("--kubeconfig={}", d.join("kcm.conf").display()),
            format!("--authentication-kubeconfig={}", d.join("kcm.conf").display()),
            format!("--authorization-kubeconfig={}", d.join("kcm.conf").display()),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", sa.key.display()),
            format!("--root-ca-file={}", server.ca.display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
        ]);
        self.control.push(spawn_logged(
            cmd,
            &d.join("kube-controller-manager.log"),
            "kube-controller-manager",
        )?);
        let mut cmd = self.in_switch("kube-scheduler");
        cmd.args([
            format!("--kubeconfig={}", d.join("scheduler.conf").display()),
            format!("--authentication-kubeconfig={}", d.join("scheduler.conf").display()),
            format!("--authorization-kubeconfig={}", d.join("scheduler.conf").display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
        ]);
        self.control.push(spawn_logged(cmd, &d.join("kube-scheduler.log"), "kube-scheduler")?);
        // The nodes' certificates, from the same CA.
        for (h, host) in lab.hosts.iter().enumerate() {
            let name = node_name(lab, h);
            let nd = d.join(format!("h{h}"));
            std::fs::create_dir_all(&nd).map_err(io("making a node directory"))?;
            let client =
                ca.issue(&nd, "kubelet-client", &format!("system:node:{name}"), &["system:nodes"], &[])?;
            ca.issue(&nd, "kubelet-server", &name, &[], &[host.underlay_ip.to_string(), name.clone()])?;
            std::fs::write(nd.join("kubelet.conf"), kubeconfig(&self.api, &client))
                .map_err(io("writing a kubeconfig"))?;
        }
        Ok(())
    }

    /// A program of the build, run in the switch namespace.
    fn in_switch(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.sw)).arg(self.bin.join(program));
        c
    }

    /// `kubectl` as the cluster's administrator; fails unless it exits 0.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl_output(args)?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("kubectl {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl` as the administrator, whatever its status.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<Output> {
        self.kubectl_command(args).stdin(Stdio::null()).output().map_err(io("running kubectl"))
    }

    /// The `kubectl` command as the administrator, to run as the caller likes.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut c = self.in_switch("kubectl");
        c.arg(format!("--kubeconfig={}", self.dir.join("admin.conf").display())).args(args);
        c
    }

    /// Restarts node `n`'s containerd (SIGTERM, then started again): its
    /// containers keep running, as under a service manager's restart.
    pub fn restart_containerd(&mut self, n: usize) -> Result<()> {
        self.restart(n, |node| &mut node.containerd, Kube::start_containerd)
    }

    /// Restarts node `n`'s kubelet (SIGTERM, then started again).
    pub fn restart_kubelet(&mut self, n: usize) -> Result<()> {
        self.restart(n, |node| &mut node.kubelet, Kube::start_kubelet)
    }

    fn restart(
        &mut self,
        n: usize,
        which: fn(&mut Node) -> &mut Option<Child>,
        start: fn(&Kube, &mut Node) -> Result<()>,
    ) -> Result<()> {
        let mut nodes = std::mem::take(&mut self.nodes);
        if let Some(c) = which(&mut nodes[n]).take() {
            stop_child(c);
        }
        let r = start(self, &mut nodes[n]);
        self.nodes = nodes;
        r
    }

    /// The pids of the processes named `comm` (as `/proc/PID/comm` has
    /// it) that run on node `n` (in its cgroup tree): what a test kills as
    /// a crash would (vnetd, say).
    pub fn pids_named(&self, n: usize, comm: &str) -> Vec<u32> {
        cgroup::node_procs(&self.nodes[n].name)
            .iter()
            .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm))
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// `kubectl ... -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let text = self.kubectl(&a)?;
        serde_json::from_str(&text).map_err(|e| Error::Other(format!("kubectl {}: {e}", args.join(" "))))
    }

    /// What node `n` has that vnet could leave, one line each: its network
    /// devices, clsact qdiscs, the files and directories of its bpffs, the
    /// files of its CNI directories, vnet-cni's iptables rules, and the eBPF programs of vnet's
    /// (`vnet_*`) loaded in the kernel (machine-wide: a TC program of the
    /// node's is among them, attached as tcx or by tc). Compared before
    /// vnet is applied and after it is deleted.
    pub fn footprint(&self, n: usize) -> Result<Vec<String>> {
        let node = &self.nodes[n];
        let run = |program: &str, args: &[&str]| -> Result<String> {
            let out = node.command(program).args(args).output().map_err(io(format!("running {program}")))?;
            if !out.status.success() {
                return Err(Error::Other(format!("{}: {program} {args:?}: {out:?}", node.name)));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let mut v = Vec::new();
        for l in run("ip", &["-o", "link", "show"])?.lines() {
            if let Some(name) = l.split(": ").nth(1) {
                v.push(format!("link {}", name.split('@').next().unwrap_or(name)));
            }
        }
        v.extend(
            run("tc", &["qdisc", "show"])?
                .lines()
                .filter(|l| l.contains("clsact"))
                .map(|l| format!("qdisc {l}")),
        );
        v.extend(run("find", &["/sys/fs/bpf", "-mindepth", "1"])?.lines().map(|l| format!("bpffs {l}")));
        // vnet-cni's rules (the node as its pods' gateway), by their comment.
        v.extend(
            run("iptables-save", &[])?
                .lines()
                .filter(|l| l.contains("--comment \"vnet "))
                .map(|l| format!("iptables {l}")),
        );
        for d in ["cni-conf", "cni-bin"] {
            for e in std::fs::read_dir(node.dir.join(d)).map_err(io(format!("reading {d}")))?.flatten() {
                v.push(format!("{d} {}", e.file_name().to_string_lossy()));
            }
        }
        for p in aya::programs::loaded_programs().flatten() {
            if let Some(name) = p.name_as_str().filter(|n| n.starts_with("vnet_")) {
                v.push(format!("program {name} (id {})", p.id()));
            }
        }
        v.sort();
        Ok(v)
    }

    /// `crictl` against `node`'s containerd, in the node's namespaces.
    pub fn crictl(&self, node: &Node, args: &[&str]) -> Result<Output> {
        node.command(self.bin.join("crictl"))
            .arg(format!("--runtime-endpoint=unix://{}", node.socket().display()))
            .arg(format!("--image-endpoint=unix://{}", node.socket().display()))
            .args(["--timeout", "20s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io("running crictl"))
    }

    /// Builds the lab's images (vnet's at `vnet_tag`) and imports them into
    /// every node's containerd.
    pub fn import_images(&self) -> Result<()> {
        self.import_vnet_image(VNET_TAG)?;
        let work = self.dir.join("images");
        let root = work.join("busybox-root");
        std::fs::create_dir_all(&root).map_err(io("making an image root"))?;
        image::add_busybox(&root)?;
        let bb = image::build(
            &image::ImageSpec { name: BUSYBOX_IMAGE, root: &root, entrypoint: &["/bin/sh"], cmd: &[] },
            &work,
            &work.join("busybox.tar"),
        )?;
        let root = work.join("pause-root");
        std::fs::create_dir_all(&root).map_err(io("making an image root"))?;
        image::add_pause(&root, &work)?;
        let pause = image::build(
            &image::ImageSpec { name: PAUSE_IMAGE, root: &root, entrypoint: &["/pause"], cmd: &[] },
            &work,
            &work.join("pause.tar"),
        )?;
        self.import(&bb)?;
        self.import(&pause)?;
        let coredns = self.bin.join("coredns");
        if !coredns.is_file() {
            return Ok(());
        }
        let root = work.join("coredns-root");
        std::fs::create_dir_all(root.join("etc")).map_err(io("making an image root"))?;
        image::copy_into(&root, &coredns, "/coredns")?;
        let tar = image::build(
            &image::ImageSpec { name: COREDNS_IMAGE, root: &root, entrypoint: &["/coredns"], cmd: &[] },
            &work,
            &work.join("coredns.tar"),
        )?;
        self.import(&tar)
    }

    /// Builds vnet's image `localhost/vnet:TAG` from this build's binaries
    /// and imports it into every node.
    pub fn import_vnet_image(&self, tag: &str) -> Result<()> {
        let work = self.dir.join("images");
        std::fs::create_dir_all(&work).map_err(io("making the images' directory"))?;
        let out = work.join(format!("vnet-{tag}.tar"));
        let tar = image::vnet_image(tag, &crate::bin, &self.bin.join("portmap"), false, &work, &out)?;
        self.import(&tar)
    }

    fn import(&self, tar: &Path) -> Result<()> {
        for node in &self.nodes {
            let out = Command::new(self.bin.join("ctr"))
                .arg("--address")
                .arg(node.socket())
                .args(["-n", "k8s.io", "images", "import"])
                .arg(tar)
                .output()
                .map_err(io("running ctr"))?;
            if !out.status.success() {
                return Err(Error::Other(format!(
                    "ctr images import {} on {}: {}",
                    tar.display(),
                    node.name,
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        Ok(())
    }

    fn wait_nodes_registered(&mut self, within: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            let exited = self
                .nodes
                .iter_mut()
                .any(|n| n.kubelet.as_mut().is_some_and(|k| !matches!(k.try_wait(), Ok(None))));
            let n = self.get_json(&["get", "nodes"]).map(|v| v["items"].as_array().map_or(0, Vec::len));
            if n.as_ref().is_ok_and(|&n| n == self.nodes.len()) {
                return Ok(());
            }
            if t0.elapsed() > within || exited {
                let logs: Vec<String> = self.nodes.iter().map(|n| tail(&n.dir.join("kubelet.log"))).collect();
                return Err(Error::Other(format!("nodes not registered within {within:?}: {n:?}; {logs:?}")));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The nodes' `Ready` condition, by name: "True", "False" or "Unknown".
    pub fn node_ready(&self) -> Result<Vec<(String, String)>> {
        let v = self.get_json(&["get", "nodes"])?;
        Ok(v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                let ready = n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready")
                    .and_then(|c| c["status"].as_str())
                    .unwrap_or("Unknown");
                (n["metadata"]["name"].as_str().unwrap_or("").to_string(), ready.to_string())
            })
            .collect())
    }
}

/// vnet's image tag: the version, as the manifest names it.
pub const VNET_TAG: &str = env!("CARGO_PKG_VERSION");
/// The test image and the sandbox image.
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:lab";
pub const PAUSE_IMAGE: &str = "localhost/pause:lab";

/// Lab host `h`'s node name.
pub fn node_name(lab: &Lab, h: usize) -> String {
    format!("{}-h{h}", lab.prefix)
}

/// The last lines of a log file.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl Drop for Kube {
    fn drop(&mut self) {
        // A signal's cleanup removes the nodes and exits: not twice at once.
        if crate::process::interrupted() {
            return;
        }
        for node in &mut self.nodes {
            for c in [node.proxy.take(), node.kubelet.take()].into_iter().flatten() {
                stop_child(c);
            }
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].containerd.is_some() {
                let _ = self.crictl(&self.nodes[i], &["rmp", "-fa"]);
            }
        }
        for node in &mut self.nodes {
            if let Some(c) = node.containerd.take() {
                stop_child(c);
            }
            let _ = node.holder.kill();
            let _ = node.holder.wait();
            // The shims, pods and anything else of the node's.
            let kept = cgroup::sweep(&node.name);
            if !kept.is_empty() {
                eprintln!("vnet-lab: {}'s cgroups left: {kept:?}", node.name);
            }
            nodes().retain(|(d, _)| *d != node.dir);
        }
        for c in self.control.drain(..).rev() {
            stop_child(c);
        }
    }
}

/// The nodes of running Kubernetes labs (directory, cgroup name), for the
/// signal cleanup: a Ctrl-C skips [`Kube`]'s drop.
static NODES: std::sync::Mutex<Vec<(PathBuf, String)>> = std::sync::Mutex::new(Vec::new());

fn nodes() -> std::sync::MutexGuard<'static, Vec<(PathBuf, String)>> {
    NODES.lock().unwrap_or_else(|p| p.into_inner())
}

/// On a signal (after the lab's own processes, containerd and the
/// kubelets among them, were killed: nothing starts a container any
/// more): every process left in a node's cgroup tree killed, the tree
/// removed.
fn cleanup_interrupted() {
    for (_, name) in std::mem::take(&mut *nodes()) {
        let t0 = Instant::now();
        let kept = cgroup::sweep(&name);
        eprintln!("vnet-lab: node {name}'s cgroups swept in {:.1?}", t0.elapsed());
        if !kept.is_empty() {
            eprintln!("vnet-lab: {name}'s cgroups left: {kept:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifest names the image the lab builds: this version's.
    #[test]
    fn the_manifest_runs_this_versions_image() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/vnet.yaml"),
        )
        .unwrap();
        let images: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("image: ")).collect();
        assert_eq!(images.len(), 3, "the two init containers' and vnetd's: {images:?}");
        assert!(images.iter().all(|i| *i == format!("localhost/vnet:{VNET_TAG}")), "{images:?}");
    }

    /// hostPort: the conflist chains the reference portmap after vnet-cni
    /// under vnet's own name, which the init container installs from the
    /// image and the preStop hook removes with vnet-cni.
    #[test]
    fn the_manifest_chains_portmap_after_vnet_cni_and_installs_it() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/vnet.yaml"),
        )
        .unwrap();
        let start = text.find("10-vnet.conflist: |").unwrap();
        let body: String = text[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    "))
            .collect::<Vec<_>>()
            .join("\n");
        let conf: serde_json::Value = serde_json::from_str(&body).unwrap();
        let types: Vec<&str> =
            conf["plugins"].as_array().unwrap().iter().filter_map(|p| p["type"].as_str()).collect();
        assert_eq!(types, ["vnet-cni", "vnet-portmap"]);
        assert_eq!(conf["plugins"][1]["capabilities"]["portMappings"], true);
        assert_eq!(conf["plugins"][1]["snat"], true);
        assert!(text.contains("cp /usr/lib/cni/vnet-portmap /host/opt/cni/bin/.vnet-portmap.new;"));
        assert!(text.contains("mv /host/opt/cni/bin/.vnet-portmap.new /host/opt/cni/bin/vnet-portmap;"));
        assert!(
            text.contains("/host/opt/cni/bin/vnet-cni /host/opt/cni/bin/vnet-portmap;"),
            "removed by preStop"
        );
    }

    /// Each node logs in as its own etcd user, the one `vnetctl network
    /// approve` makes for it (`host_user`), with the files its `join`
    /// init container wrote (which runs before the CNI is installed): no
    /// Secret, no credential shared between nodes.
    #[test]
    fn the_manifest_logs_each_node_in_as_its_own_joined_user() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/vnet.yaml"),
        )
        .unwrap();
        assert_eq!(vnet_cluster::layout::host_user("NET", "NODE"), "vnet/NET/NODE");
        assert!(text.contains(r#"--etcd-user "vnet/$VNET_NETWORK/$NODE_NAME""#));
        assert!(text.contains(r#"--etcd-password-file "$id.etcd-pw""#));
        assert!(text.contains(r#"id="/var/lib/vnet/join/$VNET_NETWORK""#));
        assert!(text.contains("vnetctl join --token-file - host \"$NODE_NAME\" dir \"$d\" wait 3600 <&3"));
        // The signed network, as the static cluster runs it: the node's
        // key and certificate, the network's key, claims bound to the API.
        for arg in
            [r#"--key "$id.key""#, r#"--network-key "$id.pub""#, r#"--host-cert "$id.cert""#, "--kube "]
        {
            assert!(text.contains(arg), "vnetd without {arg}");
        }
        assert!(!text.contains("secretKeyRef") && !text.contains("secretName"), "a Secret is read");
        let (join, cni) = (text.find("- name: join").unwrap(), text.find("- name: install-cni").unwrap());
        assert!(join < cni, "the node joins before its CNI is installed");
    }

    #[test]
    fn a_kubeconfig_names_the_users_files() {
        let f = pki::HostFiles { cert: "/d/a.pem".into(), key: "/d/a.key".into(), ca: "/d/ca.pem".into() };
        let k = kubeconfig("https://10.77.0.250:6443", &f);
        for want in
            ["server: https://10.77.0.250:6443", "certificate-authority: /d/ca.pem", "client-key: /d/a.key"]
        {
            assert!(k.contains(want), "{k}");
        }
    }
}
