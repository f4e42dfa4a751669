//! rtnetlink `RTM_NEWLINK` requests the ioctls cannot make: a device's
//! largest GSO frame (`IFLA_GSO_MAX_SIZE`) and its IPv6 address generation
//! (`addrgenmode none`). One request, one acknowledgement, on a socket of
//! its own.

use super::netdev::ifindex;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Sets the largest GSO frame the stack builds for device `name` (in the
/// current namespace), as `ip link set NAME gso_max_size SIZE` does.
pub fn set_gso_max_size(name: &str, size: u32) -> io::Result<()> {
    let mut attr = [0u8; 8];
    put_rtattr(&mut attr, libc::IFLA_GSO_MAX_SIZE, 8);
    attr[4..8].copy_from_slice(&size.to_ne_bytes());
    rtnl_setlink(ifindex(name)?, &attr)
}

/// `IFLA_INET6_ADDR_GEN_MODE` and its `IN6_ADDR_GEN_MODE_NONE` (linux/if_link.h; not in `libc`).
const IFLA_INET6_ADDR_GEN_MODE: u16 = 8;
const IN6_ADDR_GEN_MODE_NONE: u8 = 1;

/// Keeps the kernel's IPv6 from sending anything on device `name` (which
/// must still be down): no link-local address (`addrgenmode none`, by
/// rtnetlink, so no duplicate address detection, router solicitation or
/// MLD report), and IPv6 off when `/proc/sys` is writable. A kernel
/// without IPv6, or a read-only `/proc/sys` (a container's), is fine.
pub fn quiet_ipv6(name: &str) -> io::Result<()> {
    // IFLA_AF_SPEC { AF_INET6 { IFLA_INET6_ADDR_GEN_MODE: u8 } }: 4 + 4 + 8.
    let mut attr = [0u8; 16];
    put_rtattr(&mut attr[0..], libc::IFLA_AF_SPEC, 16);
    put_rtattr(&mut attr[4..], libc::AF_INET6 as u16, 12);
    put_rtattr(&mut attr[8..], IFLA_INET6_ADDR_GEN_MODE, 5);
    attr[12] = IN6_ADDR_GEN_MODE_NONE;
    match rtnl_setlink(ifindex(name)?, &attr) {
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => return Ok(()),
        r => r?,
    }
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1") {
        Err(e)
            if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EROFS | libc::EACCES | libc::EPERM)) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Writes an rtattr header (length, type) at the start of `buf`.
fn put_rtattr(buf: &mut [u8], kind: u16, len: u16) {
    buf[0..2].copy_from_slice(&len.to_ne_bytes());
    buf[2..4].copy_from_slice(&kind.to_ne_bytes());
}

/// Sends one rtnetlink `RTM_NEWLINK` request for device `ifindex` (in the
/// current namespace) with attributes `attrs` (each padded to 4 bytes) and
/// waits for its acknowledgement.
fn rtnl_setlink(ifindex: u32, attrs: &[u8]) -> io::Result<()> {
    // SAFETY: `socket` takes no pointers; the result is checked below.
    let fd =
        unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket`, is valid and owned by no one else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // nlmsghdr (16) + ifinfomsg (16) + the attributes.
    let len = 32 + attrs.len();
    let mut msg = vec![0u8; len];
    msg[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    msg[4..6].copy_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
    msg[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence
    msg[16] = libc::AF_UNSPEC as u8;
    msg[20..24].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    msg[32..].copy_from_slice(attrs);
    // SAFETY: `sock` is an open netlink socket; `msg` is live and its length
    // is passed with it; the kernel only reads it.
    let rc = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ack = [0u8; 256];
    // SAFETY: `ack` is live and writable for its whole length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), ack.as_mut_ptr().cast(), ack.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // An NLMSG_ERROR message: a negative errno after the 16-byte header, 0 for success.
    if n >= 20 && u16::from_ne_bytes([ack[4], ack[5]]) == libc::NLMSG_ERROR as u16 {
        let err = i32::from_ne_bytes([ack[16], ack[17], ack[18], ack[19]]);
        if err != 0 {
            return Err(io::Error::from_raw_os_error(-err));
        }
    }
    Ok(())
}
