//! The in-kernel fast path: loads `bpf/vnet.bpf.c` (built by `build.rs`
//! with clang), attaches it with TC, and keeps its maps equal to the
//! routing decisions of the published [`Plane`].
//!
//! vnetd stays the control plane and the slow path. The routing semantics
//! (Palacios priorities, no reflection, split horizon) are evaluated here,
//! in user space, by the same [`vnet_core::RouteTable::lookup`] the workers
//! use: for every port the kernel serves and every pair of known unicast
//! MACs, a decision with exactly one destination the kernel can reach is
//! written to the map; everything else is absent, and the programs leave
//! those frames to the user path. So behaviour is the same with and
//! without the fast path; only the speed differs.
//!
//! Updates are atomic: decisions go into the inactive one of two tables and
//! one write to `config.active` switches the programs over. Programs are
//! attached as TCX links owned by this process (aya detaches them on drop;
//! the kernel does when the process dies), so a stopped or killed vnetd
//! leaves nothing attached and a restart attaches afresh.

use crate::sys::bpf::{Cfg, LinkVal, PeerVal, PortStats, RouteKey, RouteVal, VxlanKey};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues};
use aya::programs::tc::SchedClassifierLinkId;
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use vnet_control::{LinkDef, LinkFormat, Security, Transport};
use vnet_core::{MacSpec, Port};
use vnet_engine::Plane;
use vnet_wire::MacAddr;

/// The object `build.rs` compiled (empty when clang was missing).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vnet.bpf.o"));

const PORT_LINK: u32 = 0x8000_0000;
const ACT_IFACE_PEER: u32 = 1;
const ACT_LINK: u32 = 2;
const ACT_IFACE_XMIT: u32 = 3;
const FMT_VNET: u8 = 1;
const FMT_VXLAN: u8 = 2;
/// Route entries per table (the maps' `max_entries`).
pub const MAX_ROUTES: usize = 65_536;
/// `PORT_SLOTS`: counter slots for the ports the kernel path serves (slot 0
/// is no port's: a port past the last shares it, uncounted).
const PORT_SLOTS: u32 = 4096;

/// The programs' counters, in the order of the C enum.
pub const STAT_NAMES: [&str; 9] = [
    "kernel_vm_frames",
    "kernel_local",
    "kernel_encap",
    "kernel_encap_bytes",
    "kernel_wire_datagrams",
    "kernel_decap",
    "kernel_decap_bytes",
    "kernel_to_user",
    "kernel_errors",
];

/// A local interface the kernel path serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIface {
    pub dev: String,
    pub ifindex: u32,
    /// A veth: frames for it go into its peer (`bpf_redirect_peer`);
    /// otherwise (a TAP QEMU holds) out of it (`bpf_redirect`).
    pub peer: bool,
    /// The ifindex of its hand-off TAP (what the program leaves to vnetd).
    pub handoff: u32,
}

