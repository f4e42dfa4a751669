//! `netdev`: vnetd attaches to a netdev it does not own with a packet
//! socket: a TAP that QEMU holds, or the host end of a container's veth.
//! The VM's frames are taken from a `TPACKET_V2` receive ring shared with
//! the kernel where it gives one (no system call per frame); with offloads
//! the socket carries a `virtio_net_hdr` (`PACKET_VNET_HDR`). The device's
//! MAC is the host side's, not the VM's, so it is left alone.
//!
//! Frames for the VM leave by a second packet socket, bound to no protocol,
//! which the kernel never taps. On the kernel path the tapping socket is
//! closed: packet taps run before TC ingress, so it would see every frame
//! the kernel moves. The TC program hands vnetd the frames it leaves to it
//! through a TAP of vnetd's own instead ([`Netdev::make_hand_off`]), which
//! the workers read.

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
    /// Sends the frames for the VM; bound to no protocol, it receives
    /// nothing (no packet tap).
    tx: File,
    /// Where the VM's frames are read from.
    rx: Mutex<Rx>,
    pub vnet_hdr: bool,
    /// A refused write was logged.
    refused_logged: std::sync::atomic::AtomicBool,
}

/// Where a netdev's frames for vnetd arrive.
#[derive(Clone)]
pub enum Rx {
    /// The user path: a packet socket that taps every frame of the device,
    /// and its receive ring.
    Packet(Arc<File>, Option<Arc<Mutex<sys::RxRing>>>),
    /// The kernel path: the hand-off TAP its program sends vnetd's frames
    /// to, and its name (the packet socket is closed).
    HandOff(Arc<File>, String),
}

