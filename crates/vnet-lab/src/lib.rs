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
pub mod noise;
pub mod pki;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vnet_control::{LinkDef, Transport};

pub use vnetd::client::{Client, Reply};
pub use vnetd::Endpoint;

/// Lab errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command { cmd: String, status: String, stderr: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Namespaces, pids and process groups to remove if the process is
/// interrupted.
static REGISTRY: Mutex<(Vec<String>, Vec<u32>)> = Mutex::new((Vec::new(), Vec::new()));
static GROUPS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, (Vec<String>, Vec<u32>)> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn groups() -> std::sync::MutexGuard<'static, Vec<u32>> {
    GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

fn kill_group(pgid: u32) {
    let _ =
        Command::new("kill").arg("-KILL").arg("--").arg(format!("-{pgid}")).stderr(Stdio::null()).status();
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

/// On SIGINT/SIGTERM, kills the lab's processes, deletes its namespaces and
/// exits with status 130. Call once, early, in a binary that builds labs.
pub fn install_signal_cleanup() {
    let _ = ctrlc::set_handler(|| {
        let (nss, pids) = std::mem::take(&mut *registry());
        for g in std::mem::take(&mut *groups()) {
            kill_group(g);
        }
        for p in pids {
            let _ = Command::new("kill").arg("-KILL").arg(p.to_string()).status();
        }
        for ns in nss.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        eprintln!("vnet-lab: interrupted; lab removed");
        std::process::exit(130);
    });
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

/// Which link format the lab's vnetds use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Raw,
    Vnet,
}

impl From<Format> for vnet_control::LinkFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Raw => vnet_control::LinkFormat::Raw,
            Format::Vnet => vnet_control::LinkFormat::Vnet,
        }
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct Spec {
    pub hosts: usize,
    pub vms_per_host: usize,
    pub format: Format,
    /// MTU of the underlay veths.
    pub underlay_mtu: u32,
    /// MTU of the VMs' interfaces.
    pub vm_mtu: u32,
    /// Hosts whose links and routes are written only as Palacios lines.
    pub palacios_hosts: Vec<usize>,
    /// Hosts whose VMs are containers on a veth pair (vnetd attaches to the
    /// host end as a `netdev`) instead of owning a TAP.
    pub veth_hosts: Vec<usize>,
    /// What joins the VMs: vnet, the kernel's VXLAN, or nothing (hosts only).
    pub overlay: Overlay,
    /// Shape each host's underlay egress to this rate (`tc tbf`), e.g. "10gbit".
    pub shape: Option<String>,
    /// TCP congestion control set in every namespace, e.g. "cubic".
    pub congestion_control: Option<String>,
    /// vnetd dispatch mode for interfaces and the link socket
    /// (`notify`, `poll`, `adaptive`; vnetd's default when `None`).
    pub dispatch: Option<String>,
    /// vnetd `datapath` for every interface (`user`, `kernel`, `auto`).
    /// When set, every VM is a container on a veth (the kernel path serves
    /// netdevs). Default: the `VNET_LAB_DATAPATH` environment variable, so
    /// the whole integration suite can run on the kernel path.
    pub datapath: Option<String>,
    /// Hosts whose first VM is a QEMU guest (TCG, Debian's kernel and a
    /// busybox initramfs from `lab/build-guest.sh`) on a TAP in the host
    /// namespace, which vnetd attaches to as a `netdev` (or, with
    /// `qemu_vhost`, on a vhost-user socket vnetd serves).
    pub qemu_hosts: Vec<usize>,
    /// QEMU guests get a vhost-user NIC (`interface ... vhost-user`)
    /// instead of a TAP.
    pub qemu_vhost: bool,
    /// Queue pairs of a vhost-user guest's NIC (and its vCPUs, so that the
    /// guest uses them all).
    pub qemu_queues: u32,
    /// More kernel command line for host h's guest (`vnet_peer=IP`,
    /// `vnet_ping=1`, `vnet_send_mb=N`: see `lab/build-guest.sh`).
    pub guest_args: Vec<(usize, String)>,
    /// More command-line arguments for every vnetd (e.g. `--worker-cpus 1`).
    pub vnetd_args: Vec<String>,
    /// In a vnet lab, hosts that are Linux kernel VTEPs instead of vnetds:
    /// a bridge with a `vxlan` device (VNI [`VNI`], port 4789, no learning,
    /// static FDB entries, head-end replication to every other host) and
    /// the VMs on veths in the bridge. vnetd hosts reach them over `vxlan`
    /// links.
    pub vteps: Vec<usize>,
    /// The kind of link between vnetd hosts.
    pub links: Links,
    /// A host whose "physical LAN" is a bridge (in a namespace of its own)
    /// with a plain machine on it, no vnetd ([`Lab::lan`], [`LAN_MAC`],
    /// [`LAN_IP`]); the host reaches it with a `direct` link on `dl0`, and
    /// the other hosts' routes send the machine's MAC to that host.
    pub lan_host: Option<usize>,
}

