//! What `show` reports of each route, link and interface, as typed views.
//!
//! One view per row, `#[derive(Serialize)]`, each field documented here
//! and named once: `show ... json` is the view serialized, the text
//! tables are columns of it, and Prometheus text is every numeric field of
//! it (`vnet_<kind>_<field>{<kind>="name"}`). The counters the engine
//! keeps (`SecureStats`, `DispatchStats`, a vhost device's `RingStats`)
//! are flattened in as they are named where they are defined.

use super::Daemon;
use crate::iface::vhost::RingStats;
use crate::sys::bpf::PortStats;
use serde::Serialize;
use serde_json::{Map, Value};
use std::sync::atomic::Ordering::Relaxed;
use vnet_core::stats::Snapshot;
use vnet_core::Port;
use vnet_engine::dispatch::DispatchStats;
use vnet_engine::link::Liveness;
use vnet_engine::secure::{Mode, SecureStats};

/// A port's traffic: the user path's counters plus, on the kernel path,
/// what the programs moved (so a port's whole traffic shows).
#[derive(Debug, Default, Serialize)]
pub struct Traffic {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_drops: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_drops: u64,
    /// The kernel path's part of `rx_packets` and `tx_packets` (absent
    /// when the kernel path does not serve the port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_rx_packets: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_tx_packets: Option<u64>,
}

impl Traffic {
    fn new(rx: Snapshot, tx: Snapshot, kernel: Option<PortStats>) -> Self {
        let k = kernel.unwrap_or_default();
        Traffic {
            rx_packets: rx.packets + k.rx_packets,
            rx_bytes: rx.bytes + k.rx_bytes,
            rx_drops: rx.drops,
            tx_packets: tx.packets + k.tx_packets,
            tx_bytes: tx.bytes + k.tx_bytes,
            tx_drops: tx.drops,
            kernel_rx_packets: kernel.map(|k| k.rx_packets),
            kernel_tx_packets: kernel.map(|k| k.tx_packets),
        }
    }
}

/// A route (`show routes`): its rule and what it matched.
#[derive(Debug, Serialize)]
pub struct RouteView {
    pub id: u32,
    pub src: String,
    pub dst: String,
    /// `link NAME` or `interface NAME`.
    pub to: String,
    /// `any`, or the port the frame must come from.
    pub from: String,
    /// Frames (and their bytes) the route sent, and drops on its way.
    #[serde(flatten)]
    pub counters: Snapshot,
}

/// A link (`show links`).
#[derive(Debug, Serialize)]
pub struct LinkView<'a> {
    pub id: u32,
    pub name: &'a str,
    /// The transport word: `udp`, `vxlan`, `tcp`, `direct`.
    pub kind: &'static str,
    /// The peer's address (or the LAN device of a `direct` link).
    pub remote: String,
    /// `raw`, `vnet`, `vxlan`, `stream`, `tls` or `ethernet`.
    pub format: &'static str,
    /// The `vnet` network id, or the VXLAN VNI (0 otherwise).
    pub network: u32,
    /// The underlay MTU, and the largest frame that goes whole in it.
    pub mtu: u32,
    pub max_frame: usize,
    /// Frames too big for the link (dropped, or segmented first).
    pub too_big: u64,
    #[serde(flatten)]
    pub traffic: Traffic,
    /// `up`, `down` or `quiet` (no keepalives asked), and `up` as 0/1.
    pub state: &'static str,
    pub up: u64,
    /// Milliseconds since the peer was last heard from (-1: never).
    pub last_rx_ms: i64,
    pub keepalives_sent: u64,
    pub keepalives_received: u64,
    /// Times the link went down.
    pub downs: u64,
    /// With the kernel path loaded: `kernel` or `user`, and why `user`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datapath: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datapath_reason: Option<&'a str>,
    /// A `vnet` link's path MTU: the size in use, the search's phase
    /// (`base`, `searching`, `done`, `unanswered`), probes sent and answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pmtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pmtu_search: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pmtu_probes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pmtu_probes_acked: Option<u64>,
    /// A secured link's mode and handshake state, and its counters.
    #[serde(flatten)]
    pub security: Option<SecurityView<'a>>,
    /// What the link's I/O reports of itself (`link::LinkIo::status`: a
    /// TCP link's connection, for one).
    #[serde(flatten)]
    pub io: Map<String, Value>,
}

