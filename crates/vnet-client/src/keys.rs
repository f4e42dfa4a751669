//! A host's key file: its X25519 private key in base64 (as `vnetctl genkey`
//! writes it, and as WireGuard's `wg genkey` does), readable by its owner
//! only.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use vnet_control::PeerKey;
use vnet_keys::Identity;

/// Why a secret file (a key, a token, a password) or a trusted one (a CA,
/// the network's public key), or a key in it, was refused: each says the
/// file and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a regular file")]
    NotAFile { path: String },
    #[error("{path}: mode {mode:04o} lets others read {what}; `chmod 600 {path}` (or 400)")]
    OthersRead { path: String, mode: u32, what: String },
    #[error("{path}: mode {mode:04o} lets others change {what}; `chmod go-w {path}`")]
    OthersWrite { path: String, mode: u32, what: String },
    #[error("{path}: owned by uid {uid}, not by vnetd's user ({me}) or root")]
    SecretOwner { path: String, uid: u32, me: u32 },
    #[error("{path}: {what} is owned by uid {uid}, not by vnetd's user ({me}) or root; `chown root {path}`")]
    TrustedOwner { path: String, what: String, uid: u32, me: u32 },
    #[error("{path}: more than {max} bytes, too long for {what}")]
    TooLong { path: String, max: u64, what: String },
    #[error("{path}:1:1: expected a private key (44 characters of base64)")]
    NotAKey { path: String },
}

/// A key given as text that is not one, or one that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("expected a private key (44 characters of base64)")]
    NotAKey,
    #[error("cannot derive a claim key")]
    NoClaimKey,
    #[error("{0}")]
    Generate(String),
}

fn io(path: &str) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io { path: path.to_string(), source }
}

/// Reads the key pair from `path`, refusing a file others may read.
pub fn read_key_file(path: &Path) -> Result<Identity, FileError> {
    let text = read_secret(path, "the private key", 1024)?;
    parse_private(text.trim()).ok_or_else(|| FileError::NotAKey { path: path.display().to_string() })
}

/// Reads a secret file (a key, a token, a password): opened once and
/// checked on the open file, so nothing can swap it between the check and
/// the read. It must be owned by vnetd's user or root, carry no group or
/// other permission bits, and hold at most `max` bytes.
pub fn read_secret(path: &Path, what: &str, max: u64) -> Result<String, FileError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let shown = path.display().to_string();
    let f = std::fs::File::open(path).map_err(io(&shown))?;
    let meta = f.metadata().map_err(io(&shown))?;
    if !meta.is_file() {
        return Err(FileError::NotAFile { path: shown });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(FileError::OthersRead { path: shown, mode, what: what.to_string() });
    }
    let me = crate::sys::euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(FileError::SecretOwner { path: shown, uid: meta.uid(), me });
    }
    let mut text = String::new();
    f.take(max + 1).read_to_string(&mut text).map_err(io(&shown))?;
    if text.len() as u64 > max {
        return Err(FileError::TooLong { path: shown, max, what: what.to_string() });
    }
    Ok(text)
}

/// Whether the metadata of `shown` (a file or directory whose contents vnetd
/// trusts) leaves it to root and vnetd's user: owned by one of them, and
/// writable by neither its group nor others. The error says which and how
/// to fix it.
pub fn check_trusted(meta: &std::fs::Metadata, shown: &str, what: &str) -> Result<(), FileError> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(FileError::OthersWrite {
            path: shown.to_string(),
            mode: mode & 0o777,
            what: what.to_string(),
        });
    }
    let me = crate::sys::euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(FileError::TrustedOwner {
            path: shown.to_string(),
            what: what.to_string(),
            uid: meta.uid(),
            me,
        });
    }
    Ok(())
}

/// Reads a file whose contents vnetd trusts (a CA, the network's public
/// key): opened once and checked on the open file ([`check_trusted`]),
/// at most `max` bytes.
pub fn read_trusted(path: &Path, what: &str, max: u64) -> Result<Vec<u8>, FileError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let f = std::fs::File::open(path).map_err(io(&shown))?;
    let meta = f.metadata().map_err(io(&shown))?;
    if !meta.is_file() {
        return Err(FileError::NotAFile { path: shown });
    }
    check_trusted(&meta, &shown, what)?;
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes).map_err(io(&shown))?;
    if bytes.len() as u64 > max {
        return Err(FileError::TooLong { path: shown, max, what: what.to_string() });
    }
    Ok(bytes)
}

/// A private key written as `vnetctl genkey` writes it.
pub fn parse_private(s: &str) -> Option<Identity> {
    let k = PeerKey::from_base64(s)?;
    Identity::from_private(k.0).ok()
}

/// A new private key, in base64.
pub fn genkey() -> Result<String, KeyError> {
    let id = Identity::generate().map_err(|e| KeyError::Generate(e.to_string()))?;
    Ok(PeerKey(id.private()).to_string())
}

/// Writes a new secret file `path`, created with mode 0600 (never a moment
/// readable by others, never over an existing file).
pub fn write_secret(path: &Path, text: &str) -> Result<(), FileError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display().to_string();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(&shown))?;
    f.write_all(format!("{text}\n").as_bytes()).map_err(io(&shown))
}

/// The claim key (cluster mode's MAC claims) of a base64 private key.
pub fn claim_pubkey(private: &str) -> Result<String, KeyError> {
    let id = parse_private(private.trim()).ok_or(KeyError::NotAKey)?;
    vnet_keys::claim_public_base64(&id.private()).ok_or(KeyError::NoClaimKey)
}

/// The public key of a base64 private key, in base64.
pub fn pubkey(private: &str) -> Result<String, KeyError> {
    let id = parse_private(private.trim()).ok_or(KeyError::NotAKey)?;
    Ok(PeerKey(id.public()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_files_others_may_change_are_refused_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("vnetd-trusted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("net.pub");
        std::fs::write(&f, "key").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_trusted(&f, "the network's public key", 100).unwrap(), b"key");
        for m in [0o664, 0o646, 0o666] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
            let e = read_trusted(&f, "the network's public key", 100).unwrap_err().to_string();
            assert!(
                e.contains("lets others change the network's public key") && e.contains("chmod go-w"),
                "{e}"
            );
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_trusted(&f, "x", 2).unwrap_err().to_string().contains("more than 2 bytes"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_round_trip_and_loose_files_are_refused() {
        let private = genkey().unwrap();
        assert_eq!(private.len(), 44);
        let public = pubkey(&private).unwrap();
        assert_ne!(public, private);
        assert_eq!(pubkey(&format!("{private}\n")).unwrap(), public);
        assert!(pubkey("not a key").is_err());
        // A file of mode 0644 is refused, 0600 read.
        let dir = std::env::temp_dir().join(format!("vnetd-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("host.key");
        std::fs::write(&f, format!("{private}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key_file(&f).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let id = read_key_file(&f).unwrap();
        assert_eq!(PeerKey(id.public()).to_string(), public);
        std::fs::write(&f, "garbage\n").unwrap();
        // A secret written by vnetctl is 0600 from its creation and never overwrites.
        let g = dir.join("new.key");
        write_secret(&g, &private).unwrap();
        assert_eq!(std::fs::metadata(&g).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(write_secret(&g, &private).is_err());
        assert_eq!(PeerKey(read_key_file(&g).unwrap().public()).to_string(), public);
        assert_eq!(claim_pubkey(&private).unwrap().len(), 44);
        assert!(read_key_file(&f).unwrap_err().to_string().contains(":1:1: expected a private key"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
