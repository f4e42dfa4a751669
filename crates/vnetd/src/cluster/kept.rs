//! The network's trust state kept on disk (`--state-dir`, file
//! `cluster-NETWORK.json`): the newest signed policy this host took and
//! every revocation it saw ([`vnet_cluster::member::Kept`]), so that a
//! restart never takes an older policy or forgets a revocation, whatever
//! the store says by then. Read at the start (a file that does not read,
//! parse or check is an error naming it: vnetd does not start, rather than
//! forget); written whole to a temporary file of mode 0600 and renamed
//! over the old one whenever the member's kept state moves.

use std::path::{Path, PathBuf};
use vnet_cluster::member::{Kept, KeptError};
use vnet_cluster::trust::NetworkPublic;

/// The largest file read: a policy (at most 64 KiB signed) and 65,536
/// revocations of each kind with room to spare.
pub const MAX_FILE: u64 = 16 << 20;

/// Why the kept state could not be read (each names the file).
#[derive(Debug, thiserror::Error)]
pub enum KeptFileError {
    #[error("{0}: {1}")]
    Read(String, #[source] std::io::Error),
    #[error("{0}: larger than {MAX_FILE} bytes; not this host's trust state")]
    TooLarge(String),
    #[error("{0}:{1}:{2}: {3} (the network's trust state kept by vnetd; restore it or delete it to start from the store's)")]
    Parse(String, usize, usize, String),
    #[error("{0}: {1}")]
    Check(String, #[source] KeptError),
}

/// The file `network`'s trust state is kept in.
pub fn path(state_dir: &Path, network: &str) -> PathBuf {
    state_dir.join(format!("cluster-{network}.json"))
}

/// Reads and checks the state kept in `file` (none yet: `None`).
pub fn load(
    file: &Path,
    network: &str,
    nk: &NetworkPublic,
    max_revoked: usize,
) -> Result<Option<Kept>, KeptFileError> {
    let name = || file.display().to_string();
    let f = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(KeptFileError::Read(name(), e)),
    };
    let mut bytes = Vec::new();
    use std::io::Read as _;
    f.take(MAX_FILE + 1).read_to_end(&mut bytes).map_err(|e| KeptFileError::Read(name(), e))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(KeptFileError::TooLarge(name()));
    }
    let kept: Kept = serde_json::from_slice(&bytes)
        .map_err(|e| KeptFileError::Parse(name(), e.line(), e.column(), e.to_string()))?;
    kept.check(network, nk, max_revoked).map_err(|e| KeptFileError::Check(name(), e))?;
    Ok(Some(kept))
}

/// Writes `kept` to `file` (a temporary file renamed over it).
pub fn save(file: &Path, kept: &Kept) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(kept).map_err(std::io::Error::other)?;
    crate::handshakes::write_replacing(file, &(text + "\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_cluster::trust::{NetworkKey, PolicyBody};

    #[test]
    fn kept_state_round_trips_and_a_bad_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("vnet-kept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let nk = NetworkKey::generate().unwrap();
        let file = path(&dir, "lab");
        assert!(load(&file, "lab", &nk.public(), 8).unwrap().is_none(), "nothing kept yet");
        let body = PolicyBody { network: "lab".into(), serial: 3, lines: "rule a allow\n".into() };
        let kept = Kept {
            network: "lab".into(),
            serial: 3,
            policy: Some(nk.sign_policy(&body).unwrap()),
            revoked_hosts: ["h3".to_string()].into(),
            revoked_certs: Default::default(),
        };
        save(&file, &kept).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o077, 0);
        assert_eq!(load(&file, "lab", &nk.public(), 8).unwrap(), Some(kept));
        let name = file.display().to_string();
        // Corrupt (a torn or edited file), another key's, too large.
        std::fs::write(&file, "{\"network\":\"lab\",").unwrap();
        let e = load(&file, "lab", &nk.public(), 8).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{name}:1:")), "{e}");
        std::fs::write(&file, "\u{0}\u{ff}").unwrap();
        assert!(load(&file, "lab", &nk.public(), 8).unwrap_err().to_string().starts_with(&name));
        let other = NetworkKey::generate().unwrap();
        let again = Kept { network: "lab".into(), ..Kept::default() };
        save(&file, &Kept { policy: Some(other.sign_policy(&body).unwrap()), serial: 3, ..again }).unwrap();
        let e = load(&file, "lab", &nk.public(), 8).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{name}: policy:")), "{e}");
        std::fs::File::create(&file).unwrap().set_len(MAX_FILE + 1).unwrap();
        assert!(matches!(load(&file, "lab", &nk.public(), 8), Err(KeptFileError::TooLarge(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