/// A secured link's part of [`LinkView`].
#[derive(Debug, Serialize)]
pub struct SecurityView<'a> {
    /// `auth` or `encrypt`.
    pub security: &'static str,
    /// Whether a session is established.
    pub established: bool,
    /// The AEAD the session seals with (`aes-256-gcm` or
    /// `chacha20-poly1305`; empty without a session), and the link's
    /// `cipher` option (`auto` or the one it names).
    pub cipher: &'static str,
    pub cipher_option: &'static str,
    /// Where the link sends now: the configured remote, or the address its
    /// peer was last authenticated from (roaming).
    pub endpoint: String,
    /// Times the link followed its peer to a new address.
    pub roams: u64,
    /// Which path the link's datagrams take: `direct` (to the configured
    /// remote), `punched` (a `nat` link, to the address and port its peer's
    /// datagrams authenticate from: a NAT's mapping) or `roamed` (to the
    /// address its peer moved to); and why, in words.
    pub path: &'static str,
    pub path_why: String,
    /// Where the peer sees this host (a `nat` link: behind NAT, this host's
    /// public mapping, as the peer reflects it); empty until it says.
    pub seen_as: String,
    /// Datagrams sent and received through the relay (a `relay` link).
    pub relayed_tx: u64,
    pub relayed_rx: u64,
    #[serde(flatten)]
    pub stats: &'a SecureStats,
}

/// An interface (`show interfaces`).
#[derive(Debug, Serialize)]
pub struct IfaceView<'a> {
    pub id: u32,
    pub name: &'a str,
    pub dev: &'a str,
    /// The namespace its device was moved to, or `-`.
    pub netns: &'a str,
    pub mac: String,
    /// The policy groups its MAC is in by its declaration (`group G`; a
    /// pod's labels through vnet-cni).
    pub groups: &'a [String],
    /// The IP source guard: `on`, or `off (no addresses)` for an
    /// interface that owns no address (its VM may send from any).
    pub source_guard: &'static str,
    /// The addresses its VM may send from when guarded: its `addresses`,
    /// the `neigh` lines naming its MAC, the link-local of its MAC.
    pub addresses: Vec<String>,
    /// `tap`, `netdev`, `vhost-user`.
    pub kind: &'static str,
    /// Whether frames carry offloads (a `virtio_net_hdr` the device honours).
    pub offload: bool,
    /// Queues (or a vhost-user device's queue pairs).
    pub queues: usize,
    /// A netdev's `TPACKET_V2` receive ring.
    pub rx_ring: bool,
    /// The kernel path's hand-off TAP for it, if any.
    pub handoff: Option<String>,
    /// `notify`, `poll` or `adaptive`, as declared.
    pub mode: &'static str,
    /// `kernel` or `user`, and why `user` when the kernel path was asked.
    pub datapath: &'static str,
    pub datapath_reason: Option<&'a str>,
    /// Broadcast frames a second it may send (0: no limit).
    pub broadcast_limit: u32,
    /// `present`, or `gone` (its device vanished; reattached when it returns).
    pub device: &'static str,
    /// `active`, or `standby` (waiting for its VM: a live migration's
    /// destination) and `arrived` (its VM sent; being activated).
    pub state: &'static str,
    pub reattached: u64,
    /// Broadcast frames over `broadcast_limit` (dropped).
    pub broadcast_limited: u64,
    #[serde(flatten)]
    pub dispatch: &'a DispatchStats,
    #[serde(flatten)]
    pub traffic: Traffic,
    #[serde(flatten)]
    pub vhost: Option<VhostView<'a>>,
}

