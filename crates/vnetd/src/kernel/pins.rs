//! The hand-over: the kernel path forwarding across a vnetd restart.
//!
//! A vnetd asked to hand over (SIGUSR2: an upgrade, a restart) pins each
//! TCX link it holds (its program on an interface's or an underlay
//! device's TC ingress) in a bpffs directory ([`Pins`]) before it exits,
//! so the kernel keeps running the old program with the old maps: every
//! frame with a decision keeps being forwarded while no vnetd runs. The
//! next vnetd loads its own program and fills its own maps; for each
//! device it serves it finds the pinned link and, once its maps hold the
//! decisions (at the end of its first sync), replaces the program in that
//! link atomically (`bpf_link_update`): no moment without a program, and
//! none with an empty table. Pins nothing adopted are removed after the
//! start (the old program goes from devices no longer served). A `stop`
//! (SIGTERM) pins nothing: the links go with the process, as before.
//!
//! The pins are in `DIR/v1/` ([`LAYOUT`]): only links are kept, never maps
//! (a new binary brings its own maps and never reads the old ones), and a
//! binary whose use of the pins changes bumps the layout, ignoring and
//! removing pins of another one.

use super::{io_error, KernelError};
use aya::programs::links::{FdLink, PinnedLink};
use std::path::{Path, PathBuf};

/// The pins' layout version (the directory under the bpffs one).
pub const LAYOUT: &str = "v1";

/// A bpffs directory for one vnetd's pins.
#[derive(Debug, Clone)]
pub struct Pins {
    dir: PathBuf,
}

/// `vm-DEV` or `wire-DEV`: the pin of a program on `dev`.
pub fn name(wire: bool, dev: &str) -> String {
    format!("{}-{dev}", if wire { "wire" } else { "vm" })
}

impl Pins {
    /// The pins under `base` (a bpffs directory; checked when pinning).
    pub fn new(base: &Path) -> Pins {
        Pins { dir: base.join(LAYOUT) }
    }

    /// The previous vnetd's link pinned as `name`, taken (its pin removed:
    /// the link is this process's now, and goes with it).
    pub fn take(&self, name: &str) -> Option<FdLink> {
        let path = self.dir.join(name);
        let pinned = PinnedLink::from_pin(&path).ok()?;
        let link = pinned.unpin().ok()?;
        Some(link)
    }

    /// Pins `link` as `name`.
    pub fn pin(&self, name: &str, link: FdLink) -> Result<(), KernelError> {
        std::fs::create_dir_all(&self.dir).map_err(io_error(self.dir.display().to_string()))?;
        if !crate::sys::is_bpffs(&self.dir) {
            return Err(KernelError::NotBpffs(self.dir.clone()));
        }
        let path = self.dir.join(name);
        let _ = std::fs::remove_file(&path);
        link.pin(&path).map(drop).map_err(|source| KernelError::Pin { path, source })
    }

    /// Removes every pin left (programs nothing adopted leave their
    /// devices), and pins of other layouts; returns how many. The
    /// directories [`Pins::pin`] made go too: each empty one on the bpffs
    /// up from the pins (`/sys/fs/bpf/vnet/NAME`, then `/sys/fs/bpf/vnet`
    /// if no other vnetd's is there), never the bpffs itself (a mount
    /// point) nor a directory off it.
    pub fn clear(&self) -> usize {
        let base = self.dir.parent().unwrap_or(&self.dir);
        let mut n = 0;
        for d in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let p = d.path();
            if p.is_dir() {
                for f in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                    n += usize::from(std::fs::remove_file(f.path()).is_ok());
                }
                let _ = std::fs::remove_dir(&p);
            }
        }
        let mut dir = Some(base);
        while let Some(d) = dir.filter(|d| crate::sys::is_bpffs(d)) {
            if std::fs::remove_dir(d).is_err() {
                break; // not empty, or the mount point
            }
            dir = d.parent();
        }
        n
    }
}
