//! The newest handshake initiation timestamp accepted from each peer key,
//! kept in the state directory (`--state-dir`, file `handshakes`) so that
//! a restart does not forget it: an initiation captured before the restart
//! and replayed after it is then refused as the replay it is (see
//! `vnet_engine::secure`). WireGuard keeps this in memory only; vnetd's
//! restarts are routine (upgrades, `systemctl restart`), so it is kept.
//!
//! The file is one `KEY TIMESTAMP` line per peer (the key in base64),
//! written whole to a temporary file of mode 0600 and renamed over the old
//! one, only when a timestamp moved: at most once a second, and at once
//! before a transaction makes links anew, at a stop and at a hand-over
//! (so the last initiation before any of them is refused after it;
//! `vnet_engine::secure` also refuses a timestamp far ahead of the clock,
//! which would otherwise be kept). A line that
//! does not parse is skipped with a warning naming file and line; at most
//! [`MAX_PEERS`] are kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vnet_control::PeerKey;
use vnet_engine::secure::SecureLink;

/// Peers remembered at most (the newest timestamps win).
pub const MAX_PEERS: usize = 65_536;

/// The timestamps, and where they are kept.
#[derive(Debug, Default)]
pub struct Stamps {
    file: Option<PathBuf>,
    seen: BTreeMap<[u8; 32], u64>,
    /// Whether `seen` moved since the file was written.
    dirty: bool,
    /// The last write error, logged once.
    failed: Option<String>,
}

impl Stamps {
    /// The timestamps kept in `dir` (made 0700 if missing). Errors are
    /// for the log: vnetd runs on without persistence then.
    pub fn open(dir: &Path) -> (Stamps, Option<String>) {
        let file = dir.join("handshakes");
        let mut s = Stamps { file: Some(file.clone()), ..Stamps::default() };
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).create(dir) {
            s.file = None;
            return (
                s,
                Some(format!("{}: {e}; handshake timestamps are not kept across restarts", dir.display())),
            );
        }
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (s, None),
            Err(e) => return (s, Some(format!("{}: {e}", file.display()))),
        };
        let mut warn = None;
        for (n, line) in text.lines().enumerate() {
            let parsed =
                line.split_once(' ').and_then(|(k, t)| Some((PeerKey::from_base64(k)?, t.parse().ok()?)));
            match parsed {
                Some((k, t)) if s.seen.len() < MAX_PEERS || s.seen.contains_key(&k.0) => {
                    let e = s.seen.entry(k.0).or_insert(0);
                    *e = (*e).max(t);
                }
                Some(_) => {}
                None => {
                    warn.get_or_insert_with(|| {
                        format!("{}:{}:1: expected `KEY TIMESTAMP`; line skipped", file.display(), n + 1)
                    });
                }
            }
        }
        (s, warn)
    }

    /// Gives a new secured link the last timestamp its peer's key had.
    pub fn restore(&self, link: &SecureLink) {
        if let Some(t) = self.seen.get(&link.peer()) {
            link.set_last_init(*t);
        }
    }

    /// Takes the timestamps of `links`.
    pub fn note<'a>(&mut self, links: impl Iterator<Item = &'a SecureLink>) {
        for l in links {
            let t = l.last_init();
            if t == 0 {
                continue;
            }
            let full = self.seen.len() >= MAX_PEERS;
            match self.seen.get_mut(&l.peer()) {
                Some(old) if *old < t => {
                    *old = t;
                    self.dirty = true;
                }
                Some(_) => {}
                None if !full => {
                    self.seen.insert(l.peer(), t);
                    self.dirty = true;
                }
                None => {}
            }
        }
    }

    /// Writes the file when a timestamp moved. Returns an error the first
    /// time a write fails (then quiet until one succeeds).
    pub fn flush(&mut self) -> Option<String> {
        let file = self.file.as_ref()?;
        if !self.dirty {
            return None;
        }
        let mut text = String::with_capacity(self.seen.len() * 64);
        for (k, t) in &self.seen {
            text.push_str(&format!("{} {t}\n", PeerKey(*k)));
        }
        match write_replacing(file, &text) {
            Ok(()) => {
                self.dirty = false;
                self.failed = None;
                None
            }
            Err(e) => {
                let e = format!("{}: {e}; handshake timestamps are not kept", file.display());
                (self.failed.replace(e.clone()) != Some(e.clone())).then_some(e)
            }
        }
    }
}

/// Writes `text` to a new file of mode 0600 beside `file` and renames it over `file`.
pub(crate) fn write_replacing(file: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = file.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vnet_engine::secure::{Identity, Mode, Timers};

    #[test]
    fn timestamps_survive_a_reopen_and_bad_lines_are_skipped() {
        let dir = std::env::temp_dir().join(format!("vnet-stamps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let id = Arc::new(Identity::generate().unwrap());
        let peer = Identity::generate().unwrap().public();
        let link = SecureLink::new(Mode::Encrypt, id.clone(), peer, Timers::default());
        link.set_last_init(42);
        let (mut s, warn) = Stamps::open(&dir);
        assert_eq!(warn, None);
        s.note([&link].into_iter());
        assert_eq!(s.flush(), None);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("handshakes")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0);
        // Nothing moved: nothing written.
        s.note([&link].into_iter());
        assert!(!s.dirty);
        let mut text = std::fs::read_to_string(dir.join("handshakes")).unwrap();
        text.push_str("junk line\n");
        std::fs::write(dir.join("handshakes"), text).unwrap();
        let (s, warn) = Stamps::open(&dir);
        assert!(warn.unwrap().ends_with("handshakes:2:1: expected `KEY TIMESTAMP`; line skipped"));
        let fresh = SecureLink::new(Mode::Encrypt, id, peer, Timers::default());
        s.restore(&fresh);
        assert_eq!(fresh.last_init(), 42);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
