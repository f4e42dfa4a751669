//! The one place vnetd talks to the kernel through raw system calls: TAP
//! device setup (`TUNSETIFF`), interface ioctls (MAC, MTU, flags) and
//! entering a network namespace (`setns`).
//!
//! It also opens raw packet sockets on existing netdevs (`open_packet`),
//! sends and receives GSO/GRO datagrams with their control messages
//! (`send_segments`, and `RecvBatch`: `recvmmsg` into buffers allocated once)
//! and places threads on CPUs (`pin_current_thread`), and lends guest
//! memory as bytes for a vhost-user frame cut through (`guest_bytes`).
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

/// Whether `path` is on a bpffs (`statfs`'s type `BPF_FS_MAGIC`), where
/// BPF objects can be pinned.
pub fn is_bpffs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `statfs` is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid `statfs` to fill.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as u64 == 0xcafe_4a11
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

/// Opens a raw packet socket bound to the existing netdev `name` (the host
/// end of a container's veth, or a TAP that QEMU holds): non-blocking,
/// promiscuous, not seeing its own transmissions. Reads return whole frames;
/// writes send a frame out of the device (towards the VM).
pub fn open_packet(name: &str) -> io::Result<File> {
    let ifindex = ifindex(name)?;
    let sock = packet_socket()?;
    packet_bind(&sock, ifindex, libc::ETH_P_ALL as u16)?;
    setsockopt_raw(&sock, libc::SOL_PACKET, 23 /* PACKET_IGNORE_OUTGOING */, &(1 as libc::c_int))?;
    // A VLAN tag the kernel took out of a frame comes with it as metadata
    // (read by `recv_packet`; the receive ring has it in its frame header).
    setsockopt_raw(&sock, libc::SOL_PACKET, PACKET_AUXDATA, &(1 as libc::c_int))?;
    let mreq = libc::packet_mreq {
        mr_ifindex: ifindex as i32,
        mr_type: 1 as libc::c_ushort, // PACKET_MR_PROMISC
        mr_alen: 0,
        mr_address: [0; 8],
    };
    setsockopt_raw(&sock, libc::SOL_PACKET, 1 /* PACKET_ADD_MEMBERSHIP */, &mreq)?;
    Ok(File::from(sock))
}