/// Whether `dev` is named as vnet-cni names the veth ends it makes for
/// vnetd (a pod's host end, the node gateway's attached end: `vc` and 10
/// lowercase hex digits, `vnet_cni::veth::names`).
pub fn made_by_vnet_cni(dev: &str) -> bool {
    dev.len() == 12
        && dev.starts_with("vc")
        && dev.bytes().skip(2).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Keeps the node's IP stack off `dev`, one of vnet-cni's veth ends in
/// this namespace (a port of vnetd's switch, not an interface of the
/// node's), as vnet-cni does when it makes one: the node answers no ARP
/// arriving on it (`arp_ignore` 8; the user path's bypass of the policy,
/// docs/INTEGRATION.md) and has no IPv6 on it. Done at each attach, so
/// the ends of pods an older vnet-cni made (`arp_ignore` 0) are kept off
/// once the new vnetd attaches them again. Where IPv6 is off the node's,
/// its file is absent.
pub fn keep_off_the_stack(dev: &str) -> std::io::Result<()> {
    let conf = |v: &str| std::path::Path::new("/proc/sys/net").join(v).join("conf").join(dev);
    std::fs::write(conf("ipv4").join("arp_ignore"), "8")?;
    match std::fs::write(conf("ipv6").join("disable_ipv6"), "1") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Keeps `dev` off the node's stack ([`keep_off_the_stack`]) if it is one
/// of vnet-cni's veth ends; an error (with what failed) if that fails
/// (one the node answers ARP on would bypass the policy,
/// docs/INTEGRATION.md).
fn off_the_stack(dev: &str) -> std::io::Result<()> {
    if !made_by_vnet_cni(dev) {
        return Ok(());
    }
    keep_off_the_stack(dev).map_err(|e| {
        let why =
            format!("{dev}: not attached: not kept off the node's IP stack (arp_ignore 8, IPv6 off): {e}");
        std::io::Error::new(e.kind(), why)
    })
}

/// Opens a packet socket to read the device (and its receive ring) and one
/// to send to it, sets the MTU if asked, and brings the device up (one of
/// vnet-cni's veth ends kept off the node's stack first, a failure logged).
pub fn open(def: &InterfaceDef, g: &Global) -> std::io::Result<Netdev> {
    let (dev, mtu, offload) = (def.dev.clone(), def.mtu, def.offload);
    let ns = def.netns.clone().unwrap_or_else(|| "-".into());
    let (nd, refused) = super::io::in_ns(def, move || {
        // Logged, not refused: where /proc/sys is read-only to vnetd (its
        // container in the Kubernetes manifest), refusing cut every new pod
        // off (the lab's pods stayed ContainerCreating); vnet-cni has set
        // both on the pod's end at ADD already.
        if let Err(e) = off_the_stack(&dev) {
            tracing::warn!("{e}");
        }
        let tx = sys::open_packet_tx(&dev)?;
        if let Some((f, ring)) = handed_over(&ns, &dev, offload) {
            if offload {
                sys::packet_enable_vnet_hdr(&tx)?;
            }
            let rx = Mutex::new(Rx::Packet(Arc::new(f), ring));
            if let Some(m) = mtu {
                sys::set_mtu(&dev, m)?;
            }
            sys::set_up(&dev)?;
            return Ok((Netdev { tx, rx, vnet_hdr: offload, refused_logged: Default::default() }, false));
        }
        let f = sys::open_packet(&dev)?;
        let mut vnet_hdr = offload;
        let mut refused = false;
        if offload && (sys::packet_enable_vnet_hdr(&f).is_err() || sys::packet_enable_vnet_hdr(&tx).is_err())
        {
            vnet_hdr = false;
            refused = true;
        }
        let ring = rx_ring(&f, vnet_hdr, &dev);
        if let Some(m) = mtu {
            sys::set_mtu(&dev, m)?;
        }
        sys::set_up(&dev)?;
        let rx = Mutex::new(Rx::Packet(Arc::new(f), ring));
        Ok((Netdev { tx, rx, vnet_hdr, refused_logged: Default::default() }, refused))
    })?;
    if refused {
        super::io::offloads_refused(def, g);
    }
    Ok(nd)
}

/// The tapping socket of `dev` (and its ring) as the previous vnetd handed
/// it over ([`crate::handover`]), when it was opened as this one would be.
fn handed_over(ns: &str, dev: &str, vnet_hdr: bool) -> Option<(File, Option<Arc<Mutex<sys::RxRing>>>)> {
    let (rest, fd) = crate::handover::take_prefixed(&packet_prefix(ns, dev, vnet_hdr))?;
    let f = File::from(fd);
    let words: Vec<&str> = rest.split(' ').collect();
    match words[..] {
        ["noring"] if NO_RX_RING.load(Relaxed) => Some((f, None)),
        ["ring", blocks, "next", next] if !NO_RX_RING.load(Relaxed) => {
            let (blocks, next) = (blocks.parse().ok()?, next.parse().ok()?);
            if blocks != RX_RING_BLOCKS {
                return None;
            }
            match sys::RxRing::adopt(&f, blocks, vnet_hdr, next) {
                Ok(r) => Some((f, Some(Arc::new(Mutex::new(r))))),
                Err(e) => {
                    tracing::warn!(device = %dev, "the handed-over receive ring could not be mapped ({e}): opened anew");
                    None
                }
            }
        }
        _ => None,
    }
}

fn packet_prefix(ns: &str, dev: &str, vnet_hdr: bool) -> String {
    format!("packet {ns} {dev} {} ", if vnet_hdr { "hdr" } else { "raw" })
}

impl Netdev {
    /// The tapping socket's name and a copy of it, for a hand-over (the
    /// user path's: on the kernel path it is closed). Its ring's position
    /// is in the name: the workers must have stopped.
    pub fn handed(&self, ns: &str, dev: &str) -> Option<(String, std::os::fd::OwnedFd)> {
        let Rx::Packet(sock, ring) = self.rx() else { return None };
        let rest = match &ring {
            Some(r) => format!(
                "ring {RX_RING_BLOCKS} next {}",
                r.lock().unwrap_or_else(|p| p.into_inner()).position()
            ),
            None => "noring".to_string(),
        };
        let name = format!("{}{rest}", packet_prefix(ns, dev, self.vnet_hdr));
        let fd = sock.try_clone().ok()?.into();
        Some((crate::handover::name(&[&name])?, fd))
    }

    /// Makes a hand-off TAP (`vnh<n>`, the first free number: with the
    /// packet sockets' `virtio_net_hdr` and offloads, IPv6 quiet so its own
    /// stack sends nothing on it, up) and returns it, its name and its
    /// index. Frames are read from it only after [`Netdev::use_hand_off`];
    /// dropped, it goes away.
    pub fn make_hand_off(&self) -> std::io::Result<(Arc<File>, String, u32)> {
        let (f, name) = sys::new_tap("vnh%d", self.vnet_hdr)?;
        if self.vnet_hdr {
            sys::tap_enable_offloads(&f, sys::TAP_OFFLOADS)?;
        }
        sys::quiet_ipv6(&name)?;
        sys::set_up(&name)?;
        let index = sys::ifindex(&name)?;
        Ok((Arc::new(f), name, index))
    }

    /// Reads the VM's frames from hand-off TAP `tap` (named `name`) from
    /// now on, and closes the packet socket that tapped the device (workers
    /// read their sources when they start, after this).
    pub fn use_hand_off(&self, tap: Arc<File>, name: String) {
        *self.rx.lock().unwrap_or_else(|p| p.into_inner()) = Rx::HandOff(tap, name);
    }

    /// The hand-off TAP's name, on the kernel path.
    pub fn hand_off_name(&self) -> Option<String> {
        match self.rx() {
            Rx::HandOff(_, name) => Some(name),
            Rx::Packet(..) => None,
        }
    }

    /// Where the VM's frames arrive now.
    pub fn rx(&self) -> Rx {
        self.rx.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Port for Netdev {
    fn takes_offloads(&self) -> bool {
        self.vnet_hdr
    }

    fn send(&self, _: &mut Scratch, payload: Payload<'_>) -> bool {
        super::io::write_frame(&self.tx, payload, &self.refused_logged)
    }
}

#[cfg(test)]
mod tests {
    /// One of vnet-cni's veth ends that cannot be kept off the node's
    /// stack (here: no such device's settings) is refused with a clear
    /// error, not attached; the control: a device not vnet-cni's is not
    /// touched and passes.
    #[test]
    fn a_veth_end_not_kept_off_the_stack_is_not_attached() {
        let dev = "vc0123456789";
        assert!(super::made_by_vnet_cni(dev));
        let e = super::off_the_stack(dev).unwrap_err();
        assert!(
            e.to_string().contains("vc0123456789: not attached: not kept off the node's IP stack"),
            "{e}"
        );
        assert!(super::keep_off_the_stack(dev).is_err(), "the same without the guard: only a log before");
        assert!(super::off_the_stack("vnetnosuch0").is_ok(), "not vnet-cni's: untouched");
    }
}
