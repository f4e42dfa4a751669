//! Which vnetd a client talks to when it is not told (`vnetctl` without
//! `--control`).
//!
//! The package runs one vnetd per network, `vnetd@NAME`, whose control
//! socket is `/run/vnet/NAME.sock` (`packaging/vnetd@.service`); a vnetd
//! started by hand without `--control` listens on [`DEFAULT_ENDPOINT`]'s
//! path. So: given a name, its unit's socket; otherwise every control
//! socket in `/run/vnet` and the default path. One: that one. Several: the
//! ones that answer (a socket left by a vnetd that was killed answers
//! nobody); still several, the error lists them with the `-n NAME` that
//! picks each. None: the error says how to start one.
//!
//! [`DEFAULT_ENDPOINT`]: crate::endpoint::DEFAULT_ENDPOINT

use crate::endpoint::Endpoint;
use std::path::{Path, PathBuf};

/// Where the packaged unit puts its instances' control sockets.
pub const UNIT_SOCKET_DIR: &str = "/run/vnet";
/// The control socket of a vnetd started without `--control`.
pub const DEFAULT_SOCKET: &str = "/run/vnetd.sock";

/// The control socket of `vnetd@NAME` in `dir`.
pub fn unit_socket(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

/// A vnetd found: its endpoint, and the unit instance it is, if one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: Option<String>,
    pub path: PathBuf,
}

impl Found {
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.path.clone())
    }
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(n) => write!(f, "vnetd@{n} (-n {n})"),
            None => {
                write!(f, "a vnetd at unix:{} (--control unix:{})", self.path.display(), self.path.display())
            }
        }
    }
}

