//! The daemon: turns declared [`State`] into open devices, sockets, workers
//! and a published [`Plane`], atomically.
//!
//! [`Daemon::apply`] validates commands against a copy of the state, then
//! acquires every new resource (binds the socket, opens the TAPs). Only if
//! all of that succeeds is the new plane published and the old resources
//! released; on any failure the new resources are dropped (closed) and the
//! running configuration is untouched, so traffic keeps flowing.

mod attached;
mod drops;
mod matrix;
mod neigh;
mod pins;
mod policy;
mod txn;
mod views;

use crate::dataplane;
use crate::iface::{self, Attached};
use crate::kernel::{self, KernelError, KernelIface, KernelPath};
use crate::link::{self, Sockets};
use crate::membership;
use crate::settings::{Settings, SettingsError};
use crate::shared::Shared;
use crate::sys;
use crate::workers::{self, WorkerHandle};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use vnet_control::{Command, Datapath, Error, IfaceKind, InterfaceDef, Located, ShowWhat, State};
use vnet_core::Port;
use vnet_engine::secure::{Identity, Timers};
use vnet_engine::{Link, Plane, Via};
use vnet_wire::reasm;

/// Columns of the text tables of `show`.
const IFACE_COLS: &[&str] = &[
    "id",
    "name",
    "kind",
    "dev",
    "netns",
    "mac",
    "offload",
    "queues",
    "mode",
    "datapath",
    "state",
    "source_guard",
    "dispatch",
    "mode_switches",
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "tx_drops",
];
const LINK_COLS: &[&str] = &[
    "id",
    "name",
    "kind",
    "state",
    "remote",
    "format",
    "network",
    "mtu",
    // A secured link's: `auth` or `encrypt`, the AEAD in use, and whether
    // its datagrams go `direct`, `punched` (through a NAT), `roamed` or
    // `relayed` (`-` on a link without a key).
    "security",
    "cipher",
    "path",
    "rx_packets",
    "rx_bytes",
    "rx_drops",
    "tx_packets",
    "tx_bytes",
    "tx_drops",
];
const ROUTE_COLS: &[&str] = &["id", "src", "dst", "to", "from", "packets", "bytes", "drops"];

/// One host's vnet: configuration, resources and workers.
pub struct Daemon {
    state: State,
    shared: Arc<Shared>,
    generation: u64,
    /// How long the last transaction that succeeded took, and whether it
    /// only added and deleted routes (`show stats`).
    last_transaction: (std::time::Duration, bool),
    /// Cluster mode: the addresses other hosts' claims name (`neigh`
    /// answers beside the state's own lines).
    cluster_neighbors: vnet_control::neigh::Table,
    /// The engine's table last built, for the state's lines and the
    /// cluster's table of that generation ([`Daemon::set_cluster_neighbors`]).
    neighbors_built: Option<(vnet_control::neigh::Neighbors, u64, vnet_engine::plane::Neighbors)>,
    cluster_neighbors_gen: u64,
    /// The IP source guard last built, and what it was built from.
    guards_built: Option<(neigh::GuardInputs, vnet_control::neigh::Neighbors, vnet_engine::plane::Guards)>,
    /// The policy set last built, and the declarations it was built from
    /// (the state's and the cluster's signed policy, merged).
    /// ... the generation of the cluster's groups and the interfaces'
    /// groups (`group G` on an interface) it was built with.
    policy_built: Option<policy::PolicyBuilt>,
    /// Cluster mode: the groups each MAC is in by its claim, and a count
    /// of their changes.
    cluster_groups: (vnet_engine::policy::Members, u64),
    /// Cluster mode: the network's signed policy (its serial, what it
    /// declares), enforced with the state's own lines
    /// ([`Daemon::set_cluster_policy`]).
    cluster_policy: Option<(u64, Arc<vnet_control::policy::Policies>)>,
    /// Interfaces whose device is gone (by id: since when, engine clock),
    /// and how often each was reattached.
    gone: BTreeMap<u32, u64>,
    reattached: BTreeMap<u32, u64>,
    ifaces: BTreeMap<u32, Arc<Attached>>,
    /// Worker k serves queue k of every interface; worker 0 also the link sockets.
    workers: Vec<WorkerHandle>,
    /// CPUs the workers run on: worker k on `worker_cpus[k % len]`
    /// (empty: wherever the scheduler puts them).
    worker_cpus: Vec<usize>,
    /// Sockets each link listening port gets (`vnetd --link-readers`).
    link_readers: usize,
    links: BTreeMap<u32, Arc<Link>>,
    /// Each link's I/O (its kind's own handles: a stream, a LAN reader).
    link_io: BTreeMap<u32, Arc<dyn link::LinkIo>>,
    /// The link sockets, and how the worker that reads them waits.
    sockets: Sockets,
    listen_mode: vnet_control::Mode,
    reasm: reasm::Config,
    /// The eBPF fast path, loaded the first time an interface asks for it.
    kernel: Option<KernelPath>,
    /// Why it could not be loaded (asked once; `auto` then stays on user).
    kernel_off: Option<String>,
    /// Interfaces the kernel path serves, and why others are on the user path.
    kernel_ifaces: BTreeMap<u32, KernelIface>,
    user_reasons: BTreeMap<u32, String>,
    /// Links the kernel path leaves to the user path, and why (by name).
    link_reasons: BTreeMap<String, String>,
    /// This host's key pair (`--key`), for links with `security`.
    identity: Option<Arc<Identity>>,
    /// When secured links rekey.
    timers: Timers,
    /// Each peer's last handshake timestamp, kept across restarts.
    stamps: crate::handshakes::Stamps,
    /// Cluster mode's report, when the daemon runs in it.
    cluster: Option<membership::Shared>,
    /// The config file (`vnetd --config`), for `save` and `reload`.
    config_path: Option<std::path::PathBuf>,
    /// Cluster settings are taken at start: once vnetd runs, a transaction
    /// that changes the `cluster` line is refused.
    cluster_fixed: bool,
    /// Signed cluster mode: the cluster's vnet network and the groups this
    /// host's certificate lets its interfaces there be in.
    group_authority: Option<(u32, Vec<String>)>,
    /// The control endpoint's TLS identity (`--control-tls`) and its files,
    /// renewed by `reload` like the links'.
    control_tls: Option<(Arc<link::tcp::Tls>, vnet_control::TlsFiles)>,
    /// The interfaces `attach` made, kept across restarts.
    attached: attached::Attachments,
    /// The bpffs directory of the hand-over's pins (`--bpf-dir`).
    bpf_dir: Option<std::path::PathBuf>,
    /// [`Daemon::hold_pins`] asked before the kernel path was loaded.
    hold_pins: bool,
    /// Entries each of the kernel path's route tables holds (`--kernel-routes`).
    kernel_routes: usize,
    /// Interfaces activated from standby (their VM arrived, or `activate`)
    /// whose MAC cluster mode has not claimed yet: a migration's claim,
    /// the one kind that takes a MAC another host holds.
    moved_in: std::collections::BTreeSet<u32>,
}

