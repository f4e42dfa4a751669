//! The vnet lab: hosts, an underlay and VMs built from network namespaces,
//! each host running its own `vnetd`, torn down on every exit path.
//!
//! ```text
//!   VM ns h0v0 (TAP vt0, 10.88.0.1)          VM ns h1v0 (TAP vt0, 10.88.1.1)
//!          |  fd held by vnetd                       |
//!   host ns h0: vnetd ---- veth underlay 10.77.0.0/24 ---- host ns h1: vnetd
//!                 (2 hosts: one veth pair; more: a bridge in a switch ns)
//! ```
//!
//! A VM is a namespace owning a persistent TAP device that the lab creates
//! and addresses; the host's vnetd attaches to it by name inside that
//! namespace (`interface vmN tap vt0 netns ...`). Because the TAP is
//! persistent, a vnetd can be stopped and started again and the VM keeps its
//! addresses, like a VM whose host daemon restarts.
//!
//! Every name carries a per-run prefix (`vl<pid>x<n>`, or `vl<tag>-<pid>x<n>`
//! with `VNET_LAB_TAG`), every namespace and
//! process is recorded in a process-wide registry, and [`Lab`]'s `Drop` (on
//! success, failure or panic) and [`install_signal_cleanup`] (on Ctrl-C or
//! SIGTERM) remove them. Only processes the lab started are killed, by pid.
//! Traffic stays inside the lab's namespaces.

pub mod bench;
mod cni;
mod config;
pub mod docs;
mod error;
mod etcd;
mod guest;
pub mod k8s;
mod libvirt;
mod machine;
pub mod matrix;
mod measure;
mod migrate;
pub mod noise;
mod peers;
pub mod pki;
mod process;
pub mod report;
pub mod scale;
mod spec;
mod topology;
pub mod vhost_load;

pub use cni::{cni_path, CniRun, Podman};
pub use config::config_for;
pub(crate) use error::io;
pub use error::{Error, Result};
pub use etcd::etcdctl_login;
pub use guest::{console_line, guest_files, GUEST_MEM};
pub use libvirt::{lab_emulator, Events, Libvirt, LibvirtPki};
pub use machine::Machine;
pub use measure::{iperf3_bytes, PingResult};
pub use migrate::Migration;
pub use process::{bin, install_signal_cleanup, interrupted, run, run_group};
use process::{registry, stop_child};
pub use spec::*;
use spec::{routed_gateway, underlay_cidr};

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use vnetd::client::{Client, Reply};
pub use vnetd::Endpoint;

/// A VM: a namespace with a TAP, or with one end of a veth pair.
#[derive(Debug, Clone)]
pub struct Vm {
    pub ns: String,
    /// The VM's NIC, inside its namespace.
    pub dev: String,
    /// For a veth VM, the host's end (in the host namespace).
    pub host_dev: Option<String>,
    pub mac: String,
    pub ip: Ipv4Addr,
    /// For a QEMU guest: its serial console log (`ns` is then the host's
    /// namespace, where QEMU runs).
    pub console: Option<PathBuf>,
    /// For a QEMU guest on vhost-user: the socket vnetd serves.
    pub vhost: Option<PathBuf>,
}

/// A host: a namespace running vnetd.
#[derive(Debug)]
pub struct Host {
    pub ns: String,
    pub underlay_dev: String,
    pub underlay_ip: IpAddr,
    pub config: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
    pub vms: Vec<Vm>,
    /// Secured links: the host's key file and its public key.
    pub key: Option<(PathBuf, vnet_control::PeerKey)>,
    vnetd: Option<Child>,
}

impl Host {
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.control.clone())
    }
}

/// A QEMU guest of the lab: how to start it again, and its process.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    pub(crate) host: usize,
    pub(crate) ns: String,
    pub(crate) args: Vec<String>,
    pub(crate) console: PathBuf,
    pub(crate) pid: Option<u32>,
}

