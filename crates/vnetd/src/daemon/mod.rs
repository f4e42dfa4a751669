//! The daemon: turns declared [`State`] into open devices, sockets, workers
//! and a published [`Plane`], atomically.
//!
//! [`Daemon::apply`] validates commands against a copy of the state, then
//! acquires every new resource (binds the socket, opens the TAPs). Only if
//! all of that succeeds is the new plane published and the old resources
//! released; on any failure the new resources are dropped (closed) and the
//! running configuration is untouched, so traffic keeps flowing.

mod attached;
mod clustered;
mod crew;
mod dashboard;
mod drops;
mod fastpath;
mod file;
mod interfaces;
mod links;
mod matrix;
mod neigh;
mod pins;
mod policy;
mod positions;
mod show;
mod sockets;
mod trace;
mod txn;
mod views;

use clustered::Clustered;
use crew::Crew;
use fastpath::Fastpath;
pub use file::FileError;
use interfaces::Interfaces;
use links::LinkSet;
use sockets::LinkSockets;
pub use trace::TraceError;

use crate::iface::Attached;
use crate::link::{self, Sockets};
use crate::membership;
use crate::settings::{Settings, SettingsError};
use crate::shared::Shared;
use std::sync::Arc;
use vnet_control::{Command, Error, IfaceKind, Located, State};
use vnet_engine::secure::Timers;
use vnet_engine::Plane;
use vnet_wire::reasm;