/// Why `save` or `reload` failed (the reply's text).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("vnetd was started without --config: there is no file to save to or reload")]
    NoConfig,
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse or apply (positioned in it).
    #[error("{0}")]
    Config(#[source] Box<Error>),
    /// Renewed TLS files were refused.
    #[error("{0}")]
    Tls(String),
    /// The running state's difference from the file (a bug if ever seen).
    #[error("{path}: the difference {what} ({error}):\n{diff}")]
    Difference {
        path: String,
        what: &'static str,
        #[source]
        error: Box<Error>,
        diff: String,
    },
}

impl FileError {
    fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io { path: path.display().to_string(), source }
    }
}

impl Default for Daemon {
    /// A daemon with no key and one link reader, that has read nothing (a
    /// test's, a library user's).
    fn default() -> Self {
        Daemon {
            state: State::default(),
            shared: Shared::new(),
            generation: 0,
            last_transaction: (std::time::Duration::ZERO, false),
            cluster_neighbors: Default::default(),
            neighbors_built: None,
            cluster_neighbors_gen: 0,
            guards_built: None,
            policy_built: None,
            cluster_policy: None,
            cluster_groups: Default::default(),
            gone: BTreeMap::new(),
            reattached: BTreeMap::new(),
            ifaces: BTreeMap::new(),
            workers: Vec::new(),
            worker_cpus: Vec::new(),
            link_readers: 1,
            links: BTreeMap::new(),
            link_io: BTreeMap::new(),
            sockets: Sockets::default(),
            listen_mode: vnet_control::Mode::default(),
            reasm: reasm::Config::default(),
            kernel: None,
            kernel_off: None,
            kernel_ifaces: BTreeMap::new(),
            user_reasons: BTreeMap::new(),
            link_reasons: BTreeMap::new(),
            identity: None,
            timers: Timers::default(),
            stamps: crate::handshakes::Stamps::default(),
            cluster: None,
            config_path: None,
            cluster_fixed: false,
            group_authority: None,
            control_tls: None,
            moved_in: Default::default(),
            attached: Default::default(),
            bpf_dir: None,
            hold_pins: false,
            kernel_routes: kernel::MAX_ROUTES,
        }
    }
}

