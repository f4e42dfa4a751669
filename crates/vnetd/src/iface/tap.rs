//! `tap`: vnetd holds the TAP's file descriptors (one per queue) and the
//! TAP netdev is the VM's NIC: a container that owns it, or a VMM given the
//! device. With offloads, reads and writes carry a `virtio_net_hdr`
//! (`IFF_VNET_HDR`, `TUNSETOFFLOAD` with checksum and TSO), so the VM's
//! TCP hands over 64 KB segments with a partial checksum.

use crate::sys;
use std::fs::File;
use std::sync::Arc;
use vnet_control::InterfaceDef;
use vnet_engine::port::{Payload, Port, Scratch};
use vnet_engine::Global;
use vnet_wire::MacAddr;

/// The largest GSO frame vnetd asks the VMs' stacks to build: small enough
/// that the frame, as `vnet` datagrams of a 1500- or 9000-byte underlay, goes
/// out in one GSO send (64 KB payload at most) and comes back in one GRO
/// read, so the receiver can hand it to the TAP without reassembling it.
pub const TAP_GSO_MAX: u32 = 62_000;

/// An open TAP.
pub struct Tap {
    pub queues: Vec<Arc<File>>,
    /// Reads and writes carry a `virtio_net_hdr`.
    pub vnet_hdr: bool,
    /// A refused write was logged.
    refused_logged: std::sync::atomic::AtomicBool,
}

/// Creates (if missing) and opens the TAP, one file per queue; sets its
/// MAC, MTU and GSO size and brings it up. Returns it and its MAC.
pub fn open(def: &InterfaceDef, g: &Global) -> std::io::Result<(Tap, MacAddr)> {
    let (dev, mac, mtu, offload) = (def.dev.clone(), def.mac, def.mtu, def.offload);
    let ns = def.netns.clone().unwrap_or_else(|| "-".into());
    let queues = def.queues.max(1) as usize;
    let (files, refused, mac) = super::io::in_ns(def, move || {
        let mut files = Vec::new();
        let mut refused = false;
        for k in 0..queues {
            let f = match crate::handover::take(&queue_name(&ns, &dev, k, offload, queues > 1)) {
                Some(fd) => std::fs::File::from(fd),
                None => sys::open_tap(&dev, offload, queues > 1)?,
            };
            if offload && sys::tap_enable_offloads(&f, sys::TAP_OFFLOADS).is_err() {
                // The header stays on (set at open); offloads are off.
                refused = true;
            }
            files.push(Arc::new(f));
        }
        if let Some(m) = mac {
            sys::set_mac(&dev, m)?;
        }
        if offload && sys::set_gso_max_size(&dev, TAP_GSO_MAX).is_err() {
            refused = true;
        }
        if let Some(m) = mtu {
            sys::set_mtu(&dev, m)?;
        }
        sys::set_up(&dev)?;
        Ok((files, refused, sys::get_mac(&dev)?))
    })?;
    if refused {
        super::io::offloads_refused(def, g);
    }
    Ok((Tap { queues: files, vnet_hdr: offload, refused_logged: Default::default() }, mac))
}

impl Port for Tap {
    fn takes_offloads(&self) -> bool {
        self.vnet_hdr
    }

    fn send(&self, _: &mut Scratch, payload: Payload<'_>) -> bool {
        self.queues.first().is_some_and(|q| super::io::write_frame(q, payload, &self.refused_logged))
    }
}

/// A TAP queue's name in a hand-over ([`crate::handover`]): what it was
/// opened as (a queue opened with other flags is not that queue).
pub fn queue_name(ns: &str, dev: &str, k: usize, vnet_hdr: bool, multi_queue: bool) -> String {
    let hdr = if vnet_hdr { "hdr" } else { "raw" };
    let mq = if multi_queue { "mq" } else { "sq" };
    crate::handover::name(&["tap", ns, dev, &format!("q{k}"), hdr, mq]).unwrap_or_default()
}
