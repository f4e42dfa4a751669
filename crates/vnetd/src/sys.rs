//! The one place vnetd talks to the kernel through raw system calls: TAP
//! device setup (`TUNSETIFF`), interface ioctls (MAC, MTU, flags) and
//! entering a network namespace (`setns`).
//!
//! It also opens raw packet sockets on existing netdevs (`open_packet`).
//! Everything else uses safe wrappers (`std::fs::File` for TAP reads and
//! writes, `std::net` and `mio` for sockets). Each `unsafe` block states the
//! invariants it relies on.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use vnet_wire::MacAddr;

/// Longest interface name the kernel takes (without the NUL).
pub const IFNAMSIZ_MAX: usize = libc::IFNAMSIZ - 1;

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() > IFNAMSIZ_MAX || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name `{name}`")));
    }
    // SAFETY:
    // - `ifreq` is a plain C struct of integers, arrays and a union of them;
    //   all-zero bytes are a valid value of every field.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

/// Opens `/dev/net/tun` and attaches to (or creates) the TAP device `name`,
/// without packet information, non-blocking. Returns the open file.
pub fn open_tap(name: &str) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY:
    // - `file` is an open descriptor of /dev/net/tun for the whole call.
    // - TUNSETIFF reads and writes one `struct ifreq`; `req` is one, live and
    //   exclusively borrowed for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// A datagram socket in the current namespace, for interface ioctls.
fn ctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: `socket` takes no pointers; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket`, is valid and owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn if_ioctl(req: libc::c_ulong, ifr: &mut libc::ifreq) -> io::Result<()> {
    let s = ctl_socket()?;
    // SAFETY:
    // - `s` is an open socket for the whole call.
    // - every SIOC[GS]IF* request used here reads or writes one `struct
    //   ifreq`; `ifr` is one, live and exclusively borrowed.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), req as _, ifr as *mut libc::ifreq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The MAC address of interface `name`.
pub fn get_mac(name: &str) -> io::Result<MacAddr> {
    let mut r = ifreq(name)?;
    if_ioctl(libc::SIOCGIFHWADDR, &mut r)?;
    // SAFETY: SIOCGIFHWADDR succeeded, so the kernel filled `ifru_hwaddr`.
    let data = unsafe { r.ifr_ifru.ifru_hwaddr.sa_data };
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(data.iter()) {
        *d = *s as u8;
    }
    Ok(MacAddr(m))
}

/// Sets the MAC address of interface `name`.
pub fn set_mac(name: &str, mac: MacAddr) -> io::Result<()> {
    let mut r = ifreq(name)?;
    // SAFETY: writing plain integers into the `ifru_hwaddr` member of a
    // zeroed union; no reference to another member is alive.
    unsafe {
        r.ifr_ifru.ifru_hwaddr.sa_family = libc::ARPHRD_ETHER;
        for (d, s) in r.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac.0) {
            *d = s as libc::c_char;
        }
    }
    if_ioctl(libc::SIOCSIFHWADDR, &mut r)
}

/// Sets the MTU of interface `name`.
pub fn set_mtu(name: &str, mtu: u32) -> io::Result<()> {
    let mut r = ifreq(name)?;
    r.ifr_ifru.ifru_mtu = mtu as libc::c_int;
    if_ioctl(libc::SIOCSIFMTU, &mut r)
}

/// Brings interface `name` up.
pub fn set_up(name: &str) -> io::Result<()> {
    let mut r = ifreq(name)?;
    if_ioctl(libc::SIOCGIFFLAGS, &mut r)?;
    // SAFETY: SIOCGIFFLAGS succeeded, so `ifru_flags` is the member in use.
    let flags = unsafe { r.ifr_ifru.ifru_flags };
    r.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    if_ioctl(libc::SIOCSIFFLAGS, &mut r)
}

/// Runs `f` on a fresh thread that has entered the network namespace at
/// `ns` (a path such as `/run/netns/NAME`), and returns its result. File
/// descriptors `f` opens stay valid in every namespace afterwards.
pub fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let nsfile = File::open(ns)?;
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY:
            // - `nsfile` is an open namespace file for the whole call.
            // - `setns` changes only this (scoped, short-lived) thread's
            //   network namespace, so no other thread is affected.
            let rc = unsafe { libc::setns(nsfile.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("namespace worker panicked")))
    })
}

/// The path of a named network namespace as `ip netns` makes it, or the
/// argument itself when it is already a path.
pub fn netns_path(ns: &str) -> std::path::PathBuf {
    if ns.contains('/') {
        Path::new(ns).to_path_buf()
    } else {
        Path::new("/run/netns").join(ns)
    }
}

/// Sets a socket's send and receive buffers to `bytes`, past the
/// `net.core.[rw]mem_max` limits when running as root (the `FORCE`
/// variants), else as far as those limits allow.
pub fn set_socket_buffers(sock: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for (force, plain) in [(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF), (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)] {
        if setsockopt_raw(sock, libc::SOL_SOCKET, force, &v).is_err() {
            setsockopt_raw(sock, libc::SOL_SOCKET, plain, &v)?;
        }
    }
    Ok(())
}

fn setsockopt_raw<T>(fd: &impl AsRawFd, level: libc::c_int, opt: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY:
    // - `fd` is an open socket for the whole call.
    // - `val` is a live `T` and its exact size is passed with it; the kernel
    //   only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens a raw packet socket bound to the existing netdev `name` (the host
/// end of a container's veth, or a TAP that QEMU holds): non-blocking,
/// promiscuous, not seeing its own transmissions. Reads return whole frames;
/// writes send a frame out of the device (towards the VM).
pub fn open_packet(name: &str) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the call.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // Protocol 0: receive nothing until bound to the device.
    // SAFETY: `socket` takes no pointers; the result is checked below.
    let fd = unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket`, is valid and owned by no one else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `sockaddr_ll` is a plain C struct; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY:
    // - `sock` is an open packet socket.
    // - `sll` is a live `sockaddr_ll` and its size is passed with it.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    setsockopt_raw(&sock, libc::SOL_PACKET, 23 /* PACKET_IGNORE_OUTGOING */, &(1 as libc::c_int))?;
    let mreq = libc::packet_mreq {
        mr_ifindex: ifindex as i32,
        mr_type: 1 as libc::c_ushort, // PACKET_MR_PROMISC
        mr_alen: 0,
        mr_address: [0; 8],
    };
    setsockopt_raw(&sock, libc::SOL_PACKET, 1 /* PACKET_ADD_MEMBERSHIP */, &mreq)?;
    Ok(File::from(sock))
}
