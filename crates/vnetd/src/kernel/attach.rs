//! Loading the object, attaching its programs with TCX, and keeping the
//! maps equal to the decisions: destination entries and ingress ports
//! written entry by entry (only those that changed), two (port,
//! destination, source) tables switched by one write, the link and peer
//! maps, the counter slots.

use super::decisions::{Decisions, Served};
use super::maps::{link_val, FMT_VXLAN, OBJECT, PORT_LINK, PORT_SLOTS, STAT_NAMES};
use super::object::{keys, map, program, write_diff};
use super::pins::{self, Pins};
use super::underlay::Underlay;
use super::{io_error, map_error, program_error, KernelError, KernelIface, Reason};
use crate::sys::bpf::{
    AddrKey, Cfg, DestKey, GuardKey, LinkVal, Neigh6Key, NeighKey, NeighVal, PairKey, PairVal, PeerVal,
    PortStats, PortVal, RouteKey, RouteVal, VxlanKey,
};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues};
use aya::programs::links::FdLink;
use aya::programs::tc::{SchedClassifierLink, SchedClassifierLinkId};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use vnet_engine::Plane;
use vnet_wire::MacAddr;

#[cfg(test)]
#[path = "testrun.rs"]
mod testrun;

/// What the held decisions were compiled for: the kernel's interfaces,
/// the plane's links (the same `Arc`s: a link changed is a new one) and
/// vnetd's addresses, and what that made of the links (their values,
/// counter slots, and those left to the user path, with why).
struct HeldFor {
    ifaces: BTreeMap<u32, KernelIface>,
    plane_links: Vec<(u32, std::sync::Arc<vnet_engine::Link>)>,
    listen: (SocketAddr, Option<SocketAddr>),
    links: BTreeMap<u32, LinkVal>,
    slots: BTreeMap<u32, u32>,
    skipped: Vec<(String, String)>,
}

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
    /// Cluster mode: the pending links wait for the store's view too
    /// (until it is applied the maps lack the other hosts' links and
    /// routes, which the predecessor's still hold).
    pub hold_adoption: bool,
    /// Links adopted from a predecessor.
    pub adopted: usize,
    /// Entries the destination map and each (port, destination, source)
    /// table hold.
    pub capacity: usize,
    /// The decisions the maps hold, and what they were compiled for (the
    /// kernel's interfaces, links and counter slots): a sync for the same
    /// ports whose change names the destinations it touched recompiles
    /// and writes only those. `None`: compile all (and, after a failed
    /// write, compare with the maps themselves).
    held: Decisions,
    held_for: Option<HeldFor>,
    /// Whether the destination and port maps hold exactly `held` (not
    /// after a write that failed halfway).
    known: bool,
    /// Keys written to each (port, destination, source) table.
    tables: [BTreeSet<RouteKey>; 2],
    active: u32,
    /// The peers the wire program knows, as written.
    peers: BTreeMap<AddrKey, PeerVal>,
    vxlan_peers: BTreeMap<VxlanKey, PeerVal>,
    /// Each served port's (ifindex, or `PORT_LINK | link id`) counter slot.
    slots: BTreeMap<u32, u32>,
    /// Decisions left out for lack of room, as last warned of.
    pub overflow: usize,
    /// How long the last sync took, and whether it wrote only what a
    /// change touched.
    pub last_sync: Duration,
    pub last_sync_incremental: bool,
    cfg: Cfg,
    /// The `neigh` table last written to `neigh4` and `neigh6`, and
    /// the plane's table it came from (not compiled again while the same).
    neigh:
        (Option<vnet_engine::plane::Neighbors>, BTreeMap<NeighKey, NeighVal>, BTreeMap<Neigh6Key, NeighVal>),
    /// The IP source guard's addresses as last written to `guard`.
    guard: BTreeMap<GuardKey, u32>,
    /// The networks last written to `governed`.
    governed: super::flows::Governed,
    /// The `flows` map, as the engine's mirror (`PolicySet::mirror`).
    flows: std::sync::Arc<super::flows::KernelFlows>,
    /// The drop events and the watch flag.
    drops: std::sync::Arc<super::drops::KernelDrops>,
}

