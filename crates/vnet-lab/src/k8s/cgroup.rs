//! A node's cgroups: everything a Kubernetes lab node runs stays in one
//! cgroup tree, `/NAME`, and leaving is killing that tree.
//!
//! The kubelet puts its pods under `/NAME` (its `cgroupRoot`); the node's
//! own processes (the holder, containerd, the kubelet, kube-proxy) join
//! `/NAME/lab` of the freezer hierarchy before they start ([`join`]), so
//! what they start inherits it: containerd's shims, runc and `runc init`
//! before runc moves it to its container's cgroup under `/NAME`. Nothing a
//! node started can be outside `/NAME`.
//!
//! [`sweep`] freezes the tree (no process in it can fork while it is
//! listed), kills every process listed, thaws it so that they die, and
//! repeats until the tree is empty; then it removes `/NAME` from every
//! hierarchy. A shim, a pause process or a `runc init` caught half-way
//! through a container's creation is killed like the rest: the earlier
//! cleanup, which killed what containerd had recorded (`init.pid`,
//! `shim.pid`) while containerd still ran, could leave one of each and
//! their cgroups behind.

use crate::{io, Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The cgroup v1 hierarchies' root.
const ROOT: &str = "/sys/fs/cgroup";

/// The freezer hierarchy's `/NAME` (cgroup v1), where a node's processes
/// are tracked.
fn freezer(name: &str) -> PathBuf {
    Path::new(ROOT).join("freezer").join(name)
}

/// The v1 hierarchies (a directory of `/sys/fs/cgroup` with
/// `cgroup.procs` and no `cgroup.controllers`).
fn v1_hierarchies() -> Vec<PathBuf> {
    let Ok(ctrls) = std::fs::read_dir(ROOT) else { return Vec::new() };
    ctrls
        .flatten()
        .map(|c| c.path())
        .filter(|p| p.join("cgroup.procs").exists() && !p.join("cgroup.controllers").exists())
        .collect()
}

/// Makes the cgroup `/NAME` in every v1 hierarchy (the kubelet's
/// `cgroupRoot` must exist), its cpuset with the root's CPUs and nodes,
/// and `/NAME/lab` in the freezer hierarchy for the node's own processes.
pub(super) fn make(name: &str) -> Result<()> {
    let hierarchies = v1_hierarchies();
    if !hierarchies.iter().any(|h| h.ends_with("freezer")) {
        return Err(Error::Other(format!(
            "no cgroup v1 freezer hierarchy in {ROOT}: the Kubernetes lab tracks a node's processes there"
        )));
    }
    for root in hierarchies {
        let d = root.join(name);
        std::fs::create_dir_all(&d).map_err(io(format!("making {}", d.display())))?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(root.join(f)) {
                std::fs::write(d.join(f), v.trim()).map_err(io(format!("writing {f}")))?;
            }
        }
    }
    let lab = freezer(name).join("lab");
    std::fs::create_dir_all(&lab).map_err(io(format!("making {}", lab.display())))
}

/// `cmd`, made to join node `name`'s freezer cgroup `/NAME/lab` before it
/// runs (a shell writes its own pid there, then execs the command): what
/// it starts is in the node's tree from its first instruction.
pub(super) fn join(cmd: &Command, name: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", "echo $$ > \"$1\" && shift && exec \"$@\"", "sh"])
        .arg(freezer(name).join("lab/cgroup.procs"))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// Every cgroup directory of the tree at `root`, parents first.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(es) = std::fs::read_dir(&dirs[i]) {
            dirs.extend(es.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        i += 1;
    }
    dirs
}

/// The processes of the tree at `root`.
fn procs(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = tree(root)
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| t.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The processes of node `name`'s tree (its own programs and its pods').
pub(super) fn node_procs(name: &str) -> Vec<String> {
    procs(&freezer(name))
}

/// Writes `state` (FROZEN or THAWED) to the freezer at `root` and waits
/// (2 s at most) until the tree is in it.
fn set_freezer(root: &Path, state: &str) {
    let f = root.join("freezer.state");
    if std::fs::write(&f, state).is_err() {
        return;
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        if std::fs::read_to_string(&f).is_ok_and(|s| s.trim() == state) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills every process in node `name`'s tree and removes `/NAME` from
/// every hierarchy. Returns what it could not remove (empty when the node
/// left nothing).
pub(super) fn sweep(name: &str) -> Vec<String> {
    let root = freezer(name);
    let t0 = Instant::now();
    while root.is_dir() && t0.elapsed() < Duration::from_secs(20) {
        if procs(&root).is_empty() {
            break;
        }
        set_freezer(&root, "FROZEN");
        let pids = procs(&root);
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&pids).stderr(Stdio::null()).status();
        }
        // Each cgroup, parents first (a child reads FROZEN while its
        // parent is), as runc may have frozen a container's on its own.
        for d in tree(&root).iter().skip(1) {
            let _ = std::fs::write(d.join("freezer.state"), "THAWED");
        }
        set_freezer(&root, "THAWED");
        // The killed leave their cgroups as they exit.
        let left = Instant::now();
        while !procs(&root).is_empty() && left.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut kept = Vec::new();
    // The v1 hierarchies, and the v2 one beside them (`unified`), where
    // runc and the kubelet make a container's cgroup too.
    let mut hierarchies = v1_hierarchies();
    hierarchies.push(Path::new(ROOT).join("unified"));
    for h in hierarchies {
        let top = h.join(name);
        if !top.is_dir() {
            continue;
        }
        let dirs = tree(&top);
        // A cgroup whose last process just exited may refuse for a moment.
        let t0 = Instant::now();
        while top.exists() && t0.elapsed() < Duration::from_secs(5) {
            for d in dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
            if top.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if top.exists() {
            kept.push(format!("{} ({} processes)", top.display(), procs(&top).len()));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_keeps_the_program_its_arguments_and_environment() {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", "42", "--", "/bin/kubelet", "--v=2"]).env("PATH", "/x");
        let c = join(&cmd, "vl1x1-h0");
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(c.get_program(), "sh");
        assert_eq!(args[3], "/sys/fs/cgroup/freezer/vl1x1-h0/lab/cgroup.procs");
        assert_eq!(args[4..], ["nsenter", "-t", "42", "--", "/bin/kubelet", "--v=2"]);
        assert!(c.get_envs().any(|(k, v)| k == "PATH" && v == Some("/x".as_ref())));
    }

    #[test]
    fn sweeping_a_node_without_cgroups_keeps_nothing() {
        assert!(sweep("vnet-lab-no-such-node-cgroup").is_empty());
    }
}