/// One host's vnet: its declared state, and the resources that state is
/// made of, each owning what it holds and acquired and released by the
/// transaction's phases (`txn.rs`).
pub struct Daemon {
    state: State,
    shared: Arc<Shared>,
    generation: u64,
    /// How long the last transaction that succeeded took, and whether it
    /// only added and deleted routes (`show stats`).
    last_transaction: (std::time::Duration, bool),
    /// The link sockets.
    sockets: LinkSockets,
    /// The links and their I/O.
    links: LinkSet,
    /// The interfaces and their devices.
    ifaces: Interfaces,
    /// The eBPF fast path.
    kernel: Fastpath,
    /// Cluster mode's inputs, and the tables built with them.
    cluster: Clustered,
    /// The data-path workers.
    workers: Crew,
    reasm: reasm::Config,
    /// The config file (`vnetd --config`), for `save` and `reload`.
    config_path: Option<std::path::PathBuf>,
    /// The control endpoint's TLS identity (`--control-tls`) and its files,
    /// renewed by `reload` like the links'.
    control_tls: Option<(Arc<link::tcp::Tls>, vnet_control::TlsFiles)>,
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
            sockets: LinkSockets::default(),
            links: LinkSet::default(),
            ifaces: Interfaces::default(),
            kernel: Fastpath::default(),
            cluster: Clustered::default(),
            workers: Crew::default(),
            reasm: reasm::Config::default(),
            config_path: None,
            control_tls: None,
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
        d.links.timers = Timers::with_rekey(settings.rekey_after.max(1).saturating_mul(1_000_000_000));
        if let Some(path) = &settings.key {
            let id = crate::keys::read_key_file(path)
                .map_err(|source| SettingsError::Key { flag: settings.key_flag(), source })?;
            d.links.identity = Some(Arc::new(id));
            let (stamps, warn) = crate::handshakes::Stamps::open(&settings.state_dir);
            d.links.stamps = stamps;
            if let Some(e) = warn {
                tracing::warn!("--state-dir {e}");
            }
        }
        d.workers.cpus = settings.checked_cpus()?.to_vec();
        d.sockets.readers = settings.readers().clamp(1, link::udp::MAX_READERS);
        d.kernel.bpf_dir = Some(settings.pin_dir());
        d.kernel.routes = settings.kernel_routes as usize;
        d.shared.global.relay.store(settings.relay, std::sync::atomic::Ordering::Relaxed);
        if let Some(log) =
            crate::flowlog::FlowLog::start(&settings.flow_log).map_err(SettingsError::FlowLog)?
        {
            // The engine's flows accounted from the first policy on (a new
            // generation keeps the table).
            let policy = vnet_core::policy::PolicySet {
                flows: Arc::new(crate::flowlog::FlowLog::flows()),
                ..Default::default()
            };
            d.shared
                .plane
                .store(Arc::new(vnet_engine::Plane { policy: Arc::new(policy), ..Default::default() }));
            let _ = d.shared.flow_log.set(log);
        }
        Ok(d)
    }

    /// The kernel path's flows map, when it is loaded (the flow log scans it).
    pub fn kernel_flows(&self) -> Option<Arc<crate::kernel::flows::KernelFlows>> {
        self.kernel.path.as_ref().map(|k| k.flow_mirror())
    }

    /// This host's claim key (cluster mode's MAC claims), from its key pair.
    pub fn claim_key(&self) -> Option<Arc<vnet_cluster::trust::ClaimKey>> {
        self.links
            .identity
            .as_ref()
            .and_then(|i| vnet_cluster::trust::ClaimKey::derive(&i.private()))
            .map(Arc::new)
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
        self.links.save_handshakes()
    }

    /// This host's public key (base64), when it has a key pair.
    pub fn public_key(&self) -> Option<String> {
        self.links.identity.as_ref().map(|i| vnet_control::PeerKey(i.public()).to_string())
    }

    /// Counts committed transactions: it changes whenever the state does.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Runs the daemon in cluster mode: `show cluster` and the metrics
    /// report what the cluster task writes in `status`.
    pub fn set_cluster(&mut self, status: membership::Shared) {
        self.cluster.status = Some(status);
    }

    /// From now on the `cluster` line is what vnetd started with.
    pub fn fix_cluster_line(&mut self) {
        self.cluster.fixed = true;
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
        self.workers.stop_all();
        let mut out = Vec::new();
        self.sockets.hand_over_fds(&mut out);
        self.ifaces.hand_over_fds(&mut out);
        out
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
        let ifaces = &self.ifaces.running;
        self.ifaces.gone.retain(|id, _| ifaces.contains_key(id));
        self.ifaces.reattached.retain(|id, _| ifaces.contains_key(id));
        for (id, p) in &self.ifaces.running {
            if !self.ifaces.gone.contains_key(id) && !p.device_present() {
                let then = if p.def.kind == IfaceKind::Tap {
                    "vnetd makes it again"
                } else {
                    "vnetd reattaches when a device of that name is back"
                };
                tracing::warn!(interface = %p.def.name, dev = %p.def.dev,
                    "device gone: frames to it are dropped meanwhile; {then}");
                self.ifaces.gone.insert(*id, self.shared.now_ns());
            }
        }
        if self.ifaces.gone.is_empty() {
            return;
        }
        if self.apply_reopening(&[], true).is_ok() {
            let now = self.shared.now_ns();
            for (id, since) in std::mem::take(&mut self.ifaces.gone) {
                if let Some(p) = self.ifaces.running.get(&id) {
                    tracing::info!(interface = %p.def.name, dev = %p.def.dev, ifindex = ?p.ifindex,
                        "device back: reattached after {} ms", now.saturating_sub(since) / 1_000_000);
                }
                *self.ifaces.reattached.entry(id).or_default() += 1;
            }
        }
    }

    /// Gives the kernel path's links the MTU their path MTU search found
    /// (`Fastpath::follow_path_mtus`). The daemon calls it every second.
    fn follow_path_mtus(&mut self) {
        let plane = self.shared.plane.load_full();
        self.kernel.follow_path_mtus(&plane, self.state.listen, self.sockets.vxlan());
    }

    /// Stops every worker and closes every device and socket.
    pub fn shutdown(&mut self) {
        // The handshakes' timestamps as they are now, at a stop or a
        // hand-over: the next vnetd refuses the last initiation replayed.
        if let Some(e) = self.save_handshakes() {
            tracing::warn!("--state-dir {e}");
        }
        self.kernel.unload();
        self.shared.plane.store(Arc::new(Plane::default()));
        self.workers.stop_all();
        self.ifaces.stop_all();
        self.links.stop_all();
        self.sockets.bound = Sockets::default();
    }

    /// Activates each standby interface whose VM has arrived (sent its
    /// first frame from its MAC: a live migration's switch-over), as
    /// `activate NAME` does. An activation that fails is logged and waits
    /// for the VM's next frame.
    pub fn activate_arrived(&mut self) {
        let arrived: Vec<(String, Arc<Attached>)> = self
            .ifaces
            .running
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
            .running
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
        self.ifaces.moved_in.contains(&id)
    }

    /// Cluster mode claimed interface `id`'s MAC.
    pub fn claimed(&mut self, id: u32) {
        self.ifaces.moved_in.remove(&id);
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
        self.ifaces.moved_in.retain(|id| interfaces.contains_key(id));
        if let Some(i) = self.state.iface_by_name(name) {
            self.ifaces.moved_in.insert(i.id);
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
        self.links.running.values().filter(|l| networks.contains(&l.def.network())).collect()
    }

    /// The names of the links an announcement of `mac` goes on.
    pub fn announce_link_names(&self, mac: vnet_wire::MacAddr) -> Vec<String> {
        self.announce_links(mac).iter().map(|l| l.def.name.clone()).collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}