/// A running lab. Dropping it removes everything it made.
pub struct Lab {
    pub prefix: String,
    pub spec: Spec,
    pub hosts: Vec<Host>,
    pub dir: PathBuf,
    /// The plain machine on `lan_host`'s LAN.
    pub lan: Option<Vm>,
    namespaces: Vec<String>,
    children: Vec<Child>,
    guests: Vec<Guest>,
    /// Whether the lab's bpffs (`dir/bpf`, for hand-overs) is mounted.
    bpffs: bool,
    /// The switch namespace (a bridge), when the hosts are on one.
    switch: Option<String>,
    /// Cluster mode: the etcd's members, each while it runs.
    etcd: Vec<Option<Child>>,
    /// Cluster mode: settings of one host's vnetd replaced (a value) or
    /// left out (`None`), by (host, setting as its flag without `--`): a
    /// wrong password file, another CA.
    pub cluster_overrides: Vec<(usize, &'static str, Option<String>)>,
    /// When the lab was made: its drop says how long it lived, so that a
    /// test run's output shows where its time goes.
    born: Instant,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether a lab says how long it lived when dropped (the tests' output:
/// where a run's time goes); the `vnet-lab` program turns it off.
static SAY_LIFETIME: AtomicBool = AtomicBool::new(true);

/// Labs made from now on are dropped without saying how long they lived
/// (the bench and the demo print tables of their own).
pub fn quiet_lifetimes() {
    SAY_LIFETIME.store(false, Ordering::Relaxed);
}

/// `VNET_LAB_TAG` (1-16 of `a-z0-9`), when set, goes into every name after
/// `vl` and before a `-`: a test run tags its labs so it can tell its own
/// leftovers from those of a bench running on the same machine.
fn run_tag() -> Result<String> {
    let Ok(t) = std::env::var("VNET_LAB_TAG") else { return Ok(String::new()) };
    let valid =
        (1..=16).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(Error::Other(format!("VNET_LAB_TAG {t:?}: expected 1-16 characters of a-z and 0-9")));
    }
    Ok(format!("{t}-"))
}

impl Lab {
    /// Builds the namespaces, underlay, VMs and configs, and starts a vnetd on
    /// every host. On error, whatever was made is removed.
    pub fn up(spec: Spec) -> Result<Lab> {
        if spec.hosts == 0 || spec.hosts > 200 || spec.vms_per_host > 200 {
            return Err(Error::Other("a lab has 1-200 hosts with 0-200 VMs each".into()));
        }
        let prefix =
            format!("vl{}{:x}x{}", run_tag()?, std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).map_err(io("creating the lab directory"))?;
        process::dirs().push(dir.clone());
        let mut lab = Lab {
            prefix,
            spec,
            hosts: Vec::new(),
            dir,
            lan: None,
            namespaces: Vec::new(),
            children: Vec::new(),
            guests: Vec::new(),
            bpffs: false,
            switch: None,
            etcd: Vec::new(),
            cluster_overrides: Vec::new(),
            born: Instant::now(),
        };
        lab.build()?;
        if lab.spec.cluster.is_some() {
            lab.start_etcd()?;
        }
        lab.pin_underlay_neighbors()?;
        let late = lab.spec.cluster.as_ref().map_or(vec![], |c| c.late.clone());
        for h in 0..lab.hosts.len() {
            if lab.spec.runs_vnetd(h) && !late.contains(&h) {
                lab.start_vnetd(h)?;
            }
        }
        // Guests on vhost-user connect to the vnetd serving their socket:
        // booted now, all at once, then waited for.
        let pending: Vec<usize> = (0..lab.guests.len()).filter(|&i| lab.guests[i].pid.is_none()).collect();
        for &i in &pending {
            lab.boot_guest(i)?;
        }
        for &i in &pending {
            lab.wait_guest(i)?;
        }
        Ok(lab)
    }

    /// The switch namespace, when the hosts are on one (a cluster lab's
    /// etcd runs there).
    pub fn switch_ns(&self) -> Option<&str> {
        self.switch.as_deref()
    }

    /// Runs `args` inside namespace `ns`; fails if it exits non-zero.
    pub fn ns_exec(&self, ns: &str, args: &[&str]) -> Result<Output> {
        let mut a = vec!["ip", "netns", "exec", ns];
        a.extend_from_slice(args);
        run(&a)
    }

    /// The names of namespace `ns`'s network devices (`ip -o link show`,
    /// a veth's without its `@PEER`).
    pub fn ns_link_names(&self, ns: &str) -> Result<Vec<String>> {
        let out = self.ns_output(ns, &["ip", "-o", "link", "show"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect())
    }

    /// Runs `args` inside `ns` and returns its output whatever its status.
    pub fn ns_output(&self, ns: &str, args: &[&str]) -> Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("running {}", args.join(" "))))
    }

