//! TAP devices: `/dev/net/tun` opened and attached (`TUNSETIFF`), its
//! `virtio_net_hdr` size and offloads (`TUNSETVNETHDRSZ`, `TUNSETOFFLOAD`).
//! Reads and writes go through the returned `File`.

use super::netdev::ifreq;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// Opens `/dev/net/tun` and attaches to (or creates) the TAP device `name`,
/// without packet information, non-blocking; with `vnet_hdr`, every read
/// and write carries a 10-byte `virtio_net_hdr`; with `multi_queue`, this is
/// one queue of a multi-queue TAP. Returns the open file.
pub fn open_tap(name: &str, vnet_hdr: bool, multi_queue: bool) -> io::Result<File> {
    tun_set_iff(name, vnet_hdr, multi_queue).map(|(f, _)| f)
}

/// Creates a TAP device as [`open_tap`] does, named by the kernel after
/// `pattern` (`vnh%d`: the first free number), and returns it and its name.
pub fn new_tap(pattern: &str, vnet_hdr: bool) -> io::Result<(File, String)> {
    tun_set_iff(pattern, vnet_hdr, false)
}

fn tun_set_iff(name: &str, vnet_hdr: bool, multi_queue: bool) -> io::Result<(File, String)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut req = ifreq(name)?;
    let mut flags = libc::IFF_TAP | libc::IFF_NO_PI;
    if vnet_hdr {
        flags |= libc::IFF_VNET_HDR;
    }
    if multi_queue {
        flags |= libc::IFF_MULTI_QUEUE;
    }
    req.ifr_ifru.ifru_flags = flags as libc::c_short;
    // SAFETY:
    // - `file` is an open descriptor of /dev/net/tun for the whole call.
    // - TUNSETIFF reads and writes one `struct ifreq`; `req` is one, live and
    //   exclusively borrowed for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // The kernel wrote the device's name back, NUL-terminated.
    let name: Vec<u8> = req.ifr_name.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    Ok((file, String::from_utf8_lossy(&name).into_owned()))
}

fn tap_ioctl_int(tap: &File, req: libc::Ioctl, val: libc::c_int) -> io::Result<()> {
    let rc = if req == libc::TUNSETOFFLOAD {
        // SAFETY: `tap` is an open /dev/net/tun file for the whole call, and
        // TUNSETOFFLOAD takes its argument by value (no pointer).
        unsafe { libc::ioctl(tap.as_raw_fd(), req as _, val as libc::c_ulong) }
    } else {
        // SAFETY: `tap` is an open /dev/net/tun file for the whole call, and
        // the request reads one `int` through a pointer to a live local.
        unsafe { libc::ioctl(tap.as_raw_fd(), req as _, &val as *const libc::c_int) }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Offloads a TAP accepts from its VM: checksum, TSO for IPv4 and IPv6.
pub const TAP_OFFLOADS: libc::c_uint = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;

/// Sets the `virtio_net_hdr` size (10) and the offloads of a TAP opened with
/// `vnet_hdr`.
pub fn tap_enable_offloads(tap: &File, offloads: libc::c_uint) -> io::Result<()> {
    tap_ioctl_int(tap, libc::TUNSETVNETHDRSZ, 10)?;
    tap_ioctl_int(tap, libc::TUNSETOFFLOAD, offloads as libc::c_int)
}
