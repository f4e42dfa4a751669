//! docs/INTEGRATION.md's Kubernetes walkthrough ("By hand: from a fresh
//! cluster to Services, DNS and a NetworkPolicy"), run as it is written
//! (issue 67, acceptance point 6) by `k8s::by_hand::walkthrough_*`.
//!
//! The page's blocks are read first (`vnet_lab::docs::walkthrough`): a
//! fence this runner does not know fails the test before a lab is made.
//! Then each block, in order: `sh on=admin` in node 0's network namespace
//! (the admin's machine: `kubectl` as the cluster's admin, `vnetctl`,
//! etcd), `sh on=each-node` there once per node with `NODE` set,
//! `sh on=approve` there once per node with `NODE` and the `FINGERPRINT`
//! the block before it showed for that node, `sh on=node` in each node's
//! namespaces with `NODE` set; `sh lab=WORD` blocks are not run and the
//! lab does the step ([`Walk::lab_step`]). A block fails the test when its
//! bash exits non-zero or its output lacks a line of its `text output`
//! block; one marked `until=S` is run again until it passes, S seconds at
//! most.

use super::harness::*;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use vnet_lab::docs::{self, Block, Step};
use vnet_lab::k8s::{Kube, BUSYBOX_IMAGE, VNET_TAG};

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/INTEGRATION.md");
const SECTION: &str = "### Kubernetes: `kubectl apply -f packaging/kubernetes/vnet.yaml`";
const WALK: &str = "#### By hand: from a fresh cluster to Services, DNS and a NetworkPolicy";
const PLACES: &[&str] = &["admin", "each-node", "approve", "node"];
const LAB_STEPS: &[&str] = &["kubeadm", "image", "copy-token"];
/// The workloads' image, as the page names it (the lab has no registry:
/// its busybox is tagged so).
const PAGE_BUSYBOX: &str = "docker.io/library/busybox:1.35";
/// At most this long for one run of a block.
const RUN_LIMIT: Duration = Duration::from_secs(240);

/// The walkthrough's blocks. Elsewhere in the Kubernetes section every
/// fence is `text` (what a command printed, or commands another named
/// test runs): no `sh` block is left unrun.
fn blocks() -> Vec<Block> {
    let text = std::fs::read_to_string(PAGE).unwrap();
    let k8s = docs::section(&text, SECTION).unwrap();
    let walk = docs::section(k8s, WALK).unwrap();
    let rest = k8s.replacen(walk, "", 1);
    for f in docs::fences(&rest) {
        assert_eq!(f.info, "text", "a fence of the Kubernetes section outside the walkthrough: {f:?}");
    }
    let offset = text[..text.find(walk).unwrap()].lines().count();
    docs::walkthrough(walk, PLACES, LAB_STEPS)
        .map_err(|e| format!("docs/INTEGRATION.md, {}", e.shifted(offset)))
        .unwrap()
        .into_iter()
        .map(|b| Block { line: b.line + offset, ..b })
        .collect()
}

/// Stops the etcd the page's admin block started in node 0's namespace
/// (after the cluster is gone: declared before the [`Kube`]).
struct PageEtcd(String);

