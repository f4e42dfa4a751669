//! Where the flow log's lines go: standard output, or a file of at most
//! `max` bytes that, when the next line would pass that, is renamed to
//! PATH.1 (replacing the last one) and begun afresh.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A flow log's target (`--flow-log PATH`, or `-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Stdout,
    File(PathBuf),
}

impl std::str::FromStr for Target {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(if s == "-" { Target::Stdout } else { Target::File(PathBuf::from(s)) })
    }
}

/// Why the flow log cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: rotating to .1: {source}")]
    Rotate {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing: {0}")]
    Write(#[source] std::io::Error),
}

/// The open target.
#[derive(Debug)]
pub struct Sink {
    target: Target,
    file: Option<File>,
    size: u64,
    max: u64,
    /// Rotations done.
    pub rotations: u64,
}

/// Opens the log for appending: never through a symbolic link (one
/// planted where the log goes would have root append to any file), made
/// 0600, and an existing file kept only when it is this process's user's
/// (then made 0600: a file made beforehand by another user with other
/// rights would let it read every flow).
fn open(path: &Path) -> Result<(File, u64), SinkError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let err = |source| SinkError::Open { path: path.display().to_string(), source };
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(err)?;
    let meta = f.metadata().map_err(err)?;
    if !meta.is_file() || meta.uid() != crate::sys::process::effective_uid() {
        let what = "not a regular file of vnetd's own user (owner and rights are checked)";
        return Err(err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, what)));
    }
    if meta.mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    Ok((f, meta.len()))
}

impl Sink {
    /// Opens `target` (a file is appended to), rotating past `max` bytes.
    pub fn open(target: Target, max: u64) -> Result<Sink, SinkError> {
        let (file, size) = match &target {
            Target::Stdout => (None, 0),
            Target::File(p) => {
                let (f, size) = open(p)?;
                (Some(f), size)
            }
        };
        Ok(Sink { target, file, size, max: max.max(1), rotations: 0 })
    }

    /// Writes one whole line.
    pub fn write(&mut self, line: &[u8]) -> Result<(), SinkError> {
        let Target::File(path) = &self.target else {
            return std::io::stdout().lock().write_all(line).map_err(SinkError::Write);
        };
        if self.size > 0 && self.size + line.len() as u64 > self.max {
            let mut old = path.clone().into_os_string();
            old.push(".1");
            std::fs::rename(path, &old)
                .map_err(|source| SinkError::Rotate { path: path.display().to_string(), source })?;
            let (f, size) = open(path)?;
            (self.file, self.size) = (Some(f), size);
            self.rotations += 1;
        }
        let Some(f) = self.file.as_mut() else { return Ok(()) };
        f.write_all(line).map_err(SinkError::Write)?;
        self.size += line.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_rotates_to_dot_1_before_a_line_would_pass_its_cap() {
        let dir = std::env::temp_dir().join(format!("vnet-flowlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("flows.jsonl");
        let mut s = Sink::open(Target::File(path.clone()), 100).unwrap();
        let line = |c: u8| [vec![c; 39], vec![b'\n']].concat(); // 40 bytes
        s.write(&line(b'a')).unwrap();
        s.write(&line(b'b')).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
        s.write(&line(b'c')).unwrap(); // 120 > 100: rotated first
        assert_eq!(s.rotations, 1);
        let old = std::fs::read(dir.join("flows.jsonl.1")).unwrap();
        assert_eq!(old, [line(b'a'), line(b'b')].concat(), "whole lines, none cut");
        assert_eq!(std::fs::read(&path).unwrap(), line(b'c'));
        for c in [b'd', b'e', b'f'] {
            s.write(&line(c)).unwrap();
        }
        assert_eq!(s.rotations, 2, "one .1 kept: the older one replaced");
        assert_eq!(std::fs::read(dir.join("flows.jsonl.1")).unwrap(), [line(b'c'), line(b'd')].concat());
        assert_eq!(std::fs::read(&path).unwrap(), [line(b'e'), line(b'f')].concat());
        // A line longer than the cap goes alone into a fresh file.
        s.write(&[b'x'; 150]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 150);
        // Reopened: appends, counting what is there.
        let mut again = Sink::open(Target::File(path.clone()), 1000).unwrap();
        again.write(&line(b'g')).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 190);
        assert!(Sink::open(Target::File(dir.join("no/such/dir/f")), 10).is_err());
        assert_eq!("-".parse::<Target>().unwrap(), Target::Stdout);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A symbolic link planted where the log goes (a local user's, in a
    /// directory they can write) is not followed; a file made beforehand
    /// readable by others is made 0600. The control: a plain path opens.
    #[test]
    fn a_planted_link_is_not_followed_and_a_readable_file_is_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("vnet-flowlog-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious\n").unwrap();
        let planted = dir.join("flows.jsonl");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert!(Sink::open(Target::File(planted.clone()), 100).is_err(), "a link followed");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
        let made = dir.join("made-before.jsonl");
        std::fs::write(&made, b"").unwrap();
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut s = Sink::open(Target::File(made.clone()), 100).unwrap();
        s.write(b"x\n").unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
