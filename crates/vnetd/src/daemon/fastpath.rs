//! The kernel path as a resource of the daemon: the eBPF programs and
//! maps (loaded the first time an interface asks for them), the
//! interfaces they serve, why others and which links stay on the user
//! path, and what the hand-over's pins need.

use super::interfaces::Opened;
use super::positions::Positions;
use crate::iface::{self, Attached};
use crate::kernel::{self, KernelError, KernelIface, KernelPath};
use crate::sys;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use vnet_control::{Datapath, Error, IfaceKind, InterfaceDef, State};
use vnet_engine::Plane;

/// The kernel path and what the daemon knows of it.
pub(super) struct Fastpath {
    /// The eBPF fast path, loaded the first time an interface asks for it.
    pub(super) path: Option<KernelPath>,
    /// Why it could not be loaded (asked once; `auto` then stays on user).
    pub(super) off: Option<String>,
    /// Interfaces the kernel path serves, and why others are on the user path.
    pub(super) ifaces: BTreeMap<u32, KernelIface>,
    pub(super) user_reasons: BTreeMap<u32, String>,
    /// Links the kernel path leaves to the user path, and why (by name).
    pub(super) link_reasons: BTreeMap<String, String>,
    /// The bpffs directory of the hand-over's pins (`--bpf-dir`).
    pub(super) bpf_dir: Option<std::path::PathBuf>,
    /// `Daemon::hold_pins` asked before the kernel path was loaded.
    pub(super) hold_pins: bool,
    /// Entries each of the kernel path's route tables holds (`--kernel-routes`).
    pub(super) routes: usize,
}

impl Default for Fastpath {
    fn default() -> Self {
        Fastpath {
            path: None,
            off: None,
            ifaces: BTreeMap::new(),
            user_reasons: BTreeMap::new(),
            link_reasons: BTreeMap::new(),
            bpf_dir: None,
            hold_pins: false,
            routes: crate::kernel::MAX_ROUTES,
        }
    }
}

/// The new interfaces, and which of them the kernel path serves.
pub(super) struct NewIfaces {
    pub(super) opened: Opened,
    pub(super) attached: Vec<(u32, KernelIface)>,
    /// Why each of the others (`datapath auto`) is on the user path.
    pub(super) reasons: Vec<(u32, String)>,
}

