//! A transaction, as named phases. [`Daemon::apply_reopening`] checks the
//! commands against a copy of the state ([`Daemon::check`]), then
//! *acquires* what the new state needs: the link sockets and TLS identity
//! ([`Daemon::acquire_sockets`]), the links ([`Daemon::acquire_links`]), the
//! new interfaces ([`Daemon::acquire_interfaces`]) and their kernel
//! attachments ([`Daemon::attach_kernel_all`]); then *publishes* the new
//! plane, the kernel's maps first ([`Daemon::publish`]); then *releases*
//! what the old state held that the new one does not and starts what the
//! new one needs ([`Daemon::release`]). Until publishing succeeds, a failure
//! drops what was acquired ([`Started`], [`Opened`] stop what they hold)
//! and the running configuration is untouched.

use super::Daemon;
use crate::iface::{self, Attached};
use crate::kernel::{self, KernelIface};
use crate::link::{self, Sockets};
use crate::shared::wall_ns;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use vnet_control::{Command, Datapath, Error, IfaceKind, Located, Pos, State, Transport};
use vnet_engine::{Link, Plane};
use vnet_wire::MacAddr;

/// The devices `state`'s links use, with each link's name: a `direct`
/// link's LAN device, and the device the route to a peer leaves by.
fn underlay_devs(state: &State) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let under = kernel::underlay::Underlay::read();
    for l in state.links.values() {
        match (l.transport, l.remote()) {
            (Transport::Direct { dev }, _) => out.push((dev.to_string(), l.name.clone())),
            (_, Some(a)) => {
                if let Some(h) = under.hop(a.ip()) {
                    out.push((h.dev, l.name.clone()));
                }
            }
            _ => {}
        }
    }
    out
}

/// Where VXLAN datagrams are received: `listen vxlan`, or, when a VXLAN link
/// exists without one, IANA's port on the `listen` address.
fn vxlan_addr(s: &State) -> Option<SocketAddr> {
    let wanted = s.links.values().any(|l| matches!(l.transport, Transport::Vxlan { .. }));
    s.listen_vxlan.or_else(|| wanted.then(|| SocketAddr::new(s.listen.ip(), vnet_wire::vxlan::IANA_PORT)))
}

/// Where TCP links are accepted: `listen tcp`, or, when a TCP link exists
/// without one, the `listen` address (TCP beside UDP, port 9000 by default).
fn tcp_addr(s: &State) -> Option<SocketAddr> {
    let wanted = s.links.values().any(|l| matches!(l.transport, Transport::Tcp { .. }));
    s.listen_tcp.or_else(|| wanted.then_some(s.listen))
}

/// Links whose I/O a transaction not yet committed started: stopped if it
/// fails.
struct Started(Vec<Arc<dyn link::LinkIo>>);

impl Started {
    fn keep(&mut self) {
        self.0.clear();
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        for t in &self.0 {
            t.stop();
        }
    }
}

struct Opened(Vec<Arc<Attached>>);

impl Opened {
    fn keep(mut self) -> Vec<Arc<Attached>> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        for p in &self.0 {
            p.dev.stop();
        }
    }
}

/// Undoes a failed transaction's kernel attachments: a device a running
/// interface serves gets that interface's hand-off back (its program was
/// never detached), any other is detached.
fn undo_kernel_attach(
    kp: &mut kernel::KernelPath,
    attached: &[(u32, KernelIface)],
    running: &BTreeMap<u32, KernelIface>,
) {
    for (_, k) in attached {
        match running.values().find(|r| r.dev == k.dev) {
            Some(r) => {
                let _ = kp.attach_iface(&r.dev, r.ifindex, r.handoff);
            }
            None => kp.detach_iface(&k.dev),
        }
    }
}

/// Sets each interface's standby state as `state` declares it (the data
/// path then sees its VM arrive, or not).
fn follow_standby(ifaces: &BTreeMap<u32, Arc<Attached>>, state: &State) {
    for (id, p) in ifaces {
        p.iface.set_standby(state.interfaces.get(id).is_some_and(|d| d.standby));
    }
}

