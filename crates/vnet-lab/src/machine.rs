//! A Debian machine with systemd as its PID 1, in a lab host's network
//! namespace: the systemd test's host, where the package is installed with
//! apt and vnetd runs as systemd runs it (`vnetd@NAME`, its notify socket,
//! file descriptor store, reload, restarts).
//!
//! The root file system is Debian's packages (`lab/build-rootfs.sh`,
//! mmdebstrap, cached under `target/systemd/`), copied into the lab's
//! directory for each machine and booted with `systemd-nspawn --boot`
//! joined to the host's namespace (`--network-namespace-path`). This
//! machine's PID 1 is not systemd, so nspawn neither registers with
//! machined nor makes a scope (`--register=no --keep-unit`); commands run
//! in the machine through `nsenter` into its init's namespaces. The lab's
//! bpffs has a directory for this host, bound at the machine's `/sys/fs/bpf` (vnetd's
//! default pin directory is under it), and nspawn's own seccomp filter is
//! off (`SYSTEMD_SECCOMP=0`): vnetd's unit filters for itself, and the
//! kernel path needs `bpf(2)`.

use crate::{bench, io, registry, run, stop_child, Error, Lab, Result};
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Output;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

/// A booted machine; powered off and its root unmounted (its writes
/// removed with the lab's directory) when dropped.
pub struct Machine {
    nspawn: Option<Child>,
    /// The machine's init (its PID 1), as this namespace sees it.
    pub leader: u32,
    /// Its root file system (an overlay mount in the lab's directory).
    pub root: PathBuf,
}

impl Machine {
    /// Boots a machine in host `h`'s network namespace and waits until its
    /// systemd says the system is running.
    pub fn boot(lab: &mut Lab, h: usize) -> Result<Machine> {
        let mut m = Machine::start(lab, h)?;
        m.wait_running(lab, h)?;
        Ok(m)
    }

