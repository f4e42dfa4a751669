//! What every worker reads: an immutable snapshot of routes, interfaces and
//! links, published by the control plane and swapped atomically; and the
//! daemon-wide counters of what no single port accounts for.

use crate::global::Global;
use crate::link::Link;
use crate::port::Port;
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};
use std::sync::Arc;
use vnet_control::{RouteDef, RxKey, State};
use vnet_core::{Counters, Route, RouteTable};
use vnet_wire::MacAddr;

/// A local interface as the engine sees it: counters and the port frames
/// for its VM leave by.
pub struct Iface {
    pub id: u32,
    pub name: String,
    /// The VM's MAC, when known (a TAP's own address, or the `mac` option).
    pub mac: Option<MacAddr>,
    /// Port security: the only source MAC accepted from the VM (the `mac`
    /// option, when given); frames with another are dropped and counted.
    pub source_lock: Option<MacAddr>,
    /// The network (tenant) it belongs to: the `neigh` answers it gets.
    pub network: u32,
    /// Frames from the VM.
    pub rx: Counters,
    /// Frames to the VM.
    pub tx: Counters,
    pub port: Arc<dyn Port>,
    /// Broadcast and multicast frames the VM may send in one tick of the
    /// daemon's timer (a tenth of its `broadcast-limit`; 0: no limit), how
    /// many it sent in this one, and how many were dropped over the limit.
    group_budget: u32,
    group_sent: AtomicU32,
    pub broadcast_limited: AtomicU64,
    /// [`ACTIVE`], [`WAITING`] (a standby interface: a live migration's
    /// destination port, before its VM runs here) or [`ARRIVED`] (the VM
    /// sent its first frame from its MAC; the control plane activates it).
    standby: AtomicU8,
}

/// An interface in use.
pub const ACTIVE: u8 = 0;
/// A standby interface waiting for its VM.
pub const WAITING: u8 = 1;
/// A standby interface whose VM has sent from its MAC.
pub const ARRIVED: u8 = 2;

/// What the engine calls when a standby interface's VM arrives: wakes the
/// control plane, which activates the interface. Called once per arrival,
/// from a worker: it must not block.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for Iface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iface").field("id", &self.id).field("name", &self.name).finish()
    }
}

impl Iface {
    pub fn new(id: u32, name: impl Into<String>, mac: Option<MacAddr>, port: Arc<dyn Port>) -> Self {
        Iface {
            id,
            name: name.into(),
            mac,
            source_lock: None,
            network: 0,
            rx: Counters::default(),
            tx: Counters::default(),
            port,
            group_budget: 0,
            group_sent: AtomicU32::new(0),
            broadcast_limited: AtomicU64::new(0),
            standby: AtomicU8::new(ACTIVE),
        }
    }

    /// [`ACTIVE`], [`WAITING`] or [`ARRIVED`].
    pub fn standby(&self) -> u8 {
        self.standby.load(Relaxed)
    }

    /// Follows the declaration: a standby interface waits (an arrival
    /// already seen is kept), any other is active.
    pub fn set_standby(&self, standby: bool) {
        if !standby {
            self.standby.store(ACTIVE, Relaxed);
        } else {
            let _ = self.standby.compare_exchange(ACTIVE, WAITING, Relaxed, Relaxed);
        }
    }

    /// Back to waiting after an activation that failed (the next frame
    /// tries again).
    pub fn rearm(&self) {
        let _ = self.standby.compare_exchange(ARRIVED, WAITING, Relaxed, Relaxed);
    }

    /// A frame from the VM with source `src`: if the interface waits for
    /// its VM and `src` is its MAC, the first such frame marks the arrival
    /// and calls `wake` (one load per frame otherwise).
    #[inline]
    pub fn note_arrival(&self, src: MacAddr, wake: Option<&Wake>) {
        if self.standby.load(Relaxed) == WAITING
            && self.mac == Some(src)
            && self.standby.compare_exchange(WAITING, ARRIVED, Relaxed, Relaxed).is_ok()
        {
            if let Some(w) = wake {
                w();
            }
        }
    }