/// A raw packet socket, non-blocking, of protocol 0: it receives nothing
/// until bound to a device and a protocol.
fn packet_socket() -> io::Result<OwnedFd> {
    // SAFETY: `socket` takes no pointers; the result is checked below.
    let fd = unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket`, is valid and owned by no one else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(sock)
}

/// Binds packet socket `sock` to device `ifindex` for `protocol` (an
/// EtherType; `ETH_P_ALL`: every frame; 0 keeps the socket's protocol,
/// which for one from [`packet_socket`] is none: it only sends).
fn packet_bind(sock: &impl AsRawFd, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: `sockaddr_ll` is a plain C struct; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY:
    // - `sock` is an open packet socket for the whole call.
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
    Ok(())
}

/// Opens a packet socket that sends to device `name` and receives nothing:
/// created and bound with protocol 0, the kernel registers no tap for it.
pub fn open_packet_tx(name: &str) -> io::Result<File> {
    let ifindex = ifindex(name)?;
    let sock = packet_socket()?;
    packet_bind(&sock, ifindex, 0)?;
    Ok(File::from(sock))
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

/// Makes a packet socket read and write a 10-byte `virtio_net_hdr` before
/// every frame, so GSO and partial-checksum frames pass whole.
pub fn packet_enable_vnet_hdr(sock: &File) -> io::Result<()> {
    setsockopt_raw(sock, libc::SOL_PACKET, 15 /* PACKET_VNET_HDR */, &(1 as libc::c_int))
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

/// A non-blocking UDP socket bound to `addr` with `SO_REUSEPORT` set before
/// the bind, so that a twin may share the port.
pub fn udp_bind_reuseport(addr: std::net::SocketAddr) -> io::Result<std::net::UdpSocket> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: a plain socket(2) call; the result is checked and owned at once.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor no one else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    setsockopt_raw(&sock, libc::SOL_SOCKET, libc::SO_REUSEPORT, &(1 as libc::c_int))?;
    let a = raw_addr(&addr);
    // SAFETY: `a.storage` holds a valid sockaddr of `a.len` bytes for the
    // family of the socket; bind(2) only reads it.
    let r = unsafe { libc::bind(sock.as_raw_fd(), &a.storage as *const _ as *const libc::sockaddr, a.len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::net::UdpSocket::from(sock))
}

/// Whether `sock` was bound with `SO_REUSEPORT` (so that more sockets may
/// join its port's group).
pub fn reuses_port(sock: &impl AsRawFd) -> io::Result<bool> {
    let mut on: libc::c_int = 0;
    getsockopt_raw(sock, libc::SOL_SOCKET, libc::SO_REUSEPORT, &mut on)?;
    Ok(on != 0)
}

/// `getsockopt` of a plain-data option into `val`.
fn getsockopt_raw<T>(fd: &impl AsRawFd, level: libc::c_int, opt: libc::c_int, val: &mut T) -> io::Result<()> {
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

/// A socket address in the kernel's form.
struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

fn raw_addr(a: &std::net::SocketAddr) -> RawAddr {
    // SAFETY: `sockaddr_storage` is plain data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        std::net::SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for
            // `sockaddr_in`; we write one whole value at its start.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for `sockaddr_in6`.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    RawAddr { storage, len: len as libc::socklen_t }
}

fn from_raw_addr(s: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a `sockaddr_in`.
            let sin: &libc::sockaddr_in = unsafe { &*(s as *const libc::sockaddr_storage).cast() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(std::net::SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a `sockaddr_in6`.
            let sin6: &libc::sockaddr_in6 = unsafe { &*(s as *const libc::sockaddr_storage).cast() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(std::net::SocketAddr::from((ip, u16::from_be(sin6.sin6_port))))
        }
        _ => None,
    }
}

/// Room for one `UDP_SEGMENT`/`UDP_GRO` control message (an int), aligned.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Sends the concatenation of `iov` to `dst` as one `sendmsg`. With
/// `segment > 0` the kernel splits it into datagrams of `segment` bytes
/// (UDP GSO; the last may be shorter). Returns the bytes sent.
pub fn send_segments(
    sock: &impl AsRawFd,
    dst: &std::net::SocketAddr,
    iov: &[io::IoSlice<'_>],
    segment: u16,
) -> io::Result<usize> {
    let mut addr = raw_addr(dst);
    let mut cbuf = CmsgBuf([0; 64]);
    // SAFETY: `msghdr` is plain data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr.storage as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = addr.len;
    // `IoSlice` is guaranteed ABI-compatible with `iovec` on Unix.
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    if segment > 0 {
        // SAFETY: CMSG_SPACE is a pure computation on its argument.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY:
        // - `msg.msg_control` points at `cbuf`, 64 aligned bytes, more than
        //   `space`, so CMSG_FIRSTHDR returns a pointer into it (not null).
        // - we write one `cmsghdr` and a u16 of data inside `space` bytes.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
        }
    }
    // SAFETY:
    // - `sock` is an open socket; `msg` points at `addr`, `iov` and `cbuf`,
    //   all live for the call; the kernel only reads them.
    let rc = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Most messages one [`RecvBatch::recv`] takes.
pub const RECV_BATCH: usize = 16;
/// Room for one received message: a whole GRO batch (up to 64 KB).
const RECV_MSG_BYTES: usize = 1 << 16;

/// Receives up to [`RECV_BATCH`] messages with one `recvmmsg`: datagrams,
/// or with `UDP_GRO` runs of coalesced ones. Everything is allocated once,
/// when the batch is made (16 x 64 KB), and reused for every call.
pub struct RecvBatch {
    bufs: Vec<u8>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<CmsgBuf>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point only into the batch's
// own vectors and are rewritten before each use; nothing is shared.
unsafe impl Send for RecvBatch {}

impl Default for RecvBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvBatch {
    pub fn new() -> Self {
        Self::with_slots(RECV_BATCH)
    }

    /// A batch of `slots` messages (at least one).
    pub fn with_slots(slots: usize) -> Self {
        let slots = slots.max(1);
        // SAFETY: `sockaddr_storage` and `mmsghdr` are plain data; all-zero
        // is a valid value of each.
        let (name, hdr) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        RecvBatch {
            bufs: vec![0u8; slots * RECV_MSG_BYTES],
            iovs: vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; slots],
            names: vec![name; slots],
            cmsgs: (0..slots).map(|_| CmsgBuf([0; 64])).collect(),
            hdrs: vec![hdr; slots],
        }
    }

    /// Receives what is waiting, up to the batch: returns how many
    /// messages (at least one), or `WouldBlock` when none is.
    pub fn recv(&mut self, sock: &impl AsRawFd) -> io::Result<usize> {
        let base = self.bufs.as_mut_ptr();
        let slots = self.hdrs.len();
        for i in 0..slots {
            // SAFETY: `i * RECV_MSG_BYTES` is inside `bufs`, which holds
            // `slots` such slots.
            let slot = unsafe { base.add(i * RECV_MSG_BYTES) };
            self.iovs[i] = libc::iovec { iov_base: slot.cast(), iov_len: RECV_MSG_BYTES };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i].0.as_mut_ptr().cast();
            h.msg_controllen = self.cmsgs[i].0.len() as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
        // SAFETY:
        // - `sock` is an open socket; `hdrs` holds `slots` headers, each
        //   pointing at its own name, iovec (into its own 64 KB slot of
        //   `bufs`) and control buffer, all owned by `self`, live and
        //   writable for the call, with their true sizes.
        let rc = unsafe {
            libc::recvmmsg(sock.as_raw_fd(), self.hdrs.as_mut_ptr(), slots as _, 0, std::ptr::null_mut())
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// Message `i` of the last [`recv`](Self::recv): its bytes, its
    /// sender (`None` for an unknown address family), and the size of each
    /// coalesced datagram in it (0 when not coalesced).
    pub fn message(&mut self, i: usize) -> Message<'_> {
        let (len, from, gso) = self.meta(i);
        let start = i * RECV_MSG_BYTES;
        (&mut self.bufs[start..start + len], from, gso)
    }

    /// Messages `i` and `i + 1` (if the last call returned it, `got`
    /// messages in all), each as [`message`](Self::message) gives it.
    pub fn message_and_next(&mut self, i: usize, got: usize) -> (Message<'_>, Option<Message<'_>>) {
        let (len, from, gso) = self.meta(i);
        let next = (i + 1 < got.min(self.hdrs.len())).then(|| self.meta(i + 1));
        let (this, rest) = self.bufs.split_at_mut((i + 1) * RECV_MSG_BYTES);
        let start = i * RECV_MSG_BYTES;
        let this = (&mut this[start..start + len], from, gso);
        (this, next.map(|(len, from, gso)| (&mut rest[..len], from, gso)))
    }

    /// Message `i`'s length, sender and GRO segment size.
    fn meta(&self, i: usize) -> (usize, Option<std::net::SocketAddr>, u16) {
        let h = &self.hdrs[i];
        let len = (h.msg_len as usize).min(RECV_MSG_BYTES);
        let mut gso = 0u16;
        // SAFETY: walking the control messages the kernel wrote into this
        // message's control buffer, within its `msg_controllen`, with the
        // CMSG_* helpers.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    gso = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>()) as u16;
                }
                c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
            }
        }
        (len, from_raw_addr(&self.names[i]), gso)
    }
}

/// A received message: its bytes, its sender, its GRO segment size (0: one datagram).
pub type Message<'a> = (&'a mut [u8], Option<std::net::SocketAddr>, u16);

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

/// Twins of the C structs the eBPF fast path keeps in its maps
/// (`bpf/vnet.bpf.c`): same fields, same order, no padding.
pub mod bpf {
    /// `struct route_key`: ingress port (ifindex, or `PORT_LINK | link id`),
    /// destination and source MAC.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
    pub struct RouteKey {
        pub port: u32,
        pub dst: [u8; 6],
        pub src: [u8; 6],
    }

    /// `struct route_val`: the decision, the counter slots of the ingress
    /// port and the target, and for `ACT_LINK` the link itself.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct RouteVal {
        pub action: u32,
        pub target: u32,
        pub in_slot: u32,
        pub out_slot: u32,
        pub link: LinkVal,
    }

    /// `struct dest_key`: a destination entry's network and MAC.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
    pub struct DestKey {
        pub net: u32,
        pub dst: [u8; 6],
        pub pad: u16,
    }

    /// `struct port_val`: an ingress port's counter slot, network, and the
    /// source MAC it is locked to (`locked` 1) if any.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct PortVal {
        pub slot: u32,
        pub net: u32,
        pub lock: [u8; 6],
        pub locked: u8,
        pub pad: u8,
    }

    /// `struct peer_val`: a peer's link id, counter slot and link.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct PeerVal {
        pub id: u32,
        pub slot: u32,
        pub link: LinkVal,
    }

    /// `struct link_val`: underlay addresses as 16 bytes (IPv6, or IPv4
    /// mapped, `::ffff:a.b.c.d`), the port in network byte order.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct LinkVal {
        pub remote_ip: [u8; 16],
        pub local_ip: [u8; 16],
        /// The next hop towards `remote_ip` on `ifindex`: the route's
        /// gateway, or `remote_ip` itself when it is on-link.
        pub nexthop: [u8; 16],
        pub remote_port: u16,
        pub format: u8,
        /// 1: the underlay is IPv6.
        pub v6: u8,
        pub network: u32,
        pub ifindex: u32,
        pub mtu: u32,
    }

    /// `struct addr_key`: a peer's underlay address, as in [`LinkVal`].
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
    pub struct AddrKey {
        pub a: [u8; 16],
    }

    /// `struct cfg`; ports in network byte order (`vxlan_port` 0: none).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Cfg {
        pub active: u32,
        pub port: u16,
        pub vxlan_port: u16,
    }

    /// `struct vxlan_key`: a VXLAN peer's address (as in [`AddrKey`]) and VNI.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
    pub struct VxlanKey {
        pub addr: [u8; 16],
        pub vni: u32,
    }

    /// `struct port_stats`: one port's frames and bytes moved by the kernel.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct PortStats {
        pub rx_packets: u64,
        pub rx_bytes: u64,
        pub tx_packets: u64,
        pub tx_bytes: u64,
    }

    /// `struct pair_key`: a (source, destination) MAC pair of the matrix.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct PairKey {
        pub src: [u8; 6],
        pub dst: [u8; 6],
    }

    /// `struct pair_val`: a pair's frames and bytes on one CPU.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct PairVal {
        pub frames: u64,
        pub bytes: u64,
    }

    // SAFETY: each type is `repr(C)`, made only of integers and byte arrays,
    // laid out without padding (sizes checked below), so
    // every byte pattern is a valid value and none is uninitialised: what
    // `aya::Pod` requires to copy them to and from the kernel's maps.
    unsafe impl aya::Pod for RouteKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for RouteVal {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LinkVal {}
    // SAFETY: as above.
    unsafe impl aya::Pod for PeerVal {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Cfg {}
    // SAFETY: as above (four u64, 32 bytes).
    unsafe impl aya::Pod for PortStats {}
    // SAFETY: as above (16 bytes and a u32: 20 bytes).
    unsafe impl aya::Pod for VxlanKey {}
    // SAFETY: as above (16 bytes).
    unsafe impl aya::Pod for AddrKey {}
    // SAFETY: as above (twelve bytes).
    unsafe impl aya::Pod for PairKey {}
    // SAFETY: as above (two u64, 16 bytes).
    unsafe impl aya::Pod for PairVal {}
    // SAFETY: as above (u32, six bytes, u16: 12 bytes).
    unsafe impl aya::Pod for DestKey {}
    // SAFETY: as above (two u32, eight bytes: 16 bytes).
    unsafe impl aya::Pod for PortVal {}

    const _: () = assert!(std::mem::size_of::<RouteKey>() == 16);
    const _: () = assert!(std::mem::size_of::<RouteVal>() == 80);
    const _: () = assert!(std::mem::size_of::<PeerVal>() == 72);
    const _: () = assert!(std::mem::size_of::<LinkVal>() == 64);
    const _: () = assert!(std::mem::size_of::<Cfg>() == 8);
    const _: () = assert!(std::mem::size_of::<PortStats>() == 32);
    const _: () = assert!(std::mem::size_of::<VxlanKey>() == 20);
    const _: () = assert!(std::mem::size_of::<AddrKey>() == 16);
    const _: () = assert!(std::mem::size_of::<PairKey>() == 12);
    const _: () = assert!(std::mem::size_of::<PairVal>() == 16);
    const _: () = assert!(std::mem::size_of::<DestKey>() == 12);
    const _: () = assert!(std::mem::size_of::<PortVal>() == 16);
}

/// Restricts the calling thread to CPU `cpu` (`sched_setaffinity`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {cpu} is out of range")));
    }
    // SAFETY: `cpu_set_t` is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE (checked above), so CPU_SET stays inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a live, initialised
    // `cpu_set_t` and its true size is passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs this process may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the kernel writes at most the
    // size passed into `set`, which is live and writable.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every index passed to CPU_ISSET is below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// `struct tpacket2_hdr` (linux/if_packet.h): the head of each ring frame.
#[repr(C)]
#[allow(dead_code)] // the kernel's layout; only some fields are read
struct Tpacket2Hdr {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_sec: u32,
    tp_nsec: u32,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
    tp_padding: [u8; 4],
}

/// `struct tpacket_req` (linux/if_packet.h).
#[repr(C)]
#[allow(dead_code)] // read by the kernel
struct TpacketReq {
    tp_block_size: libc::c_uint,
    tp_block_nr: libc::c_uint,
    tp_frame_size: libc::c_uint,
    tp_frame_nr: libc::c_uint,
}

const PACKET_RX_RING: libc::c_int = 5;
const PACKET_VERSION: libc::c_int = 10;
const TPACKET_V2: libc::c_int = 1;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
/// The frame's VLAN tag is in `tp_vlan_tci` (the kernel took it out).
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// `sockaddr_ll`, which the kernel writes after the (aligned) header.
const SOCKADDR_LL_LEN: usize = 20;
/// A ring block: the kernel allocates each as 2^n pages, so a power of two
/// wastes nothing.
const RING_BLOCK: usize = 256 << 10;
/// Frames per block, and one frame's slot: its header, the address, a
/// `virtio_net_hdr` and a largest GSO frame (64 KB) fit in a third of a
/// block (rounded down to the 16-byte `TPACKET_ALIGNMENT`).
const RING_PER_BLOCK: usize = 3;
const RING_FRAME: usize = RING_BLOCK / RING_PER_BLOCK / 16 * 16;

/// A `TPACKET_V2` receive ring on a packet socket: the kernel copies each
/// frame the device receives into the next free slot of a memory area it
/// shares with vnetd, and vnetd takes frames from there without a system
/// call per frame (`read` costs one each). Frames keep their
/// `virtio_net_hdr` in front when the socket has `PACKET_VNET_HDR`.
///
/// One reader at a time (the worker serving the interface's queue takes
/// the ring's lock for a batch); a slot goes back to the kernel when the
/// [`RingFrame`] that lent it is dropped.
pub struct RxRing {
    base: *mut u8,
    len: usize,
    frames: usize,
    next: usize,
    vnet_hdr: usize,
}

// SAFETY: the mapping is owned by the ring and unmapped only on drop; a
// frame's bytes are handed out only while the kernel has marked it the
// user's, through `&mut self` (one reader); the status word is accessed
// atomically. Moving the ring to another thread changes none of that.
unsafe impl Send for RxRing {}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRing").field("frames", &self.frames).finish()
    }
}

/// One frame lent by an [`RxRing`]: `data` is `[virtio_net_hdr] frame`, as
/// a `read` would have returned it; `truncated` says the slot was too
/// small for the whole frame.
pub struct RingFrame<'a> {
    status: &'a std::sync::atomic::AtomicU32,
    pub data: &'a mut [u8],
    pub truncated: bool,
}

impl Drop for RingFrame<'_> {
    fn drop(&mut self) {
        self.status.store(TP_STATUS_KERNEL, std::sync::atomic::Ordering::Release);
    }
}

impl RxRing {
    /// Sets up a ring of `blocks` blocks (3 frames of up to 64 KB each,
    /// 256 KB) on packet socket `sock`, which must have no ring yet
    /// (`vnet_hdr` as set on the socket), and maps it.
    pub fn new(sock: &File, blocks: usize, vnet_hdr: bool) -> io::Result<RxRing> {
        let blocks = blocks.max(1);
        let frames = blocks * RING_PER_BLOCK;
        setsockopt_raw(sock, libc::SOL_PACKET, PACKET_VERSION, &TPACKET_V2)?;
        let req = TpacketReq {
            tp_block_size: RING_BLOCK as libc::c_uint,
            tp_block_nr: blocks as libc::c_uint,
            tp_frame_size: RING_FRAME as libc::c_uint,
            tp_frame_nr: frames as libc::c_uint,
        };
        setsockopt_raw(sock, libc::SOL_PACKET, PACKET_RX_RING, &req)?;
        Self::adopt(sock, blocks, vnet_hdr, 0)
    }

    /// The ring made on `sock` with `blocks` blocks (by [`RxRing::new`], or
    /// by a previous vnetd and handed over with the socket), mapped and
    /// read from frame `next` (where that vnetd stopped).
    pub fn adopt(sock: &File, blocks: usize, vnet_hdr: bool, next: usize) -> io::Result<RxRing> {
        let frames = blocks.max(1) * RING_PER_BLOCK;
        if next >= frames {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a ring position past its end"));
        }
        let len = RING_BLOCK * blocks.max(1);
        // SAFETY: a new shared mapping of the socket's existing ring (the
        // kernel refuses a length other than the ring's); no existing memory
        // is touched; the result is checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                sock.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let vnet_hdr = if vnet_hdr { 10 } else { 0 };
        Ok(RxRing { base: base.cast(), len, frames, next, vnet_hdr })
    }

    /// The frame read next (what a hand-over passes on).
    pub fn position(&self) -> usize {
        self.next
    }

    /// The next frame the kernel has filled, if any.
    pub fn take_frame(&mut self) -> Option<RingFrame<'_>> {
        let slot = self.next / RING_PER_BLOCK * RING_BLOCK + self.next % RING_PER_BLOCK * RING_FRAME;
        // SAFETY: `slot` is the start of one of `frames` slots inside the
        // mapping, 16-byte aligned, so aligned for the header; the status word
        // is the header's first field and is shared with the kernel, so it
        // is only accessed atomically.
        let (hdr, status) = unsafe {
            let hdr = self.base.add(slot) as *const Tpacket2Hdr;
            (hdr, std::sync::atomic::AtomicU32::from_ptr(hdr as *mut u32))
        };
        if status.load(std::sync::atomic::Ordering::Acquire) & TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the kernel set TP_STATUS_USER (read with Acquire above):
        // it wrote the header and the frame and leaves the slot alone until
        // we hand it back. Read the header's plain fields.
        let (mac, snaplen, len, tci, tpid) = unsafe {
            (
                std::ptr::addr_of!((*hdr).tp_mac).read() as usize,
                std::ptr::addr_of!((*hdr).tp_snaplen).read() as usize,
                std::ptr::addr_of!((*hdr).tp_len).read() as usize,
                std::ptr::addr_of!((*hdr).tp_vlan_tci).read(),
                std::ptr::addr_of!((*hdr).tp_vlan_tpid).read(),
            )
        };
        self.next = (self.next + 1) % self.frames;
        let start = mac.saturating_sub(self.vnet_hdr).max(std::mem::size_of::<Tpacket2Hdr>());
        let end = (mac + snaplen).min(RING_FRAME);
        let start = start.min(end);
        // A VLAN tag the kernel took out of the frame goes back in (the
        // VM sent it; a TAP's frames keep theirs): the offload header and
        // the two MAC addresses move 4 bytes into the slack before them.
        let vlan = status.load(std::sync::atomic::Ordering::Relaxed) & TP_STATUS_VLAN_VALID != 0;
        let room = std::mem::size_of::<Tpacket2Hdr>().next_multiple_of(16) + SOCKADDR_LL_LEN + 4;
        let tagged = vlan && start >= room && end - start >= self.vnet_hdr + 12;
        let start = if tagged { start - 4 } else { start };
        // SAFETY: `slot + start .. slot + end` lies inside this slot (both
        // clamped to RING_FRAME), which the kernel has lent us (above); the
        // returned borrow of `self` keeps `take_frame` from lending it twice, and
        // `RingFrame`'s drop hands it back.
        let data = unsafe { std::slice::from_raw_parts_mut(self.base.add(slot + start), end - start) };
        if tagged {
            insert_vlan_tag(data, self.vnet_hdr, if tpid == 0 { 0x8100 } else { tpid }, tci);
        }
        Some(RingFrame { status, data, truncated: snaplen < len || mac < self.vnet_hdr })
    }
}

const PACKET_AUXDATA: libc::c_int = 8;

/// `struct tpacket_auxdata` (linux/if_packet.h): a packet socket's control
/// message with each frame.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TpacketAuxdata {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
}

/// Reads one frame from packet socket `f` into `buf[4..]` (the 4 bytes in
/// front are room for a tag) and, when the kernel had taken the frame's
/// VLAN tag out as metadata, puts it back (see [`insert_vlan_tag`];
/// `vnet_hdr` bytes of offload header come first). Returns the range of
/// `buf` the frame (with its header) is in.
pub fn recv_packet(f: &File, buf: &mut [u8], vnet_hdr: usize) -> io::Result<std::ops::Range<usize>> {
    if buf.len() < 4 + vnet_hdr + 14 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut iov = libc::iovec { iov_base: buf[4..].as_mut_ptr().cast(), iov_len: buf.len() - 4 };
    // Room for one control message holding a `TpacketAuxdata`, aligned.
    let mut control = [0u64; 8];
    // SAFETY: `msghdr` is a plain C struct; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY:
    // - `f` is an open packet socket for the whole call.
    // - `msg` points at one iovec over `buf[4..]` (live, writable, its length
    //   given) and at `control` (live, writable, its length given); both
    //   outlive the call.
    let n = unsafe { libc::recvmsg(f.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = n as usize;
    let mut aux = None;
    // SAFETY: `msg` was filled by `recvmsg` above; CMSG_FIRSTHDR/NXTHDR only
    // walk inside `msg_control[..msg_controllen]`, which the kernel wrote.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is a control message header inside `control` (above).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_PACKET && h.cmsg_type == PACKET_AUXDATA {
            // SAFETY: CMSG_LEN only computes a length (no memory is read).
            let need = unsafe { libc::CMSG_LEN(std::mem::size_of::<TpacketAuxdata>() as u32) } as usize;
            if h.cmsg_len as usize >= need {
                // SAFETY: the message's data holds a whole `tpacket_auxdata`
                // (its length was checked just above), inside `control`; it
                // may be unaligned, so it is read with `read_unaligned`.
                aux = Some(unsafe { libc::CMSG_DATA(c).cast::<TpacketAuxdata>().read_unaligned() });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    match aux {
        // (recvmsg filled at most `buf[4..]`: the frame and its tag fit.)
        Some(a) if a.tp_status & TP_STATUS_VLAN_VALID != 0 && len >= vnet_hdr + 12 => {
            let tpid = if a.tp_vlan_tpid == 0 { 0x8100 } else { a.tp_vlan_tpid };
            insert_vlan_tag(&mut buf[..4 + len], vnet_hdr, tpid, a.tp_vlan_tci);
            Ok(0..4 + len)
        }
        _ => Ok(4..4 + len),
    }
}

/// Puts a VLAN tag back into a frame laid out as 4 free bytes, then
/// `[virtio_net_hdr (vnet_hdr bytes)] dst src rest`: header and addresses
/// move to the front, the tag goes after them, and a partial checksum's
/// offsets (counted from the frame's start) move with the bytes after it.
pub fn insert_vlan_tag(data: &mut [u8], vnet_hdr: usize, tpid: u16, tci: u16) {
    data.copy_within(4..4 + vnet_hdr + 12, 0);
    let at = vnet_hdr + 12;
    data[at..at + 2].copy_from_slice(&tpid.to_be_bytes());
    data[at + 2..at + 4].copy_from_slice(&tci.to_be_bytes());
    if vnet_hdr >= 10 && data[0] & 1 != 0 {
        // NEEDS_CSUM: csum_start (and hdr_len) are past the tag now.
        for f in [2usize, 6] {
            let v = u16::from_le_bytes([data[f], data[f + 1]]);
            if v != 0 {
                data[f..f + 2].copy_from_slice(&v.saturating_add(4).to_le_bytes());
            }
        }
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `new`, and no
        // `RingFrame` can outlive the ring (it borrows it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

pub use vnet_client::sys::euid;

/// Sets the process's file mode creation mask (returns the old one): vnetd
/// sets 0o077 at start, so every socket and file it makes (control socket,
/// vhost-user sockets, saved configs, keys) is its owner's alone from the
/// moment it exists.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: `umask` takes a plain integer, touches no memory of ours and
    // cannot fail; it changes only the process's creation mask.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// File descriptors passed between processes (`SCM_RIGHTS`): a hand-over's
/// sockets and TAP queues (`crate::handover`).
pub mod fds {
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
    use std::path::Path;
    use std::time::Duration;

    fn unix_addr(path: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
        // SAFETY: `sockaddr_un` is plain data; all-zero is a valid value.
        let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if path.is_empty() || path.len() >= a.sun_path.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path empty or too long"));
        }
        for (d, s) in a.sun_path.iter_mut().zip(path) {
            *d = *s as libc::c_char;
        }
        // An abstract address (systemd's `@...`) starts with a NUL byte.
        if path[0] == b'@' {
            a.sun_path[0] = 0;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + path.len();
        Ok((a, len as libc::socklen_t))
    }

    fn socket(kind: libc::c_int) -> io::Result<OwnedFd> {
        // SAFETY: `socket` takes plain integers; a non-negative result is a
        // new descriptor that nothing else owns.
        let fd = unsafe { libc::socket(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned by no one else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A `SOCK_SEQPACKET` Unix socket listening at `path` (message
    /// boundaries kept: one name and its descriptor a message).
    pub fn listen(path: &Path) -> io::Result<OwnedFd> {
        let s = seqpacket(path, true)?;
        // SAFETY: `listen` takes the descriptor we own and an integer.
        if unsafe { libc::listen(s.as_raw_fd(), 1) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }

    /// A connection to listener `l` within `timeout`, from a process of
    /// user `uid` (or root); `None` when none came.
    pub fn accept(l: &OwnedFd, timeout: Duration, uid: u32) -> io::Result<Option<OwnedFd>> {
        let mut p = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `p` is one valid `pollfd` for the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(None);
        }
        // SAFETY: null address pointers are allowed (the peer's address is
        // not wanted); a non-negative result is a new descriptor.
        let fd = unsafe {
            libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned by no one else.
        let c = unsafe { OwnedFd::from_raw_fd(fd) };
        if !peer_uid(&c).is_ok_and(|u| u == uid || u == 0) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "a process of another user connected",
            ));
        }
        Ok(Some(c))
    }

    /// The user of the process at the other end of a Unix socket
    /// (`SO_PEERCRED`: who connected, or who listens).
    pub fn peer_uid(c: &OwnedFd) -> io::Result<u32> {
        // SAFETY: `ucred` is plain data; all-zero is valid.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        super::getsockopt_raw(c, libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred)?;
        Ok(cred.uid)
    }

    /// A `SOCK_SEQPACKET` connection to `path`.
    pub fn connect(path: &Path) -> io::Result<OwnedFd> {
        seqpacket(path, false)
    }

    /// A `SOCK_SEQPACKET` socket bound to `path` (`bind`) or connected to it.
    fn seqpacket(path: &Path, bind: bool) -> io::Result<OwnedFd> {
        use std::os::unix::ffi::OsStrExt;
        let s = socket(libc::SOCK_SEQPACKET)?;
        let (a, len) = unix_addr(path.as_os_str().as_bytes())?;
        let at = (&a as *const libc::sockaddr_un).cast();
        // SAFETY: `at` points at `a`, a valid `sockaddr_un` of `len` bytes,
        // for the duration of the call.
        let rc = unsafe {
            if bind {
                libc::bind(s.as_raw_fd(), at, len)
            } else {
                libc::connect(s.as_raw_fd(), at, len)
            }
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }

    /// Sends `data` with descriptor `fd` attached, to the connected socket
    /// `sock`, or (with `to`) as a datagram to the Unix socket at `to`
    /// (systemd's `NOTIFY_SOCKET`).
    pub fn send(sock: &OwnedFd, to: Option<&[u8]>, data: &[u8], fd: Option<BorrowedFd>) -> io::Result<()> {
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        // Room for one descriptor's control message, aligned for `cmsghdr`.
        let mut cbuf = [0u64; 4];
        // SAFETY: `CMSG_SPACE` computes a size from a plain integer.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
        // SAFETY: `msghdr` is plain data; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        let addr = to.map(unix_addr).transpose()?;
        if let Some((a, len)) = &addr {
            msg.msg_name = (a as *const libc::sockaddr_un as *mut libc::sockaddr_un).cast();
            msg.msg_namelen = *len;
        }
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space.min(std::mem::size_of_val(&cbuf)) as _;
            // SAFETY: `msg_control` points at `cbuf`, at least `CMSG_SPACE(4)`
            // bytes and aligned for `cmsghdr`, so the first header and its
            // data (one `c_int`) lie inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd.as_raw_fd());
            }
        }
        // SAFETY: every pointer in `msg` (address, iovec, control buffer) is
        // valid and sized as told for the duration of the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Descriptor `3 + k` that systemd passed this process (`LISTEN_FDS`,
    /// checked by the caller to be this process's), if it is open.
    pub fn from_systemd(k: i32) -> Option<OwnedFd> {
        let raw = 3 + k;
        // SAFETY: `fcntl(F_GETFD)` only reads the descriptor's flags.
        if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
            return None;
        }
        // Close-on-exec from now on, as every descriptor of vnetd's.
        // SAFETY: as above; F_SETFD changes only that flag.
        unsafe { libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: systemd passed descriptors 3 .. 3 + LISTEN_FDS to this
        // process (the caller checked LISTEN_PID), the descriptor is open
        // (above), and nothing else in vnetd owns it: it is taken once, at
        // the start.
        Some(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// A datagram socket to send to `NOTIFY_SOCKET` from.
    pub fn datagram() -> io::Result<OwnedFd> {
        socket(libc::SOCK_DGRAM)
    }

    /// Receives one message into `buf`: its length (0: the peer is done)
    /// and the descriptor it carried, if any (others are closed).
    pub fn recv(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut cbuf = [0u64; 16];
        // SAFETY: `msghdr` is plain data; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: `msg`'s iovec and control buffer are valid and sized as
        // told for the call; received descriptors are close-on-exec.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut got = None;
        // SAFETY: the kernel filled `msg_control` with `msg_controllen`
        // bytes of well-formed control messages; the CMSG macros walk them
        // inside that length, and each SCM_RIGHTS payload holds
        // `(cmsg_len - CMSG_LEN(0)) / 4` descriptors now ours.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    for k in 0..count {
                        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>().add(k));
                        let owned = OwnedFd::from_raw_fd(fd);
                        if got.is_none() {
                            got = Some(owned);
                        } // else: dropped, closed
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok((n as usize, got))
    }
}

/// The bytes of guest memory `s`, for a frame cut through from a guest's
/// TX buffers to where it goes (another guest's RX buffers, a TAP, a
/// socket): copied once, there, instead of first into a bounce buffer.
pub fn guest_bytes<'a, B: vm_memory::bitmap::BitmapSlice>(s: &vm_memory::VolatileSlice<'a, B>) -> &'a [u8] {
    let g = s.ptr_guard();
    // SAFETY:
    // - The pointer and length are those of `s`, a checked slice of a
    //   mapping of the guest's memory (`GuestMemoryMmap`, not Xen's
    //   per-access mappings): it stays mapped for `'a`, the life of the
    //   memory guard the slice was taken from (vm-memory unmaps a region
    //   only when its last guard is dropped).
    // - The guest may write these bytes while they are read (as a NIC's DMA
    //   may read a buffer the driver still touches): they are only copied,
    //   never interpreted. Routing reads the headers copied out before, so
    //   a racing guest can corrupt only its own frame's payload.
    unsafe { std::slice::from_raw_parts(g.as_ptr(), g.len()) }
}

