//! What `ADD` made, one file per attachment, so that `DEL` removes
//! exactly that, `CHECK` can compare, and `GC` finds attachments whose
//! container is gone: `STATE_DIR/NETWORK/CONTAINER_ID-IFNAME.json`,
//! written before anything is made (a crash mid-`ADD` leaves a record
//! that `DEL` or `GC` clean up) and replaced atomically.

use crate::spec::{Code, Error, Outcome, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    /// The interface's name in vnetd (and the veth's host end).
    pub name: String,
    /// The vhost-user socket, for a vhost-user attachment.
    #[serde(default)]
    pub socket: Option<String>,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub result: Option<Outcome>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::with(Code::Io, what, e)
}

pub fn dir(state_dir: &str, network: &str) -> PathBuf {
    Path::new(state_dir).join(network)
}

fn path(state_dir: &str, network: &str, id: &str, ifname: &str) -> PathBuf {
    dir(state_dir, network).join(format!("{id}-{ifname}.json"))
}

pub fn load(state_dir: &str, network: &str, id: &str, ifname: &str) -> Result<Option<Record>> {
    let p = path(state_dir, network, id, ifname);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::with(Code::Decode, format!("{} is not a record", p.display()), e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(format!("reading {}", p.display()))(e)),
    }
}

pub fn store(state_dir: &str, network: &str, r: &Record) -> Result<()> {
    let d = dir(state_dir, network);
    std::fs::create_dir_all(&d).map_err(io(format!("making {}", d.display())))?;
    let p = path(state_dir, network, &r.container_id, &r.ifname);
    let tmp = p.with_extension("tmp");
    let body = serde_json::to_vec_pretty(r).map_err(|e| Error::with(Code::Io, "encoding a record", e))?;
    std::fs::write(&tmp, body).map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &p).map_err(io(format!("renaming {}", p.display())))
}

pub fn remove(state_dir: &str, network: &str, id: &str, ifname: &str) -> Result<()> {
    let p = path(state_dir, network, id, ifname);
    match std::fs::remove_file(&p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(format!("removing {}", p.display()))(e)),
        _ => Ok(()),
    }
}

/// Every record of `network`; unreadable files are skipped.
pub fn all(state_dir: &str, network: &str) -> Vec<Record> {
    let Ok(rd) = std::fs::read_dir(dir(state_dir, network)) else { return Vec::new() };
    rd.filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect()
}