/// The LAN machine's MAC and address (on the VMs' /16).
pub const LAN_MAC: &str = "52:54:00:88:fa:01";
pub const LAN_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 250, 1);

/// The kind of link the lab's vnetds reach each other over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Links {
    /// `udp` links in the spec's `format`.
    #[default]
    Udp,
    /// `vxlan` links, VNI [`VNI`].
    Vxlan,
    /// `tcp` links.
    Tcp,
    /// `tcp ... tls` links, with a CA and a certificate per host made for
    /// the lab (`pki`).
    Tls,
}

/// The VXLAN network identifier of the lab's VXLAN links and devices.
pub const VNI: u32 = 42;

/// What joins the lab's VMs across hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlay {
    /// A vnetd per host; VMs on TAPs (or veths, see `veth_hosts`).
    Vnet,
    /// A Linux bridge and a kernel vxlan device per host; VMs on veths.
    Vxlan,
    /// No overlay and no vnetd: the hosts alone (the native baseline).
    None,
    /// No overlay: VMs on veths, each host an IP router between its VMs'
    /// /24 and the underlay (one VM per host). What a VM's extra veth hop
    /// costs by itself.
    Routed,
}

impl Default for Spec {
    fn default() -> Self {
        let datapath = std::env::var("VNET_LAB_DATAPATH").ok().filter(|d| !d.is_empty());
        // On the kernel path a VM's frames must fit the underlay with the
        // encapsulation (larger ones are vnetd's to fragment).
        let vm_mtu = if datapath.as_deref() == Some("kernel") {
            1500 - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32
        } else {
            1500
        };
        Spec {
            hosts: 2,
            vms_per_host: 1,
            format: Format::Vnet,
            underlay_mtu: 1500,
            vm_mtu,
            palacios_hosts: Vec::new(),
            veth_hosts: Vec::new(),
            overlay: Overlay::Vnet,
            shape: None,
            congestion_control: None,
            dispatch: None,
            datapath,
            qemu_hosts: Vec::new(),
            qemu_vhost: false,
            qemu_queues: 1,
            guest_args: Vec::new(),
            vnetd_args: Vec::new(),
            vteps: Vec::new(),
            links: Links::Udp,
            lan_host: None,
        }
    }
}

impl Spec {
    /// Whether host `h` runs a kernel VXLAN bridge (a VXLAN lab's hosts,
    /// and a vnet lab's `vteps`) rather than a vnetd or nothing.
    pub fn kernel_vtep(&self, h: usize) -> bool {
        self.overlay == Overlay::Vxlan || (self.overlay == Overlay::Vnet && self.vteps.contains(&h))
    }

    /// Whether host `h` runs a vnetd.
    pub fn runs_vnetd(&self, h: usize) -> bool {
        self.overlay == Overlay::Vnet && !self.vteps.contains(&h)
    }
}

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
    pub underlay_ip: Ipv4Addr,
    pub config: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
    pub vms: Vec<Vm>,
    vnetd: Option<Child>,
}

impl Host {
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.control.clone())
    }
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
}

/// A QEMU guest of the lab: how to start it again, and its process.
#[derive(Debug, Clone)]
struct Guest {
    host: usize,
    ns: String,
    args: Vec<String>,
    console: PathBuf,
    pid: Option<u32>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

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

/// The MAC of VM `v` on host `h`.
pub fn vm_mac(h: usize, v: usize) -> String {
    format!("52:54:00:88:{:02x}:{:02x}", h, v + 1)
}

/// The IP of VM `v` on host `h` (in 10.88.0.0/16).
pub fn vm_ip(h: usize, v: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, h as u8, v as u8 + 1)
}

/// Host h's address on its VMs' /24 in a routed lab (one VM per host).
fn routed_gateway(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, h as u8, 254)
}