    /// Lets the VM send at most `per_sec` broadcast and multicast frames a
    /// second (0: any number), counted in windows of one [`TICK_NS`].
    pub fn broadcast_limit(mut self, per_sec: u32) -> Self {
        self.group_budget = if per_sec == 0 { 0 } else { per_sec.div_ceil((1_000_000_000 / TICK_NS) as u32) };
        self
    }

    /// Whether the VM may send one more group-addressed frame in this
    /// window (counted when not).
    pub fn admit_group(&self) -> bool {
        if self.group_budget == 0 || self.group_sent.fetch_add(1, Relaxed) < self.group_budget {
            return true;
        }
        self.broadcast_limited.fetch_add(1, Relaxed);
        false
    }

    /// Accepts frames from the VM only with source MAC `mac` (if given).
    /// In `network` (its `neigh` answers).
    pub fn in_network(mut self, network: u32) -> Self {
        self.network = network;
        self
    }

    pub fn locked_to(mut self, mac: Option<MacAddr>) -> Self {
        self.source_lock = mac;
        self
    }

    /// Whether the VM may send a frame with source MAC `src`.
    pub fn may_send_from(&self, src: MacAddr) -> bool {
        self.source_lock.is_none_or(|m| m == src)
    }
}

/// The period of the daemon's timer ([`Plane::tick`], the links' ticks).
pub const TICK_NS: u64 = 100_000_000;

/// The snapshot.
#[derive(Default)]
pub struct Plane {
    pub table: RouteTable,
    pub ifaces: FxHashMap<u32, Arc<Iface>>,
    pub links: FxHashMap<u32, Arc<Link>>,
    /// Links by what attributes an arriving datagram to them.
    pub links_by_rx: FxHashMap<RxKey, u32>,
    /// Called when a standby interface's VM arrives ([`Iface::note_arrival`]).
    pub wake: Option<Wake>,
    /// Address resolution answered at the edge: the MAC of an address in
    /// a network (`neigh` lines).
    pub neighbors: Neighbors,
    /// Who may talk to whom in each network ([`crate::policy`]).
    pub policy: Arc<vnet_core::policy::PolicySet>,
    /// The IP source guard: the addresses each guarded interface's VM may
    /// send from, by interface id (an interface not here is unguarded).
    pub guards: Guards,
}

/// The IP source guard's addresses, by interface id.
pub type Guards = Arc<FxHashMap<u32, vnet_wire::guard::Owned>>;

/// The `neigh` table, by (network, address).
pub type Neighbors = Arc<FxHashMap<(u32, std::net::IpAddr), MacAddr>>;

/// The engine's `neigh` table from a state's.
pub fn neighbors(state: &State) -> Neighbors {
    Arc::new(state.neighbors.0.iter().map(|(k, v)| (*k, *v)).collect())
}

/// The IP source guard `state` declares: for each interface that owns an
/// address (its `addresses`, and the `neigh` lines of its network naming
/// its MAC), those addresses and, with a `mac`, the IPv6 link-local
/// address of that MAC. An interface that owns none is not in it
/// (unguarded).
pub fn guards(state: &State) -> Guards {
    let mut owned: FxHashMap<(u32, MacAddr), Vec<std::net::IpAddr>> = FxHashMap::default();
    for ((net, ip), mac) in &state.neighbors.0 {
        owned.entry((*net, *mac)).or_default().push(*ip);
    }
    let mut out = FxHashMap::default();
    for i in state.interfaces.values() {
        let lines = i.mac.and_then(|m| owned.get(&(i.network, m)));
        let addrs: Vec<std::net::IpAddr> =
            i.addresses.iter().chain(lines.into_iter().flatten()).copied().collect();
        if addrs.is_empty() {
            continue;
        }
        let ll = i.mac.map(|m| std::net::IpAddr::V6(vnet_wire::guard::link_local(m)));
        out.insert(i.id, vnet_wire::guard::Owned::new(addrs.into_iter().chain(ll)));
    }
    Arc::new(out)
}

