//! The interfaces as a resource of the daemon: each one's open device,
//! those whose device is gone (reattached when it is back), those that
//! moved in from standby, and the attachments kept across restarts.

use super::positions::Positions;
use crate::iface::{self, Attached};
use crate::kernel;
use crate::shared::Shared;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use vnet_control::{Error, IfaceKind, State, Transport};

/// The running interfaces and what the daemon keeps of them.
#[derive(Default)]
pub(super) struct Interfaces {
    pub(super) running: BTreeMap<u32, Arc<Attached>>,
    /// Interfaces whose device is gone (by id: since when, engine clock),
    /// and how often each was reattached.
    pub(super) gone: BTreeMap<u32, u64>,
    pub(super) reattached: BTreeMap<u32, u64>,
    /// Interfaces activated from standby (their VM arrived, or `activate`)
    /// whose MAC cluster mode has not claimed yet: a migration's claim,
    /// the one kind that takes a MAC another host holds.
    pub(super) moved_in: BTreeSet<u32>,
    /// The interfaces `attach` made, kept across restarts.
    pub(super) attachments: Attachments,
}

/// The file `attach`'s interfaces are kept in, and the names it holds.
#[derive(Debug, Default)]
pub(super) struct Attachments {
    pub(super) path: Option<PathBuf>,
    pub(super) names: BTreeSet<String>,
}

/// Interfaces a transaction not yet committed opened: stopped if it fails.
pub(super) struct Opened(pub(super) Vec<Arc<Attached>>);

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

impl Interfaces {
    /// Acquire: the new interfaces (and, with `reopen`, those whose device
    /// is gone). vhost-user servers stop again if the transaction fails.
    pub(super) fn acquire(
        &self,
        next: &State,
        reopen: bool,
        shared: &Arc<Shared>,
        cpus: &[usize],
        at: &Positions,
    ) -> Result<Opened, Error> {
        let mut opened = Opened(Vec::new());
        let mut underlay: Option<Vec<(String, String)>> = None;
        for (id, def) in &next.interfaces {
            if self.running.contains_key(id) && !(reopen && self.gone.contains_key(id)) {
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
            let att = iface::open(def, shared, cpus).map_err(|e| {
                Error::new(at.decl(&def.name), "a device vnetd can open and configure", format!("error: {e}"))
            })?;
            opened.0.push(Arc::new(att));
        }
        Ok(opened)
    }

    /// Release: the interfaces `next` no longer declares stop, the new
    /// ones (`opened`) join (one whose device was gone replaces it).
    /// Whether the set changed (the workers are started again).
    pub(super) fn release(&mut self, opened: Opened, next: &State) -> bool {
        let opened = opened.keep();
        let changed = !opened.is_empty() || self.running.keys().any(|id| !next.interfaces.contains_key(id));
        self.running.retain(|id, p| {
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
            if let Some(old) = self.running.insert(p.def.id, p) {
                old.dev.stop(); // its device was gone: this one replaces it
            }
        }
        changed
    }

    /// Stops every interface's device (a shutdown).
    pub(super) fn stop_all(&mut self) {
        for p in self.running.values() {
            p.dev.stop();
        }
        self.running.clear();
    }

    /// Copies of the interfaces' devices for a hand-over, named for the
    /// next vnetd ([`crate::handover`]).
    pub(super) fn hand_over_fds(&self, out: &mut Vec<(String, OwnedFd)>) {
        for a in self.running.values() {
            let ns = a.def.netns.clone().unwrap_or_else(|| "-".into());
            match &a.dev {
                iface::Device::Tap(t) => {
                    for (k, q) in t.queues.iter().enumerate() {
                        let name = iface::tap::queue_name(&ns, &a.def.dev, k, t.vnet_hdr, t.queues.len() > 1);
                        out.extend(q.try_clone().ok().map(|f| (name, f.into())));
                    }
                }
                iface::Device::Netdev(n) => out.extend(n.handed(&ns, &a.def.dev)),
                iface::Device::Vhost(_) => {}
            }
        }
    }
}