fn underlay_ip(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, h as u8 + 1)
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
        let mut lab = Lab {
            prefix,
            spec,
            hosts: Vec::new(),
            dir,
            lan: None,
            namespaces: Vec::new(),
            children: Vec::new(),
            guests: Vec::new(),
        };
        lab.build()?;
        for h in 0..lab.hosts.len() {
            if lab.spec.runs_vnetd(h) {
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

    fn add_ns(&mut self, name: String) -> Result<String> {
        run(&["ip", "netns", "add", &name])?;
        registry().0.push(name.clone());
        self.namespaces.push(name.clone());
        self.ns_exec(&name, &["ip", "link", "set", "lo", "up"])?;
        // Every namespace alike: the same congestion control, whatever the machine's default.
        if let Some(cc) = &self.spec.congestion_control {
            self.ns_exec(&name, &["sysctl", "-q", "-w", &format!("net.ipv4.tcp_congestion_control={cc}")])?;
        }
        Ok(name)
    }

    /// Runs `args` inside namespace `ns`; fails if it exits non-zero.
    pub fn ns_exec(&self, ns: &str, args: &[&str]) -> Result<Output> {
        let mut a = vec!["ip", "netns", "exec", ns];
        a.extend_from_slice(args);
        run(&a)
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

    fn build(&mut self) -> Result<()> {
        let s = self.spec.clone();
        if s.overlay == Overlay::Routed && s.vms_per_host > 1 {
            // Each host routes one /24 through its one VM-facing veth.
            return Err(Error::Other("a routed lab has one VM per host".into()));
        }
        let p = self.prefix.clone();
        let mut hosts = Vec::new();
        for h in 0..s.hosts {
            let ns = self.add_ns(format!("{p}-h{h}"))?;
            hosts.push(Host {
                ns,
                underlay_dev: format!("u{h}"),
                underlay_ip: underlay_ip(h),
                config: self.dir.join(format!("h{h}.conf")),
                control: self.dir.join(format!("h{h}.sock")),
                log: self.dir.join(format!("h{h}.log")),
                vms: Vec::new(),
                vnetd: None,
            });
        }
        // The underlay: a veth pair for two hosts, else a bridge in a switch namespace.
        if s.hosts == 2 {
            run(&[
                "ip",
                "link",
                "add",
                "u0",
                "netns",
                &hosts[0].ns,
                "type",
                "veth",
                "peer",
                "name",
                "u1",
                "netns",
                &hosts[1].ns,
            ])?;
        } else if s.hosts > 2 {
            let sw = self.add_ns(format!("{p}-sw"))?;
            self.ns_exec(&sw, &["ip", "link", "add", "br0", "type", "bridge"])?;
            self.ns_exec(&sw, &["ip", "link", "set", "br0", "mtu", &s.underlay_mtu.to_string(), "up"])?;
            for (h, host) in hosts.iter().enumerate() {
                let port = format!("s{h}");
                run(&[
                    "ip",
                    "link",
                    "add",
                    &host.underlay_dev,
                    "netns",
                    &host.ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &port,
                    "netns",
                    &sw,
                ])?;
                self.ns_exec(
                    &sw,
                    &["ip", "link", "set", &port, "mtu", &s.underlay_mtu.to_string(), "master", "br0", "up"],
                )?;
            }
        }
        for host in &hosts {
            if s.hosts > 1 {
                let dev = host.underlay_dev.as_str();
                self.ns_exec(
                    &host.ns,
                    &["ip", "link", "set", dev, "mtu", &s.underlay_mtu.to_string(), "up"],
                )?;
                self.ns_exec(
                    &host.ns,
                    &["ip", "addr", "add", &format!("{}/24", host.underlay_ip), "dev", dev],
                )?;
                if let Some(rate) = &s.shape {
                    self.ns_exec(
                        &host.ns,
                        &[
                            "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "4mb",
                            "latency", "20ms",
                        ],
                    )?;
                }
            }
        }
        for (h, host) in hosts.iter().enumerate() {
            if s.kernel_vtep(h) {
                self.vxlan_host(h, host, &hosts)?;
            }
        }
        for (h, host) in hosts.iter_mut().enumerate() {
            for v in 0..s.vms_per_host {
                if v == 0 && s.qemu_hosts.contains(&h) {
                    let vm = self.qemu_vm(h, host)?;
                    host.vms.push(vm);
                    continue;
                }
                let ns = self.add_ns(format!("{p}-h{h}v{v}"))?;
                let veth = s.veth_hosts.contains(&h)
                    || s.kernel_vtep(h)
                    || s.overlay == Overlay::Routed
                    || (s.overlay == Overlay::Vnet && s.datapath.is_some());
                let dev = if veth { "eth0" } else { "vt0" };
                let vm = Vm {
                    ns: ns.clone(),
                    dev: dev.into(),
                    host_dev: veth.then(|| format!("c{v}")),
                    mac: vm_mac(h, v),
                    ip: vm_ip(h, v),
                    console: None,
                    vhost: None,
                };
                for sysctl in [
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                    "net.ipv4.icmp_echo_ignore_broadcasts=0",
                ] {
                    self.ns_exec(&ns, &["sysctl", "-q", "-w", sysctl])?;
                }
                let mtu = s.vm_mtu.to_string();
                if let Some(hd) = &vm.host_dev {
                    self.add_veth(&host.ns, hd, &ns, dev)?;
                    if s.kernel_vtep(h) {
                        self.ns_exec(&host.ns, &["ip", "link", "set", hd, "master", "br0"])?;
                    }
                } else {
                    self.ns_exec(&ns, &["ip", "tuntap", "add", "dev", dev, "mode", "tap"])?;
                }
                self.ns_exec(&ns, &["ip", "link", "set", dev, "address", &vm.mac, "mtu", &mtu, "up"])?;
                if s.overlay == Overlay::Routed {
                    let gw = routed_gateway(h);
                    let hd = vm.host_dev.as_deref().unwrap_or("c0");
                    self.ns_exec(&host.ns, &["ip", "addr", "add", &format!("{gw}/24"), "dev", hd])?;
                    self.ns_exec(&ns, &["ip", "addr", "add", &format!("{}/24", vm.ip), "dev", dev])?;
                    self.ns_exec(&ns, &["ip", "route", "add", "default", "via", &gw.to_string()])?;
                } else {
                    self.ns_exec(&ns, &["ip", "addr", "add", &format!("{}/16", vm.ip), "dev", dev])?;
                }
                host.vms.push(vm);
            }
        }
        // Static forwarding on kernel VTEPs: every VM MAC to its host, no learning.
        for (h, host) in hosts.iter().enumerate() {
            if s.kernel_vtep(h) {
                for (k, other) in hosts.iter().enumerate() {
                    if k == h {
                        continue;
                    }
                    let dst = other.underlay_ip.to_string();
                    for vm in &other.vms {
                        let a = ["bridge", "fdb", "add", &vm.mac, "dev", "vxlan0", "dst", &dst, "static"];
                        self.ns_exec(&host.ns, &a)?;
                    }
                }
            }
        }
        if s.overlay == Overlay::Routed {
            // Each host forwards between its VMs' /24 and the underlay.
            for (h, host) in hosts.iter().enumerate() {
                self.ns_exec(&host.ns, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
                for (k, other) in hosts.iter().enumerate() {
                    if k != h {
                        let net = format!("10.88.{k}.0/24");
                        self.ns_exec(
                            &host.ns,
                            &["ip", "route", "add", &net, "via", &other.underlay_ip.to_string()],
                        )?;
                    }
                }
            }
        }
        if let Some(lh) = s.lan_host.filter(|&h| h < hosts.len()) {
            self.lan = Some(self.lan_segment(&hosts[lh])?);
        }
        if s.links == Links::Tls {
            let ca = pki::Ca::new(&format!("{p} CA"))?;
            for (h, host) in hosts.iter().enumerate() {
                ca.host(&self.dir, &format!("h{h}"), host.underlay_ip)?;
            }
        }
        for h in (0..hosts.len()).filter(|&h| s.runs_vnetd(h)) {
            let text = config_for(&s, &hosts, h);
            std::fs::write(&hosts[h].config, text).map_err(io("writing a config"))?;
        }
        self.hosts = hosts;
        Ok(())
    }

    /// A "physical LAN" for `host`: a bridge in a switch namespace, a port
    /// to the host (`dl0` there), and a plain machine (`eth0`) on it.
    fn lan_segment(&mut self, host: &Host) -> Result<Vm> {
        let p = self.prefix.clone();
        let sw = self.add_ns(format!("{p}-lan"))?;
        let m = self.add_ns(format!("{p}-m"))?;
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(&sw, &["ip", "link", "add", "lanbr", "type", "bridge"])?;
        self.ns_exec(&sw, &["ip", "link", "set", "lanbr", "mtu", &mtu, "up"])?;
        for (port, peer_ns, peer_dev) in [("lp0", &host.ns, "dl0"), ("lp1", &m, "eth0")] {
            run(&[
                "ip", "link", "add", port, "netns", &sw, "type", "veth", "peer", "name", peer_dev, "netns",
                peer_ns,
            ])?;
            self.ns_exec(&sw, &["ip", "link", "set", port, "mtu", &mtu, "master", "lanbr", "up"])?;
            self.ns_exec(peer_ns, &["ip", "link", "set", peer_dev, "mtu", &mtu, "up"])?;
        }
        self.ns_exec(&m, &["ip", "link", "set", "eth0", "address", LAN_MAC])?;
        self.ns_exec(&m, &["ip", "addr", "add", &format!("{LAN_IP}/16"), "dev", "eth0"])?;
        self.ns_exec(&m, &["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])?;
        Ok(Vm {
            ns: m,
            dev: "eth0".into(),
            host_dev: None,
            mac: LAN_MAC.into(),
            ip: LAN_IP,
            console: None,
            vhost: None,
        })
    }

    /// A container's NIC: a veth pair with `host_dev` in `host_ns` (for
    /// vnetd, brought up at the VM MTU) and `dev` in `vm_ns`.
    fn add_veth(&self, host_ns: &str, host_dev: &str, vm_ns: &str, dev: &str) -> Result<()> {
        run(&[
            "ip", "link", "add", host_dev, "netns", host_ns, "type", "veth", "peer", "name", dev, "netns",
            vm_ns,
        ])?;
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(host_ns, &["ip", "link", "set", host_dev, "mtu", &mtu, "up"])?;
        Ok(())
    }

    /// VM 0 of host `h` as a QEMU guest (TCG): on a TAP `q0` in the host
    /// namespace, started and waited for (its console says
    /// `VNET-GUEST-READY`) now; or on a vhost-user socket, started once
    /// vnetd serves it (`Lab::up`).
    fn qemu_vm(&mut self, h: usize, host: &Host) -> Result<Vm> {
        let repo = crate::bench::repo_dir();
        let out = run(&[
            repo.join("lab/build-guest.sh").to_str().unwrap_or("lab/build-guest.sh"),
            repo.join("target/guest").to_str().unwrap_or("target/guest"),
        ])?;
        let paths = String::from_utf8_lossy(&out.stdout).to_string();
        let mut it = paths.split_whitespace();
        let (Some(kernel), Some(initrd)) = (it.next(), it.next()) else {
            return Err(Error::Other(format!("lab/build-guest.sh printed `{paths}`, not two paths")));
        };
        let (mac, ip) = (vm_mac(h, 0), vm_ip(h, 0));
        let mtu = self.spec.vm_mtu.to_string();
        let console = self.dir.join(format!("guest-h{h}.log"));
        let mut append = format!("console=ttyS0 quiet panic=-1 vnet_ip={ip}/16 vnet_mtu={mtu}");
        for (_, a) in self.spec.guest_args.iter().filter(|(g, _)| *g == h) {
            append.push(' ');
            append.push_str(a);
        }
        let mut args: Vec<String> = [
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            "512",
            "-nographic",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
            "-kernel",
            kernel,
            "-initrd",
            initrd,
            "-append",
            &append,
            "-serial",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push(format!("file:{}", console.display()));
        let vhost = self.spec.qemu_vhost.then(|| self.dir.join(format!("vhost-h{h}.sock")));
        let q = self.spec.qemu_queues.max(1);
        match &vhost {
            Some(sock) => {
                // Guest memory vnetd can map; MSI-X off (QEMU 7.2 under TCG
                // crashes starting vhost-user with it).
                args.extend(
                    [
                        "-object",
                        "memory-backend-memfd,id=mem0,size=512M,share=on",
                        "-numa",
                        "node,memdev=mem0",
                        "-chardev",
                        &format!("socket,id=chr0,path={},reconnect=1", sock.display()),
                        "-smp",
                        &q.to_string(),
                        "-netdev",
                        &format!("vhost-user,id=n0,chardev=chr0,queues={q}"),
                        "-device",
                        &format!(
                            "virtio-net-pci,netdev=n0,mac={mac},vectors=0,mrg_rxbuf=on,mq={}",
                            if q > 1 { "on" } else { "off" }
                        ),
                    ]
                    .iter()
                    .map(|a| a.to_string()),
                );
            }
            None => {
                self.ns_exec(&host.ns, &["ip", "tuntap", "add", "dev", "q0", "mode", "tap"])?;
                self.ns_exec(&host.ns, &["ip", "link", "set", "q0", "mtu", &mtu, "up"])?;
                args.extend(
                    ["-netdev", "tap,id=n0,ifname=q0,script=no,downscript=no", "-device"]
                        .iter()
                        .map(|a| a.to_string()),
                );
                args.push(format!("virtio-net-pci,netdev=n0,mac={mac}"));
            }
        }
        let ns = host.ns.clone();
        self.guests.push(Guest { host: h, ns: ns.clone(), args, console: console.clone(), pid: None });
        if vhost.is_none() {
            let i = self.guests.len() - 1;
            self.boot_guest(i)?;
            self.wait_guest(i)?;
        }
        let host_dev = vhost.is_none().then(|| "q0".to_string());
        Ok(Vm { ns, dev: "q0".into(), host_dev, mac, ip, console: Some(console), vhost })
    }

    /// Starts QEMU for guest `i` (a fresh console log).
    fn boot_guest(&mut self, i: usize) -> Result<()> {
        let g = self.guests[i].clone();
        let _ = std::fs::remove_file(&g.console);
        let args: Vec<&str> = g.args.iter().map(String::as_str).collect();
        let pid = self.spawn(&g.ns, &args)?;
        self.guests[i].pid = Some(pid);
        Ok(())
    }

    /// Waits (up to 120 s of TCG boot) for guest `i` to say it is ready.
    fn wait_guest(&self, i: usize) -> Result<()> {
        console_line(&self.guests[i].console, "VNET-GUEST-READY", Duration::from_secs(120)).map(drop)
    }

    /// Stops host `h`'s QEMU (the guest is gone; vnetd keeps serving its
    /// socket) and starts it again, on the same socket or TAP, with `args`
    /// as its extra kernel command line; waits until it is ready.
    pub fn restart_guest(&mut self, h: usize, args: &str) -> Result<()> {
        let i = self
            .guests
            .iter()
            .position(|g| g.host == h)
            .ok_or_else(|| Error::Other(format!("host {h} has no QEMU guest")))?;
        if let Some(pid) = self.guests[i].pid.take() {
            self.kill_child(pid);
        }
        if let Some(a) = self.guests[i].args.iter_mut().find(|a| a.starts_with("console=ttyS0")) {
            let base: Vec<&str> = a
                .split_whitespace()
                .filter(|w| {
                    !w.starts_with("vnet_peer") && !w.starts_with("vnet_ping") && !w.starts_with("vnet_send")
                })
                .collect();
            *a = format!("{} {args}", base.join(" ")).trim().to_string();
        }
        self.boot_guest(i)?;
        self.wait_guest(i)
    }

    /// Kills and reaps one process the lab started.
    fn kill_child(&mut self, pid: u32) {
        if let Some(k) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.remove(k);
            let _ = c.kill();
            let _ = c.wait();
            registry().1.retain(|p| *p != pid);
        }
    }

    /// Host `h`'s kernel VXLAN: a bridge, a vxlan device (VNI 42, port 4789,
    /// no learning) and flooding entries for every other host.
    fn vxlan_host(&self, h: usize, host: &Host, hosts: &[Host]) -> Result<()> {
        let ns = host.ns.as_str();
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(ns, &["ip", "link", "add", "br0", "type", "bridge"])?;
        let local = host.underlay_ip.to_string();
        self.ns_exec(
            ns,
            &[
                "ip",
                "link",
                "add",
                "vxlan0",
                "type",
                "vxlan",
                "id",
                &VNI.to_string(),
                "local",
                &local,
                "dstport",
                "4789",
                "nolearning",
                "dev",
                &host.underlay_dev,
            ],
        )?;
        self.ns_exec(ns, &["ip", "link", "set", "vxlan0", "mtu", &mtu, "master", "br0", "up"])?;
        self.ns_exec(ns, &["ip", "link", "set", "br0", "mtu", &mtu, "up"])?;
        for (k, other) in hosts.iter().enumerate() {
            if k != h {
                let dst = other.underlay_ip.to_string();
                self.ns_exec(
                    ns,
                    &["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vxlan0", "dst", &dst],
                )?;
            }
        }
        Ok(())
    }

    /// Starts vnetd on host `h` with its config and waits for its control
    /// socket to answer.
    pub fn start_vnetd(&mut self, h: usize) -> Result<()> {
        let vnetd = bin("vnetd")?;
        let host = &mut self.hosts[h];
        let _ = std::fs::remove_file(&host.control);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&host.log)
            .map_err(io("opening the vnetd log"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &host.ns])
            .arg(&vnetd)
            .arg("--config")
            .arg(&host.config)
            .arg("--control")
            .arg(format!("unix:{}", host.control.display()))
            .args(&self.spec.vnetd_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io("log"))?)
            .stderr(log)
            .spawn()
            .map_err(io("starting vnetd"))?;
        registry().1.push(child.id());
        host.vnetd = Some(child);
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

    /// Pings from `vm` to `ip`; returns the replies received.
    pub fn ping(&self, vm: &Vm, ip: Ipv4Addr, count: u32, size: u32) -> Result<PingResult> {
        let out = self.ns_output(
            &vm.ns,
            &[
                "ping",
                "-n",
                "-q",
                "-c",
                &count.to_string(),
                "-i",
                "0.2",
                "-W",
                "2",
                "-s",
                &size.to_string(),
                &ip.to_string(),
            ],
        )?;
        Ok(PingResult::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Starts a long-running process in `ns`; it is killed when the lab goes.
    pub fn spawn(&mut self, ns: &str, args: &[&str]) -> Result<u32> {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(format!("starting {}", args.join(" "))))?;
        let id = child.id();
        registry().1.push(id);
        self.children.push(child);
        Ok(id)
    }

    /// Runs iperf3 from `from` to `to` (a server is started in `to`'s
    /// namespace); returns the receiver's throughput in Gbit/s.
    pub fn iperf3(&mut self, from: &Vm, to: &Vm, seconds: u32, extra: &[&str]) -> Result<(f64, String)> {
        let to_ns = to.ns.clone();
        self.spawn(&to_ns, &["iperf3", "-s", "-1", "-B", &to.ip.to_string()])?;
        let ip = to.ip.to_string();
        let secs = seconds.to_string();
        let mut args = vec!["iperf3", "-c", &ip, "-t", &secs, "-J"];
        args.extend_from_slice(extra);
        self.wait_listening(&to_ns, 5201)?;
        let out = self.ns_output(&from.ns, &args)?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Other(format!("iperf3 output: {e}: {text}")))?;
        let bps = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .or_else(|| v["end"]["sum"]["bits_per_second"].as_f64())
            .unwrap_or(0.0);
        if !out.status.success() || bps <= 0.0 || v.get("error").is_some() {
            return Err(Error::Other(format!("iperf3 moved nothing: {text}")));
        }
        Ok((bps / 1e9, text))
    }

    /// Waits (up to 5 s) until something listens on TCP `port` in `ns`.
    pub fn wait_listening(&self, ns: &str, port: u16) -> Result<()> {
        let want = format!(":{port} ");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let out = self.ns_output(ns, &["ss", "-Hltn"])?;
            if String::from_utf8_lossy(&out.stdout).contains(&want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Error::Other(format!("nothing listens on port {port} in {ns}")))
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
        run(&args)?;
        // The VM's address moves to its new NIC.
        let cidr = format!("{}/16", vm.ip);
        self.ns_exec(&vm.ns, &["ip", "addr", "add", &cidr, "dev", &nic])?;
        self.ns_exec(&vm.ns, &["ip", "link", "del", &vm.dev])?;
        let moved = Vm { dev: nic, host_dev: Some(hd), ..vm };
        self.hosts[from].vms.remove(v);
        self.hosts[to].vms.push(moved);
        Ok(self.hosts[to].vms.len() - 1)
    }
}

fn stop_child(mut c: Child) {
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
    let _ = c.kill();
    let _ = c.wait();
    registry().1.retain(|p| *p != pid);
}

impl Drop for Lab {
    fn drop(&mut self) {
        for h in 0..self.hosts.len() {
            let _ = self.stop_vnetd(h);
        }
        for mut c in self.children.drain(..) {
            let pid = c.id();
            let _ = c.kill();
            let _ = c.wait();
            registry().1.retain(|p| *p != pid);
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            registry().0.retain(|n| n != ns);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What ping reported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PingResult {
    pub sent: u32,
    pub received: u32,
    pub avg_ms: f64,
}

impl PingResult {
    /// Parses iputils ping's summary.
    pub fn parse(text: &str) -> PingResult {
        let mut r = PingResult::default();
        for line in text.lines() {
            if line.contains("packets transmitted") {
                let nums: Vec<u32> =
                    line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
                if nums.len() >= 2 {
                    r.sent = nums[0];
                    r.received = nums[1];
                }
            }
            if let Some(rest) = line.split(" = ").nth(1) {
                if line.starts_with("rtt") {
                    r.avg_ms = rest.split('/').nth(1).and_then(|x| x.parse().ok()).unwrap_or(0.0);
                }
            }
        }
        r
    }
}

/// The vnetd config of host `h`: interfaces in the superset (always), links
/// and routes in the superset or, for Palacios hosts, as Palacios lines.
pub fn config_for(s: &Spec, hosts: &[Host], h: usize) -> String {
    let mut c = String::new();
    let palacios = s.palacios_hosts.contains(&h);
    let _ = writeln!(c, "# vnet-lab host {h}");
    let mode = s.dispatch.as_ref().map_or(String::new(), |m| format!(" mode {m}"));
    let _ = writeln!(c, "listen udp {}:9000{mode}", hosts[h].underlay_ip);
    let vxlan_to = |k: usize| s.links == Links::Vxlan || s.vteps.contains(&k);
    if s.links == Links::Tls {
        let d = hosts[h].config.parent().unwrap_or(Path::new("/"));
        let f = |ext: &str| d.join(format!("h{h}{ext}")).display().to_string();
        let _ = writeln!(c, "tls cert {} key {} ca {}", f(".pem"), f(".key"), f("-ca.pem"));
    }
    if (0..hosts.len()).any(|k| k != h && vxlan_to(k)) {
        let _ = writeln!(c, "listen vxlan {}:{}", hosts[h].underlay_ip, vnet_wire::vxlan::IANA_PORT);
    }
    let dp = s.datapath.as_ref().map_or(String::new(), |d| format!(" datapath {d}"));
    for (v, vm) in hosts[h].vms.iter().enumerate() {
        match (&vm.host_dev, &vm.vhost) {
            (_, Some(sock)) => {
                let q = s.qemu_queues.max(1);
                writeln!(c, "interface vm{v} vhost-user {} mac {} queues {q}{mode}", sock.display(), vm.mac)
            }
            (Some(hd), None) => writeln!(c, "interface vm{v} netdev {hd} mac {}{mode}{dp}", vm.mac),
            (None, None) => {
                writeln!(c, "interface vm{v} tap {} mac {} netns {}{mode}", vm.dev, vm.mac, vm.ns)
            }
        }
        .ok();
    }
    let bcast = "ff:ff:ff:ff:ff:ff";
    for (k, other) in hosts.iter().enumerate() {
        if k == h {
            continue;
        }
        let ip = other.underlay_ip;
        if palacios {
            let _ = writeln!(c, "add {ip} 9000 udp");
            let _ = writeln!(c, "add any {bcast} edge {ip} any");
            for vm in &other.vms {
                let _ = writeln!(c, "add any {} edge {ip} any", vm.mac);
            }
        } else {
            let transport = if vxlan_to(k) {
                Transport::Vxlan { remote: SocketAddr::new(ip.into(), vnet_wire::vxlan::IANA_PORT), vni: VNI }
            } else if matches!(s.links, Links::Tcp | Links::Tls) {
                Transport::Tcp { remote: SocketAddr::new(ip.into(), 9000), tls: s.links == Links::Tls }
            } else {
                // A link to a Palacios host speaks its (raw) format.
                let format = if s.palacios_hosts.contains(&k) { Format::Raw } else { s.format };
                Transport::Udp { remote: SocketAddr::new(ip.into(), 9000), format: format.into(), network: 0 }
            };
            let def = LinkDef { id: 0, name: format!("h{k}"), transport, mtu: s.underlay_mtu };
            let _ = writeln!(c, "{}", def.to_line());
            let _ = writeln!(c, "route any {bcast} -> link h{k}");
            for vm in &other.vms {
                let _ = writeln!(c, "route any {} -> link h{k}", vm.mac);
            }
        }
    }
    for (v, vm) in hosts[h].vms.iter().enumerate() {
        if palacios {
            let _ = writeln!(c, "add any {bcast} interface {} any", vm.mac);
            let _ = writeln!(c, "add any {} interface {} any", vm.mac, vm.mac);
        } else {
            let _ = writeln!(c, "route any {bcast} -> interface vm{v}");
            let _ = writeln!(c, "route any {} -> interface vm{v}", vm.mac);
        }
    }
    match s.lan_host {
        Some(lh) if lh == h => {
            let _ = writeln!(c, "link lan direct dl0 mtu {}", s.vm_mtu);
            let _ = writeln!(c, "route any {bcast} -> link lan");
            let _ = writeln!(c, "route any {LAN_MAC} -> link lan");
        }
        Some(lh) if lh < hosts.len() => {
            let _ = writeln!(c, "route any {LAN_MAC} -> link h{lh}");
        }
        _ => {}
    }
    c
}

/// Waits up to `timeout` for a QEMU guest's console (`console`) to print
/// `marker`; returns that line from the marker on (a console line may begin
/// with terminal escapes). The error holds what the console said.
pub fn console_line(console: &Path, marker: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(console).unwrap_or_default();
        if let Some(l) = text.lines().find_map(|l| l.find(marker).map(|i| &l[i..])) {
            return Ok(l.trim().to_string());
        }
        if Instant::now() > deadline {
            return Err(Error::Other(format!(
                "no `{marker}` from the guest in {} s ({}):\n{text}",
                timeout.as_secs(),
                console.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
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
