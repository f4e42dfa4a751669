//! The config file: `save` writes the running configuration over it,
//! `reload` (and `SIGHUP`) applies its difference, and renews the TLS
//! identities whose files changed.

use super::Daemon;
use crate::link;
use std::sync::Arc;
use vnet_control::{Error, State};

/// Why `save` or `reload` failed (the reply's text).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("vnetd was started without --config: there is no file to save to or reload")]
    NoConfig,
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse or apply (positioned in it).
    #[error("{0}")]
    Config(#[source] Box<Error>),
    /// Renewed TLS files were refused.
    #[error("{0}")]
    Tls(String),
    /// The running state's difference from the file (a bug if ever seen).
    #[error("{path}: the difference {what} ({error}):\n{diff}")]
    Difference {
        path: String,
        what: &'static str,
        #[source]
        error: Box<Error>,
        diff: String,
    },
}

impl FileError {
    fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io { path: path.display().to_string(), source }
    }
}

impl Daemon {
    /// The control endpoint's TLS identity, for `reload` to renew.
    pub fn set_control_tls(&mut self, tls: Arc<link::tcp::Tls>, files: vnet_control::TlsFiles) {
        self.control_tls = Some((tls, files));
    }

    /// Renews the TLS identities whose files' contents changed (the links',
    /// when the `tls` line stays `next`; the control endpoint's): new
    /// handshakes use them, established connections keep theirs. Says what
    /// was renewed; the first refusal (an expired certificate, say) is the
    /// error, and that identity stays as it was.
    fn renew_tls(&self, next: Option<&vnet_control::TlsFiles>) -> Result<String, FileError> {
        let mut said = String::new();
        let links = match (&self.sockets.bound.tls, &self.state.tls) {
            (Some(t), Some(files)) if Some(files) == next => Some((t, files, "the links'")),
            _ => None,
        };
        let control = self.control_tls.as_ref().map(|(t, files)| (t, files, "the control endpoint's"));
        for (tls, files, whose) in links.into_iter().chain(control) {
            match tls.renew(files) {
                Ok(true) => {
                    tracing::info!(cert = %files.cert, "reload: {whose} TLS certificate renewed");
                    said.push_str(&format!("{whose} TLS certificate renewed from {}\n", files.cert));
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!("reload: {whose} TLS files refused: {e}");
                    return Err(FileError::Tls(format!("{whose} TLS files were refused ({e}); the running certificate stays and nothing changed")));
                }
            }
        }
        Ok(said)
    }

    /// Links cluster mode made (named after live hosts): not the config
    /// file's to save or to delete.
    fn cluster_links(&self) -> std::collections::BTreeSet<String> {
        match &self.cluster.status {
            Some(c) => c.lock().unwrap_or_else(|p| p.into_inner()).links.clone(),
            None => Default::default(),
        }
    }

    fn config_file(&self) -> Result<&std::path::Path, FileError> {
        self.config_path.as_deref().ok_or(FileError::NoConfig)
    }

    /// `save`: writes the running configuration (without what cluster
    /// mode derived) over the config file, atomically: a file beside it,
    /// synced, renamed over it, keeping its permissions (0600 for a new one).
    pub fn save(&self) -> Result<String, FileError> {
        let path = self.config_file()?;
        let cluster = self.cluster_links();
        let text = format!(
            "# written by vnetd (`save`) at {} s since the epoch\n{}",
            crate::membership::now_ms() / 1000,
            self.state.to_config_without(&|n| cluster.contains(n))
        );
        write_atomically(path, text.as_bytes()).map_err(FileError::io(path))?;
        Ok(format!("saved {} lines to {}\n", text.lines().count() - 1, path.display()))
    }

    /// `reload` (and `SIGHUP`): reads the config file and applies its
    /// difference from the running state as one transaction; objects the
    /// file declares as they are keep running untouched. A file that does
    /// not parse or apply changes nothing; the error names its line.
    pub fn reload(&mut self) -> Result<String, FileError> {
        let path = self.config_file()?.to_path_buf();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(FileError::io(&path))?;
        let target = vnet_control::parse(&text)
            .and_then(|cmds| State::default().apply_all(&cmds))
            .map_err(|e| FileError::Config(Box::new(e.in_file(shown.clone()))))?;
        let renewed = self.renew_tls(target.tls.as_ref())?;
        let cluster = self.cluster_links();
        let t = self.state.diff(&target, &|n| cluster.contains(n));
        if t.is_empty() {
            return Ok(format!("{renewed}reloaded {shown}: nothing differs\n"));
        }
        let refused = |what, error| FileError::Difference {
            path: shown.clone(),
            what,
            error: Box::new(error),
            diff: t.clone(),
        };
        let cmds = vnet_control::parse(&t).map_err(|e| refused("does not parse", e))?;
        self.apply(&cmds).map_err(|e| refused("was refused", e))?;
        Ok(format!("{renewed}reloaded {shown}: {} lines applied as one transaction\n", t.lines().count()))
    }
}

/// Replaces `path` with `data` so that a crash leaves the old file or the
/// new one, never a part: a temporary file beside it (same permissions as
/// the old file, else 0600), synced, renamed over it, the directory synced.
pub(super) fn write_atomically(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::other("not a file path"))?;
    let tmp = dir.join(format!(".{}.vnetd-{}", name.to_string_lossy(), std::process::id()));
    let mode = std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