/// Why the kernel path failed, or why it leaves something to the user
/// path. Its text is what the log and `show` say.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("vnetd was built without the eBPF object (clang was missing)")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("program {0} missing from the object")]
    NoProgram(String),
    #[error("map {0} missing")]
    NoMap(String),
    /// A program the kernel refused, or could not attach.
    #[error("{what}: {source}")]
    Program {
        what: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map that refused a read or write.
    #[error("{what}: {source}")]
    Map {
        what: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no route to {0} in /proc/net/route")]
    NoRoute(Ipv4Addr),
    /// Something the kernel path leaves to the user path by design.
    #[error("{0}")]
    UserPath(&'static str),
}

/// Why the kernel path cannot serve something.
pub type Reason = KernelError;

fn map_error(what: impl Into<String>) -> impl FnOnce(aya::maps::MapError) -> KernelError {
    let what = what.into();
    move |source| KernelError::Map { what, source }
}

fn program_error(what: impl Into<String>) -> impl FnOnce(aya::programs::ProgramError) -> KernelError {
    let what = what.into();
    move |source| KernelError::Program { what, source }
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KernelError {
    let what = what.into();
    move |source| KernelError::Io { what, source }
}

/// The loaded programs and their maps.
pub struct KernelPath {
    ebpf: Ebpf,
    /// Each served interface's TC link, and its ifindex (its key in
    /// `handoff`).
    vm_attached: BTreeMap<String, (SchedClassifierLinkId, u32)>,
    wire_attached: BTreeMap<String, SchedClassifierLinkId>,
    /// Keys written to each route table.
    tables: [BTreeSet<RouteKey>; 2],
    active: u32,
    peers: BTreeSet<u32>,
    vxlan_peers: BTreeSet<VxlanKey>,
    /// Each served port's (ifindex, or `PORT_LINK | link id`) counter slot.
    slots: BTreeMap<u32, u32>,
    /// Route entries in the live table, and decisions left out for lack of room.
    pub entries: usize,
    pub overflow: usize,
}

impl KernelPath {
    /// Loads the programs into the kernel (not attached yet).
    pub fn load() -> Result<Self, Reason> {
        if OBJECT.is_empty() {
            return Err(KernelError::NoObject);
        }
        let mut ebpf = Ebpf::load(OBJECT).map_err(KernelError::Load)?;
        for name in ["vnet_from_vm", "vnet_from_wire"] {
            let p: &mut SchedClassifier = program(&mut ebpf, name)?;
            p.load().map_err(program_error(format!("the kernel refused {name}")))?;
        }
        Ok(KernelPath {
            ebpf,
            vm_attached: BTreeMap::new(),
            wire_attached: BTreeMap::new(),
            tables: Default::default(),
            active: 0,
            peers: BTreeSet::new(),
            vxlan_peers: BTreeSet::new(),
            slots: BTreeMap::new(),
            entries: 0,
            overflow: 0,
        })
    }

    fn classifier(&mut self, name: &str) -> Result<&mut SchedClassifier, Reason> {
        program(&mut self.ebpf, name)
    }

    /// Serves interface `dev` (index `ifindex`): the frames its program
    /// leaves to vnetd go to hand-off device `handoff` (a TAP vnetd reads),
    /// then TC ingress.
    pub fn attach_iface(&mut self, dev: &str, ifindex: u32, handoff: u32) -> Result<(), Reason> {
        let mut m: BpfHashMap<&mut MapData, u32, u32> = map(&mut self.ebpf, "handoff")?;
        m.insert(ifindex, handoff, 0).map_err(map_error(format!("the hand-off of {dev}")))?;
        if !self.vm_attached.contains_key(dev) {
            match self.attach_ingress("vnet_from_vm", dev) {
                Ok(id) => {
                    self.vm_attached.insert(dev.to_string(), (id, ifindex));
                }
                Err(e) => {
                    self.forget_handoff(ifindex);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn forget_handoff(&mut self, ifindex: u32) {
        if let Ok(mut m) = map::<BpfHashMap<&mut MapData, u32, u32>>(&mut self.ebpf, "handoff") {
            let _ = m.remove(&ifindex);
        }
    }

    /// Attaches program `name` to TC ingress of `dev` (TCX, owned by vnetd).
    fn attach_ingress(&mut self, name: &str, dev: &str) -> Result<SchedClassifierLinkId, Reason> {
        self.classifier(name)?
            .attach(dev, TcAttachType::Ingress)
            .map_err(program_error(format!("attaching {name} to TC ingress of {dev}")))
    }

    /// Stops serving interface `dev` (its device may already be gone).
    pub fn detach_iface(&mut self, dev: &str) {
        if let Some((id, ifindex)) = self.vm_attached.remove(dev) {
            if let Ok(p) = self.classifier("vnet_from_vm") {
                let _ = p.detach(id);
            }
            self.forget_handoff(ifindex);
        }
    }

    /// Makes the maps say what `plane` says, for the interfaces in `ifaces`
    /// (by interface id), and attaches the wire program to every underlay
    /// device a link leaves by. `listen` is vnetd's link socket address.
    /// Returns the links the kernel cannot serve, with the reason.
    pub fn sync(
        &mut self,
        plane: &Plane,
        ifaces: &BTreeMap<u32, KernelIface>,
        listen: SocketAddr,
        listen_vxlan: Option<SocketAddr>,
    ) -> Result<Vec<(String, Reason)>, Reason> {
        // Links: where each one leaves, from which address.
        let mut link_vals = BTreeMap::new();
        let mut skipped = Vec::new();
        for (id, l) in &plane.links {
            match link_val(&l.def, listen) {
                Ok((v, dev)) => {
                    link_vals.insert(*id, (v, dev));
                }
                Err(r) => skipped.push((l.def.name.clone(), r)),
            }
        }
        let devs: BTreeSet<String> = link_vals.values().map(|(_, d)| d.clone()).collect();
        self.attach_wire(&devs)?;

        // A counter slot for every port served, zeroed when first given (the
        // programs only add). Slots of ports gone are freed after the switch
        // below, so that no live decision counts into a slot given again.
        let served: BTreeSet<u32> =
            ifaces.values().map(|k| k.ifindex).chain(link_vals.keys().map(|id| PORT_LINK | id)).collect();
        self.give_slots(&served)?;
        let slot = |p: u32| self.slots.get(&p).copied().unwrap_or(0);
        let links: BTreeMap<u32, LinkVal> = link_vals.iter().map(|(id, (v, _))| (*id, *v)).collect();
        let peer_vals: Vec<PeerVal> =
            links.iter().map(|(&id, v)| PeerVal { id, slot: slot(PORT_LINK | id), link: *v }).collect();
        // Decisions into the inactive table, then switch.
        let (decisions, overflow) = decisions(plane, ifaces, &links, &self.slots);

        // Peers first (a route may only name a link whose datagrams are known).
        self.write_peers(&peer_vals)?;

        self.switch_table(decisions, overflow, listen, listen_vxlan)?;

        // Ports that are gone: after the switch, no decision names their slots.
        self.slots.retain(|p, _| served.contains(p));
        Ok(skipped)
    }

    /// Attaches the wire program to each of `devs` (the underlay devices
    /// links leave by) and detaches it from the devices no link uses now.
    fn attach_wire(&mut self, devs: &BTreeSet<String>) -> Result<(), Reason> {
        for dev in devs {
            if !self.wire_attached.contains_key(dev) {
                let id = self.attach_ingress("vnet_from_wire", dev)?;
                self.wire_attached.insert(dev.clone(), id);
            }
        }
        let stale: Vec<String> = self.wire_attached.keys().filter(|d| !devs.contains(*d)).cloned().collect();
        for dev in stale {
            if let Some(id) = self.wire_attached.remove(&dev) {
                let _ = self.classifier("vnet_from_wire")?.detach(id);
            }
        }
        Ok(())
    }

    /// A counter slot for every port `served`, zeroed when first given (the
    /// programs only add).
    fn give_slots(&mut self, served: &BTreeSet<u32>) -> Result<(), Reason> {
        let cpus = aya::util::nr_cpus().map_err(|(w, e)| io_error(w)(e))?;
        let mut m: PerCpuArray<&mut MapData, PortStats> = map(&mut self.ebpf, "port_stats")?;
        let mut used: BTreeSet<u32> = self.slots.values().copied().collect();
        for &p in served {
            if self.slots.contains_key(&p) {
                continue;
            }
            let Some(slot) = (1..PORT_SLOTS).find(|s| !used.contains(s)) else {
                tracing::warn!(
                    port = p,
                    "the kernel path's {PORT_SLOTS} port counters are taken: not counted"
                );
                self.slots.insert(p, 0);
                continue;
            };
            let zero =
                PerCpuValues::try_from(vec![PortStats::default(); cpus]).map_err(io_error("port_stats"))?;
            m.set(slot, zero, 0).map_err(map_error("port_stats"))?;
            self.slots.insert(p, slot);
            used.insert(slot);
        }
        Ok(())
    }

    /// The `vnet` peers and VXLAN peers the wire program knows datagrams of.
    fn write_peers(&mut self, peer_vals: &[PeerVal]) -> Result<(), Reason> {
        {
            let mut m: BpfHashMap<&mut MapData, u32, PeerVal> = map(&mut self.ebpf, "peers")?;
            let mut now = BTreeSet::new();
            // Every entry written is remembered at once, so that a sync that
            // fails halfway leaves nothing the next one does not remove.
            for pv in peer_vals.iter().filter(|p| p.link.format != FMT_VXLAN) {
                let v = &pv.link;
                m.insert(v.remote_ip, pv, 0).map_err(map_error("peers"))?;
                self.peers.insert(v.remote_ip);
                now.insert(v.remote_ip);
            }
            for gone in self.peers.difference(&now) {
                let _ = m.remove(gone);
            }
            self.peers = now;
        }
        {
            let mut m: BpfHashMap<&mut MapData, VxlanKey, PeerVal> = map(&mut self.ebpf, "vxlan_peers")?;
            let mut now = BTreeSet::new();
            for pv in peer_vals.iter().filter(|p| p.link.format == FMT_VXLAN) {
                let k = VxlanKey { addr: pv.link.remote_ip, vni: pv.link.network };
                m.insert(k, pv, 0).map_err(map_error("vxlan_peers"))?;
                self.vxlan_peers.insert(k);
                now.insert(k);
            }
            for gone in self.vxlan_peers.difference(&now) {
                let _ = m.remove(gone);
            }
            self.vxlan_peers = now;
        }
        Ok(())
    }

    /// Writes `decisions` into the inactive route table and switches to it
    /// (one write of the config: readers see the old table or the new).
    fn switch_table(
        &mut self,
        decisions: BTreeMap<RouteKey, RouteVal>,
        overflow: usize,
        listen: SocketAddr,
        listen_vxlan: Option<SocketAddr>,
    ) -> Result<(), Reason> {
        let next = 1 - self.active;
        {
            let name = if next == 0 { "routes_0" } else { "routes_1" };
            let mut m: BpfHashMap<&mut MapData, RouteKey, RouteVal> = map(&mut self.ebpf, name)?;
            let table = &mut self.tables[next as usize];
            table.retain(|k| decisions.contains_key(k) || m.remove(k).is_err());
            for (k, v) in &decisions {
                m.insert(k, v, 0).map_err(map_error(name))?;
                table.insert(*k);
            }
        }
        let port = listen.port().to_be();
        {
            let mut cfg: Array<&mut MapData, Cfg> = map(&mut self.ebpf, "config")?;
            let vxlan_port = listen_vxlan.map_or(0, |a| a.port().to_be());
            cfg.set(0, Cfg { active: next, port, vxlan_port }, 0).map_err(map_error("config"))?;
        }
        self.active = next;
        self.tables[next as usize] = decisions.keys().copied().collect();
        self.entries = decisions.len();
        if overflow > 0 && self.overflow == 0 {
            tracing::warn!(
                entries = decisions.len(),
                left_to_user_path = overflow,
                "the kernel path's route map is full: the decisions that did not fit take the user path \
                 (counted as kernel_route_overflow)"
            );
        }
        self.overflow = overflow;
        Ok(())
    }

    /// What the kernel moved for an interface (by ifindex) or a link (by id).
    pub fn iface_counters(&self, ifindex: u32) -> PortStats {
        self.port_counters(ifindex)
    }
    pub fn link_counters(&self, id: u32) -> PortStats {
        self.port_counters(PORT_LINK | id)
    }

    fn port_counters(&self, port: u32) -> PortStats {
        let Some(&slot) = self.slots.get(&port).filter(|s| **s != 0) else { return PortStats::default() };
        let Some(m) = self.ebpf.map("port_stats") else { return PortStats::default() };
        let Ok(a) = PerCpuArray::<&MapData, PortStats>::try_from(m) else {
            return PortStats::default();
        };
        let Ok(vals) = a.get(&slot, 0) else { return PortStats::default() };
        vals.iter().fold(PortStats::default(), |a, v| PortStats {
            rx_packets: a.rx_packets + v.rx_packets,
            rx_bytes: a.rx_bytes + v.rx_bytes,
            tx_packets: a.tx_packets + v.tx_packets,
            tx_bytes: a.tx_bytes + v.tx_bytes,
        })
    }

    /// The programs' counters summed over CPUs, named by [`STAT_NAMES`].
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let Some(m) = self.ebpf.map("stats") else { return Vec::new() };
        let Ok(a) = PerCpuArray::<&MapData, u64>::try_from(m) else { return Vec::new() };
        STAT_NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, a.get(&(i as u32), 0).map_or(0, |v| v.iter().sum())))
            .collect()
    }
}

impl Drop for KernelPath {
    fn drop(&mut self) {
        let vms: Vec<String> = self.vm_attached.keys().cloned().collect();
        for d in vms {
            self.detach_iface(&d);
        }
        let wires: Vec<(String, SchedClassifierLinkId)> =
            std::mem::take(&mut self.wire_attached).into_iter().collect();
        if let Ok(p) = self.classifier("vnet_from_wire") {
            for (_, id) in wires {
                let _ = p.detach(id);
            }
        }
    }
}

/// The decisions the kernel can carry out: for each port it serves and each
/// pair of distinct known unicast MACs, the one destination the route table
/// gives, when that is a kernel interface (or, from an interface, a link the
/// kernel can send on). Returns them and how many did not fit the map.
///
/// The map is keyed by (port, destination, source), so a network of many
/// MACs (a cluster of 100000 VMs) has far more decisions than the map's
/// [`MAX_ROUTES`]: those stay with the user path, counted. The work is
/// bounded too: from a link only destinations that a route sends to a
/// kernel interface are tried, and once the map is full the rest is not
/// computed (the count is then an upper bound), so a transaction over
/// 100000 MACs costs milliseconds here, not the square of them.
pub fn decisions(
    plane: &Plane,
    ifaces: &BTreeMap<u32, KernelIface>,
    kernel_links: &BTreeMap<u32, LinkVal>,
    slots: &BTreeMap<u32, u32>,
) -> (BTreeMap<RouteKey, RouteVal>, usize) {
    let slot = |p: u32| slots.get(&p).copied().unwrap_or(0);
    let mut macs: BTreeSet<MacAddr> = BTreeSet::new();
    for r in plane.table.routes() {
        for spec in [r.src, r.dst] {
            if let Some(m) = spec.addr() {
                if !m.is_group() {
                    macs.insert(m);
                }
            }
        }
    }
    for p in plane.ifaces.values() {
        if let Some(m) = p.mac {
            macs.insert(m);
        }
    }
    let mut ports: Vec<(Port, u32)> =
        ifaces.iter().map(|(id, k)| (Port::Interface(*id), k.ifindex)).collect();
    ports.extend(kernel_links.keys().map(|id| (Port::Link(*id), PORT_LINK | id)));
    // Destinations a link's frames can have in the kernel: those routed to
    // a kernel interface (all of them if such a route matches any MAC).
    let mut to_kernel: BTreeSet<MacAddr> = BTreeSet::new();
    let mut to_kernel_any = false;
    for r in plane.table.routes() {
        if let Port::Interface(i) = r.to {
            if ifaces.contains_key(&i) {
                match r.dst {
                    MacSpec::Addr(m) => {
                        to_kernel.insert(m);
                    }
                    MacSpec::None => {}
                    MacSpec::Any | MacSpec::Not(_) => to_kernel_any = true,
                }
            }
        }
    }
    let link_dsts: Vec<MacAddr> = if to_kernel_any {
        macs.iter().copied().collect()
    } else {
        to_kernel.intersection(&macs).copied().collect()
    };
    let all_dsts: Vec<MacAddr> = macs.iter().copied().collect();
    let candidates: usize = ports
        .iter()
        .map(|(p, _)| macs.len() * if p.is_link() { link_dsts.len() } else { all_dsts.len() })
        .sum();
    let mut visited = 0;
    let mut out = BTreeMap::new();
    let mut overflow = 0;
    let mut found = Vec::new();
    for &(port, key_port) in &ports {
        let dsts = if port.is_link() { &link_dsts } else { &all_dsts };
        for &s in &macs {
            if out.len() >= MAX_ROUTES {
                // Full: what is left is the user path's.
                return (out, overflow + candidates.saturating_sub(visited));
            }
            visited += dsts.len();
            // Port security: from an interface locked to a MAC, frames with
            // another source are the user path's (which drops and counts them).
            if let Port::Interface(i) = port {
                if !plane.ifaces.get(&i).is_none_or(|f| f.may_send_from(s)) {
                    continue;
                }
            }
            for &d in dsts {
                if s == d {
                    continue;
                }
                plane.table.lookup(port, s, d, &mut found);
                let [(to, _)] = found[..] else { continue };
                let val = match to {
                    Port::Interface(i) => match ifaces.get(&i) {
                        Some(k) => RouteVal {
                            action: if k.peer { ACT_IFACE_PEER } else { ACT_IFACE_XMIT },
                            target: k.ifindex,
                            in_slot: slot(key_port),
                            out_slot: slot(k.ifindex),
                            link: LinkVal::default(),
                        },
                        None => continue,
                    },
                    Port::Link(l) if !port.is_link() => match kernel_links.get(&l) {
                        Some(v) => RouteVal {
                            action: ACT_LINK,
                            target: l,
                            in_slot: slot(key_port),
                            out_slot: slot(PORT_LINK | l),
                            link: *v,
                        },
                        None => continue,
                    },
                    Port::Link(_) => continue,
                };
                if out.len() >= MAX_ROUTES {
                    overflow += 1;
                    continue;
                }
                out.insert(RouteKey { port: key_port, dst: d.0, src: s.0 }, val);
            }
        }
    }
    (out, overflow)
}

/// Program `name` of the object, as its type `T`.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, Reason>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or_else(|| KernelError::NoProgram(name.into()))?;
    p.try_into().map_err(program_error(name))
}

/// Map `name` of the object, as its type `T`.
fn map<'a, T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<T, Reason> {
    let m = ebpf.map_mut(name).ok_or_else(|| KernelError::NoMap(name.into()))?;
    T::try_from(m).map_err(map_error(format!("map {name}")))
}

/// What the kernel needs to send on a link, and the underlay device; or
/// why the link stays on the user path.
fn link_val(def: &LinkDef, listen: SocketAddr) -> Result<(LinkVal, String), Reason> {
    let (remote, format, network) = match def.transport {
        Transport::Udp { security: Security::Auth(_) | Security::Encrypt(_), .. } => {
            // Kernel IPsec (xfrm) under the eBPF encapsulation is the way to
            // keep such links in the kernel; until it is built they are the
            // user path's, visibly (never sent unprotected).
            return Err(KernelError::UserPath(
                "a link with `security` is served by the user path, which authenticates and encrypts its \
                 datagrams (the kernel path has no IPsec yet)",
            ));
        }
        Transport::Udp { remote, format: LinkFormat::Vnet, network, security: Security::None } => {
            (remote, FMT_VNET, network)
        }
        // A VTEP takes the frames as the VM made them too: the outer headers
        // go through tunnel GSO, and a receiving VTEP (or vnetd) finishes
        // checksums; the VM's MTU must fit the link (else: the user path).
        Transport::Vxlan { remote, vni } => (remote, FMT_VXLAN, vni),
        Transport::Udp { format: LinkFormat::Raw, .. } => {
            // The kernel hands frames over as the VM made them (checksums
            // may be partial, TCP frames larger than a segment); a `vnet`
            // datagram says so with its WHOLE flag, a `raw` one cannot, and
            // a Palacios peer could not finish them.
            return Err(KernelError::UserPath(
                "the raw format (Palacios) stays on the user path: it cannot mark frames whose checksum or \
                 segmentation the receiver must finish",
            ));
        }
        Transport::Tcp { .. } => {
            return Err(KernelError::UserPath("TCP links are served by the user path (a stream is vnetd's)"))
        }
        Transport::Direct { .. } => {
            return Err(KernelError::UserPath("direct links are served by the user path"))
        }
    };
    let mtu = def.mtu;
    let IpAddr::V4(rip) = remote.ip() else {
        return Err(KernelError::UserPath("an IPv6 underlay is the user path's (not yet the kernel's)"));
    };
    let lip = match listen.ip() {
        IpAddr::V4(a) if !a.is_unspecified() => a,
        _ => local_ip_towards(rip).map_err(io_error(format!("no local address towards {rip}")))?,
    };
    let Hop { dev, gateway } = route_to(rip).ok_or(KernelError::NoRoute(rip))?;
    let ifindex = crate::sys::ifindex(&dev).map_err(io_error(format!("no ifindex for {dev}")))?;
    let v = LinkVal {
        remote_ip: u32::from_ne_bytes(rip.octets()),
        local_ip: u32::from_ne_bytes(lip.octets()),
        remote_port: remote.port().to_be(),
        format,
        pad: 0,
        network,
        ifindex,
        mtu,
        nexthop: u32::from_ne_bytes(gateway.unwrap_or(rip).octets()),
    };
    Ok((v, dev))
}

/// The source address the kernel would pick towards `ip`.
fn local_ip_towards(ip: Ipv4Addr) -> std::io::Result<Ipv4Addr> {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    s.connect((ip, 9))?;
    match s.local_addr()?.ip() {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(std::io::Error::other("an IPv6 source")),
    }
}

/// Where the route to an address leaves: its device, and its gateway
/// (`None`: the address is on the device's link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub dev: String,
    pub gateway: Option<Ipv4Addr>,
}

/// The longest-prefix IPv4 route to `ip` (this namespace's
/// `/proc/net/route`).
pub fn route_to(ip: Ipv4Addr) -> Option<Hop> {
    let text = std::fs::read_to_string("/proc/net/route").ok()?;
    best_route(&text, ip)
}

fn best_route(table: &str, ip: Ipv4Addr) -> Option<Hop> {
    let addr = u32::from_ne_bytes(ip.octets());
    let mut best: Option<(u32, Hop)> = None;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(dev), Some(dst), Some(gw), Some(mask)) = (f.first(), f.get(1), f.get(2), f.get(7)) else {
            continue;
        };
        let word = |s: &str| u32::from_str_radix(s, 16);
        let (Ok(dst), Ok(gw), Ok(mask)) = (word(dst), word(gw), word(mask)) else { continue };
        // The file holds the kernel's in-memory (network order) words.
        if addr & mask == dst && best.as_ref().is_none_or(|(m, _)| mask.count_ones() > m.count_ones()) {
            let gateway = (gw != 0).then(|| Ipv4Addr::from(gw.to_ne_bytes()));
            best = Some((mask, Hop { dev: dev.to_string(), gateway }));
        }
    }
    best.map(|(_, h)| h)
}

