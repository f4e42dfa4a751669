//! `netdev`: vnetd attaches to a netdev it does not own with a packet
//! socket: a TAP that QEMU holds, or the host end of a container's veth.
//! The VM's frames are taken from a `TPACKET_V2` receive ring shared with
//! the kernel where it gives one (no system call per frame); with offloads
//! the socket carries a `virtio_net_hdr` (`PACKET_VNET_HDR`). The device's
//! MAC is the host side's, not the VM's, so it is left alone.

use crate::sys;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use vnet_control::InterfaceDef;
use vnet_engine::port::{Payload, Port, Scratch};
use vnet_engine::Global;

/// Receive ring of a netdev (or a `direct` link's device), in 256 KB blocks
/// of 3 frames (4 MB, 48 frames of up to 64 KB).
pub const RX_RING_BLOCKS: usize = 16;

/// Set by `vnetd --no-rx-ring`: packet sockets are read frame by frame
/// (the path taken where the kernel refuses a ring).
pub static NO_RX_RING: AtomicBool = AtomicBool::new(false);

/// The receive ring of packet socket `f` on `dev`, unless refused (by the
/// kernel, or by `--no-rx-ring`): then frames are read one by one.
pub fn rx_ring(f: &File, vnet_hdr: bool, dev: &str) -> Option<Arc<Mutex<sys::RxRing>>> {
    if NO_RX_RING.load(Relaxed) {
        return None;
    }
    match sys::RxRing::new(f, RX_RING_BLOCKS, vnet_hdr) {
        Ok(r) => Some(Arc::new(Mutex::new(r))),
        Err(e) => {
            tracing::warn!(device = %dev, "no receive ring ({e}): frames are read one by one");
            None
        }
    }
}

/// An attached netdev.
pub struct Netdev {
    pub sock: Arc<File>,
    pub ring: Option<Arc<Mutex<sys::RxRing>>>,
    pub vnet_hdr: bool,
    /// A refused write was logged.
    refused_logged: std::sync::atomic::AtomicBool,
}

/// Opens a packet socket on the device (and its receive ring), sets the MTU
/// if asked, and brings the device up.
pub fn open(def: &InterfaceDef, g: &Global) -> std::io::Result<Netdev> {
    let (dev, mtu, offload) = (def.dev.clone(), def.mtu, def.offload);
    let (nd, refused) = super::in_ns(def, move || {
        let f = sys::open_packet(&dev)?;
        let mut vnet_hdr = offload;
        let mut refused = false;
        if offload && sys::packet_enable_vnet_hdr(&f).is_err() {
            vnet_hdr = false;
            refused = true;
        }
        let ring = rx_ring(&f, vnet_hdr, &dev);
        if let Some(m) = mtu {
            sys::set_mtu(&dev, m)?;
        }
        sys::set_up(&dev)?;
        Ok((Netdev { sock: Arc::new(f), ring, vnet_hdr, refused_logged: Default::default() }, refused))
    })?;
    if refused {
        super::offloads_refused(def, g);
    }
    Ok(nd)
}

impl Port for Netdev {
    fn takes_offloads(&self) -> bool {
        self.vnet_hdr
    }

    fn send(&self, _: &mut Scratch, payload: Payload<'_>) -> bool {
        super::write_frame(&self.sock, payload, &self.refused_logged)
    }
}