impl Plane {
    /// The daemon's timer, every [`TICK_NS`]: a new window for the
    /// interfaces' broadcast limits, and the links' timers; `changed` hears
    /// of each link whose peer went down or came back.
    pub fn tick(&self, now_ns: u64, mut changed: impl FnMut(&Link, crate::link::Liveness)) {
        self.policy.flows.tick(now_ns);
        for i in self.ifaces.values() {
            i.group_sent.store(0, Relaxed);
        }
        for l in self.links.values() {
            if let Some(s) = l.tick(now_ns) {
                changed(l, s);
            }
        }
    }

    /// A plane over `table`, `ifaces` and `links`, with the receive index
    /// built and each relayed link's relay found (the link whose peer has
    /// the key its `relay` names).
    pub fn new(table: RouteTable, ifaces: Vec<Arc<Iface>>, links: Vec<Arc<Link>>) -> Self {
        let links_by_rx = links.iter().map(|l| (l.def.rx_key(), l.def.id)).collect();
        for l in &links {
            if let vnet_control::Transport::Udp { relay: Some(k), .. } = l.def.transport {
                let via = links.iter().find(|v| v.secure.as_ref().is_some_and(|s| s.peer() == k.0));
                l.relay_via.store(via.map(|v| Arc::new(Arc::downgrade(v))));
            }
        }
        Plane {
            table,
            ifaces: ifaces.into_iter().map(|i| (i.id, i)).collect(),
            links: links.into_iter().map(|l| (l.def.id, l)).collect(),
            links_by_rx,
            wake: None,
            neighbors: Neighbors::default(),
            policy: Arc::default(),
            guards: Guards::default(),
        }
    }

    /// With `guards` (the IP source guard's addresses) enforced.
    pub fn guarding(mut self, guards: Guards) -> Self {
        self.guards = guards;
        self
    }

    /// Whether the VM of interface `id` may send `frame` (its source
    /// address one it owns, when its interface is guarded).
    #[inline]
    pub fn source_ip_allowed(&self, id: u32, frame: &[u8]) -> bool {
        self.guards.is_empty() || self.guards.get(&id).is_none_or(|o| o.allows(frame))
    }

    /// With `policy` enforced.
    pub fn governed(mut self, policy: Arc<vnet_core::policy::PolicySet>) -> Self {
        self.policy = policy;
        self
    }

    /// The network of the port a frame came in by (0 for one not here).
    pub fn network_of(&self, port: vnet_core::Port) -> u32 {
        match port {
            vnet_core::Port::Interface(id) => self.ifaces.get(&id).map_or(0, |i| i.network),
            vnet_core::Port::Link(id) => self.links.get(&id).map_or(0, |l| l.def.network()),
        }
    }

    /// With `neighbors` answered at the edge.
    pub fn answering(mut self, neighbors: Neighbors) -> Self {
        self.neighbors = neighbors;
        self
    }

    /// With `wake` called when a standby interface's VM arrives.
    pub fn waking(mut self, wake: Option<Wake>) -> Self {
        self.wake = wake;
        self
    }

    /// The link datagrams with this key belong to.
    pub fn link_for(&self, key: RxKey) -> Option<&Arc<Link>> {
        self.links_by_rx.get(&key).and_then(|id| self.links.get(id))
    }