    /// Starts host `h`'s machine (its init running) without waiting for it
    /// to boot: several boot at once, then [`Machine::wait_running`] each.
    pub fn start(lab: &mut Lab, h: usize) -> Result<Machine> {
        let repo = bench::repo_dir();
        let script = repo.join("lab/build-rootfs.sh");
        let built = run(&[
            script.to_str().unwrap_or_default(),
            repo.join("target/systemd/rootfs").to_str().unwrap_or_default(),
        ])?;
        let image = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
        let root = overlay(&image, &lab.dir.join(format!("machine-h{h}")))?;
        // A directory of the lab's bpffs (unmounted with the lab).
        let bpf = lab.bpffs()?.join(format!("machine-h{h}"));
        std::fs::create_dir_all(&bpf).map_err(io("the machine's bpffs directory"))?;
        let log = std::fs::File::create(lab.dir.join(format!("machine-h{h}.log")))
            .map_err(io("the machine's log"))?;
        let child = Command::new("systemd-nspawn")
            .env("SYSTEMD_SECCOMP", "0")
            .args(["--boot", "--quiet", "--register=no", "--keep-unit", "--console=passive"])
            .arg(format!("--machine={}-h{h}", lab.prefix))
            .arg("--directory")
            .arg(&root)
            .arg(format!("--network-namespace-path=/run/netns/{}", lab.hosts[h].ns))
            .arg(format!("--bind={}:/sys/fs/bpf", bpf.display()))
            // What vnetd's unit may have (its CapabilityBoundingSet): nspawn
            // keeps CAP_SYS_ADMIN and CAP_NET_* for a machine in a network
            // namespace of its own, not these.
            .arg("--capability=CAP_BPF,CAP_PERFMON,CAP_IPC_LOCK,CAP_SYS_RESOURCE,CAP_NET_ADMIN,CAP_NET_RAW")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io("the machine's log"))?)
            .stderr(log)
            .spawn()
            .map_err(io("starting systemd-nspawn"))?;
        registry().1.push(child.id());
        let mut m = Machine { nspawn: Some(child), leader: 0, root };
        let t0 = Instant::now();
        while m.leader == 0 {
            let nspawn = m.nspawn.as_mut().map(|c| c.id()).unwrap_or_default();
            let kids =
                std::fs::read_to_string(format!("/proc/{nspawn}/task/{nspawn}/children")).unwrap_or_default();
            // nspawn's first child forks the machine's init and exits:
            // the leader is the child that runs systemd.
            m.leader = kids
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .find(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "systemd")
                })
                .unwrap_or(0);
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(Error::Other(format!("systemd-nspawn started no machine: {}", m.log(lab, h))));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(m)
    }

    /// Waits until the machine's systemd says the system is running (host
    /// `h`'s: its log is nspawn's in the lab's directory).
    pub fn wait_running(&mut self, lab: &Lab, h: usize) -> Result<()> {
        let (m, t0) = (self, Instant::now());
        // Until its systemd answers (its bus socket comes a moment after
        // it starts; before it makes /run/systemd/system, systemctl says
        // `offline`: seen once, on a machine loaded by builds), then until
        // it has started what it starts at boot.
        let (up, state) = loop {
            let up = m.exec(&["systemctl", "is-system-running", "--wait"])?;
            let state = String::from_utf8_lossy(&up.stdout).trim().to_string();
            let gone = m.nspawn.as_mut().is_some_and(|c| !matches!(c.try_wait(), Ok(None)));
            let answered = !state.is_empty() && state != "offline";
            if answered || gone || t0.elapsed() > Duration::from_secs(60) {
                break (up, state);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if state != "running" {
            let failed =
                m.exec(&["systemctl", "--failed", "--no-legend"]).map(|o| o.stdout).unwrap_or_default();
            let failed = String::from_utf8_lossy(&failed).into_owned();
            // Each failed unit's own journal: why it failed, not only that.
            let mut why = String::new();
            let units = failed.lines().filter_map(|l| l.split_whitespace().find(|w| w.contains('.')));
            for unit in units {
                let o = m.exec(&["journalctl", "-b", "-u", unit, "--no-pager", "-n", "20"]);
                let text = o.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                why.push_str(&format!("\n{unit}'s journal:\n{text}"));
            }
            return Err(Error::Other(format!(
                "the machine's systemd says `{state}` ({}), not running: {}{why}\nnspawn: {}",
                String::from_utf8_lossy(&up.stderr).trim(),
                failed,
                m.log(lab, h)
            )));
        }
        Ok(())
    }

    /// nspawn's own output for host `h`'s machine.
    pub fn log(&self, lab: &Lab, h: usize) -> String {
        std::fs::read_to_string(lab.dir.join(format!("machine-h{h}.log"))).unwrap_or_default()
    }

    /// Runs `args` in the machine (all its init's namespaces); its output,
    /// whatever its status.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        Command::new("nsenter")
            .args(["--target", &self.leader.to_string(), "--all", "--"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("running {} in the machine", args.join(" "))))
    }

    /// Runs the shell script `script` in the machine; its stdout, or an
    /// error with its stderr when it fails.
    pub fn sh(&self, script: &str) -> Result<String> {
        let out = self.exec(&["sh", "-ec", script])?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "`{script}` in the machine: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Copies `from` (this machine's file) to `to` in the machine.
    pub fn copy_in(&self, from: &Path, to: &str) -> Result<()> {
        let dest = self.root.join(to.trim_start_matches('/'));
        if let Some(d) = dest.parent() {
            std::fs::create_dir_all(d).map_err(io("a directory in the machine"))?;
        }
        std::fs::copy(from, &dest).map_err(io(format!("copying {} into the machine", from.display())))?;
        Ok(())
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // SIGTERM to nspawn: the machine's systemd shuts down (its units
        // stopped as on any machine); then nspawn exits.
        if let Some(mut c) = self.nspawn.take() {
            if let Ok(Some(st)) = c.try_wait() {
                eprintln!("vnet-lab: the machine had ended before its test did ({st})");
                registry().1.retain(|p| *p != c.id());
                return;
            }
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).output();
            let t0 = Instant::now();
            while matches!(c.try_wait(), Ok(None)) {
                if t0.elapsed() > Duration::from_secs(15) {
                    return stop_child(c);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            registry().1.retain(|p| *p != c.id());
        }
        unmount(&self.root);
    }
}

/// Mounts an overlay of `image` (read-only, shared by every machine) at
/// `dir/root`, its writes in `dir/upper`: a machine of its own at once,
/// where a copy of the 217 MB image took up to 13 s, and the removal of
/// the quickstart's five copies 185 s, on a machine loaded by builds.
fn overlay(image: &Path, dir: &Path) -> Result<PathBuf> {
    let (upper, work, root) = (dir.join("upper"), dir.join("work"), dir.join("root"));
    for d in [&upper, &work, &root] {
        std::fs::create_dir_all(d).map_err(io("the machine's overlay directories"))?;
    }
    let paths = [image, &upper, &work].map(|p| p.to_str().unwrap_or_default());
    // mount(8)'s option list is split at commas, its lowerdir at colons.
    if paths.iter().any(|p| p.is_empty() || p.contains([',', ':'])) {
        return Err(Error::Other(format!("an overlay cannot name these directories: {paths:?}")));
    }
    let options = format!("lowerdir={},upperdir={},workdir={}", paths[0], paths[1], paths[2]);
    run(&["mount", "-t", "overlay", "overlay", "-o", &options, root.to_str().unwrap_or_default()])?;
    Ok(root)
}

/// Unmounts a machine's root (lazily: a process of the machine's that has
/// not ended yet keeps it, not its path).
fn unmount(root: &Path) {
    let _ = Command::new("umount").arg("-l").arg(root).stderr(Stdio::null()).status();
}