/// Where in a transaction's commands an error points.
struct Positions<'a>(&'a [Located<Command>]);

impl Positions<'_> {
    /// Where interface `name` was declared.
    fn decl(&self, name: &str) -> Pos {
        self.0
            .iter()
            .find(|c| matches!(&c.item, Command::Interface { name: n, .. } if n == name))
            .map_or(Default::default(), |c| c.pos)
    }

    /// The last command `pick` chooses.
    fn last(&self, pick: fn(&Command) -> bool) -> Pos {
        self.0.iter().rev().find(|c| pick(&c.item)).map_or(Default::default(), |c| c.pos)
    }
}

/// The link sockets and TLS identity the new state needs, and what changed.
struct NewSockets {
    sockets: Sockets,
    /// A UDP or VXLAN socket is new: every link is opened again on it.
    new_socket: bool,
    /// The TLS identity changed: TCP links are opened again.
    tls_changed: bool,
}

/// The new state's links, kept or opened, and their I/O.
struct NewLinks {
    links: BTreeMap<u32, Arc<Link>>,
    io: BTreeMap<u32, Arc<dyn link::LinkIo>>,
    /// The I/O this transaction started (stopped if it fails).
    started: Started,
    /// A new link has a reader of its own (the workers take it up).
    new_reader: bool,
}

/// The new interfaces, and which of them the kernel path serves.
struct NewIfaces {
    opened: Opened,
    attached: Vec<(u32, KernelIface)>,
    /// Why each of the others (`datapath auto`) is on the user path.
    reasons: Vec<(u32, String)>,
}

/// What a transaction that only adds and deletes routes (a MAC move)
/// does: the route table is patched rather than built whole, and the
/// kernel path recompiles only the destinations it touched.
struct RouteChange {
    /// Ids of the running state's routes deleted.
    removed: Vec<u32>,
    /// The routes added (in the new state).
    added: Vec<vnet_control::RouteDef>,
    /// The unicast destinations of both, when every one names a
    /// destination (`None`: a route to `any` or `not`, which touches
    /// every destination).
    touched: Option<BTreeSet<MacAddr>>,
}

impl RouteChange {
    /// `None` unless adding and deleting routes is all `cmds` do.
    fn of(cmds: &[Located<Command>], old: &State, next: &State) -> Option<Self> {
        let mut removed = Vec::new();
        for c in cmds {
            match &c.item {
                Command::Route { .. } => {}
                Command::DeleteRoute(r) => removed.extend(old.routes.get(&r.by).map(|r| r.id)),
                _ => return None,
            }
        }
        let added: Vec<_> = next.routes.range(old.next_route_id()..).map(|(_, r)| *r).collect();
        let dsts = removed.iter().filter_map(|id| old.routes.get(id)).chain(&added).map(|r| r.dst.addr());
        let touched = dsts.collect::<Option<BTreeSet<MacAddr>>>();
        Some(RouteChange { removed, added, touched })
    }
}

/// What the acquire phases hold for the publish phase.
struct Acquired {
    next: State,
    /// What the commands change, if adding and deleting routes is all.
    change: Option<RouteChange>,
    sock: NewSockets,
    links: NewLinks,
    ifaces: NewIfaces,
}

/// What publishing made: the kernel path's interfaces as the published
/// plane has them.
struct Published {
    kernel_ifaces: BTreeMap<u32, KernelIface>,
}

