//! The `*-monitor` cases' watchers: `vnetctl monitor all` against each
//! host's vnetd for the whole measurement, its output read and thrown
//! away (as a terminal would take it, so the stream's cost is paid), each
//! killed by its pid at the end. A monitor that ended before that fails the
//! case: its figures were not measured with monitoring on.

use super::{Case, MONITOR_ARGS};
use crate::Lab;
use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The most of a monitor's standard error kept for the error that says
/// why it ended.
const STDERR_KEPT: usize = 2048;

/// One `vnetctl monitor all` and what it said on standard error.
struct Watcher {
    host: usize,
    child: Child,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// The monitors of a case's lab (none for a case that is not monitored).
pub(super) struct Monitors {
    watchers: Vec<Watcher>,
}

impl Monitors {
    /// Starts `vnetctl monitor all` against every host's vnetd when `case`
    /// is monitored; nothing otherwise.
    pub(super) fn start(case: Case, lab: &Lab) -> crate::Result<Monitors> {
        let mut m = Monitors { watchers: Vec::new() };
        if !case.monitored() {
            return Ok(m);
        }
        let vnetctl = crate::bin("vnetctl")?;
        for (h, host) in lab.hosts.iter().enumerate() {
            let mut child = Command::new(&vnetctl)
                .arg("--control")
                .arg(format!("unix:{}", host.control.display()))
                .args(MONITOR_ARGS)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("vnetctl monitor on host {h}: {e}"))?;
            if let Some(mut out) = child.stdout.take() {
                std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            }
            let stderr = Arc::new(Mutex::new(Vec::new()));
            if let Some(mut err) = child.stderr.take() {
                let kept = stderr.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    while let Ok(n @ 1..) = err.read(&mut buf) {
                        let mut k = kept.lock().unwrap_or_else(|p| p.into_inner());
                        let room = STDERR_KEPT.saturating_sub(k.len());
                        k.extend_from_slice(&buf[..n.min(room)]);
                    }
                });
            }
            m.watchers.push(Watcher { host: h, child, stderr });
        }
        Ok(m)
    }

    /// Ends the monitors (each killed by its pid); an error if one had
    /// already ended, with its status and what it said.
    pub(super) fn finish(mut self) -> crate::Result<()> {
        let mut ended = Vec::new();
        for w in &mut self.watchers {
            if let Ok(Some(status)) = w.child.try_wait() {
                let said = w.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone();
                ended.push(format!(
                    "the monitor on host {} ended during the measurement ({status}): {}",
                    w.host,
                    String::from_utf8_lossy(&said).trim()
                ));
            }
        }
        self.stop();
        match ended.is_empty() {
            true => Ok(()),
            false => Err(ended.join("; ").into()),
        }
    }

    fn stop(&mut self) {
        for mut w in self.watchers.drain(..) {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

impl Drop for Monitors {
    /// A measurement that failed: its monitors end with it.
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{spec_for, Condition, Wire};
    use super::*;

    #[test]
    fn the_monitor_case_is_the_kernel_case_with_a_flow_log_and_monitor_all() {
        let case = Case::VnetKernelMonitor(Wire::Vnet);
        assert_eq!(case.name(), "vnet-kernel-vnet-monitor");
        assert!(Case::known().contains(&case), "in --cases");
        assert!(!Case::all().contains(&case), "not in the default matrix");
        assert_eq!(case.base(), Case::VnetKernel(Wire::Vnet));
        assert!(case.monitored() && !case.ruled());
        assert!(!Case::VnetKernel(Wire::Vnet).monitored() && !Case::VnetKernelRules(Wire::Vnet).monitored());
        assert!(Case::VnetKernelRules(Wire::Vnet).ruled());
        assert_eq!(MONITOR_ARGS, ["monitor", "all"]);
        let cond = Condition { mtu: 1500, shaped: None };
        let extra = vec!["--worker-cpus".to_string(), "0".to_string()];
        let (mon, plain) = (spec_for(case, &cond, 1, &extra), spec_for(case.base(), &cond, 1, &extra));
        // The same lab as `vnet-kernel-vnet`, with `--flow-log -` added
        // (without a flow log `monitor all` exits 1).
        assert_eq!(mon.vnetd_args, ["--worker-cpus", "0", "--flow-log", "-"]);
        assert_eq!(plain.vnetd_args, ["--worker-cpus", "0"]);
        assert_eq!(mon.datapath.as_deref(), Some("kernel"));
        assert_eq!((mon.vm_mtu, mon.links, mon.format), (plain.vm_mtu, plain.links, plain.format));
        assert_eq!(case.endpoint_mtu(1500), case.base().endpoint_mtu(1500));
    }

    #[test]
    fn a_monitor_that_ended_early_fails_the_case_and_one_still_running_is_killed() {
        let spawn = |cmd: &str| Watcher {
            host: 0,
            child: Command::new("sh").args(["-c", cmd]).stderr(Stdio::piped()).spawn().unwrap(),
            stderr: Arc::new(Mutex::new(b"vnetctl: monitor: no flow log".to_vec())),
        };
        let mut early = Monitors { watchers: vec![spawn("exit 1")] };
        // Ended: wait for it (its status is what finish reads).
        let _ = early.watchers[0].child.wait();
        let e = early.finish().unwrap_err().to_string();
        assert!(e.contains("ended during the measurement") && e.contains("no flow log"), "{e}");
        let running = Monitors { watchers: vec![spawn("sleep 30")] };
        let pid = running.watchers[0].child.id();
        running.finish().unwrap();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped");
    }
}