impl Drop for PageEtcd {
    fn drop(&mut self) {
        let etcds = || -> Vec<String> {
            let out = Command::new("ip").args(["netns", "pids", &self.0]).output();
            let pids = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
            pids.split_whitespace()
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "etcd")
                })
                .map(str::to_string)
                .collect()
        };
        for sig in ["-TERM", "-KILL"] {
            for pid in etcds() {
                let _ = Command::new("kill").args([sig, &pid]).status();
            }
            let t0 = Instant::now();
            while !etcds().is_empty() && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Where one run of a block goes (`None`: the admin's machine, `Some(n)`:
/// node `n`) and the variables it is given.
type BlockRun = (Option<usize>, Vec<(String, String)>);

/// The walk's state: the lab, the page's variables, what the last block showed.
struct Walk<'a> {
    lab: &'a Lab,
    kube: &'a Kube,
    vnet_dir: PathBuf,
    path: String,
    last: String,
    runs: usize,
}

impl Walk<'_> {
    /// Runs (or, for `lab=`, does) one block of the page.
    fn block(&mut self, b: &Block) {
        let t0 = Instant::now();
        let (runs, until) = match &b.step {
            Step::Lab { word, why } => {
                self.lab_step(word);
                eprintln!("walkthrough: line {} ({}) not run: {why}", b.line, b.step);
                return;
            }
            Step::Run { on, until } => (self.runs_of(on), until.map(Duration::from_secs)),
        };
        let mut shown = String::new();
        let mut tries = 0;
        for (n, vars) in &runs {
            loop {
                tries += 1;
                let r = self.run_once(*n, vars, &b.body);
                let checked = r.and_then(|out| {
                    docs::check_output(&b.output, &out).map_err(|e| format!("{e}\nits output:\n{out}"))?;
                    Ok(out)
                });
                match checked {
                    Ok(out) => {
                        shown.push_str(&out);
                        break;
                    }
                    Err(_) if until.is_some_and(|u| t0.elapsed() < u) => {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    Err(e) => panic!(
                        "docs/INTEGRATION.md line {} (```{}, with {vars:?}), tried {tries} times in {:.1?}:\n{}\n{e}",
                        b.line,
                        b.step,
                        t0.elapsed(),
                        b.body
                    ),
                }
            }
        }
        self.runs += runs.len();
        eprintln!(
            "walkthrough: line {} ({}) passed: {} run(s), {tries} tries, {:.1?}",
            b.line,
            b.step,
            runs.len(),
            t0.elapsed()
        );
        for l in shown.lines() {
            eprintln!("  | {l}");
        }
        self.last = shown;
    }

    /// Where block runs go (`None`: the admin's machine, `Some(n)`: node
    /// `n`), and the variables each sees.
    fn runs_of(&self, on: &str) -> Vec<BlockRun> {
        let kube = self.kube;
        let node = |n: usize| ("NODE".to_string(), kube.nodes[n].name.clone());
        let each = 0..kube.nodes.len();
        match on {
            "admin" => vec![(None, vec![])],
            "each-node" => each.map(|n| (None, vec![node(n)])).collect(),
            "node" => each.map(|n| (Some(n), vec![node(n)])).collect(),
            "approve" => {
                each.map(|n| (None, vec![node(n), ("FINGERPRINT".into(), self.fingerprint(n))])).collect()
            }
            other => unreachable!("docs::walkthrough admits only {PLACES:?}, not {other}"),
        }
    }

    /// The fingerprint the last block showed for node `n` (`vnetctl join`'s
    /// line `vnetctl join: host NODE at ADDR, key fingerprint FP`), as the
    /// admin reads it.
    fn fingerprint(&self, n: usize) -> String {
        let host = format!("host {} at ", self.kube.nodes[n].name);
        let fp =
            self.last.lines().filter(|l| l.contains(&host)).find_map(|l| l.split("key fingerprint ").nth(1));
        let fp = fp.map(str::trim).filter(|f| !f.is_empty());
        fp.unwrap_or_else(|| {
            panic!("no fingerprint for {host:?} in the block before approve:\n{}", self.last)
        })
        .to_string()
    }

    /// One run of `body` (bash, `-euo pipefail`) on the admin's machine or
    /// node `n`, with the page's variables and `vars`: its standard output,
    /// or why it failed.
    fn run_once(
        &mut self,
        n: Option<usize>,
        vars: &[(String, String)],
        body: &str,
    ) -> Result<String, String> {
        let kube = self.kube;
        // (`env -C`: entering a node's mount namespace moves to its root.)
        let mut c = match n {
            None => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &self.lab.hosts[0].ns, "env", "-C"]).arg(repo());
                c
            }
            Some(n) => {
                let mut c = kube.nodes[n].command("env");
                let socket = kube.nodes[n].socket().display().to_string();
                c.arg("-C").arg(kube.dir.join("images")).arg(format!("CONTAINERD_ADDRESS={socket}"));
                c
            }
        };
        c.arg(format!("PATH={}", self.path))
            .arg(format!("KUBECONFIG={}", kube.dir.join("admin.conf").display()))
            .arg(format!("NETWORK={}", self.lab.prefix))
            .arg(format!("ETCD_IP={}", self.lab.hosts[0].underlay_ip))
            .arg(format!("VNET_DIR={}", self.vnet_dir.display()));
        for (k, v) in vars {
            c.arg(format!("{k}={v}"));
        }
        let (out, err) = (kube.dir.join("walk.out"), kube.dir.join("walk.err"));
        let file = |p: &Path| std::fs::File::create(p).unwrap();
        c.args(["bash", "-euo", "pipefail", "-c", body])
            .stdin(Stdio::null())
            .stdout(file(&out))
            .stderr(file(&err))
            .process_group(0);
        let mut child = c.spawn().map_err(|e| format!("starting bash: {e}"))?;
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed() > RUN_LIMIT {
                // The block's process group: bash and what it runs.
                let _ = Command::new("kill").args(["-s", "KILL", "--", &format!("-{}", child.id())]).status();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let (stdout, stderr) = (
            std::fs::read_to_string(&out).unwrap_or_default(),
            std::fs::read_to_string(&err).unwrap_or_default(),
        );
        match status {
            Some(s) if s.success() => Ok(stdout),
            Some(s) => Err(format!("it exited with {s}\nstdout:\n{stdout}\nstderr:\n{stderr}")),
            None => Err(format!("it ran longer than {RUN_LIMIT:?}\nstdout:\n{stdout}\nstderr:\n{stderr}")),
        }
    }

    /// What the lab does for a `lab=WORD` block.
    fn lab_step(&mut self, word: &str) {
        let kube = self.kube;
        match word {
            // kubeadm init and join: the lab's control plane and nodes run
            // (Kube::start_without_store); CoreDNS from kubeadm's manifests,
            // as kubeadm init deploys it (Pending until a network is up);
            // busybox under the name the page gives it (no registry).
            "kubeadm" => {
                let yaml = kube.dir.join("coredns.yaml");
                std::fs::write(&yaml, vnet_lab::k8s::COREDNS_MANIFEST).unwrap();
                kube.kubectl(&["apply", "-f", yaml.to_str().unwrap()]).unwrap();
                for node in &kube.nodes {
                    let out = node
                        .command(kube.bin.join("ctr"))
                        .arg("--address")
                        .arg(node.socket())
                        .args(["-n", "k8s.io", "images", "tag", "--force", BUSYBOX_IMAGE, PAGE_BUSYBOX])
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "ctr images tag on {}: {out:?}", node.name);
                }
            }
            // The image: built by the lab (k8s/image.rs) and imported when
            // the nodes started; the page's `ctr images import` takes the
            // archive from where the lab wrote it.
            "image" => {
                let tar = kube.dir.join(format!("images/vnet-{VNET_TAG}.tar"));
                assert!(tar.is_file(), "{} missing", tar.display());
            }
            // scp: each node's token to its /var/lib/vnet/join.token, 0600.
            "copy-token" => {
                for node in &kube.nodes {
                    let from = self.vnet_dir.join(format!("{}.token", node.name));
                    let text = std::fs::read_to_string(&from).unwrap();
                    let lib = node.dir.join("lib-vnet");
                    std::fs::create_dir_all(&lib).unwrap();
                    vnetd::keys::write_secret(&lib.join("join.token"), text.trim()).unwrap();
                }
            }
            other => unreachable!("docs::walkthrough admits only {LAB_STEPS:?}, not {other}"),
        }
    }
}