impl Daemon {
    /// A daemon that runs as `settings` say: its host key read (and, with
    /// one, the handshakes' timestamps of its state directory), its
    /// workers' CPUs checked, its link readers, pin directory and kernel
    /// maps sized, relaying or not. It declares nothing yet.
    pub fn new(settings: &Settings) -> Result<Self, SettingsError> {
        settings.check_state_dir()?;
        let mut d = Daemon::default();
        crate::iface::netdev::NO_RX_RING.store(settings.no_rx_ring, std::sync::atomic::Ordering::Relaxed);
        d.timers = Timers::with_rekey(settings.rekey_after.max(1).saturating_mul(1_000_000_000));
        if let Some(path) = &settings.key {
            let id = crate::keys::read_key_file(path)
                .map_err(|source| SettingsError::Key { flag: settings.key_flag(), source })?;
            d.identity = Some(Arc::new(id));
            let (stamps, warn) = crate::handshakes::Stamps::open(&settings.state_dir);
            d.stamps = stamps;
            if let Some(e) = warn {
                tracing::warn!("--state-dir {e}");
            }
        }
        d.worker_cpus = settings.checked_cpus()?.to_vec();
        d.link_readers = settings.readers().clamp(1, link::udp::MAX_READERS);
        d.bpf_dir = Some(settings.pin_dir());
        d.kernel_routes = settings.kernel_routes as usize;
        d.shared.global.relay.store(settings.relay, std::sync::atomic::Ordering::Relaxed);
        Ok(d)
    }