    /// A bpffs of the lab's own for hand-overs' pins (`DIR/bpf`), mounted
    /// before the first vnetd (each runs in a mount namespace of `ip netns
    /// exec`'s, which sees mounts made before it, not necessarily after);
    /// unmounted with the lab.
    pub fn bpffs(&mut self) -> Result<PathBuf> {
        let bpf = self.dir.join("bpf");
        if !self.bpffs {
            std::fs::create_dir_all(&bpf).map_err(io("the lab's bpffs directory"))?;
            run(&["mount", "-t", "bpf", "bpf", bpf.to_str().unwrap_or_default()])?;
            self.bpffs = true;
        }
        Ok(bpf)
    }

    /// Starts vnetd on host `h` with its config and waits for its control
    /// socket to answer.
    pub fn start_vnetd(&mut self, h: usize) -> Result<()> {
        self.bpffs()?;
        let vnetd = match &self.spec.vnetd {
            Some(path) => path.clone(),
            None => bin("vnetd")?,
        };
        let cluster_args = self.cluster_args(h);
        let key_in_line = self.cluster_line(h).is_some();
        if let Some(line) = self.cluster_line(h) {
            let conf = std::fs::read_to_string(&self.hosts[h].config).map_err(io("reading a config"))?;
            if !conf.contains(&line) {
                std::fs::write(&self.hosts[h].config, format!("{conf}{line}"))
                    .map_err(io("writing a config"))?;
            }
        }
        // The control socket is left as it is: a stale one vnetd replaces,
        // and a hand-over's is the listener the next vnetd takes.
        let host = &mut self.hosts[h];
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &host.ns]);
        if let Some(caps) = &self.spec.vnetd_caps {
            // As the unit runs it: only these capabilities can be had.
            // setpriv names them as capabilities(7) does, less the `cap_`.
            let set: Vec<String> =
                caps.iter().map(|c| format!("+{}", c.to_lowercase().trim_start_matches("cap_"))).collect();
            cmd.args(["setpriv", "--no-new-privs", &format!("--bounding-set=-all,{}", set.join(",")), "--"]);
        }
        cmd.arg(&vnetd)
            .arg("--config")
            .arg(&host.config)
            .arg("--control")
            .arg(format!("unix:{}", host.control.display()))
            .args(
                host.key
                    .iter()
                    .filter(|_| !key_in_line)
                    .flat_map(|(f, _)| [std::ffi::OsStr::new("--key"), f.as_os_str()]),
            )
            .arg("--state-dir")
            .arg(self.dir.join(format!("state-h{h}")))
            .arg("--bpf-dir")
            .arg(self.dir.join("bpf").join(format!("h{h}")))
            .args(&self.spec.vnetd_args)
            .args((self.spec.nat && h == 2).then_some("--relay"))
            .args(cluster_args);
        host.vnetd = Some(process::spawn_logged(cmd, &host.log, "vnetd")?);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Client::connect(&self.hosts[h].endpoint()) {
                if c.request("show links").is_ok() {
                    return Ok(());
                }
            }
            if let Some(c) = self.hosts[h].vnetd.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(Error::Other(format!(
                        "vnetd on host {h} exited ({st}): {}",
                        std::fs::read_to_string(&self.hosts[h].log).unwrap_or_default()
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!("vnetd on host {h} did not come up")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops host `h`'s vnetd (SIGTERM, then SIGKILL after 5 s).
    pub fn stop_vnetd(&mut self, h: usize) -> Result<()> {
        if let Some(c) = self.hosts[h].vnetd.take() {
            stop_child(c);
        }
        Ok(())
    }

    /// Hands host `h`'s vnetd over (SIGUSR2: it pins the kernel path,
    /// serves the user path's sockets and devices on `STATE/handover` and
    /// exits 75 once the next one took them) and starts the next one as a
    /// supervisor outside systemd does: when that socket appears (or the
    /// old one ended). Returns how long no vnetd answered (from the signal
    /// to the new one's control socket answering). The pins go to the
    /// lab's bpffs (`DIR/bpf`, see [`Lab::start_vnetd`]).
    pub fn hand_over_vnetd(&mut self, h: usize) -> Result<Duration> {
        let t0 = Instant::now();
        let sock = self.dir.join(format!("state-h{h}")).join("handover");
        let old = self.hosts[h].vnetd.take();
        let mut old = match old {
            Some(mut c) => {
                run(&["kill", "-USR2", &c.id().to_string()])?;
                let deadline = Instant::now() + Duration::from_secs(10);
                while !sock.exists() && matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Some(c)
            }
            None => None,
        };
        let started = self.start_vnetd(h);
        if let Some(c) = old.as_mut() {
            let pid = c.id();
            let status = c.wait().map_err(io("waiting for vnetd"))?;
            registry().1.retain(|p| *p != pid);
            if status.code() != Some(75) {
                return Err(Error::Other(format!(
                    "vnetd on host {h} ended {status} on SIGUSR2, not 75:\n{}",
                    self.log(h)
                )));
            }
        }
        started?;
        Ok(t0.elapsed())
    }

    /// Kills host `h`'s vnetd with SIGKILL (no cleanup of its own) and
    /// waits for it to be gone.
    pub fn kill_vnetd(&mut self, h: usize) -> Result<()> {
        if let Some(mut c) = self.hosts[h].vnetd.take() {
            let pid = c.id();
            let _ = c.kill();
            let _ = c.wait();
            registry().1.retain(|p| *p != pid);
        }
        Ok(())
    }

    /// Whether host `h`'s vnetd is still running.
    pub fn vnetd_alive(&mut self, h: usize) -> bool {
        self.hosts[h].vnetd.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends one control line to host `h`'s vnetd.
    pub fn control(&self, h: usize, line: &str) -> Result<Reply> {
        let mut c = Client::connect(&self.hosts[h].endpoint()).map_err(io("connecting to vnetd"))?;
        c.request(line).map_err(io("talking to vnetd"))
    }

    /// Sends one typed request to host `h`'s vnetd (`vnet_control::request`).
    pub fn send(&self, h: usize, r: &vnet_control::request::Request) -> Result<Reply> {
        let mut c = Client::connect(&self.hosts[h].endpoint()).map_err(io("connecting to vnetd"))?;
        c.send(r).map_err(io("talking to vnetd"))
    }

    /// Every running vnetd's interfaces, each on the data path the spec
    /// puts it on ([`Spec::datapath_of`]), said as `datapaths (pass P): h0
    /// vm0 tap user, ...` (P: the spec's path, `auto` where vnetd chooses).
    /// An interface on another path is an error that names it and its
    /// `datapath_reason`.
    pub fn check_datapaths(&self) -> Result<String> {
        let pass = self.spec.datapath.as_deref().unwrap_or("auto");
        let mut said = Vec::new();
        for h in (0..self.hosts.len()).filter(|&h| self.hosts[h].vnetd.is_some()) {
            let r = self.control(h, "show interfaces json")?;
            let v: serde_json::Value = serde_json::from_str(&r.body)
                .map_err(|e| Error::Other(format!("host {h}'s show interfaces json: {e}")))?;
            for i in v["interfaces"].as_array().into_iter().flatten() {
                let (name, kind) = (i["name"].as_str().unwrap_or("?"), i["kind"].as_str().unwrap_or("?"));
                let on = i["datapath"].as_str().unwrap_or("?");
                if let Some(want) = self.spec.datapath_of(kind).filter(|w| *w != on) {
                    return Err(Error::Other(format!(
                        "host {h}'s interface {name} ({kind}) is on the {on} path, not the {want} path \
                         of this pass: {}",
                        i["datapath_reason"]
                    )));
                }
                said.push(format!("h{h} {name} {kind} {on}"));
            }
        }
        Ok(format!("datapaths (pass {pass}): {}", said.join(", ")))
    }

    /// Runs `vnetctl` against host `h` with `args`, returning its output.
    pub fn vnetctl(&self, h: usize, args: &[&str]) -> Result<Output> {
        Command::new(bin("vnetctl")?)
            .arg("--control")
            .arg(format!("unix:{}", self.hosts[h].control.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io("running vnetctl"))
    }

    /// The vnetd log of host `h`.
    pub fn log(&self, h: usize) -> String {
        std::fs::read_to_string(&self.hosts[h].log).unwrap_or_default()
    }

    /// The process id of host `h`'s running vnetd.
    pub fn vnetd_pid(&self, h: usize) -> Option<u32> {
        self.hosts[h].vnetd.as_ref().map(Child::id)
    }

    pub fn vm(&self, h: usize, v: usize) -> &Vm {
        &self.hosts[h].vms[v]
    }

    /// How many VMs host `h` has.
    pub fn hosts_vms(&self, h: usize) -> usize {
        self.hosts[h].vms.len()
    }

    /// Applies `text` as one transaction on host `h` (through `vnetctl apply`).
    pub fn apply(&self, h: usize, text: &str) -> Result<()> {
        let file = self.dir.join(format!("change-h{h}.conf"));
        std::fs::write(&file, text).map_err(io("writing a change"))?;
        let out = self.vnetctl(h, &["apply", file.to_str().unwrap_or("")])?;
        if !out.status.success() {
            return Err(Error::Other(format!("host {h}: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Ok(())
    }

    /// The ids of host `h`'s routes whose `field` (`dst` or `to`) is `value`.
    /// Moves VM `v` of host `from` (a container on a veth) to host `to`, the
    /// way a VM is relocated: a new NIC with the same MAC is plugged into
    /// host `to`; `vnetctl move` has the new host attach and route it, every
    /// other host route the MAC to the new host (one transaction each; the
    /// old host also deletes the interface) and the new host announce the
    /// MAC (a broadcast RARP over every link); then the VM's address moves
    /// to the new NIC and the old one is removed. The VM keeps its MAC and
    /// IP, so its peers' ARP caches and connections stay valid. Returns the
    /// VM's new index on host `to`.
    pub fn relocate(&mut self, from: usize, v: usize, to: usize) -> Result<usize> {
        let (moved, out) = self.relocate_whatever_move_says(from, v, to)?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: "vnetctl move".into(),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(moved)
    }

    /// [`Lab::relocate`], the VM's NIC moved whether or not `vnetctl move`
    /// succeeded (as a VM moves whatever its overlay says): the VM's new
    /// index and `vnetctl move`'s output, to be judged by the caller (a
    /// move while the store is away).
    pub fn relocate_whatever_move_says(
        &mut self,
        from: usize,
        v: usize,
        to: usize,
    ) -> Result<(usize, Output)> {
        let vm = self.hosts[from].vms[v].clone();
        if vm.host_dev.is_none() || vm.console.is_some() {
            return Err(Error::Other("only a VM on a veth can be relocated".into()));
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let (hd, nic) = (format!("m{n}"), format!("eth{}", n + 1));
        let name = format!("mv{n}");
        let mtu = self.spec.vm_mtu.to_string();
        let to_ns = self.hosts[to].ns.clone();
        self.add_veth(&to_ns, &hd, &vm.ns, &nic)?;
        self.ns_exec(&vm.ns, &["ip", "link", "set", &nic, "address", &vm.mac, "mtu", &mtu, "up"])?;
        let dp = self.spec.datapath.as_ref().map_or(String::new(), |d| format!(" datapath {d}"));
        // What `vnetctl move` does: the new host attaches and routes the
        // MAC, every other host routes it over its link to the new host
        // (the old one also drops its interface), the new host announces.
        let ep = |h: &Host| format!("unix:{}", h.control.display());
        let hosts: Vec<String> = self.hosts.iter().map(ep).collect();
        let (to_ep, hosts) = (ep(&self.hosts[to]), hosts.join(","));
        let vnetctl = bin("vnetctl")?;
        let mut args =
            vec![vnetctl.to_str().unwrap_or("vnetctl"), "move", &vm.mac, "to", &to_ep, "hosts", &hosts];
        let decl = format!("{name} netdev {hd}{dp}");
        args.push("interface");
        args.extend(decl.split_whitespace());
        let out = Command::new(args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .map_err(io("running vnetctl move"))?;
        // The VM's address moves to its new NIC.
        let cidr = format!("{}/16", vm.ip);
        self.ns_exec(&vm.ns, &["ip", "addr", "add", &cidr, "dev", &nic])?;
        self.ns_exec(&vm.ns, &["ip", "link", "del", &vm.dev])?;
        let moved = Vm { dev: nic, host_dev: Some(hd), ..vm };
        self.hosts[from].vms.remove(v);
        self.hosts[to].vms.push(moved);
        Ok((self.hosts[to].vms.len() - 1, out))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // A signal's cleanup removes the lab and exits: not twice at once.
        if process::interrupted() {
            return;
        }
        if SAY_LIFETIME.load(Ordering::Relaxed) {
            let (n, lived) = (self.hosts.len(), self.born.elapsed().as_secs_f64());
            println!("lab {}: {n} hosts, lived {lived:.1} s", self.prefix);
        }
        for h in 0..self.hosts.len() {
            let _ = self.stop_vnetd(h);
        }
        self.stop_etcd();
        for mut c in self.children.drain(..) {
            let pid = c.id();
            let _ = c.kill();
            let _ = c.wait();
            registry().1.retain(|p| *p != pid);
        }
        self.forget_wireguard();
        for ns in self.namespaces.iter().rev() {
            process::kill_in_ns(ns);
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            registry().0.retain(|n| n != ns);
        }
        if self.bpffs {
            let _ = Command::new("umount").arg(self.dir.join("bpf")).status();
        }
        process::unmount_under(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
        process::dirs().retain(|d| *d != self.dir);
    }
}

/// Whether the lab can run here (root, with `ip netns`).
pub fn available() -> bool {
    Path::new("/dev/net/tun").exists() && run(&["ip", "netns", "list"]).is_ok() && is_root()
}

fn is_root() -> bool {
    run(&["id", "-u"]).is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ping_summary() {
        let t = "--- 10.88.1.1 ping statistics ---\n3 packets transmitted, 2 received, 33.3333% packet loss, time 402ms\nrtt min/avg/max/mdev = 0.301/0.412/0.523/0.090 ms\n";
        assert_eq!(PingResult::parse(t), PingResult { sent: 3, received: 2, avg_ms: 0.412 });
    }
}
