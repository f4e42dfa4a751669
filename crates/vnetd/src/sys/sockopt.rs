//! Socket options (`setsockopt`/`getsockopt` of plain data): buffers past
//! the sysctl limits, UDP GRO, TCP liveness, `SO_REUSEPORT`, don't-fragment
//! and path MTU probing, UDP checksums.

use std::io;
use std::os::fd::AsRawFd;

/// Sets a socket's send and receive buffers, past the
/// `net.core.[rw]mem_max` limits when running as root (the `FORCE`
/// variants), else as far as those limits allow. A receive buffer of 0 is
/// the kernel's minimum (a few KB): for sockets that only send, whose
/// port anyone may send to.
pub fn set_socket_buffers(sock: &impl AsRawFd, send: usize, receive: usize) -> io::Result<()> {
    let v = |b: usize| b.min(i32::MAX as usize) as libc::c_int;
    for (force, plain, bytes) in
        [(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, send), (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, receive)]
    {
        if setsockopt_raw(sock, libc::SOL_SOCKET, force, &v(bytes)).is_err() {
            setsockopt_raw(sock, libc::SOL_SOCKET, plain, &v(bytes))?;
        }
    }
    Ok(())
}

pub(super) fn setsockopt_raw<T>(
    fd: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: &T,
) -> io::Result<()> {
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

/// Asks the kernel to coalesce received datagrams of one flow (`UDP_GRO`).
pub fn udp_enable_gro(sock: &impl AsRawFd) -> io::Result<()> {
    setsockopt_raw(sock, libc::SOL_UDP, libc::UDP_GRO, &(1 as libc::c_int))
}

/// A TCP connection's liveness: keepalive probes after `idle` s without
/// traffic, every `interval` s, `count` of them; and unacknowledged data
/// fails the connection after `user_timeout_ms` (`TCP_USER_TIMEOUT`).
pub fn tcp_liveness(
    sock: &impl AsRawFd,
    idle: libc::c_int,
    interval: libc::c_int,
    count: libc::c_int,
    user_timeout_ms: libc::c_uint,
) -> io::Result<()> {
    setsockopt_raw(sock, libc::SOL_SOCKET, libc::SO_KEEPALIVE, &(1 as libc::c_int))?;
    setsockopt_raw(sock, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, &idle)?;
    setsockopt_raw(sock, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, &interval)?;
    setsockopt_raw(sock, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, &count)?;
    setsockopt_raw(sock, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, &user_timeout_ms)
}

/// Whether `sock` was bound with `SO_REUSEPORT` (so that more sockets may
/// join its port's group).
pub fn reuses_port(sock: &impl AsRawFd) -> io::Result<bool> {
    let mut on: libc::c_int = 0;
    getsockopt_raw(sock, libc::SOL_SOCKET, libc::SO_REUSEPORT, &mut on)?;
    Ok(on != 0)
}

/// `getsockopt` of a plain-data option into `val`.
pub(super) fn getsockopt_raw<T>(
    fd: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: &mut T,
) -> io::Result<()> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `val` is a live, exclusively borrowed `T` and its exact size is
    // passed with it; the kernel writes at most that many bytes.
    let rc = unsafe { libc::getsockopt(fd.as_raw_fd(), level, opt, (val as *mut T).cast(), &mut len) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Never lets the kernel fragment what this socket sends (`IP_MTU_DISCOVER`
/// = `IP_PMTUDISC_DO`, or `IPV6_MTU_DISCOVER` for IPv6): a datagram larger
/// than the path fails instead.
pub fn set_dont_fragment(sock: &impl AsRawFd, ipv4: bool) -> io::Result<()> {
    if ipv4 {
        setsockopt_raw(sock, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, &libc::IP_PMTUDISC_DO)
    } else {
        setsockopt_raw(sock, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, &libc::IPV6_PMTUDISC_DO)
    }
}

/// Sends with DF set and the kernel's own path MTU cache ignored
/// (`IP_PMTUDISC_PROBE`): vnet finds the path MTU itself by probing (RFC
/// 8899), so a datagram is neither fragmented on the way nor refused
/// because of an ICMP message that may not be genuine.
pub fn set_pmtu_probe(sock: &impl AsRawFd, ipv4: bool) -> io::Result<()> {
    if ipv4 {
        setsockopt_raw(sock, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, &libc::IP_PMTUDISC_PROBE)
    } else {
        setsockopt_raw(sock, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, &libc::IPV6_PMTUDISC_PROBE)
    }
}

/// Sends IPv4 UDP datagrams with a zero checksum (`SO_NO_CHECK`), as Linux
/// VXLAN devices do by default.
pub fn udp_no_checksum(sock: &impl AsRawFd) -> io::Result<()> {
    /// `asm-generic/socket.h` (libc names it for L4Re only).
    const SO_NO_CHECK: libc::c_int = 11;
    setsockopt_raw(sock, libc::SOL_SOCKET, SO_NO_CHECK, &(1 as libc::c_int))
}

/// Takes IPv6 UDP datagrams whose checksum is zero (`UDP_NO_CHECK6_RX`):
/// what tunnels send under RFC 6935/6936, vnet's kernel path among them.
pub fn udp_accept_zero_checksum6(sock: &impl AsRawFd) -> io::Result<()> {
    /// `linux/udp.h`.
    const UDP_NO_CHECK6_RX: libc::c_int = 102;
    setsockopt_raw(sock, libc::SOL_UDP, UDP_NO_CHECK6_RX, &(1 as libc::c_int))
}