    /// This host's claim key (cluster mode's MAC claims), from its key pair.
    pub fn claim_key(&self) -> Option<Arc<vnet_cluster::trust::ClaimKey>> {
        self.identity.as_ref().and_then(|i| vnet_cluster::trust::ClaimKey::derive(&i.private())).map(Arc::new)
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// What the control plane's timer task needs.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Notes the secured links' handshake timestamps and writes them when
    /// one moved (the daemon calls it every second); an error, once.
    pub fn save_handshakes(&mut self) -> Option<String> {
        self.stamps.note(self.links.values().filter_map(|l| l.secure.as_ref()));
        self.stamps.flush()
    }

    /// This host's public key (base64), when it has a key pair.
    pub fn public_key(&self) -> Option<String> {
        self.identity.as_ref().map(|i| vnet_control::PeerKey(i.public()).to_string())
    }

    /// Counts committed transactions: it changes whenever the state does.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Runs the daemon in cluster mode: `show cluster` and the metrics
    /// report what the cluster task writes in `status`.
    pub fn set_cluster(&mut self, status: membership::Shared) {
        self.cluster = Some(status);
    }

    /// From now on the `cluster` line is what vnetd started with.
    pub fn fix_cluster_line(&mut self) {
        self.cluster_fixed = true;
    }

    /// The config file `save` writes and `reload` (and `SIGHUP`) reads.
    pub fn set_config_path(&mut self, path: std::path::PathBuf) {
        self.config_path = Some(path);
    }

    /// The user path's part of a hand-over: stops the workers (so that no
    /// frame is read from here on, and each receive ring's position is
    /// final) and returns copies of the link sockets and the interfaces'
    /// devices, named for the next vnetd ([`crate::handover`]). What is not
    /// here (a vhost-user socket, a `direct` link's device, the kernel
    /// path's hand-off TAPs, TCP connections) is opened anew by it.
    pub fn hand_over_fds(&mut self) -> Vec<(String, std::os::fd::OwnedFd)> {
        self.workers.drain(..).for_each(WorkerHandle::stop);
        let mut out = Vec::new();
        for (kind, b) in [("udp", &self.sockets.udp), ("vxlan", &self.sockets.vxlan)] {
            let Some(b) = b else { continue };
            for (k, r) in b.readers.iter().enumerate() {
                let name = link::udp::reader_name(kind, b.addr, k);
                out.extend(name.zip(r.sock.try_clone().ok().map(Into::into)));
            }
        }
        if let Some(a) = &self.sockets.tcp {
            let name = crate::handover::name(&["tcp", &a.addr.to_string()]);
            out.extend(name.zip(a.listener().ok()));
        }
        for a in self.ifaces.values() {
            let ns = a.def.netns.clone().unwrap_or_else(|| "-".into());
            match &a.dev {
                iface::Device::Tap(t) => {
                    for (k, q) in t.queues.iter().enumerate() {
                        let name = iface::tap::queue_name(&ns, &a.def.dev, k, t.vnet_hdr, t.queues.len() > 1);
                        out.extend(q.try_clone().ok().map(|f| (name, f.into())));
                    }
                }
                iface::Device::Netdev(n) => out.extend(n.handed(&ns, &a.def.dev)),
                iface::Device::Vhost(_) => {}
            }
        }
        out
    }

    /// The control endpoint's TLS identity, for `reload` to renew.
    pub fn set_control_tls(&mut self, tls: Arc<link::tcp::Tls>, files: vnet_control::TlsFiles) {
        self.control_tls = Some((tls, files));
    }

    /// Renews the TLS identities whose files' contents changed (the links',
    /// when the `tls` line stays `next`; the control endpoint's): new
    /// handshakes use them, established connections keep theirs. Says what
    /// was renewed; the first refusal (an expired certificate, say) is the
    /// error, and that identity stays as it was.
    fn renew_tls(&self, next: Option<&vnet_control::TlsFiles>) -> Result<String, FileError> {
        let mut said = String::new();
        let links = match (&self.sockets.tls, &self.state.tls) {
            (Some(t), Some(files)) if Some(files) == next => Some((t, files, "the links'")),
            _ => None,
        };
        let control = self.control_tls.as_ref().map(|(t, files)| (t, files, "the control endpoint's"));
        for (tls, files, whose) in links.into_iter().chain(control) {
            match tls.renew(files) {
                Ok(true) => {
                    tracing::info!(cert = %files.cert, "reload: {whose} TLS certificate renewed");
                    said.push_str(&format!("{whose} TLS certificate renewed from {}\n", files.cert));
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!("reload: {whose} TLS files refused: {e}");
                    return Err(FileError::Tls(format!("{whose} TLS files were refused ({e}); the running certificate stays and nothing changed")));
                }
            }
        }
        Ok(said)
    }

    /// Links cluster mode made (named after live hosts): not the config
    /// file's to save or to delete.
    fn cluster_links(&self) -> std::collections::BTreeSet<String> {
        match &self.cluster {
            Some(c) => c.lock().unwrap_or_else(|p| p.into_inner()).links.clone(),
            None => Default::default(),
        }
    }

    fn config_file(&self) -> Result<&std::path::Path, FileError> {
        self.config_path.as_deref().ok_or(FileError::NoConfig)
    }

    /// `save`: writes the running configuration (without what cluster
    /// mode derived) over the config file, atomically: a file beside it,
    /// synced, renamed over it, keeping its permissions (0600 for a new one).
    pub fn save(&self) -> Result<String, FileError> {
        let path = self.config_file()?;
        let cluster = self.cluster_links();
        let text = format!(
            "# written by vnetd (`save`) at {} s since the epoch\n{}",
            crate::membership::now_ms() / 1000,
            self.state.to_config_without(&|n| cluster.contains(n))
        );
        write_atomically(path, text.as_bytes()).map_err(FileError::io(path))?;
        Ok(format!("saved {} lines to {}\n", text.lines().count() - 1, path.display()))
    }

    /// `reload` (and `SIGHUP`): reads the config file and applies its
    /// difference from the running state as one transaction; objects the
    /// file declares as they are keep running untouched. A file that does
    /// not parse or apply changes nothing; the error names its line.
    pub fn reload(&mut self) -> Result<String, FileError> {
        let path = self.config_file()?.to_path_buf();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(FileError::io(&path))?;
        let target = vnet_control::parse(&text)
            .and_then(|cmds| State::default().apply_all(&cmds))
            .map_err(|e| FileError::Config(Box::new(e.in_file(shown.clone()))))?;
        let renewed = self.renew_tls(target.tls.as_ref())?;
        let cluster = self.cluster_links();
        let t = self.state.diff(&target, &|n| cluster.contains(n));
        if t.is_empty() {
            return Ok(format!("{renewed}reloaded {shown}: nothing differs\n"));
        }
        let refused = |what, error| FileError::Difference {
            path: shown.clone(),
            what,
            error: Box::new(error),
            diff: t.clone(),
        };
        let cmds = vnet_control::parse(&t).map_err(|e| refused("does not parse", e))?;
        self.apply(&cmds).map_err(|e| refused("was refused", e))?;
        Ok(format!("{renewed}reloaded {shown}: {} lines applied as one transaction\n", t.lines().count()))
    }

    /// Applies `cmds` as one transaction: all of them, or none.
    pub fn apply(&mut self, cmds: &[Located<Command>]) -> Result<(), Error> {
        self.apply_reopening(cmds, false)
    }

    /// Notices interfaces whose device is gone (deleted, or deleted and made
    /// again: its index changed) and reattaches them: a TAP is made again at
    /// once (vnetd makes its TAPs), a netdev when a device of its name is
    /// back. The daemon calls it every second; each change is logged once.
    pub fn check_devices(&mut self) {
        self.follow_path_mtus();
        let ifaces = &self.ifaces;
        self.gone.retain(|id, _| ifaces.contains_key(id));
        self.reattached.retain(|id, _| ifaces.contains_key(id));
        for (id, p) in &self.ifaces {
            if !self.gone.contains_key(id) && !p.device_present() {
                let then = if p.def.kind == IfaceKind::Tap {
                    "vnetd makes it again"
                } else {
                    "vnetd reattaches when a device of that name is back"
                };
                tracing::warn!(interface = %p.def.name, dev = %p.def.dev,
                    "device gone: frames to it are dropped meanwhile; {then}");
                self.gone.insert(*id, self.shared.now_ns());
            }
        }
        if self.gone.is_empty() {
            return;
        }
        if self.apply_reopening(&[], true).is_ok() {
            let now = self.shared.now_ns();
            for (id, since) in std::mem::take(&mut self.gone) {
                if let Some(p) = self.ifaces.get(&id) {
                    tracing::info!(interface = %p.def.name, dev = %p.def.dev, ifindex = ?p.ifindex,
                        "device back: reattached after {} ms", now.saturating_sub(since) / 1_000_000);
                }
                *self.reattached.entry(id).or_default() += 1;
            }
        }
    }

    /// Places the data-path workers: worker k runs only on CPU
    /// `cpus[k % cpus.len()]` (an empty list unpins them). Takes effect for
    /// the running workers at once.
    /// Gives the kernel path's links the MTU their path MTU search found
    /// (a link whose MTU moved is written again; frames that no longer fit
    /// are left to the user path, which fragments them). The daemon calls
    /// it every second.
    fn follow_path_mtus(&mut self) {
        let plane = self.shared.plane.load_full();
        let Some(kp) = self.kernel.as_mut().filter(|k| k.mtus_moved(&plane)) else { return };
        let vxlan = self.sockets.vxlan.as_ref().map(|b| b.addr);
        match kp.sync(&plane, &self.kernel_ifaces, self.state.listen, vxlan, None) {
            Ok(skipped) => self.link_reasons = skipped.into_iter().collect(),
            Err(e) => tracing::warn!("the kernel path's links keep their old MTU: {e}"),
        }
    }

    /// Replaces the workers: worker k reads queue k of every interface and
    /// socket j of each listening group where `j mod workers = k` (as many
    /// workers as the most queues or sockets), and worker 0 the `direct`
    /// links too.
    fn respawn(&mut self) {
        self.workers.drain(..).for_each(WorkerHandle::stop);
        let queues = self.ifaces.values().map(|p| p.dev.queues()).max().unwrap_or(1).max(1);
        let groups = [(&self.sockets.udp, Via::Udp), (&self.sockets.vxlan, Via::Vxlan)];
        let readers =
            groups.iter().filter_map(|(b, _)| b.as_ref().map(|b| b.readers.len())).max().unwrap_or(0);
        let workers = queues.max(readers);
        for k in 0..workers {
            let mut sources = Vec::new();
            for (b, via) in groups {
                let Some(b) = b else { continue };
                for r in b.readers.iter().skip(k).step_by(workers) {
                    let mode = self.listen_mode;
                    sources.push(dataplane::link_source(&self.shared, r, via, mode, self.reasm));
                }
            }
            if k == 0 {
                for (id, r) in self.link_io.iter().filter_map(|(id, l)| Some((id, l.reader()?))) {
                    let stats = self.shared.global.link_dispatch.clone();
                    let (port, mode) = (Port::Link(*id), self.listen_mode);
                    sources.push(dataplane::frame_source(&self.shared, port, r, true, mode, stats));
                }
            }
            for p in self.ifaces.values() {
                sources.extend(dataplane::iface_source(&self.shared, p, k));
            }
            if sources.is_empty() {
                continue;
            }
            let cpu = (!self.worker_cpus.is_empty()).then(|| self.worker_cpus[k % self.worker_cpus.len()]);
            match workers::spawn_worker(format!("vnet-w{k}"), cpu, sources) {
                Ok(w) => self.workers.push(w),
                Err(e) => tracing::error!("cannot start worker {k}: {e}"),
            }
        }
    }

    /// Puts a new interface on the kernel path if its `datapath` asks for
    /// it and the kernel path can serve it: `Ok(None)` for `user`, the
    /// reason when it cannot.
    fn attach_kernel(
        &mut self,
        def: &InterfaceDef,
        att: &Attached,
    ) -> Result<Option<KernelIface>, KernelError> {
        use KernelError::UserPath;
        if def.datapath == Datapath::User {
            return Ok(None);
        }
        if def.kind == IfaceKind::VhostUser {
            return Err(UserPath("vnetd reads and writes this guest's virtio rings itself"));
        }
        if def.kind == IfaceKind::Tap {
            return Err(UserPath(
                "vnetd serves this TAP through its file descriptor (the kernel path takes netdevs: a \
                 container's veth, a TAP QEMU holds)",
            ));
        }
        if def.netns.is_some() {
            return Err(UserPath("the device is in another namespace than vnetd and its underlay"));
        }
        if let Some(r) = &self.kernel_off {
            return Err(KernelError::Unavailable(r.clone()));
        }
        if self.kernel.is_none() {
            match KernelPath::load(self.bpf_dir.as_deref().map(kernel::pins::Pins::new), self.kernel_routes) {
                Ok(mut k) => {
                    tracing::info!("eBPF fast path loaded");
                    k.hold_adoption = self.hold_pins;
                    self.kernel = Some(k);
                }
                Err(r) => {
                    tracing::warn!(reason = %r, "eBPF fast path unavailable");
                    self.kernel_off = Some(r.to_string());
                    return Err(r);
                }
            }
        }
        let kp = self.kernel.as_mut().ok_or(UserPath("the kernel path is not loaded"))?;
        let ifindex =
            sys::ifindex(&def.dev).map_err(kernel::io_error(format!("no ifindex for {}", def.dev)))?;
        let iface::Device::Netdev(nd) = &att.dev else {
            return Err(UserPath("the interface has no packet socket"));
        };
        // The hand-off TAP first, the program second, and only then does
        // the packet socket stop receiving (the workers read the TAP): a
        // failure on the way leaves the interface on the user path whole.
        let (tap, tap_name, tap_index) =
            nd.make_hand_off().map_err(kernel::io_error("cannot make its hand-off TAP"))?;
        kp.attach_iface(&def.dev, ifindex, tap_index)?;
        nd.use_hand_off(tap, tap_name);
        Ok(Some(KernelIface {
            dev: def.dev.clone(),
            ifindex,
            peer: kernel::is_veth(&def.dev),
            handoff: tap_index,
        }))
    }

    /// Stops every worker and closes every device and socket.
    pub fn shutdown(&mut self) {
        // The handshakes' timestamps as they are now, at a stop or a
        // hand-over: the next vnetd refuses the last initiation replayed.
        if let Some(e) = self.save_handshakes() {
            tracing::warn!("--state-dir {e}");
        }
        self.kernel_ifaces.clear();
        self.kernel = None;
        self.shared.plane.store(Arc::new(Plane::default()));
        self.workers.drain(..).for_each(WorkerHandle::stop);
        for p in self.ifaces.values() {
            p.dev.stop();
        }
        self.ifaces.clear();
        self.links.clear();
        for l in std::mem::take(&mut self.link_io).into_values() {
            l.stop();
        }
        self.sockets = Sockets::default();
    }

    /// The reply body of a `show` command.
    pub fn show(&self, what: ShowWhat, as_json: bool) -> String {
        if what == ShowWhat::Metrics {
            return self.metrics();
        }
        if what == ShowWhat::Matrix {
            return self.show_matrix(as_json);
        }
        if what == ShowWhat::Policy {
            return if as_json { self.policy_json().to_string() } else { self.policy_text() };
        }
        if what == ShowWhat::Cluster {
            let status = self.cluster.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).clone());
            return match (status, as_json) {
                (Some(s), true) => json!({ "cluster": s.json() }).to_string(),
                (Some(s), false) => s.text(),
                (None, true) => json!({ "cluster": null }).to_string(),
                (None, false) => "not in cluster mode (vnetd --cluster)\n".to_string(),
            };
        }
        if what == ShowWhat::Config {
            return if as_json {
                json!({ "config": self.state.to_config() }).to_string()
            } else {
                self.state.to_config()
            };
        }
        let v = match what {
            ShowWhat::Routes => json!({ "routes": self.routes_json() }),
            ShowWhat::Links => json!({ "links": self.links_json() }),
            ShowWhat::Interfaces => json!({ "interfaces": self.ifaces_json() }),
            ShowWhat::Global => json!({ "global": self.global_json() }),
            _ => json!({
                "routes": self.routes_json(),
                "links": self.links_json(),
                "interfaces": self.ifaces_json(),
                "global": self.global_json(),
            }),
        };
        if as_json {
            return v.to_string();
        }
        let mut out = String::new();
        for (key, cols) in [("interfaces", IFACE_COLS), ("links", LINK_COLS), ("routes", ROUTE_COLS)] {
            if let Some(Value::Array(rows)) = v.get(key) {
                if what == ShowWhat::Stats {
                    out.push_str(&format!("{key}:\n"));
                }
                out.push_str(&table(cols, rows));
            }
        }
        if let Some(Value::Object(g)) = v.get("global") {
            out.push_str("global:\n");
            for (k, v) in g {
                out.push_str(&format!("  {k} {v}\n"));
            }
        }
        out
    }

    /// Activates each standby interface whose VM has arrived (sent its
    /// first frame from its MAC: a live migration's switch-over), as
    /// `activate NAME` does. An activation that fails is logged and waits
    /// for the VM's next frame.
    pub fn activate_arrived(&mut self) {
        let arrived: Vec<(String, Arc<Attached>)> = self
            .ifaces
            .iter()
            .filter(|(_, a)| a.iface.standby() == vnet_engine::plane::ARRIVED)
            .filter_map(|(id, a)| self.state.interfaces.get(id).map(|d| (d.name.clone(), a.clone())))
            .collect();
        for (name, att) in arrived {
            match self.activate(&name, Default::default()) {
                Ok(said) => tracing::info!(interface = %name, "its VM arrived: {}", said.trim_end()),
                Err(e) => {
                    att.iface.rearm();
                    tracing::error!(interface = %name, "its VM arrived, but it could not be activated: {e}");
                }
            }
        }
    }

    /// Where this host's peers see it (each `nat` link's reflection: behind
    /// a NAT, its public mapping), by link name.
    pub fn reflections(&self) -> Vec<(String, std::net::SocketAddr)> {
        self.links
            .iter()
            .filter_map(|(id, l)| {
                let seen = *l.seen_as.load().as_deref()?;
                Some((self.state.links.get(id)?.name.clone(), seen))
            })
            .collect()
    }

    /// Whether interface `id` was activated from standby and its MAC not
    /// claimed since ([`Daemon::claimed`]).
    pub fn moved_in(&self, id: u32) -> bool {
        self.moved_in.contains(&id)
    }

    /// Cluster mode claimed interface `id`'s MAC.
    pub fn claimed(&mut self, id: u32) {
        self.moved_in.remove(&id);
    }

    /// `activate NAME`: the standby interface becomes active in one
    /// transaction ([`vnet_control::attach::activate`]), and its MAC is
    /// announced over every link. Returns the reply body.
    pub fn activate(&mut self, name: &str, pos: vnet_control::Pos) -> Result<String, Error> {
        let cmds = vnet_control::attach::activate(&self.state, pos, name)?;
        if !cmds.is_empty() {
            self.apply(&cmds)?;
        }
        // A migration's claim (cluster mode): also for an interface active
        // already whose MAC another host holds, which `activate` takes.
        let interfaces = &self.state.interfaces;
        self.moved_in.retain(|id| interfaces.contains_key(id));
        if let Some(i) = self.state.iface_by_name(name) {
            self.moved_in.insert(i.id);
        }
        self.shared.activated.notify_one();
        if cmds.is_empty() {
            return Ok(format!("{name} is active already\n"));
        }
        if let Some(e) = self.save_attached() {
            tracing::warn!("--state-dir {e}");
        }
        let mac = self.state.iface_by_name(name).and_then(|i| i.mac);
        Ok(match mac {
            Some(mac) => format!("{name} active; {}", self.announce(mac)),
            None => format!("{name} active\n"),
        })
    }

    /// Sends a broadcast RARP from `mac` over every link (`announce MAC`),
    /// as QEMU does after a migration: the relocated VM's new host says
    /// where the MAC now lives, so learning switches and caches on the way
    /// re-learn at once (vnet's own routes are changed by the controller).
    /// Returns the reply body.
    /// Only the links of the MAC's networks (those of the local interfaces
    /// that have it, as networks may share MACs; network 0 for a MAC no
    /// local interface has) carry it: a tenant's RARP never reaches another
    /// tenant's links.
    pub fn announce(&self, mac: vnet_wire::MacAddr) -> String {
        let frame = vnet_wire::arp::rarp_announcement(mac);
        let parts = [std::io::IoSlice::new(&frame)];
        let mut scratch = vnet_engine::port::Scratch::default();
        let mut sent = 0;
        let links = self.announce_links(mac);
        for link in &links {
            // Each link's own codec: raw, vnet or VXLAN.
            if vnet_engine::Port::send(
                &***link,
                &mut scratch,
                vnet_engine::Payload::Frame { parts: &parts, hdr: false },
            ) {
                link.tx.add(frame.len());
                sent += 1;
            } else {
                link.tx.drop_one();
                tracing::warn!(link = %link.def.name, "announce: not sent");
            }
        }
        format!("announced {mac} to {sent} of {} links\n", links.len())
    }

    /// The links an announcement of `mac` goes on: those of its network.
    fn announce_links(&self, mac: vnet_wire::MacAddr) -> Vec<&Arc<vnet_engine::Link>> {
        let mut networks: Vec<u32> =
            self.state.interfaces.values().filter(|i| i.mac == Some(mac)).map(|i| i.network).collect();
        if networks.is_empty() {
            networks.push(0);
        }
        self.links.values().filter(|l| networks.contains(&l.def.network())).collect()
    }

    /// The names of the links an announcement of `mac` goes on.
    pub fn announce_link_names(&self, mac: vnet_wire::MacAddr) -> Vec<String> {
        self.announce_links(mac).iter().map(|l| l.def.name.clone()).collect()
    }

    /// Every counter of `show stats` (user and kernel path merged) in the
    /// Prometheus text exposition format (version 0.0.4), for `show
    /// metrics` and `vnetd --metrics`. Written out here rather than through
    /// a metrics registry: vnetd already keeps every counter, and the
    /// format is a line per sample.
    pub fn metrics(&self) -> String {
        let mut out = String::new();
        let groups =
            [("interface", self.ifaces_json()), ("link", self.links_json()), ("route", self.routes_json())];
        for (kind, rows) in &groups {
            let label = if *kind == "route" { "id" } else { "name" };
            metric_rows(&mut out, kind, label, rows);
        }
        if let Value::Object(g) = self.global_json() {
            for (k, v) in g {
                if let Some(n) = v.as_u64() {
                    out.push_str(&format!("# TYPE vnet_{k} untyped\nvnet_{k} {n}\n"));
                }
            }
        }
        self.matrix_metrics(&mut out);
        self.policy_metrics(&mut out);
        self.drop_metrics(&mut out);
        if let Some(c) = &self.cluster {
            c.lock().unwrap_or_else(|p| p.into_inner()).metrics(&mut out);
        }
        out
    }

    fn routes_json(&self) -> Vec<Value> {
        views::rows(&self.route_views())
    }

    fn links_json(&self) -> Vec<Value> {
        views::rows(&self.link_views())
    }

    fn ifaces_json(&self) -> Vec<Value> {
        views::rows(&self.iface_views())
    }

    fn global_json(&self) -> Value {
        let mut v = self.global_user_json();
        if let Value::Object(m) = &mut v {
            let status = match (&self.kernel, &self.kernel_off) {
                (Some(_), _) => "loaded".to_string(),
                (None, Some(r)) => format!("off: {r}"),
                (None, None) => "not requested".to_string(),
            };
            m.insert("kernel_path".into(), status.into());
            m.insert(
                "last_transaction_us".into(),
                (self.last_transaction.0.as_nanos() as f64 / 1000.0).into(),
            );
            m.insert("last_transaction_routes_only".into(), self.last_transaction.1.into());
            if let Some(k) = &self.kernel {
                m.insert("kernel_route_entries".into(), k.entries().into());
                m.insert("kernel_route_capacity".into(), k.capacity.into());
                m.insert("kernel_route_overflow".into(), k.overflow.into());
                m.insert("kernel_dest_entries".into(), k.dest_entries().into());
                m.insert("kernel_last_sync_us".into(), (k.last_sync.as_nanos() as f64 / 1000.0).into());
                m.insert("kernel_last_sync_incremental".into(), k.last_sync_incremental.into());
                for (name, n) in k.stats() {
                    m.insert(name.into(), n.into());
                }
            }
        }
        v
    }

    /// `show stats`' global part: the daemon-wide counters
    /// (`vnet_engine::global::Global`, named where they are defined) and the
    /// link worker's dispatch (`link_`-prefixed).
    fn global_user_json(&self) -> Value {
        let g = &self.shared.global;
        let mut v = json!(&**g);
        merge(&mut v, json!(&*g.link_dispatch), "link_");
        merge(
            &mut v,
            json!({
                "route_table_generation": self.generation,
                "link_mode": self.state.listen_mode.word(),
                "link_reader_messages": self.sockets.udp.iter().chain(&self.sockets.vxlan)
                    .flat_map(|b| b.readers.iter().map(|r| r.messages.load(std::sync::atomic::Ordering::Relaxed)))
                    .collect::<Vec<u64>>(),
            }),
            "",
        );
        v
    }
}