/// A vhost-user interface's part of [`IfaceView`].
#[derive(Debug, Serialize)]
pub struct VhostView<'a> {
    #[serde(flatten)]
    pub rings: &'a RingStats,
    /// Per queue pair: frames placed in its RX ring, chains taken from its TX ring.
    pub pair_rx_frames: Vec<u64>,
    pub pair_tx_frames: Vec<u64>,
    /// 1 while QEMU has vnetd log the guest pages it writes (a live
    /// migration), and the writes logged since the guest's memory was
    /// last mapped.
    pub vhost_logging: u64,
    pub vhost_logged_writes: u64,
}

impl Daemon {
    pub(super) fn route_views(&self) -> Vec<RouteView> {
        let port = |p: Port| {
            let kind = if p.is_link() { "link" } else { "interface" };
            format!("{kind} {}", self.state.port_name(p))
        };
        let plane = self.shared.plane.load();
        let table = &plane.table;
        self.state
            .routes
            .values()
            .map(|r| RouteView {
                id: r.id,
                src: r.src.to_string(),
                dst: r.dst.to_string(),
                to: port(r.to),
                from: match r.from {
                    vnet_core::SourceFilter::Any => "any".to_string(),
                    vnet_core::SourceFilter::Port(p) => port(p),
                },
                counters: table.route_by_id(r.id).map(|c| c.counters.snapshot()).unwrap_or_default(),
            })
            .collect()
    }

