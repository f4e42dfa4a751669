//! A hand-over of the user path: the sockets and TAP queues one vnetd
//! hands to the next, so that what arrives while no vnetd runs waits in
//! their queues instead of being lost (a TAP whose last file closes drops
//! what its VM sends; a packet socket closed sees nothing; a UDP port that
//! nobody holds answers with ICMP). The kernel path's hand-over is its
//! pins (`kernel::pins`); this is the user path's.
//!
//! Two ways, as the supervisor allows:
//! - **systemd's file descriptor store.** With `$NOTIFY_SOCKET` set, each
//!   descriptor goes to it with `FDSTORE=1` and `FDNAME=` its name (the
//!   unit has `FileDescriptorStoreMax=` and `NotifyAccess=main`); systemd
//!   gives them to the next vnetd it starts (`LISTEN_FDS`,
//!   `LISTEN_FDNAMES`), which takes them and removes them from the store
//!   (`FDSTOREREMOVE=1`).
//! - **Anywhere else**, a socket in the state directory (`handover`): the
//!   old vnetd serves the descriptors there for a while (`vnetd
//!   --hand-over-wait`, 5 s), and a vnetd starting while it is there takes
//!   them (`SCM_RIGHTS`, one a message;
//!   only a process of vnetd's user, or root, is served).
//!
//! A descriptor is named by what it is: `udp ADDR`, `vxlan ADDR`, `tcp
//! ADDR`, `tap NETNS DEV qK hdr|raw`, `packet NETNS DEV hdr|raw ring N next
//! K`. The next vnetd uses one only for exactly that (a TAP opened with
//! other flags is opened anew); what its first transaction did not use is
//! closed and said in the log.

use crate::sys::fds;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The socket's name in the state directory.
const SOCKET: &str = "handover";

/// The longest name (systemd's `FDNAME` limit).
const NAME_MAX: usize = 255;

/// Descriptors inherited from the previous vnetd, by name, until used.
static INHERITED: Mutex<BTreeMap<String, OwnedFd>> = Mutex::new(BTreeMap::new());

fn inherited() -> std::sync::MutexGuard<'static, BTreeMap<String, OwnedFd>> {
    INHERITED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The inherited descriptor named `name`, taken (`None`: open anew).
pub fn take(name: &str) -> Option<OwnedFd> {
    inherited().remove(name)
}

/// The inherited descriptor whose name starts with `prefix`, and the rest
/// of its name.
pub fn take_prefixed(prefix: &str) -> Option<(String, OwnedFd)> {
    let mut m = inherited();
    let name = m.keys().find(|k| k.starts_with(prefix))?.clone();
    let fd = m.remove(&name)?;
    Some((name[prefix.len()..].to_string(), fd))
}

/// The prefix of the control listener's name: it is taken after the
/// first transaction, when the control endpoint is served.
pub const CONTROL: &str = "control ";

/// Closes what was inherited and not used (the control listener is left
/// for [`take_control`]); returns the names.
pub fn close_unused() -> Vec<String> {
    let mut m = inherited();
    let mut unused = Vec::new();
    for (name, fd) in std::mem::take(&mut *m) {
        if name.starts_with(CONTROL) {
            m.insert(name, fd);
        } else {
            unused.push(name);
        }
    }
    unused
}

/// The inherited control listener named `name`, taken; any other
/// inherited control listener (the endpoint changed) is closed.
pub fn take_control(name: &str) -> Option<OwnedFd> {
    let mut m = inherited();
    let fd = m.remove(name);
    m.retain(|k, _| !k.starts_with(CONTROL));
    fd
}

/// The hand-over socket of state directory `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET)
}

/// Takes the previous vnetd's descriptors: from systemd (`LISTEN_FDS` for
/// this process), else from the hand-over socket in `state_dir` if one is
/// there. Returns how many, and from where.
pub fn receive(state_dir: &Path) -> std::io::Result<(usize, &'static str)> {
    if let Some(n) = from_systemd()? {
        return Ok((n, "systemd's file descriptor store"));
    }
    let path = socket_path(state_dir);
    if !path.exists() {
        return Ok((0, ""));
    }
    let sock = match fds::connect(&path) {
        Ok(s) => s,
        // A socket left by a vnetd that is gone: nothing to take.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok((0, "")),
        Err(e) => return Err(e),
    };
    // Descriptors only from a vnetd of our user (or root): whoever else
    // served this socket would hand us its sockets as ours.
    let server = fds::peer_uid(&sock)?;
    if server != crate::sys::euid() && server != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is served by uid {server}, not vnetd's user or root: nothing taken", path.display()),
        ));
    }
    let mut buf = [0u8; NAME_MAX + 1];
    let mut n = 0;
    loop {
        let (len, fd) = fds::recv(&sock, &mut buf)?;
        if len == 0 {
            break;
        }
        let (Ok(name), Some(fd)) = (std::str::from_utf8(&buf[..len]), fd) else { continue };
        inherited().insert(name.to_string(), fd);
        n += 1;
    }
    Ok((n, "the previous vnetd"))
}

