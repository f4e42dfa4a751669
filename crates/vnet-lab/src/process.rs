//! The lab's processes and namespaces: running commands, the registry of
//! what the lab made, and the cleanup on exit, failure or signal.

use crate::{io, Error, Result};
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Output;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

/// Namespaces, pids and process groups to remove if the process is
/// interrupted.
pub(crate) static REGISTRY: Mutex<(Vec<String>, Vec<u32>)> = Mutex::new((Vec::new(), Vec::new()));
pub(crate) static GROUPS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// The labs' temporary directories, removed on a signal too.
pub(crate) static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// What else a signal must undo once the registered processes are killed
/// (the Kubernetes lab's containers, which no registered process is the
/// parent of), registered by the module that made it.
pub(crate) static CLEANUPS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

pub(crate) fn on_signal(f: fn()) {
    let mut c = CLEANUPS.lock().unwrap_or_else(|p| p.into_inner());
    if !c.contains(&f) {
        c.push(f);
    }
}

pub(crate) fn dirs() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    DIRS.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn registry() -> std::sync::MutexGuard<'static, (Vec<String>, Vec<u32>)> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn groups() -> std::sync::MutexGuard<'static, Vec<u32>> {
    GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn kill_group(pgid: u32) {
    let _ =
        Command::new("kill").arg("-KILL").arg("--").arg(format!("-{pgid}")).stderr(Stdio::null()).status();
}

/// Kills (SIGKILL) every process in the lab's network namespace `ns`
/// (`ip netns pids`): what a lab ran there and has not ended itself (an
/// iperf3 client a bench was waiting for when Ctrl-C came, a ping), before
/// the namespace goes, so that none outlives it reparented to init. The
/// namespace's name is the run's own (its prefix), so they are this run's.
pub(crate) fn kill_in_ns(ns: &str) {
    let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).stderr(Stdio::null()).output() else { return };
    let pids: Vec<String> =
        String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect();
    if !pids.is_empty() {
        let _ = Command::new("kill").arg("-KILL").args(&pids).stderr(Stdio::null()).status();
    }
}

/// Runs `cmd` in a process group of its own and returns its output; the
/// whole group (children that outlive it, such as MPI ranks) is killed when
/// it ends, and on Ctrl-C.
pub fn run_group(mut cmd: Command) -> Result<Output> {
    use std::os::unix::process::CommandExt;
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io("starting a process group"))?;
    let pgid = child.id();
    groups().push(pgid);
    let out = child.wait_with_output().map_err(io("waiting for a process group"));
    kill_group(pgid);
    groups().retain(|g| *g != pgid);
    out
}

/// Set by the signal cleanup: no lab daemon starts any more.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether a signal's cleanup has begun: a drop then leaves the lab to
/// it, and a program must not exit under it (the cleanup exits).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// On SIGINT/SIGTERM, kills the lab's processes, deletes its namespaces and
/// exits with status 130. Call once, early, in a binary that builds labs.
///
/// In this order, so that nothing escapes: no daemon starts any more
/// ([`spawn_logged`] checks [`INTERRUPTED`] under the registry's lock), the
/// process groups and daemons are killed (the Kubernetes lab's containerds
/// and kubelets, which start containers), then the cleanups of
/// [`on_signal`] (the Kubernetes lab's cgroup trees: shims and containers),
/// then the namespaces and directories.
pub fn install_signal_cleanup() {
    let _ = ctrlc::set_handler(|| {
        let (nss, pids) = {
            let mut r = registry();
            INTERRUPTED.store(true, Ordering::SeqCst);
            std::mem::take(&mut *r)
        };
        for g in std::mem::take(&mut *groups()) {
            kill_group(g);
        }
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(pids.iter().map(u32::to_string)).status();
        }
        for f in std::mem::take(&mut *CLEANUPS.lock().unwrap_or_else(|p| p.into_inner())) {
            f();
        }
        for ns in nss.iter().rev() {
            kill_in_ns(ns);
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for d in std::mem::take(&mut *dirs()) {
            // A lab's bpffs (hand-overs) first, or the directory stays.
            let _ = Command::new("umount").arg("-l").arg(d.join("bpf")).stderr(Stdio::null()).status();
            unmount_under(&d);
            let _ = std::fs::remove_dir_all(d);
        }
        eprintln!("vnet-lab: interrupted; lab removed");
        std::process::exit(130);
    });
}

/// Unmounts (lazily) whatever is mounted under directory `dir`, deepest
/// first (a lab's machines' overlay roots, before the lab's directory is
/// removed: removing it then removes only what the machines wrote).
pub(crate) fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut under: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir) && Path::new(m) != dir)
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in under {
        let _ = Command::new("umount").arg("-l").arg(m).stderr(Stdio::null()).status();
    }
}

/// Runs a command, failing with its stderr if it exits non-zero.
pub fn run(args: &[&str]) -> Result<Output> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("running {}", args[0])))?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: args.join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Where the workspace's binaries are: `$VNET_BIN_DIR`, else the cargo
/// target directory of the running executable (tests live in `deps/`).
pub fn bin(name: &str) -> Result<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("VNET_BIN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            if let Some(p) = d.parent() {
                dirs.push(p.to_path_buf());
            }
        }
    }
    dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()).ok_or_else(|| {
        Error::Other(format!("`{name}` not found in {dirs:?}: run `cargo build --bins` first"))
    })
}

/// Starts `cmd` (a lab daemon) with its output appended to `log`, and
/// records its pid for the cleanup on a signal.
pub(crate) fn spawn_logged(mut cmd: Command, log: &Path, what: &str) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("opening the {what} log")))?;
    let mut r = registry();
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(Error::Other(format!("interrupted: {what} not started")));
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(io("log"))?)
        .stderr(out)
        .spawn()
        .map_err(io(format!("starting {what}")))?;
    r.1.push(child.id());
    Ok(child)
}

/// Kills `c` (if it still runs: a node's power cut kills its whole cgroup
/// tree at once), waits for it and forgets its pid.
pub(crate) fn reap_killed(mut c: Child) {
    let pid = c.id();
    let _ = c.kill();
    let _ = c.wait();
    registry().1.retain(|p| *p != pid);
}

pub(crate) fn stop_child(mut c: Child) {
    let pid = c.id();
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            registry().1.retain(|p| *p != pid);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    reap_killed(c);
}