#[cfg(test)]
mod tests {
    use super::insert_vlan_tag;

    #[test]
    fn a_vlan_tag_goes_back_between_the_addresses_and_the_type() {
        // 4 free bytes, a virtio_net_hdr (NEEDS_CSUM, hdr_len 54, csum_start 34), dst, src, type.
        let mut d = vec![0xee; 4];
        d.extend_from_slice(&[1, 0, 54, 0, 0, 0, 34, 0, 16, 0]);
        d.extend_from_slice(&[0xaa; 6]);
        d.extend_from_slice(&[0xbb; 6]);
        d.extend_from_slice(&[0x08, 0x00, 0x45]);
        insert_vlan_tag(&mut d, 10, 0x8100, 77);
        assert_eq!(&d[..10], &[1, 0, 58, 0, 0, 0, 38, 0, 16, 0]);
        assert_eq!(&d[10..22], &[0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xbb, 0xbb, 0xbb, 0xbb, 0xbb, 0xbb]);
        assert_eq!(&d[22..], &[0x81, 0x00, 0, 77, 0x08, 0x00, 0x45]);
        // Without an offload header.
        let mut p = vec![0; 4];
        p.extend_from_slice(&[1; 12]);
        p.extend_from_slice(&[0x86, 0xdd]);
        insert_vlan_tag(&mut p, 0, 0x8100, 5);
        assert_eq!(&p[12..], &[0x81, 0x00, 0, 5, 0x86, 0xdd]);
    }
}