/// The descriptors systemd passed this process, named; `None` when it
/// passed none.
fn from_systemd() -> std::io::Result<Option<usize>> {
    let pid = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok());
    let count = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<i32>().ok());
    let (Some(pid), Some(count)) = (pid, count) else { return Ok(None) };
    if pid != std::process::id() || count <= 0 {
        return Ok(None);
    }
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    let names: Vec<String> = names.split(':').map(unescape).collect();
    let notify = Notify::from_env();
    for k in 0..count {
        let Some(fd) = fds::from_systemd(k) else { continue };
        let name = names.get(k as usize).cloned().unwrap_or_default();
        if let Some(n) = &notify {
            // Out of the store: the next hand-over stores what is current.
            let _ = n.send(&format!("FDSTOREREMOVE=1\nFDNAME={}", escape(&name)), None);
        }
        inherited().insert(name, fd);
    }
    Ok(Some(count as usize))
}

/// `$NOTIFY_SOCKET`, systemd's.
struct Notify {
    sock: OwnedFd,
    path: Vec<u8>,
}

impl Notify {
    fn from_env() -> Option<Notify> {
        let path = std::env::var("NOTIFY_SOCKET").ok().filter(|p| !p.is_empty())?;
        Some(Notify { sock: fds::datagram().ok()?, path: path.into_bytes() })
    }

    fn send(&self, text: &str, fd: Option<std::os::fd::BorrowedFd>) -> std::io::Result<()> {
        fds::send(&self.sock, Some(&self.path), text.as_bytes(), fd)
    }
}

/// Tells systemd `text` (`READY=1`, `STATUS=...`; `sd_notify(3)`), when
/// vnetd runs under it; false when it does not (or the message failed).
pub fn notify(text: &str) -> bool {
    Notify::from_env().is_some_and(|n| n.send(text, None).is_ok())
}

/// `FDNAME` may not hold `:` (it separates `LISTEN_FDNAMES`).
fn escape(name: &str) -> String {
    name.replace('%', "%25").replace(':', "%3A")
}

fn unescape(name: &str) -> String {
    name.replace("%3A", ":").replace("%25", "%")
}

/// Why descriptors were not handed over.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("{}: {source}", path.display())]
    Listen { path: std::path::PathBuf, source: std::io::Error },
    #[error("systemd's store refused {name}: {source}")]
    Store { name: String, source: std::io::Error },
    #[error("no vnetd took them within {} s", .0.as_secs())]
    NotTaken(Duration),
    #[error("the hand-over socket: {0}")]
    Accept(std::io::Error),
    #[error("sending {name}: {source}")]
    Send { name: String, source: std::io::Error },
}

/// Hands `offered` to the next vnetd: into systemd's store when vnetd runs
/// under systemd, else on the hand-over socket of `state_dir` until one
/// takes them (at most `wait`; zero: none are handed). Returns how many
/// were handed.
pub fn offer(
    state_dir: &Path,
    offered: Vec<(String, OwnedFd)>,
    wait: Duration,
) -> Result<usize, HandoverError> {
    if offered.is_empty() {
        return Ok(0);
    }
    if let Some(n) = Notify::from_env() {
        return store(&n, &offered);
    }
    if wait.is_zero() {
        return Ok(0);
    }
    let path = socket_path(state_dir);
    let _ = std::fs::create_dir_all(state_dir);
    let _ = std::fs::remove_file(&path);
    let l = fds::listen(&path).map_err(|source| HandoverError::Listen { path: path.clone(), source })?;
    let served = serve(&l, &offered, wait);
    let _ = std::fs::remove_file(&path);
    served
}

/// Puts `offered` into systemd's file descriptor store, each with its name.
fn store(n: &Notify, offered: &[(String, OwnedFd)]) -> Result<usize, HandoverError> {
    for (name, fd) in offered {
        let msg = format!("FDSTORE=1\nFDNAME={}", escape(name));
        n.send(&msg, Some(fd.as_fd()))
            .map_err(|source| HandoverError::Store { name: name.clone(), source })?;
    }
    Ok(offered.len())
}

/// Serves `offered` to the first process of our user that connects to
/// `l` within `wait`.
fn serve(l: &OwnedFd, offered: &[(String, OwnedFd)], wait: Duration) -> Result<usize, HandoverError> {
    let deadline = Instant::now() + wait;
    let uid = crate::sys::euid();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandoverError::NotTaken(wait));
        }
        let c = match fds::accept(l, left, uid) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!("hand-over: {e}: refused");
                continue;
            }
            Err(e) => return Err(HandoverError::Accept(e)),
        };
        for (name, fd) in offered {
            fds::send(&c, None, name.as_bytes(), Some(fd.as_fd()))
                .map_err(|source| HandoverError::Send { name: name.clone(), source })?;
        }
        // The end: an empty message.
        let _ = fds::send(&c, None, &[], None);
        tracing::debug!(fd = c.as_raw_fd(), "hand-over: served");
        return Ok(offered.len());
    }
}