fn listed(found: &[Found]) -> String {
    found.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// No vnetd, or no one vnetd, to talk to.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error(
        "no vnetd runs here (no control socket in {dir}/, where vnetd@NAME puts it, nor {default}): \
         start one with `systemctl enable --now vnetd@NAME` (vnetctl join does), or say where it \
         listens with --control unix:PATH"
    )]
    None { dir: String, default: String },
    #[error("{} vnetds run here: {}; say which with -n NAME", .0.len(), listed(.0))]
    Several(Vec<Found>),
    #[error(
        "no vnetd@{name} runs here ({path} is not there){}: start it with `systemctl enable --now vnetd@{name}`",
        running(.others)
    )]
    NoSuch { name: String, path: String, others: Vec<Found> },
    #[error("-n `{0}`: a network's name, 1 to 63 of A-Za-z0-9._-")]
    BadName(String),
    #[error("{dir}: {source}: the control sockets are root's; run vnetctl as root, or give --control")]
    Unreadable {
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

fn running(others: &[Found]) -> String {
    if others.is_empty() {
        String::new()
    } else {
        format!("; running: {}", listed(others))
    }
}

/// The vnetd to talk to: `name`'s unit socket in `dir`, or the one vnetd
/// whose socket is in `dir` or at `default`.
pub fn find(dir: &Path, default: &Path, name: Option<&str>) -> Result<Found, FindError> {
    if let Some(n) = name {
        if !vnet_keys::valid_name(n) {
            return Err(FindError::BadName(n.into()));
        }
        let path = unit_socket(dir, n);
        if is_socket(&path) {
            return Ok(Found { name: Some(n.into()), path });
        }
        let others = candidates(dir, default).unwrap_or_default();
        return Err(FindError::NoSuch { name: n.into(), path: path.display().to_string(), others });
    }
    let all = candidates(dir, default)?;
    let live = |all: Vec<Found>| -> Vec<Found> {
        all.into_iter().filter(|f| std::os::unix::net::UnixStream::connect(&f.path).is_ok()).collect()
    };
    let mut found = match all.len() {
        0 => {
            return Err(FindError::None {
                dir: dir.display().to_string(),
                default: default.display().to_string(),
            })
        }
        1 => all,
        _ => live(all),
    };
    match found.len() {
        // Several sockets and none answers: the first one's error says so.
        0 => candidates(dir, default)?.into_iter().next().ok_or(FindError::None {
            dir: dir.display().to_string(),
            default: default.display().to_string(),
        }),
        1 => Ok(found.remove(0)),
        _ => Err(FindError::Several(found)),
    }
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// The control sockets in `dir` (by name) and `default`, if a socket.
fn candidates(dir: &Path, default: &Path) -> Result<Vec<Found>, FindError> {
    let mut out = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries.flatten() {
                let path = e.path();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".sock"))
                    .filter(|n| vnet_keys::valid_name(n))
                    .map(String::from);
                if let Some(name) = name.filter(|_| is_socket(&path)) {
                    out.push(Found { name: Some(name), path });
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(FindError::Unreadable { dir: dir.display().to_string(), source }),
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if is_socket(default) {
        out.push(Found { name: None, path: default.to_path_buf() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("vnet-find-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("run")).unwrap();
        Dir(d)
    }

    #[test]
    fn one_unit_socket_is_found_without_a_name() {
        let d = dir("one");
        let (run, default) = (d.0.join("run"), d.0.join("vnetd.sock"));
        let none = find(&run, &default, None).unwrap_err().to_string();
        assert!(none.contains("systemctl enable --now vnetd@NAME") && none.contains("--control"), "{none}");
        let _l = UnixListener::bind(run.join("lab.sock")).unwrap();
        // Not a socket, not a name: no vnetd.
        std::fs::write(run.join("lab.log"), "").unwrap();
        std::fs::write(run.join("x.sock"), "").unwrap();
        let f = find(&run, &default, None).unwrap();
        assert_eq!((f.name.as_deref(), f.path.clone()), (Some("lab"), run.join("lab.sock")));
        assert_eq!(f.endpoint(), Endpoint::Unix(run.join("lab.sock")));
        assert_eq!(find(&run, &default, Some("lab")).unwrap(), f);
    }

    #[test]
    fn several_are_listed_and_a_name_picks_one() {
        let d = dir("several");
        let (run, default) = (d.0.join("run"), d.0.join("vnetd.sock"));
        let _a = UnixListener::bind(run.join("lab.sock")).unwrap();
        let _b = UnixListener::bind(run.join("prod.sock")).unwrap();
        let _c = UnixListener::bind(&default).unwrap();
        let e = find(&run, &default, None).unwrap_err().to_string();
        for want in ["3 vnetds", "vnetd@lab (-n lab)", "vnetd@prod (-n prod)", "--control unix:", "-n NAME"] {
            assert!(e.contains(want), "{want}: {e}");
        }
        assert_eq!(find(&run, &default, Some("prod")).unwrap().path, run.join("prod.sock"));
        let e = find(&run, &default, Some("test")).unwrap_err().to_string();
        assert!(e.contains("no vnetd@test") && e.contains("systemctl enable --now vnetd@test"), "{e}");
        assert!(e.contains("running: vnetd@lab (-n lab), vnetd@prod"), "{e}");
        assert!(matches!(find(&run, &default, Some("../x")), Err(FindError::BadName(_))));
    }

    #[test]
    fn a_socket_nobody_listens_on_is_passed_over_among_several() {
        let d = dir("stale");
        let (run, default) = (d.0.join("run"), d.0.join("vnetd.sock"));
        let _a = UnixListener::bind(run.join("lab.sock")).unwrap();
        drop(UnixListener::bind(run.join("old.sock")).unwrap());
        assert_eq!(find(&run, &default, None).unwrap().name.as_deref(), Some("lab"));
        // Only the default path: a vnetd started by hand.
        let d2 = dir("default");
        let _c = UnixListener::bind(d2.0.join("vnetd.sock")).unwrap();
        let f = find(&d2.0.join("none"), &d2.0.join("vnetd.sock"), None).unwrap();
        assert_eq!((f.name, f.path), (None, d2.0.join("vnetd.sock")));
    }
}
