//! File descriptors passed between processes (`SCM_RIGHTS`): a hand-over's
//! sockets and TAP queues (`crate::handover`).

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
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "a process of another user connected"));
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
