//! Network devices by ioctl on a control socket: an interface's driver
//! (`SIOCETHTOOL`), MAC, MTU and flags, its index; and entering a network
//! namespace (`setns`) on a thread of its own.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use vnet_wire::MacAddr;

/// Longest interface name the kernel takes (without the NUL).
pub const IFNAMSIZ_MAX: usize = libc::IFNAMSIZ - 1;

pub(super) fn ifreq(name: &str) -> io::Result<libc::ifreq> {
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

pub(super) fn if_ioctl(req: libc::c_ulong, ifr: &mut libc::ifreq) -> io::Result<()> {
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

/// `struct ethtool_drvinfo` (linux/ethtool.h), what `ETHTOOL_GDRVINFO` fills.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// The kernel driver of interface `name` in the current network namespace
/// (`tun` for a TAP, `veth`, ...), as the kernel itself answers
/// (`SIOCETHTOOL`), not sysfs: a process that entered another network
/// namespace without remounting /sys reads the sysfs of the first.
pub fn driver(name: &str) -> io::Result<String> {
    let mut r = ifreq(name)?;
    let mut info = EthtoolDrvinfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    r.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
    // SIOCETHTOOL reads `ifru_data` as a pointer to the command's struct:
    // `info`, live and exclusively borrowed until `if_ioctl` returns.
    if_ioctl(libc::SIOCETHTOOL, &mut r)?;
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(info.driver.len());
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
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

/// The index of device `name` in this thread's network namespace (asked of
/// the kernel, so right inside `in_netns` too, unlike sysfs).
pub fn ifindex(name: &str) -> io::Result<u32> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the call.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ifindex)
}

/// Every IPv4 and IPv6 address of this network namespace's interfaces
/// (`getifaddrs`): the node's own, when vnetd runs in the node's network.
pub fn local_addresses() -> io::Result<Vec<std::net::IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` writes a list it allocated into `head`; checked below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list `getifaddrs` made, not freed
        // until `freeifaddrs` below; its `ifa_addr` is null or points to a
        // sockaddr of the family it names, whose size that family fixes.
        unsafe {
            let a = (*at).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let s = &*(a as *const libc::sockaddr_in);
                        out.push(std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)).into());
                    }
                    libc::AF_INET6 => {
                        let s = &*(a as *const libc::sockaddr_in6);
                        out.push(std::net::Ipv6Addr::from(s.sin6_addr.s6_addr).into());
                    }
                    _ => {}
                }
            }
            at = (*at).ifa_next;
        }
    }
    // SAFETY: `head` is the list `getifaddrs` made, freed once, not used after.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
