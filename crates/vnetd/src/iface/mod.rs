//! Interfaces: the local virtual NICs VMs are attached to, one module per
//! kind (`tap`, `netdev`, `vhost`), each opening its device and
//! implementing the engine's `Port` for the frames that go to the VM.
//! [`open`] and [`Device`] match on the kind exhaustively, so a new kind is
//! a variant of `IfaceKind` and a module here.

mod io;
pub mod netdev;
pub mod tap;
pub mod vhost;

use io::in_ns;

use crate::shared::Shared;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use vnet_control::{IfaceKind, InterfaceDef};
use vnet_engine::{DispatchStats, Iface, Port};

/// An interface vnetd serves: the engine's view, its declaration, and the
/// device behind it.
pub struct Attached {
    pub iface: Arc<Iface>,
    pub def: InterfaceDef,
    pub dev: Device,
    pub dispatch: Arc<DispatchStats>,
    /// The device's index when it was opened (a TAP or netdev; a vhost-user
    /// socket has none): a device deleted, or deleted and made again, no
    /// longer has it.
    pub ifindex: Option<u32>,
}

impl Attached {
    /// Whether the device vnetd opened is still there (in its namespace).
    pub fn device_present(&self) -> bool {
        let Some(was) = self.ifindex else { return true };
        let dev = self.def.dev.clone();
        in_ns(&self.def, move || crate::sys::ifindex(&dev)).is_ok_and(|now| now == was)
    }
}

/// The device behind an interface, by kind.
pub enum Device {
    Tap(Arc<tap::Tap>),
    Netdev(Arc<netdev::Netdev>),
    Vhost(Arc<vhost::VhostDev>),
}

/// Where a worker reads a queue's frames from.
#[derive(Clone)]
pub enum Reader {
    /// A TAP queue: a frame a `read`.
    File(Arc<File>),
    /// A packet socket without a ring: a frame a `recvmsg`, with its VLAN tag metadata.
    Packet(Arc<File>),
    /// A netdev's receive ring, and the socket that signals it.
    Ring(Arc<File>, Arc<Mutex<crate::sys::RxRing>>),
}

impl Reader {
    pub fn fd(&self) -> RawFd {
        match self {
            Reader::File(f) | Reader::Packet(f) | Reader::Ring(f, _) => f.as_raw_fd(),
        }
    }
}

impl Device {
    /// The port frames for the VM leave by.
    pub fn port(&self) -> Arc<dyn Port> {
        match self {
            Device::Tap(t) => t.clone(),
            Device::Netdev(n) => n.clone(),
            Device::Vhost(v) => v.clone(),
        }
    }

    /// Queues workers read (a vhost-user interface has its own threads).
    pub fn queues(&self) -> usize {
        match self {
            Device::Tap(t) => t.queues.len(),
            Device::Netdev(_) => 1,
            Device::Vhost(_) => 0,
        }
    }

    /// What worker `q` reads, if it reads this device.
    pub fn reader(&self, q: usize) -> Option<Reader> {
        match self {
            Device::Tap(t) => t.queues.get(q).map(|f| Reader::File(f.clone())),
            Device::Netdev(n) if q == 0 => Some(match n.rx() {
                netdev::Rx::HandOff(tap, _) => Reader::File(tap),
                netdev::Rx::Packet(sock, Some(r)) => Reader::Ring(sock, r),
                netdev::Rx::Packet(sock, None) => Reader::Packet(sock),
            }),
            Device::Netdev(_) | Device::Vhost(_) => None,
        }
    }

    /// Whether frames carry a `virtio_net_hdr` both ways.
    pub fn vnet_hdr(&self) -> bool {
        match self {
            Device::Tap(t) => t.vnet_hdr,
            Device::Netdev(n) => n.vnet_hdr,
            Device::Vhost(v) => v.takes_offloads(),
        }
    }

    /// Whether a netdev's frames come off a receive ring (not off the
    /// kernel path's hand-off TAP).
    pub fn rx_ring(&self) -> bool {
        matches!(self, Device::Netdev(n) if matches!(n.rx(), netdev::Rx::Packet(_, Some(_))))
    }

    /// A netdev on the kernel path: the name of the hand-off TAP vnetd
    /// reads its frames from.
    pub fn hand_off_name(&self) -> Option<String> {
        match self {
            Device::Netdev(n) => n.hand_off_name(),
            Device::Tap(_) | Device::Vhost(_) => None,
        }
    }

    pub fn vhost(&self) -> Option<&Arc<vhost::VhostDev>> {
        match self {
            Device::Vhost(v) => Some(v),
            Device::Tap(_) | Device::Netdev(_) => None,
        }
    }

    /// Stops what runs on its own (a vhost-user server).
    pub fn stop(&self) {
        if let Device::Vhost(v) = self {
            v.stop();
        }
    }
}

/// Opens an interface's device, in its namespace if it has one.
pub fn open(def: &InterfaceDef, shared: &Arc<Shared>, cpus: &[usize]) -> std::io::Result<Attached> {
    let dispatch = Arc::<DispatchStats>::default();
    let (dev, mac) = match def.kind {
        IfaceKind::Tap => {
            let (t, mac) = tap::open(def, &shared.global)?;
            (Device::Tap(Arc::new(t)), Some(mac))
        }
        IfaceKind::Netdev => (Device::Netdev(Arc::new(netdev::open(def, &shared.global)?)), def.mac),
        IfaceKind::VhostUser => {
            let path = std::path::Path::new(&def.dev);
            let cfg = vhost::Serve { pairs: def.queues as usize, mode: def.mode, cpus: cpus.to_vec() };
            let v = vhost::serve(shared, def.id, &def.name, path, cfg, dispatch.clone())?;
            (Device::Vhost(v), def.mac)
        }
    };
    let iface = Arc::new(
        Iface::new(def.id, def.name.clone(), mac, dev.port())
            .locked_to(def.mac)
            .in_network(def.network)
            .broadcast_limit(def.broadcast_limit),
    );
    let ifindex = match def.kind {
        IfaceKind::Tap | IfaceKind::Netdev => {
            let name = def.dev.clone();
            Some(in_ns(def, move || crate::sys::ifindex(&name))?)
        }
        IfaceKind::VhostUser => None,
    };
    Ok(Attached { iface, def: def.clone(), dev, dispatch, ifindex })
}