/// Undoes a failed transaction's kernel attachments: a device a running
/// interface serves gets that interface's hand-off back (its program was
/// never detached), any other is detached.
fn undo_kernel_attach(
    kp: &mut KernelPath,
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

impl Fastpath {
    /// Acquire: the kernel path for the new interfaces that ask for it;
    /// undone if one that requires it (`datapath kernel`) cannot have it.
    pub(super) fn acquire(
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
            if let (Some(k), Some(kp)) = (self.ifaces.get(&p.def.id), self.path.as_mut()) {
                kp.detach_iface(&k.dev);
            }
        }
        for p in &opened.0 {
            let def = &p.def;
            match self.attach(def, p) {
                Ok(Some(k)) => attached.push((def.id, k)),
                Ok(None) => {}
                Err(reason) if def.datapath == Datapath::Kernel => {
                    if let Some(kp) = self.path.as_mut() {
                        undo_kernel_attach(kp, &attached, &self.ifaces);
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

    /// Puts a new interface on the kernel path if its `datapath` asks for
    /// it and the kernel path can serve it: `Ok(None)` for `user`, the
    /// reason when it cannot.
    fn attach(&mut self, def: &InterfaceDef, att: &Attached) -> Result<Option<KernelIface>, KernelError> {
        use KernelError::UserPath;
        if def.datapath == Datapath::User {
            return Ok(None);
        }
        if def.kind == IfaceKind::VhostUser {
            return Err(UserPath("vnetd reads and writes this guest's virtio rings itself"));
        }
        if def.kind == IfaceKind::Tap {
            return Err(UserPath(
                "vnetd serves this TAP through its file descriptor (the kernel path takes netdevs: a \
                 container's veth, a TAP QEMU holds)",
            ));
        }
        if def.netns.is_some() {
            return Err(UserPath("the device is in another namespace than vnetd and its underlay"));
        }
        if let Some(r) = &self.off {
            return Err(KernelError::Unavailable(r.clone()));
        }
        if self.path.is_none() {
            match KernelPath::load(self.bpf_dir.as_deref().map(kernel::pins::Pins::new), self.routes) {
                Ok(mut k) => {
                    tracing::info!("eBPF fast path loaded");
                    k.hold_adoption = self.hold_pins;
                    self.path = Some(k);
                }
                Err(r) => {
                    tracing::warn!(reason = %r, "eBPF fast path unavailable");
                    self.off = Some(r.to_string());
                    return Err(r);
                }
            }
        }
        let kp = self.path.as_mut().ok_or(UserPath("the kernel path is not loaded"))?;
        let ifindex =
            sys::ifindex(&def.dev).map_err(kernel::io_error(format!("no ifindex for {}", def.dev)))?;
        let iface::Device::Netdev(nd) = &att.dev else {
            return Err(UserPath("the interface has no packet socket"));
        };
        // The hand-off TAP first, the program second, and only then does
        // the packet socket stop receiving (the workers read the TAP): a
        // failure on the way leaves the interface on the user path whole.
        let (tap, tap_name, tap_index) =
            nd.make_hand_off().map_err(kernel::io_error("cannot make its hand-off TAP"))?;
        kp.attach_iface(&def.dev, ifindex, tap_index)?;
        nd.use_hand_off(tap, tap_name);
        Ok(Some(KernelIface {
            dev: def.dev.clone(),
            ifindex,
            peer: kernel::is_veth(&def.dev),
            handoff: tap_index,
        }))
    }

    /// A publish the maps refused: they are put back as the `running`
    /// plane has them, and the transaction's attachments (`attached`)
    /// undone.
    pub(super) fn put_back(
        &mut self,
        running: &Plane,
        listen: SocketAddr,
        vxlan: Option<SocketAddr>,
        attached: &[(u32, KernelIface)],
    ) {
        let Some(kp) = self.path.as_mut() else { return };
        if let Err(back) = kp.sync(running, &self.ifaces, listen, vxlan, None) {
            tracing::error!("the kernel path's maps could not be put back: {back}");
        }
        undo_kernel_attach(kp, attached, &self.ifaces);
    }

    /// Release: the devices no interface of the new state serves are
    /// detached (not one a new interface serves: one declared anew on the
    /// same device keeps its program, its hand-off is the new one
    /// already); `served` becomes what the kernel path serves, `reasons`
    /// why the new interfaces of `next` it does not serve are on the user
    /// path.
    pub(super) fn release(
        &mut self,
        served: BTreeMap<u32, KernelIface>,
        next: &State,
        reasons: Vec<(u32, String)>,
    ) {
        for (id, k) in &self.ifaces {
            let reused = served.values().any(|n| n.dev == k.dev);
            if !served.contains_key(id) && !reused {
                if let Some(kp) = self.path.as_mut() {
                    kp.detach_iface(&k.dev);
                }
            }
        }
        self.ifaces = served;
        self.user_reasons.retain(|id, _| next.interfaces.contains_key(id));
        self.user_reasons.extend(reasons);
    }

    /// Gives the kernel path's links the MTU their path MTU search found
    /// (a link whose MTU moved is written again; frames that no longer fit
    /// are left to the user path, which fragments them).
    pub(super) fn follow_path_mtus(&mut self, plane: &Plane, listen: SocketAddr, vxlan: Option<SocketAddr>) {
        let Some(kp) = self.path.as_mut().filter(|k| k.mtus_moved(plane)) else { return };
        match kp.sync(plane, &self.ifaces, listen, vxlan, None) {
            Ok(skipped) => self.link_reasons = skipped.into_iter().collect(),
            Err(e) => tracing::warn!("the kernel path's links keep their old MTU: {e}"),
        }
    }

    /// Unloads the kernel path (a shutdown).
    pub(super) fn unload(&mut self) {
        self.ifaces.clear();
        self.path = None;
    }
}