    pub(super) fn link_views(&self) -> Vec<LinkView<'_>> {
        let now = self.shared.now_ns();
        self.links
            .running
            .values()
            .map(|l| {
                let d = &l.def;
                let (format, network) = d.transport.encapsulation();
                let (a, state) = (&l.alive, l.liveness(now));
                let mut io = Map::new();
                if let Some(link_io) = self.links.io.get(&d.id) {
                    link_io.status(&mut io);
                }
                let reason = self.kernel.link_reasons.get(&d.name).map(String::as_str);
                LinkView {
                    id: d.id,
                    name: &d.name,
                    kind: d.transport.word(),
                    remote: d.remote().map_or_else(|| d.transport.peer(), |r| r.to_string()),
                    format,
                    network,
                    mtu: d.mtu,
                    max_frame: l.max_whole_frame(),
                    too_big: l.too_big.load(Relaxed),
                    traffic: Traffic::new(
                        l.rx.snapshot(),
                        l.tx.snapshot(),
                        self.kernel.path.as_ref().map(|k| k.link_counters(d.id)),
                    ),
                    state: state.word(),
                    up: u64::from(state == Liveness::Up),
                    last_rx_ms: a.age_ns(now).map_or(-1, |n| (n / 1_000_000) as i64),
                    keepalives_sent: a.keepalives_sent.load(Relaxed),
                    keepalives_received: a.keepalives_received.load(Relaxed),
                    downs: a.downs.load(Relaxed),
                    datapath: self
                        .kernel
                        .path
                        .as_ref()
                        .map(|_| if reason.is_some() { "user" } else { "kernel" }),
                    datapath_reason: reason.filter(|_| self.kernel.path.is_some()),
                    pmtu: l.pmtu.as_ref().map(|p| p.current()),
                    pmtu_search: l.pmtu.as_ref().map(|p| p.phase().word()),
                    pmtu_probes: l.pmtu.as_ref().map(|p| p.probes_sent.load(Relaxed)),
                    pmtu_probes_acked: l.pmtu.as_ref().map(|p| p.probes_acked.load(Relaxed)),
                    security: l.secure.as_ref().map(|sec| {
                        let (path, path_why) = link_path(l);
                        SecurityView {
                            security: if sec.mode() == Mode::Auth { "auth" } else { "encrypt" },
                            established: sec.established(),
                            cipher: sec.aead().map_or("", |a| a.word()),
                            cipher_option: sec.policy().cipher.word(),
                            endpoint: l.endpoint().map_or_else(String::new, |e| e.to_string()),
                            roams: l.roams.load(Relaxed),
                            path,
                            path_why,
                            seen_as: l.seen_as.load().as_deref().map_or_else(String::new, |a| a.to_string()),
                            relayed_tx: l.relayed_tx.load(Relaxed),
                            relayed_rx: l.relayed_rx.load(Relaxed),
                            stats: &sec.stats,
                        }
                    }),
                    io,
                }
            })
            .collect()
    }

    pub(super) fn iface_views(&self) -> Vec<IfaceView<'_>> {
        let plane = self.shared.plane.load();
        self.ifaces
            .running
            .values()
            .map(|p| {
                let (def, i) = (&p.def, &p.iface);
                let vhost = p.dev.vhost();
                let kernel = self.kernel.ifaces.get(&def.id);
                IfaceView {
                    id: def.id,
                    name: &def.name,
                    dev: &def.dev,
                    netns: def.netns.as_deref().unwrap_or("-"),
                    mac: i.mac.map_or("-".to_string(), |m| m.to_string()),
                    groups: &def.groups,
                    source_guard: if plane.guards.contains_key(&def.id) {
                        "on"
                    } else {
                        "off (no addresses)"
                    },
                    addresses: plane
                        .guards
                        .get(&def.id)
                        .map_or_else(Vec::new, |o| o.addrs().iter().map(|a| a.to_string()).collect()),
                    kind: def.kind.word(),
                    offload: vhost.map_or_else(|| p.dev.vnet_hdr(), |d| d.takes_offloads()),
                    queues: vhost.map_or_else(|| p.dev.queues(), |d| d.pairs),
                    rx_ring: p.dev.rx_ring(),
                    handoff: p.dev.hand_off_name(),
                    mode: def.mode.word(),
                    datapath: if kernel.is_some() { "kernel" } else { "user" },
                    datapath_reason: self.kernel.user_reasons.get(&def.id).map(String::as_str),
                    broadcast_limit: def.broadcast_limit,
                    device: if self.ifaces.gone.contains_key(&def.id) { "gone" } else { "present" },
                    state: match i.standby() {
                        vnet_engine::plane::WAITING => "standby",
                        vnet_engine::plane::ARRIVED => "arrived",
                        _ => "active",
                    },
                    reattached: self.ifaces.reattached.get(&def.id).copied().unwrap_or(0),
                    broadcast_limited: i.broadcast_limited.load(Relaxed),
                    dispatch: &p.dispatch,
                    traffic: Traffic::new(
                        i.rx.snapshot(),
                        i.tx.snapshot(),
                        self.kernel.path.as_ref().zip(kernel).map(|(k, ki)| k.iface_counters(ki.ifindex)),
                    ),
                    vhost: vhost.map(|d| {
                        let per_pair = |c: &[std::sync::atomic::AtomicU64]| {
                            c.iter().take(d.pairs).map(|n| n.load(Relaxed)).collect()
                        };
                        let (logging, logged) = d.dirty_log();
                        VhostView {
                            rings: &d.stats,
                            pair_rx_frames: per_pair(&d.stats.pair_rx),
                            pair_tx_frames: per_pair(&d.stats.pair_tx),
                            vhost_logging: u64::from(logging),
                            vhost_logged_writes: logged,
                        }
                    }),
                }
            })
            .collect()
    }
}

/// A view as the JSON rows `show` and the metrics are made of.
pub(super) fn rows<T: Serialize>(views: &[T]) -> Vec<Value> {
    views.iter().map(|v| serde_json::to_value(v).unwrap_or(Value::Null)).collect()
}

/// Which path a secured link takes, and why ([`SecurityView::path`]).
fn link_path(l: &vnet_engine::Link) -> (&'static str, String) {
    let configured = l.def.remote().map_or_else(String::new, |r| r.to_string());
    if let Some(r) = l.relay_link().filter(|_| l.relaying.load(Relaxed)) {
        return (
            "relayed",
            format!(
                "through link {} (the relay): the peer was not heard from directly within {} ms",
                r.def.name,
                vnet_engine::link::DEAD_NS / 1_000_000
            ),
        );
    }
    match l.roamed.load().as_deref() {
        None => ("direct", format!("to the configured remote {configured}")),
        Some(at) if l.nat() => (
            "punched",
            format!(
                "to {at}, where the peer's datagrams authenticate from (its NAT's mapping), not {configured}"
            ),
        ),
        Some(at) => ("roamed", format!("to {at}, where the peer's datagrams now authenticate from")),
    }
}
