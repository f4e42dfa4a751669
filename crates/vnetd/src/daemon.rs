//! The daemon: turns declared [`State`] into open devices, sockets, workers
//! and a published [`Plane`], atomically.
//!
//! [`Daemon::apply`] validates commands against a copy of the state, then
//! acquires every new resource (binds the socket, opens the TAPs). Only if
//! all of that succeeds is the new plane published and the old resources
//! released; on any failure the new resources are dropped (closed) and the
//! running configuration is untouched, so traffic keeps flowing.

use crate::dataplane::{self, IfacePort, LinkPort, Plane, Shared, WorkerHandle};
use crate::sys;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{Command, Error, IfaceKind, InterfaceDef, Located, ShowWhat, State};
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

/// One host's vnet: configuration, resources and workers.
pub struct Daemon {
    state: State,
    shared: Arc<Shared>,
    generation: u64,
    ifaces: BTreeMap<u32, (Arc<IfacePort>, WorkerHandle)>,
    links: BTreeMap<u32, Arc<LinkPort>>,
    route_counters: BTreeMap<u32, Arc<Counters>>,
    socket: Option<(SocketAddr, Arc<UdpSocket>, WorkerHandle)>,
    reasm: reasm::Config,
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
            links: BTreeMap::new(),
            route_counters: BTreeMap::new(),
            socket: None,
            reasm: reasm::Config::default(),
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
        if self.socket.as_ref().map(|s| s.0) != Some(next.listen) {
            let sock = bind(next.listen).map_err(|e| {
                let pos = cmds
                    .iter()
                    .rev()
                    .find(|c| matches!(c.item, Command::Listen(_)))
                    .map_or(Default::default(), |c| c.pos);
                Error::new(pos, format!("an address vnetd can bind ({})", next.listen), format!("error: {e}"))
            })?;
            new_socket = Some(sock);
        }
        // Acquire: new interfaces.
        let mut opened = Vec::new();
        for (id, def) in &next.interfaces {
            if self.ifaces.contains_key(id) {
                continue;
            }
            let port = open_iface(def).map_err(|e| {
                Error::new(
                    decl_pos(&def.name),
                    "a device vnetd can open and configure",
                    format!("error: {e}"),
                )
            })?;
            opened.push(Arc::new(port));
        }

        // Everything acquired: build and publish the new plane.
        let socket = match &new_socket {
            Some(s) => Some(s.clone()),
            None => self.socket.as_ref().map(|s| s.1.clone()),
        };
        let mut ifaces: BTreeMap<u32, Arc<IfacePort>> = self
            .ifaces
            .iter()
            .filter(|(id, _)| next.interfaces.contains_key(id))
            .map(|(id, (p, _))| (*id, p.clone()))
            .collect();
        for p in &opened {
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
        };
        self.shared.plane.store(Arc::new(plane));

        // Start workers for what is new, stop those of what is gone.
        if let Some(sock) = new_socket {
            match dataplane::spawn_link_worker(&self.shared, sock.clone(), self.reasm) {
                Ok(w) => {
                    if let Some((_, _, old)) = self.socket.replace((next.listen, sock, w)) {
                        old.stop();
                    }
                }
                Err(e) => tracing::error!("cannot start the link worker: {e}"),
            }
        }
        let gone: Vec<u32> =
            self.ifaces.keys().filter(|id| !next.interfaces.contains_key(id)).copied().collect();
        for id in gone {
            if let Some((p, w)) = self.ifaces.remove(&id) {
                w.stop();
                tracing::info!(interface = %p.name, "interface removed");
            }
        }
        for p in opened {
            match dataplane::spawn_iface_worker(&self.shared, p.clone()) {
                Ok(w) => {
                    tracing::info!(interface = %p.name, dev = %p.dev, mac = ?p.mac, "interface attached");
                    self.ifaces.insert(p.id, (p, w));
                }
                Err(e) => tracing::error!("cannot start a worker for {}: {e}", p.name),
            }
        }
        self.links = links;
        self.route_counters = route_counters;
        self.state = next;
        Ok(())
    }

    /// Stops every worker and closes every device and socket.
    pub fn shutdown(&mut self) {
        self.shared.plane.store(Arc::new(Plane::default()));
        for (_, (_, w)) in std::mem::take(&mut self.ifaces) {
            w.stop();
        }
        if let Some((_, _, w)) = self.socket.take() {
            w.stop();
        }
    }

    /// The reply body of a `show` command.
    pub fn show(&self, what: ShowWhat, as_json: bool) -> String {
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
                v
            })
            .collect()
    }

    fn ifaces_json(&self) -> Vec<Value> {
        self.ifaces
            .values()
            .map(|(p, _)| {
                let def = self.state.interfaces.get(&p.id);
                let mut v = json!({
                    "id": p.id,
                    "name": p.name,
                    "dev": p.dev,
                    "netns": def.and_then(|d| d.netns.clone()).unwrap_or_else(|| "-".into()),
                    "mac": p.mac.map_or("-".to_string(), |m| m.to_string()),
                    "kind": match def.map(|d| d.kind) { Some(IfaceKind::Netdev) => "netdev", _ => "tap" },
                });
                counters_into(&mut v, p.rx.snapshot(), p.tx.snapshot());
                v
            })
            .collect()
    }

    fn global_json(&self) -> Value {
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
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn counters_into(v: &mut Value, rx: Snapshot, tx: Snapshot) {
    if let Value::Object(m) = v {
        for (k, n) in [
            ("rx_packets", rx.packets),
            ("rx_bytes", rx.bytes),
            ("rx_drops", rx.drops),
            ("tx_packets", tx.packets),
            ("tx_bytes", tx.bytes),
            ("tx_drops", tx.drops),
        ] {
            m.insert(k.into(), n.into());
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

fn bind(addr: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    if let Err(e) = sys::set_socket_buffers(&s, dataplane::SOCKET_BUFFER) {
        tracing::warn!("socket buffers left at the default: {e}");
    }
    Ok(Arc::new(s))
}

/// Opens an interface's device, in its namespace if it has one: a TAP
/// (created if missing, MAC and MTU set, brought up) or a packet socket on an
/// existing netdev (MTU set if asked; its MAC is the host side's, not the
/// VM's, so it is left alone).
fn open_iface(def: &InterfaceDef) -> std::io::Result<IfacePort> {
    let (dev, kind, mac, mtu) = (def.dev.clone(), def.kind, def.mac, def.mtu);
    let setup = move || {
        let file = match kind {
            IfaceKind::Tap => sys::open_tap(&dev)?,
            IfaceKind::Netdev => sys::open_packet(&dev)?,
        };
        if let (IfaceKind::Tap, Some(m)) = (kind, mac) {
            sys::set_mac(&dev, m)?;
        }
        if let Some(m) = mtu {
            sys::set_mtu(&dev, m)?;
        }
        sys::set_up(&dev)?;
        let mac = match kind {
            IfaceKind::Tap => Some(sys::get_mac(&dev)?),
            IfaceKind::Netdev => mac,
        };
        Ok((file, mac))
    };
    let (file, mac) = match &def.netns {
        Some(ns) => sys::in_netns(&sys::netns_path(ns), setup)?,
        None => setup()?,
    };
    Ok(IfacePort {
        id: def.id,
        name: def.name.clone(),
        dev: def.dev.clone(),
        mac,
        file,
        rx: Counters::default(),
        tx: Counters::default(),
    })
}