/// Whether `dev` is a TAP (frames for it leave by it) rather than a veth
/// (frames for it go into its peer).
pub fn is_tap(dev: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/net/{dev}/tun_flags")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use vnet_core::{Route, RouteTable, SourceFilter};
    use vnet_engine::port::Nowhere;
    use vnet_engine::{Iface, Link};

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    /// A `vnet` link `h<id>` to `remote`, sending nowhere.
    fn vnet_link(id: u32, remote: SocketAddr) -> Arc<Link> {
        let transport =
            Transport::Udp { remote, format: LinkFormat::Vnet, network: 0, security: Security::None };
        let def = vnet_control::LinkDef { id, name: format!("h{id}"), transport, mtu: 1500 };
        Arc::new(Link::new(def, Arc::new(Nowhere)))
    }

    fn iface(id: u32, m: MacAddr) -> Arc<Iface> {
        Arc::new(Iface::new(id, format!("vm{id}"), Some(m), Arc::new(Nowhere)))
    }

    #[test]
    fn decisions_are_the_route_tables_single_destination_answers() {
        let (a, b, c) = (mac(1), mac(2), mac(3));
        let any = SourceFilter::Any;
        let routes = vec![
            Route::new(0, MacSpec::Any, MacSpec::Addr(MacAddr::BROADCAST), Port::Link(0), any),
            Route::new(1, MacSpec::Any, MacSpec::Addr(b), Port::Link(0), any),
            Route::new(2, MacSpec::Any, MacSpec::Addr(a), Port::Interface(0), any),
            Route::new(3, MacSpec::Any, MacSpec::Addr(c), Port::Interface(1), any),
        ];
        let plane = Plane::new(
            RouteTable::new(1, routes),
            vec![iface(0, a), iface(1, c)],
            vec![vnet_link(0, "10.77.0.2:9000".parse().unwrap())],
        );
        let kif = |ifindex, peer| KernelIface { dev: String::new(), ifindex, peer, handoff: 0 };
        let ifaces: BTreeMap<u32, KernelIface> = [(0, kif(10, true)), (1, kif(11, false))].into();
        let link = LinkVal { remote_ip: 0x0200_4d0a, mtu: 1500, ..LinkVal::default() };
        let links: BTreeMap<u32, LinkVal> = [(0, link)].into();
        // Counter slots: interface A's veth 1, C's TAP 2, the link 3.
        let slots: BTreeMap<u32, u32> = [(10, 1), (11, 2), (PORT_LINK, 3)].into();
        let (d, overflow) = decisions(&plane, &ifaces, &links, &slots);
        assert_eq!(overflow, 0);
        let get = |port, dst: MacAddr, src: MacAddr| {
            d.get(&RouteKey { port, dst: dst.0, src: src.0 })
                .map(|v| (v.action, v.target, v.in_slot, v.out_slot))
        };
        // A -> B leaves by the link (which the decision carries); A -> C
        // goes out of C's TAP; from the link, B -> A goes into A's veth
        // peer. Each names the counter slots of both ports.
        assert_eq!(get(10, b, a), Some((ACT_LINK, 0, 1, 3)));
        assert_eq!(d[&RouteKey { port: 10, dst: b.0, src: a.0 }].link, link);
        assert_eq!(get(10, c, a), Some((ACT_IFACE_XMIT, 11, 1, 2)));
        assert_eq!(get(PORT_LINK, a, b), Some((ACT_IFACE_PEER, 10, 3, 1)));
        // No reflection (link -> same link, interface -> itself), no group
        // destinations: those stay with the user path.
        assert_eq!(get(PORT_LINK, b, a), None);
        assert_eq!(get(10, a, c), None);
        assert!(d.keys().all(|k| k.dst[0] & 1 == 0));
        // Port security: with interface 0 locked to A, its frames from
        // another source (B to C) are the user path's, which drops them.
        assert_eq!(get(10, c, b), Some((ACT_IFACE_XMIT, 11, 1, 2)));
        let locked = Arc::new(Iface::new(0, "vm0", Some(a), Arc::new(Nowhere)).locked_to(Some(a)));
        let plane = Plane::new(
            RouteTable::new(2, plane.table.routes().to_vec()),
            vec![locked, iface(1, c)],
            plane.links.values().cloned().collect(),
        );
        let (d, _) = decisions(&plane, &ifaces, &links, &slots);
        assert_eq!(d.get(&RouteKey { port: 10, dst: c.0, src: b.0 }), None);
        assert_eq!(
            d.get(&RouteKey { port: 10, dst: c.0, src: a.0 }).map(|v| (v.action, v.target)),
            Some((ACT_IFACE_XMIT, 11))
        );
        // A route change is a different answer.
        let none = decisions(&Plane::default(), &ifaces, &links, &slots).0;
        assert!(none.is_empty());
    }

    #[test]
    fn a_network_of_100000_macs_fills_the_map_counts_the_rest_and_costs_milliseconds() {
        // Two kernel interfaces here, 100000 MACs behind 1000 links (a
        // cluster's view): far more decisions than the map holds.
        let any = SourceFilter::Any;
        let big = |i: u32| MacAddr([0x52, 0x54, 1, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        let (a, c) = (mac(1), mac(3));
        let mut routes = vec![
            Route::new(0, MacSpec::Any, MacSpec::Addr(a), Port::Interface(0), any),
            Route::new(1, MacSpec::Any, MacSpec::Addr(c), Port::Interface(1), any),
        ];
        let links = (0..1000u32)
            .map(|l| {
                vnet_link(l, SocketAddr::new(Ipv4Addr::new(10, 1, (l >> 8) as u8, l as u8).into(), 9000))
            })
            .collect();
        for i in 0..100_000u32 {
            routes.push(Route::new(i + 2, MacSpec::Any, MacSpec::Addr(big(i)), Port::Link(i % 1000), any));
        }
        let plane = Plane::new(RouteTable::new(1, routes), vec![iface(0, a), iface(1, c)], links);
        let kif = |ifindex| KernelIface { dev: String::new(), ifindex, peer: true, handoff: 0 };
        let ifaces: BTreeMap<u32, KernelIface> = [(0, kif(10)), (1, kif(11))].into();
        let t0 = std::time::Instant::now();
        let links = (0..1000).map(|l| (l, LinkVal::default())).collect();
        let (d, overflow) = decisions(&plane, &ifaces, &links, &BTreeMap::new());
        let took = t0.elapsed();
        assert_eq!(d.len(), MAX_ROUTES);
        assert!(overflow > 100_000, "{overflow}");
        // Debug builds are ~20x slower than release; either way not the square of 100000.
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
        // A link's frames are decided only for the kernel interfaces' MACs.
        assert!(d.keys().filter(|k| k.port & PORT_LINK != 0).all(|k| k.dst == a.0 || k.dst == c.0));
    }

    #[test]
    fn longest_prefix_route_wins() {
        let t = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 eth9\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                 u0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let hop = |dev: &str, gateway| Some(Hop { dev: dev.into(), gateway });
        assert_eq!(best_route(t, Ipv4Addr::new(10, 77, 0, 2)), hop("u0", None));
        assert_eq!(
            best_route(t, Ipv4Addr::new(8, 8, 8, 8)),
            hop("eth9", Some(Ipv4Addr::new(192, 168, 1, 1)))
        );
        assert_eq!(best_route("garbage\nx y z\n", Ipv4Addr::LOCALHOST), None);
    }
}