    /// The secured link a datagram from `from`, an address no link is
    /// configured with, may be from: the link that roamed there, the one
    /// owning the session a secured data datagram names, or the one whose
    /// peer made a handshake initiation (read to learn whose it is, at most
    /// [`crate::global::STRANGER_INITS_PER_SEC`] a second). A candidate only: the caller
    /// authenticates the datagram before the link moves.
    pub fn roaming_link(
        &self,
        g: &Global,
        from: std::net::IpAddr,
        data: &[u8],
        now_ns: u64,
    ) -> Option<&Arc<Link>> {
        if let Some(l) = g.roamed.load().get(&from).and_then(|id| self.links.get(id)) {
            if l.endpoint().is_some_and(|e| e.ip() == from) {
                return Some(l);
            }
        }
        let secured = || self.links.values().filter_map(|l| l.secure.as_ref().map(|s| (l, s)));
        if crate::secure::is_initiation(data) {
            let (_, any) = secured().next()?;
            // MAC1 first: junk never spends the budget the real peers need.
            if !any.initiation_to_us(data) {
                g.stranger_initiations_bad_mac.fetch_add(1, Relaxed);
                return None;
            }
            if !g.stranger_initiation(now_ns) {
                return None;
            }
            let key = any.initiator_of(data)?;
            return secured().find(|(_, s)| s.peer() == key).map(|(l, _)| l);
        }
        // One hash lookup: no link is looked into, and no link's lock taken.
        let index = crate::secure::data_index(data)?;
        g.sessions.link_of(index).and_then(|id| self.links.get(&id)).filter(|l| l.secure.is_some())
    }
}

/// The route table `state` declares, as generation `generation`. Each
/// route keeps the counters of the route of the same id in `old` (the
/// running table), so they survive rebuilds; a new route starts at zero.
pub fn route_table(state: &State, generation: u64, old: &RouteTable) -> RouteTable {
    let routes = state.routes.values().map(|r| route(r, old)).collect();
    // A `direct` link is an edge of the overlay (the LAN), not the mesh.
    let edges =
        state.links.values().filter(|l| matches!(l.transport, vnet_control::Transport::Direct { .. }));
    // Each port's network (tenant): frames never cross networks.
    let networks = state
        .interfaces
        .values()
        .map(|i| (vnet_core::Port::Interface(i.id), i.network))
        .chain(state.links.values().map(|l| (vnet_core::Port::Link(l.id), l.network())));
    RouteTable::new(generation, routes)
        .with_edge_links(edges.map(|l| l.id).collect::<Vec<_>>())
        .with_networks(networks)
}

/// What a change that only deleted routes (ids `removed`) and added
/// `added` makes of the running table `old`, as generation `generation`:
/// the same as [`route_table`] of the new state, at the cost of the change
/// ([`RouteTable::patched`]).
pub fn patched_table<'a>(
    old: &RouteTable,
    generation: u64,
    removed: &[u32],
    added: impl IntoIterator<Item = &'a RouteDef>,
) -> RouteTable {
    let added = added.into_iter().map(|r| route(r, old)).collect();
    old.patched(generation, removed, added)
}