impl KernelPath {
    /// Loads the programs into the kernel (not attached yet).
    pub fn load(pins: Option<Pins>, capacity: usize) -> Result<Self, Reason> {
        if OBJECT.is_empty() {
            return Err(KernelError::NoObject);
        }
        // The route maps sized as asked (`--kernel-routes`).
        let size = u32::try_from(capacity).unwrap_or(u32::MAX);
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries("dests", size)
            .map_max_entries("routes_0", size)
            .map_max_entries("routes_1", size)
            .load(OBJECT)
            .map_err(KernelError::Load)?;
        for name in ["vnet_from_vm", "vnet_from_wire"] {
            let p: &mut SchedClassifier = program(&mut ebpf, name)?;
            p.load().map_err(program_error(format!("the kernel refused {name}")))?;
        }
        let flows = std::sync::Arc::new(super::flows::KernelFlows::open(&ebpf)?);
        let drops = std::sync::Arc::new(super::drops::KernelDrops::open(&ebpf)?);
        Ok(KernelPath {
            ebpf,
            vm_attached: BTreeMap::new(),
            wire_attached: BTreeMap::new(),
            pins,
            pending: BTreeMap::new(),
            hold_adoption: false,
            adopted: 0,
            capacity,
            held: Decisions::default(),
            held_for: None,
            known: true,
            tables: Default::default(),
            active: 0,
            peers: BTreeMap::new(),
            vxlan_peers: BTreeMap::new(),
            slots: BTreeMap::new(),
            overflow: 0,
            last_sync: Duration::ZERO,
            last_sync_incremental: false,
            cfg: Cfg { active: u32::MAX, port: 0, vxlan_port: 0, policy: 0 },
            neigh: (None, BTreeMap::new(), BTreeMap::new()),
            guard: BTreeMap::new(),
            governed: Default::default(),
            flows,
            drops,
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
        if self.hold_adoption {
            return Ok(());
        }
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

    /// Ends [`KernelPath::hold_adoption`]: the pending links take this
    /// process's program now (the last sync wrote its decisions).
    pub fn release_adoption(&mut self) -> Result<(), Reason> {
        self.hold_adoption = false;
        self.adopt_pending()
    }

    /// The hand-over: pins every link this process holds (their programs
    /// keep forwarding with these maps after it exits) and lets go of them.
    /// Returns how many were pinned.
    pub fn pin_all(&mut self) -> Result<usize, KernelError> {
        let Some(pins) = self.pins.clone() else {
            return Err(KernelError::NoPins);
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
                        let what = format!("the link on {dev}");
                        let l = self
                            .classifier(program_name(wire))?
                            .take_link(id)
                            .map_err(program_error(what.clone()))?;
                        FdLink::try_from(l).map_err(|source| KernelError::Link { what, source })?
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

    /// Whether the MTU the maps hold for a link is not the one its link now
    /// uses (a path MTU search moved it): the caller syncs again.
    pub fn mtus_moved(&self, plane: &Plane) -> bool {
        let Some(h) = &self.held_for else { return false };
        h.links.iter().any(|(id, v)| plane.links.get(id).is_some_and(|l| l.mtu() != v.mtu))
    }

    /// Makes the maps say what `plane` says, for the interfaces in `ifaces`
    /// (by interface id), and attaches the wire program to every underlay
    /// device a link leaves by. `listen` is vnetd's link socket address.
    /// `touched`: the destinations whose routes are all that changed since
    /// the last sync, when the caller knows: if the interfaces, links and
    /// addresses are those of the last sync too, only those destinations'
    /// entries are recompiled and written (a MAC move at 100000 MACs over
    /// 1000 links writes one entry; the links are not looked at again, so
    /// an underlay route that changed meanwhile reaches them at the next
    /// other change). Returns the links the kernel cannot serve, with why.
    pub fn sync(
        &mut self,
        plane: &Plane,
        ifaces: &BTreeMap<u32, KernelIface>,
        listen: SocketAddr,
        listen_vxlan: Option<SocketAddr>,
        touched: Option<&BTreeSet<MacAddr>>,
    ) -> Result<Vec<(String, String)>, Reason> {
        let t0 = Instant::now();
        // The guard's new addresses before any port is guarded by them.
        let guard = super::decisions::guard(plane, ifaces);
        self.add_guard(&guard.entries)?;
        let plane_links: Vec<(u32, std::sync::Arc<vnet_engine::Link>)> =
            plane.links.iter().map(|(id, l)| (*id, l.clone())).collect();
        let same = |h: &HeldFor| {
            h.ifaces == *ifaces
                && h.listen == (listen, listen_vxlan)
                && h.plane_links.len() == plane_links.len()
                && h.plane_links
                    .iter()
                    .zip(&plane_links)
                    .all(|(a, b)| a.0 == b.0 && std::sync::Arc::ptr_eq(&a.1, &b.1))
        };
        let skipped = match (touched, self.held_for.take()) {
            (Some(touched), Some(h)) if same(&h) => {
                let on = Served { ifaces: &h.ifaces, links: &h.links, slots: &h.slots };
                let (writes, pairs_too) = self.held.changed(plane, &on, touched, self.capacity);
                self.write_dests(writes)?;
                if pairs_too {
                    let pairs = std::mem::take(&mut self.held.pairs);
                    let r = self.switch_table(&pairs);
                    self.held.pairs = pairs;
                    r?;
                    self.write_cfg(listen, listen_vxlan)?;
                }
                let skipped = h.skipped.clone();
                self.held_for = Some(h);
                self.last_sync_incremental = true;
                skipped
            }
            _ => {
                self.last_sync_incremental = false;
                self.sync_all(plane, ifaces, plane_links, (listen, listen_vxlan))?
            }
        };
        self.finish_guard(guard)?;
        self.write_neighbors(&plane.neighbors)?;
        self.governed.write(&mut self.ebpf, &plane.policy)?;
        // `cfg.policy` once the networks are in `governed`.
        self.write_cfg(listen, listen_vxlan)?;
        self.note_overflow();
        self.last_sync = t0.elapsed();
        Ok(skipped)
    }

    /// The whole sync: every link looked at again, every decision compiled.
    fn sync_all(
        &mut self,
        plane: &Plane,
        ifaces: &BTreeMap<u32, KernelIface>,
        plane_links: Vec<(u32, std::sync::Arc<vnet_engine::Link>)>,
        (listen, listen_vxlan): (SocketAddr, Option<SocketAddr>),
    ) -> Result<Vec<(String, String)>, Reason> {
        // Links: where each one leaves, from which address.
        let mut link_vals = BTreeMap::new();
        let mut skipped = Vec::new();
        let mut under = Underlay::read();
        for (id, l) in &plane.links {
            match link_val(&l.def, l.mtu(), listen, &mut under) {
                Ok((v, dev)) => {
                    link_vals.insert(*id, (v, dev));
                }
                Err(r) => skipped.push((l.def.name.clone(), r.to_string())),
            }
        }
        let devs: BTreeSet<String> = link_vals.values().map(|(_, d)| d.clone()).collect();
        self.attach_wire(&devs)?;

        // A counter slot for every port served, zeroed when first given (the
        // programs only add). Slots of ports gone are freed after the maps
        // are written, so that no live decision counts into a slot given
        // again.
        let served: BTreeSet<u32> =
            ifaces.values().map(|k| k.ifindex).chain(link_vals.keys().map(|id| PORT_LINK | id)).collect();
        self.give_slots(&served)?;
        let slot = |p: u32| self.slots.get(&p).copied().unwrap_or(0);
        let links: BTreeMap<u32, LinkVal> = link_vals.iter().map(|(id, (v, _))| (*id, *v)).collect();
        let peer_vals: Vec<PeerVal> =
            links.iter().map(|(&id, v)| PeerVal { id, slot: slot(PORT_LINK | id), link: *v }).collect();
        // Peers first (a route may only name a link whose datagrams are known).
        self.write_peers(&peer_vals)?;

        let slots = self.slots.clone();
        let next = Decisions::compile(plane, &Served { ifaces, links: &links, slots: &slots }, self.capacity);
        self.write_all(next)?;
        self.write_cfg(listen, listen_vxlan)?;
        // A predecessor's programs give way to this one's, now that its
        // maps hold the decisions.
        self.adopt_pending()?;
        // Ports that are gone: no decision names their slots now.
        self.slots.retain(|p, _| served.contains(p));
        self.held_for = Some(HeldFor {
            ifaces: ifaces.clone(),
            plane_links,
            listen: (listen, listen_vxlan),
            links,
            slots,
            skipped: skipped.clone(),
        });
        Ok(skipped)
    }

    /// Writes every decision of `next`: destination entries and ports that
    /// differ from those held (or, when what the maps hold is not known,
    /// all of them, and removes what the maps hold beyond them), then the
    /// (port, destination, source) table.
    fn write_all(&mut self, next: Decisions) -> Result<(), Reason> {
        let known = self.known;
        let mut held = std::mem::take(&mut self.held);
        if !known {
            // The maps' own keys, after a write that failed halfway.
            held.dests = keys::<DestKey, RouteVal, _>(&mut self.ebpf, "dests")?;
            held.ports = keys::<u32, PortVal, _>(&mut self.ebpf, "ports")?;
        }
        let writes: Vec<(DestKey, Option<RouteVal>)> = next
            .dests
            .iter()
            .filter(|(k, v)| held.dests.get(k) != Some(v))
            .map(|(k, v)| (*k, Some(*v)))
            .chain(held.dests.keys().filter(|k| !next.dests.contains_key(k)).map(|k| (*k, None)))
            .collect();
        self.write_dests(writes)?;
        self.known = false;
        write_diff(&mut self.ebpf, "ports", &mut held.ports, next.ports.clone())?;
        if !known || held.pairs != next.pairs {
            self.switch_table(&next.pairs)?;
        }
        self.held = next;
        self.known = true;
        Ok(())
    }

    /// Writes the guard's addresses the map lacks (none removed yet).
    fn add_guard(&mut self, next: &BTreeMap<GuardKey, u32>) -> Result<(), Reason> {
        let mut m: BpfHashMap<&mut MapData, GuardKey, u32> = map(&mut self.ebpf, "guard")?;
        let held = &mut self.guard;
        for (k, v) in next {
            if !held.contains_key(k) {
                m.insert(k, v, 0).map_err(map_error("guard"))?;
                held.insert(*k, *v);
            }
        }
        Ok(())
    }

    /// The ports' `guarded` flags as `guard` says (a sync that wrote only
    /// the destinations a route change touched left the ports as they
    /// were), then the addresses no port owns now removed from `guard`.
    fn finish_guard(&mut self, guard: super::decisions::Guard) -> Result<(), Reason> {
        let stale: Vec<(u32, PortVal)> = self
            .held
            .ports
            .iter()
            .filter(|(k, _)| *k & PORT_LINK == 0)
            .filter_map(|(k, v)| {
                let want = guard.flags.get(k).copied().unwrap_or(0);
                (v.guarded != want).then_some((*k, PortVal { guarded: want, ..*v }))
            })
            .collect();
        if !stale.is_empty() {
            let mut m: BpfHashMap<&mut MapData, u32, PortVal> = map(&mut self.ebpf, "ports")?;
            for (k, v) in stale {
                m.insert(k, v, 0).map_err(map_error("ports"))?;
                self.held.ports.insert(k, v);
            }
        }
        write_diff(&mut self.ebpf, "guard", &mut self.guard, guard.entries)
    }

    /// `neigh4` and `neigh6`: the plane's `neigh` table (the programs
    /// answer ARP requests and neighbour solicitations for them in place;
    /// as many of each family as a map takes, the rest answered by the
    /// user path).
    fn write_neighbors(&mut self, table: &vnet_engine::plane::Neighbors) -> Result<(), Reason> {
        if self.neigh.0.as_ref().is_some_and(|t| std::sync::Arc::ptr_eq(t, table)) {
            return Ok(());
        }
        let mut v4: BTreeMap<NeighKey, NeighVal> = BTreeMap::new();
        let mut v6: BTreeMap<Neigh6Key, NeighVal> = BTreeMap::new();
        for ((net, ip), mac) in table.iter() {
            let val = NeighVal { mac: mac.0, pad: 0 };
            match ip {
                std::net::IpAddr::V4(a) if v4.len() < super::maps::NEIGH_ENTRIES => {
                    v4.insert(NeighKey { net: *net, ip: a.octets() }, val);
                }
                std::net::IpAddr::V6(a) if v6.len() < super::maps::NEIGH_ENTRIES => {
                    v6.insert(Neigh6Key { net: *net, ip: a.octets() }, val);
                }
                _ => {}
            }
        }
        write_diff(&mut self.ebpf, "neigh4", &mut self.neigh.1, v4)?;
        write_diff(&mut self.ebpf, "neigh6", &mut self.neigh.2, v6)?;
        self.neigh.0 = Some(table.clone());
        Ok(())
    }

    /// The programs' drop events and the flag that asks for them.
    pub fn drops(&self) -> std::sync::Arc<super::drops::KernelDrops> {
        self.drops.clone()
    }

    /// The `flows` map as the engine's mirror of its allowed flows.
    pub fn flow_mirror(&self) -> std::sync::Arc<super::flows::KernelFlows> {
        self.flows.clone()
    }

    /// What the programs forwarded by known flows, per governed network.
    pub fn policy_counts(&self) -> BTreeMap<u32, (u64, u64)> {
        self.governed.counts(&self.ebpf)
    }

    /// The programs' clock for flows' idle times.
    pub fn policy_clock(&self) -> Option<super::flows::KernelClock> {
        super::flows::KernelClock::read(&self.ebpf)
    }

    /// Writes destination entries (`None`: removes it), each on its own:
    /// a reader sees an entry's old value or its new one.
    fn write_dests(&mut self, writes: Vec<(DestKey, Option<RouteVal>)>) -> Result<(), Reason> {
        let mut m: BpfHashMap<&mut MapData, DestKey, RouteVal> = map(&mut self.ebpf, "dests")?;
        self.known = false;
        for (k, v) in writes {
            match v {
                Some(v) => m.insert(k, v, 0).map_err(map_error("dests"))?,
                None => {
                    let _ = m.remove(&k);
                }
            }
        }
        self.known = true;
        Ok(())
    }

    /// The config: vnetd's ports, and which (port, destination, source)
    /// table is live. Written when it changed.
    fn write_cfg(&mut self, listen: SocketAddr, listen_vxlan: Option<SocketAddr>) -> Result<(), Reason> {
        let next = Cfg {
            active: self.active,
            port: listen.port().to_be(),
            vxlan_port: listen_vxlan.map_or(0, |a| a.port().to_be()),
            policy: self.governed.any().into(),
        };
        if next != self.cfg {
            let mut cfg: Array<&mut MapData, Cfg> = map(&mut self.ebpf, "config")?;
            cfg.set(0, next, 0).map_err(map_error("config"))?;
            self.cfg = next;
        }
        Ok(())
    }

    fn note_overflow(&mut self) {
        let overflow = self.held.overflow;
        if overflow > 0 && self.overflow == 0 {
            tracing::warn!(
                destination_entries = self.held.dests.len(),
                entries = self.held.pairs.len(),
                left_to_user_path = overflow,
                "the kernel path's route maps are full: the decisions that did not fit take the user path \
                 (counted as kernel_route_overflow; --kernel-routes sizes them)"
            );
        }
        self.overflow = overflow;
    }

    /// Destination entries the maps hold.
    pub fn dest_entries(&self) -> usize {
        self.held.dests.len()
    }

    /// Entries of both kinds the maps hold (the live (port, destination,
    /// source) table's).
    pub fn entries(&self) -> usize {
        self.held.dests.len() + self.held.pairs.len()
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

    /// The `vnet` peers and VXLAN peers the wire program knows datagrams
    /// of: what changed is written, what is gone removed.
    fn write_peers(&mut self, peer_vals: &[PeerVal]) -> Result<(), Reason> {
        let vnet: BTreeMap<AddrKey, PeerVal> = peer_vals
            .iter()
            .filter(|p| p.link.format != FMT_VXLAN)
            .map(|p| (AddrKey { a: p.link.remote_ip }, *p))
            .collect();
        let vxlan: BTreeMap<VxlanKey, PeerVal> = peer_vals
            .iter()
            .filter(|p| p.link.format == FMT_VXLAN)
            .map(|p| (VxlanKey { addr: p.link.remote_ip, vni: p.link.network }, *p))
            .collect();
        let mut held = std::mem::take(&mut self.peers);
        let r = write_diff(&mut self.ebpf, "peers", &mut held, vnet);
        self.peers = held;
        r?;
        let mut held = std::mem::take(&mut self.vxlan_peers);
        let r = write_diff(&mut self.ebpf, "vxlan_peers", &mut held, vxlan);
        self.vxlan_peers = held;
        r
    }

    /// Writes `pairs` into the inactive (port, destination, source) table
    /// and switches to it (one write of the config, by the caller's
    /// `write_cfg`: readers see the old table or the new).
    fn switch_table(&mut self, pairs: &BTreeMap<RouteKey, RouteVal>) -> Result<(), Reason> {
        let next = 1 - self.active;
        {
            let name = if next == 0 { "routes_0" } else { "routes_1" };
            let mut m: BpfHashMap<&mut MapData, RouteKey, RouteVal> = map(&mut self.ebpf, name)?;
            let table = &mut self.tables[next as usize];
            table.retain(|k| pairs.contains_key(k) || m.remove(k).is_err());
            for (k, v) in pairs {
                m.insert(k, v, 0).map_err(map_error(name))?;
                table.insert(*k);
            }
        }
        self.active = next;
        self.tables[next as usize] = pairs.keys().copied().collect();
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