/// The repository's root (the page's commands name its files).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The walkthrough, on a fresh Kubernetes lab with no vnet and no vnet etcd.
pub fn run() {
    let t_all = Instant::now();
    let blocks = blocks();
    let (ran, not_run) = (
        blocks.iter().filter(|b| matches!(b.step, Step::Run { .. })).count(),
        blocks.iter().filter(|b| matches!(b.step, Step::Lab { .. })).count(),
    );
    eprintln!("walkthrough: {} blocks read ({ran} to run, {not_run} the lab's own steps)", blocks.len());
    let lab = lab(super::k8s::kube_spec());
    let _etcd = PageEtcd(lab.hosts[0].ns.clone());
    let t0 = Instant::now();
    let kube = Kube::start_without_store(&lab).unwrap_or_else(|e| panic!("kubernetes: {e}"));
    assert!(
        kube.bin.join("coredns").is_file(),
        "no coredns in {}: scripts/k8s-build.sh builds it",
        kube.bin.display()
    );
    eprintln!("k8s: control plane and 3 nodes registered in {:.1?}", t0.elapsed());
    let vnetctl = vnet_lab::bin("vnetctl").unwrap();
    let path = format!(
        "{}:{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        kube.bin.display(),
        vnetctl.parent().unwrap().display()
    );
    let mut walk = Walk {
        lab: &lab,
        vnet_dir: kube.dir.join("vnet-admin"),
        kube: &kube,
        path,
        last: String::new(),
        runs: 0,
    };
    let t0 = Instant::now();
    for b in &blocks {
        walk.block(b);
    }
    eprintln!(
        "walkthrough: {ran} blocks run ({} runs) and {not_run} done by the lab, all passed, in {:.1?} ({:.1?} with the lab)",
        walk.runs,
        t0.elapsed(),
        t_all.elapsed()
    );
}
