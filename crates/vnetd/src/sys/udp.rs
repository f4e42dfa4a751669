//! UDP datagrams in batches: one `sendmsg` of many segments (UDP GSO,
//! `UDP_SEGMENT`), `recvmmsg` into buffers allocated once with each
//! message's GRO segment size (`RecvBatch`), sockets bound with
//! `SO_REUSEPORT` before the bind, and socket addresses in the kernel's form.

use super::sockopt::setsockopt_raw;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
