//! A transaction, as named phases over the daemon's resources.
//! [`Daemon::apply_reopening`] checks the commands against a copy of the
//! state ([`Daemon::check`]), then each resource *acquires* what the new
//! state needs: the link sockets and TLS identity
//! (`LinkSockets::acquire`), the links (`LinkSet::acquire`), the new
//! interfaces (`Interfaces::acquire`) and their kernel attachments
//! (`Fastpath::acquire`); then the new plane is *published*, the kernel's
//! maps first ([`Daemon::publish`]); then each resource *releases* what
//! the old state held that the new one does not, and the workers start
//! again if what they read changed ([`Daemon::release`]). Until publishing
//! succeeds, a failure drops what was acquired (what the links and
//! interfaces started stops again) and the running configuration is
//! untouched.
//!
//! The phases visit each file once (docs/ARCHITECTURE.md, "Two walks"):
//! a resource is asked once per phase it takes part in, and what a later
//! phase needs of a file the walk left is taken with it (the route change
//! at the check, the handshakes' stamps at the links' acquire) or done
//! here (the interfaces' standby, the kernel's maps written).

use super::fastpath::{Fastpath, NewIfaces};
use super::links::NewLinks;
use super::positions::Positions;
use super::sockets::NewSockets;
use super::Daemon;
use crate::iface::Attached;
use crate::kernel::{KernelError, KernelIface};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use vnet_control::{Command, Error, Located, State};
use vnet_engine::Plane;
use vnet_wire::MacAddr;

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
        let (next, change) = self.check(cmds, &at)?;
        let sock = self.sockets.acquire(&self.state, &next, &self.shared.global, &at)?;
        let links = self.links.acquire(&next, &sock, &self.shared, &at)?;
        let opened = self.ifaces.acquire(&next, reopen, &self.shared, &self.workers.cpus, &at)?;
        let ifaces = self.kernel.acquire(opened, reopen, &at)?;
        let route_only = change.is_some();
        let acquired = Acquired { next, sock, links, ifaces, change };
        let published = self.publish(&acquired, &at)?;
        self.release(acquired, published);
        self.last_transaction = (t0.elapsed(), route_only);
        Ok(())
    }

    /// The state `cmds` make of the running one (nothing acquired yet),
    /// and what they change if adding and deleting routes is all they do.
    fn check(
        &self,
        cmds: &[Located<Command>],
        at: &Positions,
    ) -> Result<(State, Option<RouteChange>), Error> {
        let next = self.state.apply_all(cmds)?;
        let change = RouteChange::of(cmds, &self.state, &next);
        if self.cluster.fixed && next.cluster != self.state.cluster {
            return Err(Error::new(
                at.last(|c| matches!(c, Command::Cluster(_))),
                "the `cluster` line vnetd started with",
                "a change: cluster settings are taken at start; restart vnetd to use them",
            ));
        }
        self.check_neighbors(cmds, &next)?;
        self.cluster.check_groups(&next, &|name| at.decl(name))?;
        Ok((next, change))
    }

    /// A `neigh` line may not answer for an address another host's VM
    /// claims (cluster mode): that would make this host's edge answer with
    /// another MAC than the owner's. An address claimed by one of this
    /// host's own VMs, or with the same MAC, is fine.
    fn check_neighbors(&self, cmds: &[Located<Command>], next: &State) -> Result<(), Error> {
        let mine = |m: &vnet_wire::MacAddr| next.interfaces.values().any(|i| i.mac.as_ref() == Some(m));
        for c in cmds {
            let Command::Neigh(n) = &c.item else { continue };
            if let Some(owner) = self.cluster.neighbors.get(&(n.network, n.ip)) {
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

    /// Publish: builds the new plane and makes it the one every path uses.
    /// The kernel path's maps first: a change reaches both paths, or, if
    /// the maps refuse it, neither (they are put back as the running plane
    /// has them, and the transaction fails).
    fn publish(&mut self, a: &Acquired, at: &Positions) -> Result<Published, Error> {
        let next = &a.next;
        let neighbors = self.neighbors_of(next);
        let guards = self.guards_of(next);
        let policy = self.policy_of(next);
        let mut ifaces: BTreeMap<u32, Arc<Attached>> = self
            .ifaces
            .running
            .iter()
            .filter(|(id, _)| next.interfaces.contains_key(id))
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        for p in &a.ifaces.opened.0 {
            ifaces.insert(p.def.id, p.clone());
        }
        follow_standby(&ifaces, next);
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
        let mut kernel_ifaces = self.kernel.ifaces.clone();
        let reopened = |id: &u32| a.ifaces.opened.0.iter().any(|p| p.def.id == *id);
        kernel_ifaces.retain(|id, _| next.interfaces.contains_key(id) && !reopened(id));
        kernel_ifaces.extend(a.ifaces.attached.iter().cloned());
        let vxlan = a.sock.sockets.vxlan.as_ref().map(|b| b.addr);
        let touched = a.change.as_ref().and_then(|c| c.touched.as_ref());
        if let Err(e) =
            publish_kernel(&mut self.kernel, &plane, &kernel_ifaces, (next.listen, vxlan), touched)
        {
            follow_standby(&self.ifaces.running, &self.state);
            self.kernel.put_back(&running, self.state.listen, self.sockets.vxlan(), &a.ifaces.attached);
            return Err(Error::new(
                at.last(|_| true),
                "a change the kernel path's maps can hold",
                format!("error: {e} (nothing was changed)"),
            ));
        }
        self.shared.plane.store(plane);
        Ok(Published { kernel_ifaces })
    }

    /// Release: each resource lets go of what the old state held that the
    /// new one does not (kernel attachments, links' I/O, sockets,
    /// interfaces), and the workers start again when what they read
    /// changed. Cannot fail.
    fn release(&mut self, a: Acquired, p: Published) {
        let Acquired { next, sock, links, ifaces, .. } = a;
        let NewIfaces { opened, reasons, .. } = ifaces;
        self.kernel.release(p.kernel_ifaces, &next, reasons);
        let lans_changed = self.links.release(links, &sock.sockets, &next);
        let respawn = sock.new_socket || lans_changed || self.sockets.mode != next.listen_mode;
        self.sockets.release(sock.sockets, next.listen_mode);
        let ifaces_changed = self.ifaces.release(opened, &next);
        if respawn || ifaces_changed {
            self.workers.respawn(&self.shared, &self.sockets, &self.links, &self.ifaces, self.reasm);
        }
        self.state = next;
    }
}

/// Sets each interface's standby state as `state` declares it (the data
/// path then sees its VM arrive, or not).
fn follow_standby(ifaces: &BTreeMap<u32, Arc<Attached>>, state: &State) {
    for (id, p) in ifaces {
        p.iface.set_standby(state.interfaces.get(id).is_some_and(|d| d.standby));
    }
}

/// Publish, the kernel's part: the maps made to hold `plane` for the
/// interfaces `ifaces` serves (`listen`: the link socket's and the VXLAN
/// socket's addresses; `touched`: the destinations a change of routes
/// alone touched); the links left to the user path noted.
fn publish_kernel(
    kernel: &mut Fastpath,
    plane: &Plane,
    ifaces: &BTreeMap<u32, KernelIface>,
    (listen, vxlan): (SocketAddr, Option<SocketAddr>),
    touched: Option<&BTreeSet<MacAddr>>,
) -> Result<(), KernelError> {
    let Some(kp) = kernel.path.as_mut() else { return Ok(()) };
    let skipped = kp.sync(plane, ifaces, listen, vxlan, touched)?;
    for (link, reason) in &skipped {
        if kernel.link_reasons.get(link) != Some(reason) {
            tracing::info!(%link, %reason, "link left to the user path");
        }
    }
    kernel.link_reasons = skipped.into_iter().collect();
    Ok(())
}
