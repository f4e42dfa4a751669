//! Loading the object, attaching its programs with TCX, and keeping the
//! maps equal to the decisions: two route tables switched by one write,
//! the link and peer maps, the counter slots.

use super::decisions::decisions;
use super::maps::{link_val, FMT_VXLAN, OBJECT, PORT_LINK, PORT_SLOTS, STAT_NAMES};
use super::pins::{self, Pins};
use super::{io_error, map_error, program_error, KernelError, KernelIface, Reason};
use crate::sys::bpf::{Cfg, LinkVal, PairKey, PairVal, PeerVal, PortStats, RouteKey, RouteVal, VxlanKey};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues};
use aya::programs::links::FdLink;
use aya::programs::tc::{SchedClassifierLink, SchedClassifierLinkId};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use vnet_engine::Plane;

/// The loaded programs and their maps.
pub struct KernelPath {
    ebpf: Ebpf,
    /// Each served interface's TC link (`None` while a previous vnetd's
    /// link waits in `pending` to be adopted), and its ifindex (its key in
    /// `handoff`).
    vm_attached: BTreeMap<String, (Option<SchedClassifierLinkId>, u32)>,
    wire_attached: BTreeMap<String, Option<SchedClassifierLinkId>>,
    /// Where a hand-over pins the links, and where this vnetd found its
    /// predecessor's ([`pins`]).
    pins: Option<Pins>,
    /// A predecessor's links, by (wire program?, device), still running
    /// its program: the program is replaced at the end of the next sync,
    /// when the maps hold the decisions.
    pending: BTreeMap<(bool, String), FdLink>,
    /// Links adopted from a predecessor.
    pub adopted: usize,
    /// Entries each route table holds.
    pub capacity: usize,
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
    pub fn load(pins: Option<Pins>, capacity: usize) -> Result<Self, Reason> {
        if OBJECT.is_empty() {
            return Err(KernelError::NoObject);
        }
        // Both route tables sized as asked (`--kernel-routes`).
        let size = u32::try_from(capacity).unwrap_or(u32::MAX);
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries("routes_0", size)
            .map_max_entries("routes_1", size)
            .load(OBJECT)
            .map_err(KernelError::Load)?;
        for name in ["vnet_from_vm", "vnet_from_wire"] {
            let p: &mut SchedClassifier = program(&mut ebpf, name)?;
            p.load().map_err(program_error(format!("the kernel refused {name}")))?;
        }
        Ok(KernelPath {
            ebpf,
            vm_attached: BTreeMap::new(),
            wire_attached: BTreeMap::new(),
            pins,
            pending: BTreeMap::new(),
            adopted: 0,
            capacity,
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
            if self.take_pinned(false, dev) {
                self.vm_attached.insert(dev.to_string(), (None, ifindex));
                return Ok(());
            }
            match self.attach_ingress("vnet_from_vm", dev) {
                Ok(id) => {
                    self.vm_attached.insert(dev.to_string(), (Some(id), ifindex));
                }
                Err(e) => {
                    self.forget_handoff(ifindex);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Takes a predecessor's link on `dev` into `pending`, if one is pinned.
    fn take_pinned(&mut self, wire: bool, dev: &str) -> bool {
        match self.pins.as_ref().and_then(|p| p.take(&pins::name(wire, dev))) {
            Some(link) => {
                self.pending.insert((wire, dev.to_string()), link);
                true
            }
            None => false,
        }
    }

    /// Puts this process's program into each pending link (atomically: the
    /// predecessor's program runs until then), or, where that fails (the
    /// device went and came back), attaches it anew.
    fn adopt_pending(&mut self) -> Result<(), Reason> {
        for ((wire, dev), fd) in std::mem::take(&mut self.pending) {
            let prog = program_name(wire);
            let adopted = SchedClassifierLink::try_from(fd).map_err(|e| e.to_string()).and_then(|l| {
                self.classifier(prog).map_err(|e| e.to_string())?.attach_to_link(l).map_err(|e| e.to_string())
            });
            let id = match adopted {
                Ok(id) => {
                    self.adopted += 1;
                    tracing::info!(%dev, "kernel path: took over the previous vnetd's program on {dev} (replaced in place)");
                    id
                }
                Err(e) => {
                    tracing::info!(%dev, "kernel path: the previous vnetd's link on {dev} could not be taken over ({e}); attaching anew");
                    self.attach_ingress(prog, &dev)?
                }
            };
            if wire {
                self.wire_attached.insert(dev, Some(id));
            } else if let Some(v) = self.vm_attached.get_mut(&dev) {
                v.0 = Some(id);
            }
        }
        Ok(())
    }

    /// The hand-over: pins every link this process holds (their programs
    /// keep forwarding with these maps after it exits) and lets go of them.
    /// Returns how many were pinned.
    pub fn pin_all(&mut self) -> Result<usize, String> {
        let Some(pins) = self.pins.clone() else {
            return Err("no bpffs directory for pins (--bpf-dir)".into());
        };
        let mut n = 0;
        let vms: Vec<(String, Option<SchedClassifierLinkId>)> =
            std::mem::take(&mut self.vm_attached).into_iter().map(|(d, (id, _))| (d, id)).collect();
        let wires: Vec<(String, Option<SchedClassifierLinkId>)> =
            std::mem::take(&mut self.wire_attached).into_iter().collect();
        for (wire, list) in [(false, vms), (true, wires)] {
            for (dev, id) in list {
                let name = pins::name(wire, &dev);
                let fd = match id {
                    Some(id) => {
                        let l = self
                            .classifier(program_name(wire))
                            .map_err(|e| e.to_string())?
                            .take_link(id)
                            .map_err(|e| e.to_string())?;
                        FdLink::try_from(l).map_err(|e| e.to_string())?
                    }
                    None => match self.pending.remove(&(wire, dev)) {
                        Some(fd) => fd,
                        None => continue,
                    },
                };
                pins.pin(&name, fd)?;
                n += 1;
            }
        }
        Ok(n)
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
            match id {
                Some(id) => {
                    if let Ok(p) = self.classifier("vnet_from_vm") {
                        let _ = p.detach(id);
                    }
                }
                // A predecessor's link not taken over: it goes with its fd.
                None => drop(self.pending.remove(&(false, dev.to_string()))),
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
        let (decisions, overflow) = decisions(plane, ifaces, &links, &self.slots, self.capacity);

        // Peers first (a route may only name a link whose datagrams are known).
        self.write_peers(&peer_vals)?;

        self.switch_table(decisions, overflow, listen, listen_vxlan)?;
        // A predecessor's programs give way to this one's, now that its
        // maps hold the decisions.
        self.adopt_pending()?;

        // Ports that are gone: after the switch, no decision names their slots.
        self.slots.retain(|p, _| served.contains(p));
        Ok(skipped)
    }

    /// Attaches the wire program to each of `devs` (the underlay devices
    /// links leave by) and detaches it from the devices no link uses now.
    fn attach_wire(&mut self, devs: &BTreeSet<String>) -> Result<(), Reason> {
        for dev in devs {
            if !self.wire_attached.contains_key(dev) {
                if self.take_pinned(true, dev) {
                    self.wire_attached.insert(dev.clone(), None);
                    continue;
                }
                let id = self.attach_ingress("vnet_from_wire", dev)?;
                self.wire_attached.insert(dev.clone(), Some(id));
            }
        }
        let stale: Vec<String> = self.wire_attached.keys().filter(|d| !devs.contains(*d)).cloned().collect();
        for dev in stale {
            match self.wire_attached.remove(&dev) {
                Some(Some(id)) => {
                    let _ = self.classifier("vnet_from_wire")?.detach(id);
                }
                _ => drop(self.pending.remove(&(true, dev))),
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

    /// The kernel path's traffic matrix: each (source, destination) MAC
    /// pair it forwarded, frames and bytes summed over CPUs.
    pub fn pairs(&self) -> Vec<vnet_engine::matrix::Pair> {
        let Some(m) = self.ebpf.map("pairs") else { return Vec::new() };
        let Ok(h) = aya::maps::PerCpuHashMap::<&MapData, PairKey, PairVal>::try_from(m) else {
            return Vec::new();
        };
        h.iter()
            .filter_map(Result::ok)
            .map(|(k, vals)| {
                let (frames, bytes) = vals.iter().fold((0, 0), |(f, b), v| (f + v.frames, b + v.bytes));
                vnet_engine::matrix::Pair {
                    src: vnet_wire::MacAddr(k.src),
                    dst: vnet_wire::MacAddr(k.dst),
                    frames,
                    bytes,
                }
            })
            .collect()
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
        let wires: Vec<SchedClassifierLinkId> =
            std::mem::take(&mut self.wire_attached).into_values().flatten().collect();
        if let Ok(p) = self.classifier("vnet_from_wire") {
            for id in wires {
                let _ = p.detach(id);
            }
        }
    }
}

/// The program on an underlay device (`wire`) or on a VM's.
fn program_name(wire: bool) -> &'static str {
    if wire {
        "vnet_from_wire"
    } else {
        "vnet_from_vm"
    }
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