impl Daemon {
    /// [`Daemon::apply`], and with `reopen` the interfaces whose device is
    /// gone are opened again too (only [`Daemon::check_devices`] asks, so a
    /// gone device never fails an unrelated transaction).
    pub(super) fn apply_reopening(&mut self, cmds: &[Located<Command>], reopen: bool) -> Result<(), Error> {
        let t0 = std::time::Instant::now();
        let at = Positions(cmds);
        let next = self.check(cmds, &at)?;
        let sock = self.acquire_sockets(&next, &at)?;
        // The running links' newest handshake timestamps, kept before any
        // link is made anew: a remade link starts from them, so the last
        // initiation before the change cannot be replayed after it.
        if let Some(e) = self.save_handshakes() {
            tracing::warn!("--state-dir {e}");
        }
        let links = self.acquire_links(&next, &sock, &at)?;
        let opened = self.acquire_interfaces(&next, reopen, &at)?;
        let ifaces = self.attach_kernel_all(opened, reopen, &at)?;
        let change = RouteChange::of(cmds, &self.state, &next);
        let route_only = change.is_some();
        let acquired = Acquired { next, sock, links, ifaces, change };
        let published = self.publish(&acquired, &at)?;
        self.release(acquired, published);
        self.last_transaction = (t0.elapsed(), route_only);
        Ok(())
    }

    /// The state `cmds` make of the running one (nothing acquired yet).
    fn check(&self, cmds: &[Located<Command>], at: &Positions) -> Result<State, Error> {
        let next = self.state.apply_all(cmds)?;
        if self.cluster_fixed && next.cluster != self.state.cluster {
            return Err(Error::new(
                at.last(|c| matches!(c, Command::Cluster(_))),
                "the `cluster` line vnetd started with",
                "a change: cluster settings are taken at start; restart vnetd to use them",
            ));
        }
        self.check_neighbors(cmds, &next)?;
        self.check_groups(&next, &|name| at.decl(name))?;
        Ok(next)
    }