/// Adds `more`'s fields to the object `v`, each name behind `prefix`.
fn merge(v: &mut Value, more: Value, prefix: &str) {
    if let (Value::Object(m), Value::Object(more)) = (v, more) {
        for (k, x) in more {
            m.insert(format!("{prefix}{k}"), x);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One Prometheus family per numeric field of `rows`, a sample per row
/// labelled by its `label` field: `vnet_<kind>_<field>{<kind>="..."} N`.
fn metric_rows(out: &mut String, kind: &str, label: &str, rows: &[Value]) {
    let mut fields: Vec<&str> = Vec::new();
    for r in rows {
        if let Value::Object(m) = r {
            for (k, v) in m {
                if v.is_u64() && k != "id" && !fields.contains(&k.as_str()) {
                    fields.push(k);
                }
            }
        }
    }
    for f in fields {
        out.push_str(&format!("# TYPE vnet_{kind}_{f} untyped\n"));
        for r in rows {
            let (Some(n), Some(l)) = (r[f].as_u64(), r.get(label)) else { continue };
            let l = match l {
                Value::String(s) => s.replace('\\', "\\\\").replace('"', "\\\""),
                other => other.to_string(),
            };
            out.push_str(&format!("vnet_{kind}_{f}{{{kind}=\"{l}\"}} {n}\n"));
        }
    }
}

/// Renders `rows` (JSON objects) as an aligned text table of `cols`.
fn table(cols: &[&str], rows: &[Value]) -> String {
    let cell = |r: &Value, c: &str| match r.get(c) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "-".into(),
    };
    let mut widths: Vec<usize> = cols.iter().map(|c| c.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(cols) {
            *w = (*w).max(cell(r, c).len());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(cols.iter().map(|c| c.to_string()).collect());
    for r in rows {
        out.push_str(&line(cols.iter().map(|c| cell(r, c)).collect()));
    }
    out
}

/// Replaces `path` with `data` so that a crash leaves the old file or the
/// new one, never a part: a temporary file beside it (same permissions as
/// the old file, else 0600), synced, renamed over it, the directory synced.
fn write_atomically(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::other("not a file path"))?;
    let tmp = dir.join(format!(".{}.vnetd-{}", name.to_string_lossy(), std::process::id()));
    let mode = std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
