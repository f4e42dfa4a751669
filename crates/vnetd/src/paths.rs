//! What vnetd may create or take over on the host, named in config: socket
//! paths (the control endpoint, vhost-user interfaces) and the devices a
//! VM's interface may attach to.
//!
//! A socket is created only where nothing is, or where a socket is that
//! nobody listens on any more (a stale one of a dead vnetd). A regular file,
//! a directory, a symlink or a socket someone serves (the control endpoint,
//! another interface, another program) is never replaced: the transaction
//! that names it fails and the path is untouched.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A group that could not be found.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("/etc/group: {0}")]
    Read(#[source] io::Error),
    #[error("no group `{0}` in /etc/group")]
    Unknown(String),
}

/// A group's id, from a number or a name in `/etc/group`.
pub fn group_id(group: &str) -> Result<u32, GroupError> {
    if let Ok(id) = group.parse() {
        return Ok(id);
    }
    let text = std::fs::read_to_string("/etc/group").map_err(GroupError::Read)?;
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            Some((f.next()?, f.nth(1)?))
        })
        .find(|(name, _)| *name == group)
        .and_then(|(_, id)| id.parse().ok())
        .ok_or_else(|| GroupError::Unknown(group.to_string()))
}

/// Makes `path` free for a new listening socket, or says why it may not be.
pub fn claim_socket_path(path: &Path) -> io::Result<()> {
    let shown = path.display();
    let m = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{shown}: {e}"))),
        Ok(m) => m,
    };
    let t = m.file_type();
    if !t.is_socket() {
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_symlink() {
            "a symbolic link"
        } else if t.is_file() {
            "a regular file"
        } else {
            "a device or pipe"
        };
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{shown} is {what}, not a socket: vnetd does not replace it"),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{shown} is a socket in use (vnetd's control endpoint, another interface, or another program)"),
        )),
        // Nobody listens: a stale socket, safe to replace.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
        Err(e) => Err(io::Error::new(e.kind(), format!("{shown}: a socket vnetd cannot tell is stale: {e}"))),
    }
}

/// Why `dev` may not be a VM's netdev (in vnetd's own namespace), if it may
/// not: the loopback device, or a device a link uses (`underlay`: the
/// devices links leave by, with the link's name).
pub fn forbidden_netdev<'a>(
    dev: &str,
    underlay: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    if dev == "lo" {
        return Some("the loopback device".into());
    }
    underlay
        .into_iter()
        .find(|(d, _)| *d == dev)
        .map(|(_, link)| format!("the device link `{link}` leaves by (the underlay)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A fresh directory of this test run (removed on drop).
    struct Dir(std::path::PathBuf);
    impl Dir {
        fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("vnetd-paths-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn only_nothing_or_a_stale_socket_is_claimed() {
        let d = Dir::new("claim");
        let free = d.0.join("free.sock");
        assert!(claim_socket_path(&free).is_ok());

        let file = d.0.join("file");
        std::fs::write(&file, b"keep me").unwrap();
        let e = claim_socket_path(&file).unwrap_err().to_string();
        assert!(e.to_string().contains("a regular file"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

        let e = claim_socket_path(&d.0).unwrap_err().to_string();
        assert!(e.to_string().contains("a directory"), "{e}");

        let link = d.0.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(claim_socket_path(&link).unwrap_err().to_string().contains("symbolic link"));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

        let live = d.0.join("live.sock");
        let l = UnixListener::bind(&live).unwrap();
        let e = claim_socket_path(&live).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(live.exists());
        drop(l);
        // The listener is gone, its file stays: stale, and claimed.
        assert!(live.exists());
        claim_socket_path(&live).unwrap();
        assert!(!live.exists());
    }

    #[test]
    fn loopback_and_underlay_devices_are_not_vm_netdevs() {
        let under = [("u0", "h1")];
        assert_eq!(forbidden_netdev("lo", under).as_deref(), Some("the loopback device"));
        assert!(forbidden_netdev("u0", under).unwrap().contains("link `h1`"));
        assert_eq!(forbidden_netdev("veth3", under), None);
    }
}
