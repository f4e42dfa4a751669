//! The daemon: turns declared [`State`] into open devices, sockets, workers
//! and a published [`Plane`], atomically.
//!
//! [`Daemon::apply`] validates commands against a copy of the state, then
//! acquires every new resource (binds the socket, opens the TAPs). Only if
//! all of that succeeds is the new plane published and the old resources
//! released; on any failure the new resources are dropped (closed) and the
//! running configuration is untouched, so traffic keeps flowing.

use crate::dataplane::{self, IfacePort, LinkPort, Plane, Shared, WorkerHandle};
use crate::kernel::{self, KernelIface, KernelPath};
use crate::sys;
use crate::vhost;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{Command, Datapath, Error, IfaceKind, InterfaceDef, Located, ShowWhat, State};
use vnet_core::stats::Snapshot;
use vnet_core::{Counters, Port, Route, RouteTable};
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
    "remote",
    "format",
    "network",
    "mtu",
    "rx_packets",
    "rx_bytes",
    "rx_drops",
    "tx_packets",
    "tx_bytes",
    "tx_drops",
];
const ROUTE_COLS: &[&str] = &["id", "src", "dst", "to", "from", "packets", "bytes", "drops"];

/// The link sockets: the one bound to the `listen` address (received on)
/// and the pool `vnet` links send from.
struct Listener {
    addr: SocketAddr,
    mode: vnet_control::Mode,
    sock: Arc<UdpSocket>,
    pool: Vec<Arc<UdpSocket>>,
}

/// One host's vnet: configuration, resources and workers.
pub struct Daemon {
    state: State,
    shared: Arc<Shared>,
    generation: u64,
    ifaces: BTreeMap<u32, Arc<IfacePort>>,
    /// Worker k serves queue k of every interface; worker 0 also the link socket.
    workers: Vec<WorkerHandle>,
    /// CPUs the workers run on: worker k on `worker_cpus[k % len]`
    /// (empty: wherever the scheduler puts them).
    worker_cpus: Vec<usize>,
    links: BTreeMap<u32, Arc<LinkPort>>,
    route_counters: BTreeMap<u32, Arc<Counters>>,
    socket: Option<Listener>,
    reasm: reasm::Config,
    /// The eBPF fast path, loaded the first time an interface asks for it.
    kernel: Option<KernelPath>,
    /// Why it could not be loaded (asked once; `auto` then stays on user).
    kernel_off: Option<String>,
    /// Interfaces the kernel path serves, and why others are on the user path.
    kernel_ifaces: BTreeMap<u32, KernelIface>,
    user_reasons: BTreeMap<u32, String>,
}

impl Default for Daemon {
    fn default() -> Self {
        Self::new()
    }
}