/// A name for descriptors: the words joined by spaces, at most
/// [`NAME_MAX`] bytes (longer ones are not handed over).
pub fn name(words: &[&str]) -> Option<String> {
    let n = words.join(" ");
    (n.len() <= NAME_MAX && !n.contains('\n')).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inherited descriptors are the process's: one test at a time.
    static ONE: Mutex<()> = Mutex::new(());

    fn pipe() -> (OwnedFd, OwnedFd) {
        let (r, w) = std::io::pipe().unwrap();
        (r.into(), w.into())
    }

    #[test]
    fn descriptors_go_from_one_vnetd_to_the_next_by_name_over_the_state_dirs_socket() {
        let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("vnet-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (r, w) = pipe();
        let offered = vec![("tap ns0 vt0 q0 hdr".to_string(), w), ("udp 10.0.0.1:9000".to_string(), r)];
        let d2 = dir.clone();
        let old = std::thread::spawn(move || offer(&d2, offered, Duration::from_secs(5)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket_path(&dir).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (n, from) = receive(&dir).unwrap();
        assert_eq!((n, from), (2, "the previous vnetd"));
        assert_eq!(old.join().unwrap().unwrap(), 2);
        assert!(!socket_path(&dir).exists(), "the socket goes with the hand-over");
        // The same pipe, both ends: written through one, read from the other.
        let w = take("tap ns0 vt0 q0 hdr").unwrap();
        let r = take("udp 10.0.0.1:9000").unwrap();
        let mut w = std::fs::File::from(w);
        std::io::Write::write_all(&mut w, b"frame").unwrap();
        let mut got = [0u8; 5];
        std::io::Read::read_exact(&mut std::fs::File::from(r), &mut got).unwrap();
        assert_eq!(&got, b"frame");
        assert!(take("tap ns0 vt0 q0 hdr").is_none(), "taken once");
        // Nobody there: nothing taken, no error.
        assert_eq!(receive(&dir).unwrap().0, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The store's messages as systemd reads them (`sd_notify(3)`): a
    /// datagram each, `FDSTORE=1` and the escaped name, the descriptor
    /// attached. (No systemd runs here to take them: PID 1 is not systemd.)
    #[test]
    fn the_store_gets_one_datagram_per_descriptor_with_its_name() {
        let dir = std::env::temp_dir().join(format!("vnet-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let systemd = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let n = Notify { sock: fds::datagram().unwrap(), path: path.as_os_str().as_encoded_bytes().to_vec() };
        let (r, w) = pipe();
        assert_eq!(store(&n, &[("udp 10.0.0.1:9000".into(), w)]).unwrap(), 1);
        let got = OwnedFd::from(systemd);
        let mut buf = [0u8; 300];
        let (len, fd) = fds::recv(&got, &mut buf).unwrap();
        assert_eq!(&buf[..len], b"FDSTORE=1\nFDNAME=udp 10.0.0.1%3A9000");
        let mut w = std::fs::File::from(fd.expect("the descriptor came with it"));
        std::io::Write::write_all(&mut w, b"x").unwrap();
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut std::fs::File::from(r), &mut one).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_survive_systemds_fdname_rules_and_the_unused_are_closed() {
        let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        let n = "udp [fd00::1]:9000";
        assert!(!escape(n).contains(':'));
        assert_eq!(unescape(&escape(n)), n);
        assert_eq!(unescape(&escape("a%3Ab")), "a%3Ab");
        assert_eq!(name(&["tap", "", "vt0"]).as_deref(), Some("tap  vt0"));
        assert!(name(&[&"x".repeat(300)]).is_none());
        let (r, _w) = pipe();
        inherited().insert("packet ns dev hdr ring 16 next 7".into(), r);
        let (rest, _) = take_prefixed("packet ns dev hdr ring ").unwrap();
        assert_eq!(rest, "16 next 7");
        let (r, _w) = pipe();
        inherited().insert("left over".into(), r);
        // The control listeners wait for the control endpoint, after the
        // first transaction: its own is taken, another (the endpoint
        // changed) closed.
        for n in ["control unix /run/vnet.sock", "control tcp 127.0.0.1:7"] {
            inherited().insert(n.into(), pipe().0);
        }
        assert_eq!(close_unused(), ["left over"]);
        assert!(take_control("control unix /run/vnet.sock").is_some());
        assert!(inherited().is_empty(), "the other control listener stayed");
    }
}