/// Route `r`, with the counters of its namesake in `old` if it has one.
fn route(r: &RouteDef, old: &RouteTable) -> Route {
    let counters = old.route_by_id(r.id).map(|o| o.counters.clone()).unwrap_or_default();
    Route { id: r.id, src: r.src, dst: r.dst, to: r.to, from: r.from, counters }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::Nowhere;

    #[test]
    fn a_standby_interface_wakes_once_on_its_vms_first_frame_and_only_from_its_mac() {
        let (vm, other) = (MacAddr([0x52, 0x54, 0, 0, 0, 7]), MacAddr([0x52, 0x54, 0, 0, 0, 8]));
        let i = Iface::new(1, "g", Some(vm), Arc::new(Nowhere));
        let woken = Arc::new(AtomicU32::new(0));
        let w = woken.clone();
        let wake: Wake = Arc::new(move || {
            w.fetch_add(1, Relaxed);
        });
        i.note_arrival(vm, Some(&wake));
        assert_eq!((i.standby(), woken.load(Relaxed)), (ACTIVE, 0), "an active one wakes nobody");
        i.set_standby(true);
        i.note_arrival(other, Some(&wake));
        assert_eq!((i.standby(), woken.load(Relaxed)), (WAITING, 0), "another MAC is not its VM");
        i.note_arrival(vm, Some(&wake));
        i.note_arrival(vm, Some(&wake));
        assert_eq!((i.standby(), woken.load(Relaxed)), (ARRIVED, 1), "woken once");
        i.set_standby(true);
        assert_eq!(i.standby(), ARRIVED, "a transaction meanwhile keeps the arrival");
        i.rearm();
        i.note_arrival(vm, Some(&wake));
        assert_eq!((i.standby(), woken.load(Relaxed)), (ARRIVED, 2), "after a failed activation, again");
        i.set_standby(false);
        assert_eq!(i.standby(), ACTIVE);
        assert_eq!(format!("{i:?}"), r#"Iface { id: 1, name: "g" }"#);
    }

    #[test]
    fn a_plane_wakes_the_control_plane_when_a_standby_interfaces_vm_first_sends() {
        let vm = MacAddr([0x52, 0x54, 0, 0, 0, 7]);
        let i = Arc::new(Iface::new(1, "g", Some(vm), Arc::new(Nowhere)));
        i.set_standby(true);
        let woken = Arc::new(AtomicU32::new(0));
        let w = woken.clone();
        let wake: Wake = Arc::new(move || {
            w.fetch_add(1, Relaxed);
        });
        let plane = Plane::new(RouteTable::default(), vec![i], Vec::new()).waking(Some(wake));
        let mut fw = crate::forward::Forwarder::new(Arc::default());
        let mut frame = [0u8; 60];
        frame[..6].fill(0xff);
        frame[6..12].copy_from_slice(&vm.0);
        let vh = vnet_wire::virtio::VirtioNetHdr::NONE;
        fw.forward(&plane, vnet_core::Port::Interface(1), vh, &mut frame);
        assert_eq!(woken.load(Relaxed), 1);
    }

    #[test]
    fn a_patched_table_is_the_new_states_table_with_the_counters_of_the_routes_that_stay() {
        let cmds = |t: &str| vnet_control::parse(t).unwrap();
        let a = State::default()
            .apply_all(&cmds(
                "interface vm tap t mac 52:54:00:00:00:01\n\
                 route any 52:54:00:00:00:02 -> interface vm\n\
                 route any 52:54:00:00:00:03 -> interface vm\n",
            ))
            .unwrap();
        let old = route_table(&a, 1, &RouteTable::default());
        let ids: Vec<u32> = a.routes.keys().copied().collect();
        old.route_by_id(ids[1]).unwrap().counters.add(100);
        // The first route deleted (a typed command: its id is the state's),
        // and one added.
        let mut change = cmds("route any 52:54:00:00:00:04 -> interface vm\n");
        let pos = vnet_control::Pos::default();
        let delete = vnet_control::Command::DeleteRoute(vnet_control::ast::Ref { pos, by: ids[0] });
        change.insert(0, vnet_control::Located { pos, item: delete });
        let b = a.apply_all(&change).unwrap();
        let added = b.routes.values().filter(|r| !a.routes.contains_key(&r.id));
        let patched = patched_table(&old, 2, &[ids[0]], added);
        let dump = |t: &RouteTable| {
            let mut v: Vec<_> =
                t.routes().map(|r| (r.id, r.dst.to_string(), r.counters.snapshot().bytes)).collect();
            v.sort();
            v
        };
        assert_eq!(dump(&patched), dump(&route_table(&b, 2, &old)));
        assert_eq!((patched.generation(), patched.len()), (2, 2));
        assert_eq!(patched.route_by_id(ids[1]).unwrap().counters.snapshot().bytes, 100, "kept");
    }
}