impl Daemon {
    pub fn new() -> Self {
        Daemon {
            state: State::default(),
            shared: Shared::new(),
            generation: 0,
            ifaces: BTreeMap::new(),
            workers: Vec::new(),
            worker_cpus: Vec::new(),
            links: BTreeMap::new(),
            route_counters: BTreeMap::new(),
            socket: None,
            reasm: reasm::Config::default(),
            kernel: None,
            kernel_off: None,
            kernel_ifaces: BTreeMap::new(),
            user_reasons: BTreeMap::new(),
        }
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Applies `cmds` as one transaction: all of them, or none.
    pub fn apply(&mut self, cmds: &[Located<Command>]) -> Result<(), Error> {
        let next = self.state.apply_all(cmds)?;
        // Where each new interface was declared, to point errors at it.
        let decl_pos = |name: &str| {
            cmds.iter()
                .find(|c| matches!(&c.item, Command::Interface { name: n, .. } if n == name))
                .map_or(Default::default(), |c| c.pos)
        };

        // Acquire: the socket, if the address changed or there is none yet.
        let mut new_socket = None;
        let mode_changed = self.socket.as_ref().is_some_and(|s| s.mode != next.listen_mode);
        if self.socket.as_ref().map(|s| s.addr) != Some(next.listen) {
            let sock = bind_all(next.listen).map_err(|e| {
                let pos = cmds
                    .iter()
                    .rev()
                    .find(|c| matches!(c.item, Command::Listen { .. }))
                    .map_or(Default::default(), |c| c.pos);
                Error::new(pos, format!("an address vnetd can bind ({})", next.listen), format!("error: {e}"))
            })?;
            new_socket = Some(sock);
        }
        // Acquire: new interfaces (vhost-user servers stop again if the
        // transaction fails after this).
        let mut opened = Opened(Vec::new());
        for (id, def) in &next.interfaces {
            if self.ifaces.contains_key(id) {
                continue;
            }
            let port = open_iface(def, &self.shared, &self.worker_cpus).map_err(|e| {
                Error::new(
                    decl_pos(&def.name),
                    "a device vnetd can open and configure",
                    format!("error: {e}"),
                )
            })?;
            opened.0.push(Arc::new(port));
        }
        // The kernel path for the new interfaces that ask for it; undone if
        // one that requires it (`datapath kernel`) cannot have it.
        let mut attached: Vec<(u32, KernelIface)> = Vec::new();
        let mut reasons: Vec<(u32, String)> = Vec::new();
        for p in &opened.0 {
            let def = &next.interfaces[&p.id];
            match self.attach_kernel(def, p) {
                Ok(Some(k)) => attached.push((p.id, k)),
                Ok(None) => {}
                Err(reason) if def.datapath == Datapath::Kernel => {
                    for (_, k) in &attached {
                        if let Some(kp) = self.kernel.as_mut() {
                            kp.detach_iface(&k.dev);
                        }
                    }
                    return Err(Error::new(
                        decl_pos(&def.name),
                        "an interface the kernel path can serve (`datapath kernel`)",
                        reason,
                    ));
                }
                Err(reason) => {
                    tracing::info!(interface = %def.name, %reason, "datapath auto: user path");
                    reasons.push((p.id, reason));
                }
            }
        }

        // Everything acquired: build and publish the new plane.
        let (socket, tx_pool) = match &new_socket {
            Some((s, pool)) => (Some(s.clone()), pool.clone()),
            None => match &self.socket {
                Some(l) => (Some(l.sock.clone()), l.pool.clone()),
                None => (None, Vec::new()),
            },
        };
        let mut ifaces: BTreeMap<u32, Arc<IfacePort>> = self
            .ifaces
            .iter()
            .filter(|(id, _)| next.interfaces.contains_key(id))
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        for p in &opened.0 {
            ifaces.insert(p.id, p.clone());
        }
        let links: BTreeMap<u32, Arc<LinkPort>> = next
            .links
            .values()
            .map(|d| {
                let p = match self.links.get(&d.id) {
                    Some(p) if p.def == *d => p.clone(),
                    _ => Arc::new(LinkPort::new(d.clone())),
                };
                (d.id, p)
            })
            .collect();
        let route_counters: BTreeMap<u32, Arc<Counters>> = next
            .routes
            .keys()
            .map(|id| (*id, self.route_counters.get(id).cloned().unwrap_or_default()))
            .collect();
        self.generation += 1;
        let routes = next
            .routes
            .values()
            .map(|r| Route {
                id: r.id,
                src: r.src,
                dst: r.dst,
                to: r.to,
                from: r.from,
                counters: route_counters[&r.id].clone(),
            })
            .collect();
        let mut links_by_ip = rustc_hash::FxHashMap::default();
        for l in links.values().rev() {
            links_by_ip.insert(l.def.remote.ip(), l.def.id);
        }
        let plane = Plane {
            table: RouteTable::new(self.generation, routes),
            ifaces: ifaces.iter().map(|(k, v)| (*k, v.clone())).collect(),
            links: links.iter().map(|(k, v)| (*k, v.clone())).collect(),
            links_by_ip,
            socket,
            tx_pool,
        };
        let plane = Arc::new(plane);
        self.shared.plane.store(plane.clone());
        self.kernel_ifaces.retain(|id, k| {
            let keep = next.interfaces.contains_key(id);
            if !keep {
                if let Some(kp) = self.kernel.as_mut() {
                    kp.detach_iface(&k.dev);
                }
            }
            keep
        });
        self.user_reasons.retain(|id, _| next.interfaces.contains_key(id));
        self.kernel_ifaces.extend(attached);
        self.user_reasons.extend(reasons);
        if let Some(kp) = self.kernel.as_mut() {
            match kp.sync(&plane, &self.kernel_ifaces, next.listen) {
                Ok(skipped) => {
                    for (link, reason) in skipped {
                        tracing::info!(%link, %reason, "link left to the user path");
                    }
                }
                Err(e) => tracing::error!("the kernel path's maps could not be updated: {e}"),
            }
        }

        // Workers: restarted when interfaces or the link socket changed.
        let opened = opened.keep();
        let respawn = restart_needed(&new_socket, mode_changed, &opened, &self.ifaces, &next);
        if let Some((sock, pool)) = new_socket {
            self.socket = Some(Listener { addr: next.listen, mode: next.listen_mode, sock, pool });
        } else if let Some(l) = self.socket.as_mut() {
            l.mode = next.listen_mode;
        }
        self.ifaces.retain(|id, p| {
            let keep = next.interfaces.contains_key(id);
            if !keep {
                if let Some(v) = &p.vhost {
                    v.stop();
                }
                tracing::info!(interface = %p.name, "interface removed");
            }
            keep
        });
        for p in opened {
            tracing::info!(interface = %p.name, dev = %p.dev, mac = ?p.mac, queues = p.queues.len(),
                offload = p.vnet_hdr, "interface attached");
            self.ifaces.insert(p.id, p);
        }
        if respawn {
            self.respawn();
        }
        self.links = links;
        self.route_counters = route_counters;
        self.state = next;
        Ok(())
    }

    /// Places the data-path workers: worker k runs only on CPU
    /// `cpus[k % cpus.len()]` (an empty list unpins them). Takes effect for
    /// the running workers at once.
    pub fn set_worker_cpus(&mut self, cpus: Vec<usize>) {
        self.worker_cpus = cpus;
        if !self.workers.is_empty() {
            self.respawn();
        }
    }

    /// Replaces the workers: worker k reads queue k of every interface, and
    /// worker 0 the link socket too.
    fn respawn(&mut self) {
        self.workers.drain(..).for_each(WorkerHandle::stop);
        let queues = self.ifaces.values().map(|p| p.queues.len()).max().unwrap_or(1).max(1);
        for k in 0..queues {
            let mut sources = Vec::new();
            if let (0, Some(l)) = (k, &self.socket) {
                sources.push(dataplane::link_source(&self.shared, l.sock.clone(), l.mode, self.reasm));
            }
            for p in self.ifaces.values().filter(|p| p.queues.len() > k) {
                sources.push(dataplane::iface_source(&self.shared, p.clone(), k));
            }
            if sources.is_empty() {
                continue;
            }
            let cpu = (!self.worker_cpus.is_empty()).then(|| self.worker_cpus[k % self.worker_cpus.len()]);
            match dataplane::spawn_worker(format!("vnet-w{k}"), cpu, sources) {
                Ok(w) => self.workers.push(w),
                Err(e) => tracing::error!("cannot start worker {k}: {e}"),
            }
        }
    }

    /// Puts a new interface on the kernel path if its `datapath` asks for
    /// it and the kernel path can serve it: `Ok(None)` for `user`, the
    /// reason when it cannot.
    fn attach_kernel(&mut self, def: &InterfaceDef, port: &IfacePort) -> Result<Option<KernelIface>, String> {
        if def.datapath == Datapath::User {
            return Ok(None);
        }
        if def.kind == IfaceKind::VhostUser {
            return Err("vnetd reads and writes this guest's virtio rings itself".into());
        }
        if def.kind == IfaceKind::Tap {
            return Err("vnetd serves this TAP through its file descriptor (the kernel path takes netdevs: \
                        a container's veth, a TAP QEMU holds)"
                .into());
        }
        if def.netns.is_some() {
            return Err("the device is in another namespace than vnetd and its underlay".into());
        }
        if let Some(r) = &self.kernel_off {
            return Err(r.clone());
        }
        if self.kernel.is_none() {
            match KernelPath::load() {
                Ok(k) => {
                    tracing::info!("eBPF fast path loaded");
                    self.kernel = Some(k);
                }
                Err(r) => {
                    tracing::warn!(reason = %r, "eBPF fast path unavailable");
                    self.kernel_off = Some(r.clone());
                    return Err(r);
                }
            }
        }
        let kp = self.kernel.as_mut().ok_or("the kernel path is not loaded")?;
        let ifindex = sys::ifindex(&def.dev).map_err(|e| format!("no ifindex for {}: {e}", def.dev))?;
        let sock = port.queues.first().ok_or("the interface has no socket")?;
        kp.attach_iface(&def.dev, sock)?;
        Ok(Some(KernelIface { dev: def.dev.clone(), ifindex, peer: !kernel::is_tap(&def.dev) }))
    }

    /// Stops every worker and closes every device and socket.
    pub fn shutdown(&mut self) {
        self.kernel_ifaces.clear();
        self.kernel = None;
        self.shared.plane.store(Arc::new(Plane::default()));
        self.workers.drain(..).for_each(WorkerHandle::stop);
        for v in self.ifaces.values().filter_map(|p| p.vhost.as_ref()) {
            v.stop();
        }
        self.ifaces.clear();
        self.socket = None;
    }

    /// The reply body of a `show` command.
    pub fn show(&self, what: ShowWhat, as_json: bool) -> String {
        if what == ShowWhat::Metrics {
            return self.metrics();
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

    /// Sends a broadcast RARP from `mac` over every link (`announce MAC`),
    /// as QEMU does after a migration: the relocated VM's new host says
    /// where the MAC now lives, so learning switches and caches on the way
    /// re-learn at once (vnet's own routes are changed by the controller).
    /// Returns the reply body.
    pub fn announce(&self, mac: vnet_wire::MacAddr) -> String {
        let mut frame = [0u8; 60];
        frame[..6].copy_from_slice(&[0xff; 6]);
        frame[6..12].copy_from_slice(&mac.0);
        frame[12..14].copy_from_slice(&0x8035u16.to_be_bytes()); // RARP
        frame[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]); // Ethernet/IPv4, request reverse
        frame[22..28].copy_from_slice(&mac.0); // sender hardware address
        frame[32..38].copy_from_slice(&mac.0); // target hardware address
        let Some(l) = &self.socket else { return "no link socket: nothing sent\n".into() };
        let mut sent = 0;
        let mut dgram = [0u8; vnet_wire::vnet::HEADER_LEN + 60];
        for link in self.links.values() {
            let payload: &[u8] = match link.def.format {
                vnet_control::LinkFormat::Raw => &frame,
                vnet_control::LinkFormat::Vnet => {
                    let repr = vnet_wire::vnet::VnetRepr {
                        flags: vnet_wire::vnet::Flags(vnet_wire::vnet::Flags::WHOLE),
                        network: link.def.network,
                        frame_id: 0,
                        frame_len: 0,
                        offset: 0,
                    };
                    let _ = repr.emit(&mut dgram);
                    dgram[vnet_wire::vnet::HEADER_LEN..].copy_from_slice(&frame);
                    &dgram
                }
            };
            match l.sock.send_to(payload, link.def.remote) {
                Ok(_) => {
                    link.tx.add(frame.len());
                    sent += 1;
                }
                Err(e) => {
                    link.tx.drop_one();
                    tracing::warn!(link = %link.def.name, "announce: {e}");
                }
            }
        }
        format!("announced {mac} to {sent} of {} links\n", self.links.len())
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
        out
    }

    fn routes_json(&self) -> Vec<Value> {
        let port = |p: Port| {
            let kind = if p.is_link() { "link" } else { "interface" };
            format!("{kind} {}", self.state.port_name(p))
        };
        self.state
            .routes
            .values()
            .map(|r| {
                let c = self.route_counters.get(&r.id).map(|c| c.snapshot()).unwrap_or_default();
                json!({
                    "id": r.id,
                    "src": r.src.to_string(),
                    "dst": r.dst.to_string(),
                    "to": port(r.to),
                    "from": match r.from {
                        vnet_core::SourceFilter::Any => "any".to_string(),
                        vnet_core::SourceFilter::Port(p) => port(p),
                    },
                    "packets": c.packets,
                    "bytes": c.bytes,
                    "drops": c.drops,
                })
            })
            .collect()
    }

    fn links_json(&self) -> Vec<Value> {
        self.links
            .values()
            .map(|l| {
                let (rx, tx) = (l.rx.snapshot(), l.tx.snapshot());
                let d = &l.def;
                let mut v = json!({
                    "id": d.id,
                    "name": d.name,
                    "remote": d.remote.to_string(),
                    "format": match d.format { vnet_control::LinkFormat::Raw => "raw", vnet_control::LinkFormat::Vnet => "vnet" },
                    "network": d.network,
                    "mtu": d.mtu,
                });
                counters_into(&mut v, rx, tx);
                if let Some(k) = &self.kernel {
                    add_kernel(&mut v, k.link_counters(d.id));
                }
                v
            })
            .collect()
    }

    fn ifaces_json(&self) -> Vec<Value> {
        self.ifaces
            .values()
            .map(|p| {
                let def = self.state.interfaces.get(&p.id);
                let mut v = json!({
                    "id": p.id,
                    "name": p.name,
                    "dev": p.dev,
                    "netns": def.and_then(|d| d.netns.clone()).unwrap_or_else(|| "-".into()),
                    "mac": p.mac.map_or("-".to_string(), |m| m.to_string()),
                    "kind": def.map_or("tap", |d| d.kind.word()),
                    "offload": p.vnet_hdr,
                    "queues": p.queues.len(),
                    "rx_ring": !p.rings.is_empty(),
                    "mode": p.mode.word(),
                    "datapath": if self.kernel_ifaces.contains_key(&p.id) { "kernel" } else { "user" },
                    "datapath_reason": self.user_reasons.get(&p.id),
                    "dispatch": p.dispatch.mode_word(),
                    "mode_switches": p.dispatch.switches.load(Relaxed),
                    "wakeups": p.dispatch.wakeups.load(Relaxed),
                });
                counters_into(&mut v, p.rx.snapshot(), p.tx.snapshot());
                if let (Some(d), Value::Object(m)) = (&p.vhost, &mut v) {
                    let s = &d.stats;
                    for (k, n) in [
                        ("queues", d.pairs as u64),
                        ("vhost_connected", s.connected.load(Relaxed) as u64),
                        ("vhost_connections", s.connections.load(Relaxed)),
                        ("vhost_features", s.features.load(Relaxed)),
                        ("kicks", s.kicks.load(Relaxed)),
                        ("rx_kicks", s.rx_kicks.load(Relaxed)),
                        ("signals", s.signals.load(Relaxed)),
                        ("early_signals", s.early_signals.load(Relaxed)),
                        ("signals_suppressed", s.signals_suppressed.load(Relaxed)),
                        ("rx_no_buffers", s.rx_no_buffers.load(Relaxed)),
                        ("bad_chains", s.bad_chains.load(Relaxed)),
                    ] {
                        m.insert(k.into(), n.into());
                    }
                    m.insert("offload".into(), d.takes_offloads().into());
                    let per_pair = |c: &[std::sync::atomic::AtomicU64]| -> Value {
                        c.iter().take(d.pairs).map(|n| n.load(Relaxed)).collect::<Vec<_>>().into()
                    };
                    m.insert("pair_rx_frames".into(), per_pair(&s.pair_rx));
                    m.insert("pair_tx_frames".into(), per_pair(&s.pair_tx));
                }
                if let (Some(k), Some(ki)) = (&self.kernel, self.kernel_ifaces.get(&p.id)) {
                    add_kernel(&mut v, k.iface_counters(ki.ifindex));
                }
                v
            })
            .collect()
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
            if let Some(k) = &self.kernel {
                m.insert("kernel_route_entries".into(), k.entries.into());
                m.insert("kernel_route_overflow".into(), k.overflow.into());
                for (name, n) in k.stats() {
                    m.insert(name.into(), n.into());
                }
            }
        }
        v
    }

    fn global_user_json(&self) -> Value {
        let g = &self.shared.global;
        json!({
            "no_route": g.no_route.load(Relaxed),
            "unknown_source": g.unknown_source.load(Relaxed),
            "malformed": g.malformed.load(Relaxed),
            "wrong_network": g.wrong_network.load(Relaxed),
            "reasm_fragments": g.reasm_fragments.load(Relaxed),
            "reasm_completed": g.reasm_completed.load(Relaxed),
            "reasm_timed_out": g.reasm_timed_out.load(Relaxed),
            "reasm_evicted": g.reasm_evicted.load(Relaxed),
            "reasm_rejected": g.reasm_rejected.load(Relaxed),
            "route_cache_hits": g.cache_hits.load(Relaxed),
            "route_cache_misses": g.cache_misses.load(Relaxed),
            "route_table_generation": self.generation,
            "unsupported_flags": g.unsupported_flags.load(Relaxed),
            "rx_whole_batches": g.rx_whole_batches.load(Relaxed),
            "link_recv_calls": g.link_recv_calls.load(Relaxed),
            "link_recv_messages": g.link_recv_messages.load(Relaxed),
            "sw_segmented": g.sw_segmented.load(Relaxed),
            "sw_checksummed": g.sw_checksummed.load(Relaxed),
            "offload_errors": g.offload_errors.load(Relaxed),
            "offload_refused": g.offload_refused.load(Relaxed),
            "gso_fallbacks": g.gso_fallbacks.load(Relaxed),
            "link_mode": self.state.listen_mode.word(),
            "link_dispatch": g.link_dispatch.mode_word(),
            "link_mode_switches": g.link_dispatch.switches.load(Relaxed),
            "link_wakeups": g.link_dispatch.wakeups.load(Relaxed),
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn counters_into(v: &mut Value, rx: Snapshot, tx: Snapshot) {
    add_counters(
        v,
        &[
            ("rx_packets", rx.packets),
            ("rx_bytes", rx.bytes),
            ("rx_drops", rx.drops),
            ("tx_packets", tx.packets),
            ("tx_bytes", tx.bytes),
            ("tx_drops", tx.drops),
        ],
    );
}

/// Adds what the kernel path moved for a port to its (user path) counters,
/// so `show` reports the port's whole traffic, and shows the kernel's part.
fn add_kernel(v: &mut Value, k: crate::sys::bpf::PortStats) {
    add_counters(
        v,
        &[
            ("rx_packets", k.rx_packets),
            ("rx_bytes", k.rx_bytes),
            ("tx_packets", k.tx_packets),
            ("tx_bytes", k.tx_bytes),
            ("kernel_rx_packets", k.rx_packets),
            ("kernel_tx_packets", k.tx_packets),
        ],
    );
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

/// Adds each named count to the object's field of that name (0 if absent).
fn add_counters(v: &mut Value, counts: &[(&str, u64)]) {
    if let Value::Object(m) = v {
        for &(key, n) in counts {
            let sum = m.get(key).and_then(Value::as_u64).unwrap_or(0) + n;
            m.insert(key.into(), sum.into());
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

/// Whether the workers must be restarted for a change.
fn restart_needed(
    new_socket: &Option<(Arc<UdpSocket>, Vec<Arc<UdpSocket>>)>,
    mode_changed: bool,
    opened: &[Arc<IfacePort>],
    ifaces: &BTreeMap<u32, Arc<IfacePort>>,
    next: &State,
) -> bool {
    new_socket.is_some()
        || mode_changed
        || !opened.is_empty()
        || ifaces.keys().any(|id| !next.interfaces.contains_key(id))
}

fn bind(addr: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    if let Err(e) = sys::set_socket_buffers(&s, dataplane::SOCKET_BUFFER) {
        tracing::warn!("socket buffers left at the default: {e}");
    }
    Ok(Arc::new(s))
}

/// Binds the listening socket and the pool of sending sockets (same
/// address, ephemeral ports).
fn bind_all(addr: SocketAddr) -> std::io::Result<(Arc<UdpSocket>, Vec<Arc<UdpSocket>>)> {
    let sock = bind(addr)?;
    if let Err(e) = sys::udp_enable_gro(&*sock) {
        tracing::warn!("UDP GRO refused ({e}): receiving datagram by datagram");
    }
    let pool = (0..dataplane::TX_POOL)
        .map(|_| bind(SocketAddr::new(addr.ip(), 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok((sock, pool))
}

/// Opens an interface's device, in its namespace if it has one: a TAP
/// (created if missing, one file per queue, MAC and MTU set, brought up) or
/// a packet socket on an existing netdev (MTU set if asked; its MAC is the
/// host side's, not the VM's, so it is left alone). With `offload`, frames
/// carry a `virtio_net_hdr` and the TAP accepts checksum and TSO offloads;
/// where the kernel refuses, the interface works without them.
fn open_iface(def: &InterfaceDef, shared: &Arc<Shared>, cpus: &[usize]) -> std::io::Result<IfacePort> {
    let g = &shared.global;
    let dispatch = Arc::<dataplane::DispatchStats>::default();
    let port = |queues, rings, mac, vnet_hdr, vhost| IfacePort {
        id: def.id,
        name: def.name.clone(),
        dev: def.dev.clone(),
        mac,
        queues,
        rings,
        vnet_hdr,
        vhost,
        mode: def.mode,
        rx: Counters::default(),
        tx: Counters::default(),
        dispatch: dispatch.clone(),
    };
    if def.kind == IfaceKind::VhostUser {
        let path = std::path::Path::new(&def.dev);
        let cfg = vhost::Serve { pairs: def.queues as usize, mode: def.mode, cpus: cpus.to_vec() };
        let dev = vhost::serve(shared, def.id, &def.name, path, cfg, dispatch.clone())?;
        return Ok(port(Vec::new(), Vec::new(), def.mac, true, Some(dev)));
    }
    let (dev, kind, mac, mtu) = (def.dev.clone(), def.kind, def.mac, def.mtu);
    let (queues, offload) = (def.queues.max(1) as usize, def.offload);
    type Devices =
        (Vec<std::fs::File>, Vec<std::sync::Mutex<sys::RxRing>>, Option<vnet_wire::MacAddr>, bool, bool);
    let setup = move || -> std::io::Result<Devices> {
        let mut files = Vec::new();
        let mut rings = Vec::new();
        let mut vnet_hdr = offload;
        let mut refused = false;
        match kind {
            IfaceKind::Tap => {
                for _ in 0..queues {
                    let f = sys::open_tap(&dev, offload, queues > 1)?;
                    if offload && sys::tap_enable_offloads(&f, sys::TAP_OFFLOADS).is_err() {
                        // The header stays on (set at open); offloads are off.
                        refused = true;
                    }
                    files.push(f);
                }
            }
            IfaceKind::VhostUser => {
                return Err(std::io::Error::other("a vhost-user interface has no device"))
            }
            IfaceKind::Netdev => {
                let f = sys::open_packet(&dev)?;
                if offload && sys::packet_enable_vnet_hdr(&f).is_err() {
                    vnet_hdr = false;
                    refused = true;
                }
                match sys::RxRing::new(&f, dataplane::RX_RING_BLOCKS, vnet_hdr) {
                    Ok(r) => rings.push(std::sync::Mutex::new(r)),
                    Err(e) => {
                        tracing::warn!(device = %dev, "no receive ring ({e}): frames are read one by one")
                    }
                }
                files.push(f);
            }
        }
        if let (IfaceKind::Tap, Some(m)) = (kind, mac) {
            sys::set_mac(&dev, m)?;
        }
        if kind == IfaceKind::Tap && vnet_hdr && sys::set_gso_max_size(&dev, dataplane::TAP_GSO_MAX).is_err()
        {
            refused = true;
        }
        if let Some(m) = mtu {
            sys::set_mtu(&dev, m)?;
        }
        sys::set_up(&dev)?;
        let mac = match kind {
            IfaceKind::Tap => Some(sys::get_mac(&dev)?),
            IfaceKind::Netdev | IfaceKind::VhostUser => mac,
        };
        Ok((files, rings, mac, vnet_hdr, refused))
    };
    let (files, rings, mac, vnet_hdr, refused) = match &def.netns {
        Some(ns) => sys::in_netns(&sys::netns_path(ns), setup)?,
        None => setup()?,
    };
    if refused {
        g.offload_refused.fetch_add(1, Relaxed);
        tracing::warn!(interface = %def.name, "the kernel refused offloads: frames are finished in software");
    }
    Ok(port(files, rings, mac, vnet_hdr, None))
}

/// Interfaces opened by a transaction not yet committed: their vhost-user
/// servers are stopped if it fails.
struct Opened(Vec<Arc<IfacePort>>);

impl Opened {
    fn keep(mut self) -> Vec<Arc<IfacePort>> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        for v in self.0.iter().filter_map(|p| p.vhost.as_ref()) {
            v.stop();
        }
    }
}