    /// A `neigh` line may not answer for an address another host's VM
    /// claims (cluster mode): that would make this host's edge answer with
    /// another MAC than the owner's. An address claimed by one of this
    /// host's own VMs, or with the same MAC, is fine.
    fn check_neighbors(&self, cmds: &[Located<Command>], next: &State) -> Result<(), Error> {
        let mine = |m: &vnet_wire::MacAddr| next.interfaces.values().any(|i| i.mac.as_ref() == Some(m));
        for c in cmds {
            let Command::Neigh(n) = &c.item else { continue };
            if let Some(owner) = self.cluster_neighbors().get(&(n.network, n.ip)) {
                if *owner != n.mac && !mine(owner) {
                    return Err(Error::new(
                        c.pos,
                        format!("an address no other host's VM claims (network {})", n.network),
                        format!("{}, which VM {owner} of another host claims", n.ip),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Acquire: the link sockets whose address changed (or that are new),
    /// and the TLS identity if the `tls` line changed.
    fn acquire_sockets(&self, next: &State, at: &Positions) -> Result<NewSockets, Error> {
        let mut sockets = self.sockets.clone();
        let mut new_socket = false;
        let bind_error = |pick: fn(&Command) -> bool, what: String, e: std::io::Error| {
            Error::new(at.last(pick), what, format!("error: {e}"))
        };
        if sockets.udp.as_ref().map(|b| b.addr) != Some(next.listen) {
            let b = link::udp::bind_udp(next.listen, self.link_readers).map_err(|e| {
                bind_error(
                    |c| matches!(c, Command::Listen { .. }),
                    format!("an address vnetd can bind ({})", next.listen),
                    e,
                )
            })?;
            sockets.udp = Some(b);
            new_socket = true;
        }
        let want_vxlan = vxlan_addr(next);
        if sockets.vxlan.as_ref().map(|b| b.addr) != want_vxlan {
            sockets.vxlan = match want_vxlan {
                Some(a) => Some(link::udp::bind_vxlan(a, self.link_readers).map_err(|e| {
                    bind_error(
                        |c| matches!(c, Command::ListenVxlan(_) | Command::Link { .. }),
                        format!("an address vnetd can bind for VXLAN ({a})"),
                        e,
                    )
                })?),
                None => None,
            };
            new_socket = true;
        }
        let want_tcp = tcp_addr(next);
        if sockets.tcp.as_ref().map(|a| a.addr) != want_tcp {
            sockets.tcp = match want_tcp {
                Some(a) => {
                    Some(Arc::new(link::tcp::Acceptor::bind(a, self.shared.global.clone()).map_err(|e| {
                        bind_error(
                            |c| matches!(c, Command::ListenTcp(_) | Command::Link { .. }),
                            format!("an address vnetd can listen on for TCP links ({a})"),
                            e,
                        )
                    })?))
                }
                None => None,
            };
        }
        let mut tls_changed = false;
        if next.tls != self.state.tls || (sockets.tls.is_none() && next.tls.is_some()) {
            sockets.tls = match &next.tls {
                // Why a file did not load goes to vnetd's log only: a
                // control client is not told whether a path it may not read
                // exists (the issue-27 review's `tls cert` oracle).
                Some(files) => Some(Arc::new(link::tcp::Tls::load(files).map_err(|e| {
                    tracing::warn!("tls: {e}");
                    Error::new(
                        at.last(|c| matches!(c, Command::Tls(_))),
                        "a readable certificate chain, private key (owner only) and CA (PEM)",
                        "error: the files did not load as such; vnetd's log says why",
                    )
                })?)),
                None => None,
            };
            tls_changed = true;
        }
        Ok(NewSockets { sockets, new_socket, tls_changed })
    }

    /// Acquire: the links' I/O (new links, and every link if its socket
    /// changed; TCP links when the TLS identity did). TCP links started
    /// here stop again if the transaction fails.
    fn acquire_links(&self, next: &State, sock: &NewSockets, at: &Positions) -> Result<NewLinks, Error> {
        let mut out = NewLinks {
            links: BTreeMap::new(),
            io: BTreeMap::new(),
            started: Started(Vec::new()),
            new_reader: false,
        };
        let link_pos = at.last(|c| matches!(c, Command::Link { .. }));
        for d in next.links.values() {
            let is_tcp = matches!(d.transport, Transport::Tcp { .. });
            let keep = self
                .links
                .get(&d.id)
                .filter(|l| l.def == *d && !sock.new_socket && !(is_tcp && sock.tls_changed));
            let l = match keep {
                Some(l) => {
                    if let Some(io) = self.link_io.get(&d.id) {
                        out.io.insert(d.id, io.clone());
                    }
                    l.clone()
                }
                None => {
                    let sec = vnet_engine::secure::for_link(
                        d,
                        self.identity.as_ref(),
                        self.timers.dated_by(wall_ns),
                    )
                    .map_err(|e| {
                        Error::new(link_pos, format!("a link vnetd can secure ({})", d.name), e.to_string())
                    })?
                    .map(|s| s.listed_in(self.shared.global.sessions.clone(), d.id));
                    let o = link::open(d, &sock.sockets, &self.shared).map_err(|e| {
                        Error::new(link_pos, format!("a link vnetd can send on ({})", d.name), e.to_string())
                    })?;
                    out.started.0.push(o.clone());
                    out.new_reader |= o.reader().is_some();
                    out.io.insert(d.id, o.clone());
                    if let Some(sec) = &sec {
                        self.stamps.restore(sec);
                    }
                    Arc::new(Link::new(d.clone(), o.tx()).secured(sec))
                }
            };
            out.links.insert(d.id, l);
        }
        Ok(out)
    }

    /// Acquire: the new interfaces (and, with `reopen`, those whose device
    /// is gone). vhost-user servers stop again if the transaction fails.
    fn acquire_interfaces(&self, next: &State, reopen: bool, at: &Positions) -> Result<Opened, Error> {
        let mut opened = Opened(Vec::new());
        let mut underlay: Option<Vec<(String, String)>> = None;
        for (id, def) in &next.interfaces {
            if self.ifaces.contains_key(id) && !(reopen && self.gone.contains_key(id)) {
                continue;
            }
            if def.kind == IfaceKind::Netdev && def.netns.is_none() {
                let under = underlay.get_or_insert_with(|| underlay_devs(next));
                let under = under.iter().map(|(d, l)| (d.as_str(), l.as_str()));
                if let Some(why) = crate::paths::forbidden_netdev(&def.dev, under) {
                    return Err(Error::new(
                        at.decl(&def.name),
                        "a VM's device (not loopback, not a device a link uses)",
                        format!("`{}`, {why}", def.dev),
                    ));
                }
            }
            let att = iface::open(def, &self.shared, &self.worker_cpus).map_err(|e| {
                Error::new(at.decl(&def.name), "a device vnetd can open and configure", format!("error: {e}"))
            })?;
            opened.0.push(Arc::new(att));
        }
        Ok(opened)
    }

    /// Acquire: the kernel path for the new interfaces that ask for it;
    /// undone if one that requires it (`datapath kernel`) cannot have it.
    fn attach_kernel_all(
        &mut self,
        opened: Opened,
        reopen: bool,
        at: &Positions,
    ) -> Result<NewIfaces, Error> {
        let mut attached: Vec<(u32, KernelIface)> = Vec::new();
        let mut reasons: Vec<(u32, String)> = Vec::new();
        // A reopened interface's old device is gone: what the kernel path
        // held of it goes too, so the new device (of the same name) gets
        // its program.
        for p in opened.0.iter().filter(|_| reopen) {
            if let (Some(k), Some(kp)) = (self.kernel_ifaces.get(&p.def.id), self.kernel.as_mut()) {
                kp.detach_iface(&k.dev);
            }
        }
        for p in &opened.0 {
            let def = &p.def;
            match self.attach_kernel(def, p) {
                Ok(Some(k)) => attached.push((def.id, k)),
                Ok(None) => {}
                Err(reason) if def.datapath == Datapath::Kernel => {
                    if let Some(kp) = self.kernel.as_mut() {
                        undo_kernel_attach(kp, &attached, &self.kernel_ifaces);
                    }
                    return Err(Error::new(
                        at.decl(&def.name),
                        "an interface the kernel path can serve (`datapath kernel`)",
                        reason.to_string(),
                    ));
                }
                Err(reason) => {
                    tracing::info!(interface = %def.name, %reason, "datapath auto: user path");
                    reasons.push((def.id, reason.to_string()));
                }
            }
        }
        Ok(NewIfaces { opened, attached, reasons })
    }

    /// Publish: builds the new plane and makes it the one every path uses.
    /// The kernel path's maps first: a change reaches both paths, or, if
    /// the maps refuse it, neither (they are put back as the running plane
    /// has them, and the transaction fails).
    fn publish(&mut self, a: &Acquired, at: &Positions) -> Result<Published, Error> {
        let next = &a.next;
        let mut ifaces: BTreeMap<u32, Arc<Attached>> = self
            .ifaces
            .iter()
            .filter(|(id, _)| next.interfaces.contains_key(id))
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        for p in &a.ifaces.opened.0 {
            ifaces.insert(p.def.id, p.clone());
        }
        self.generation += 1;
        let running = self.shared.plane.load_full();
        // Patched from the running table when that is the running state's
        // (it always is but after a shutdown: checked, cheaply).
        let table = match &a.change {
            Some(c) if running.table.len() == self.state.routes.len() => {
                vnet_engine::plane::patched_table(&running.table, self.generation, &c.removed, &c.added)
            }
            _ => vnet_engine::plane::route_table(next, self.generation, &running.table),
        };
        follow_standby(&ifaces, next);
        let neighbors = self.neighbors_of(next);
        let guards = self.guards_of(next);
        let policy = self.policy_of(next);
        let plane = Arc::new(
            Plane::new(
                table,
                ifaces.values().map(|a| a.iface.clone()).collect(),
                a.links.links.values().cloned().collect(),
            )
            .waking(Some(self.shared.wake.clone()))
            .answering(neighbors)
            .guarding(guards)
            .governed(policy),
        );
        let mut kernel_ifaces = self.kernel_ifaces.clone();
        let reopened = |id: &u32| a.ifaces.opened.0.iter().any(|p| p.def.id == *id);
        kernel_ifaces.retain(|id, _| next.interfaces.contains_key(id) && !reopened(id));
        kernel_ifaces.extend(a.ifaces.attached.iter().cloned());
        if let Some(kp) = self.kernel.as_mut() {
            let vxlan = a.sock.sockets.vxlan.as_ref().map(|b| b.addr);
            let touched = a.change.as_ref().and_then(|c| c.touched.as_ref());
            match kp.sync(&plane, &kernel_ifaces, next.listen, vxlan, touched) {
                Ok(skipped) => {
                    for (link, reason) in &skipped {
                        if self.link_reasons.get(link) != Some(reason) {
                            tracing::info!(%link, %reason, "link left to the user path");
                        }
                    }
                    self.link_reasons = skipped.into_iter().collect();
                }
                Err(e) => {
                    follow_standby(&self.ifaces, &self.state);
                    let vxlan = self.sockets.vxlan.as_ref().map(|b| b.addr);
                    if let Err(back) = kp.sync(&running, &self.kernel_ifaces, self.state.listen, vxlan, None)
                    {
                        tracing::error!("the kernel path's maps could not be put back: {back}");
                    }
                    undo_kernel_attach(kp, &a.ifaces.attached, &self.kernel_ifaces);
                    return Err(Error::new(
                        at.last(|_| true),
                        "a change the kernel path's maps can hold",
                        format!("error: {e} (nothing was changed)"),
                    ));
                }
            }
        }
        self.shared.plane.store(plane);
        Ok(Published { kernel_ifaces })
    }

    /// Release: what the old state held that the new one does not (kernel
    /// attachments, TCP links, interfaces), and start what the new one
    /// needs (the TCP acceptor's links, the workers). Cannot fail.
    fn release(&mut self, a: Acquired, p: Published) {
        let Acquired { next, sock, links, ifaces, .. } = a;
        let NewLinks { links, io, mut started, new_reader } = links;
        let NewIfaces { opened, reasons, .. } = ifaces;
        // Not a device a new interface serves (one declared anew on the
        // same device: its program stays attached, its hand-off is the new
        // one already).
        for (id, k) in &self.kernel_ifaces {
            let reused = p.kernel_ifaces.values().any(|n| n.dev == k.dev);
            if !p.kernel_ifaces.contains_key(id) && !reused {
                if let Some(kp) = self.kernel.as_mut() {
                    kp.detach_iface(&k.dev);
                }
            }
        }
        self.kernel_ifaces = p.kernel_ifaces;
        self.user_reasons.retain(|id, _| next.interfaces.contains_key(id));
        self.user_reasons.extend(reasons);

        // Links' I/O: the acceptor hands peers' connections to the new
        // streams; what was replaced or removed stops.
        started.keep();
        if let Some(acc) = &sock.sockets.tcp {
            acc.set_links(io.iter().filter_map(|(id, l)| Some((next.links.get(id)?.rx_key(), l.stream()?))));
        }
        for (id, old) in &self.link_io {
            if !io.get(id).is_some_and(|n| Arc::ptr_eq(n, old)) {
                old.stop();
            }
        }
        let readers =
            |m: &BTreeMap<u32, Arc<dyn link::LinkIo>>| m.values().filter(|l| l.reader().is_some()).count();
        let lans_changed = new_reader || readers(&io) != readers(&self.link_io);
        self.link_io = io;

        // Workers: restarted when interfaces or the link sockets changed.
        let opened = opened.keep();
        let respawn = sock.new_socket
            || lans_changed
            || self.listen_mode != next.listen_mode
            || !opened.is_empty()
            || self.ifaces.keys().any(|id| !next.interfaces.contains_key(id));
        self.sockets = sock.sockets;
        self.listen_mode = next.listen_mode;
        self.ifaces.retain(|id, p| {
            let keep = next.interfaces.contains_key(id);
            if !keep {
                p.dev.stop();
                tracing::info!(interface = %p.def.name, "interface removed");
            }
            keep
        });
        for p in opened {
            tracing::info!(interface = %p.def.name, dev = %p.def.dev, mac = ?p.iface.mac,
                queues = p.dev.queues(), offload = p.dev.vnet_hdr(), "interface attached");
            if let Some(old) = self.ifaces.insert(p.def.id, p) {
                old.dev.stop(); // its device was gone: this one replaces it
            }
        }
        if respawn {
            self.respawn();
        }
        self.links = links;
        self.state = next;
    }
}
