//! The in-kernel fast path: loads `bpf/vnet.bpf.c` (built by `build.rs`
//! with clang), attaches it with TC, and keeps its maps equal to the
//! routing decisions of the published [`Plane`].
//!
//! vnetd stays the control plane and the slow path. The routing semantics
//! (Palacios priorities, no reflection, split horizon) are evaluated here,
//! in user space, by the same [`vnet_core::RouteTable::lookup`] the workers
//! use: each decision with exactly one destination the kernel can reach is
//! written to the maps, one per destination where the answer does not
//! depend on the source ([`decisions`]), one per (port, destination,
//! source) where it does; everything else is absent, and the programs
//! leave those frames to the user path. So behaviour is the same with and
//! without the fast path; only the speed differs.
//!
//! Updates are atomic for readers: destination entries are replaced one by
//! one (a move writes only its own), the (port, destination, source)
//! entries go into the inactive one of two tables and one write to
//! `config.active` switches the programs over. Programs are
//! attached as TCX links owned by this process (aya detaches them on drop;
//! the kernel does when the process dies), so a stopped or killed vnetd
//! leaves nothing attached; a hand-over ([`pins`]) pins them instead, and
//! the next vnetd replaces their programs in place.
//!
//! The folder: [`attach`] loads the object, attaches the programs and
//! writes the maps; [`maps`] holds the layouts the C program shares (its
//! constants, what a link is to it); [`decisions`] compiles the route
//! table into the map's entries; [`underlay`] finds where a link's
//! datagrams leave; [`drops`] reads the programs' drop events.

mod attach;
pub mod decisions;
pub mod drops;
pub mod flows;
pub mod maps;
mod object;
pub mod pins;
pub mod underlay;

pub use attach::KernelPath;
pub use decisions::{Decisions, Served};
pub use flows::KernelFlows;
pub use maps::{MATRIX_PAIRS, MAX_ROUTES, STAT_NAMES};
pub use underlay::{route_to, Hop};

use std::net::IpAddr;

/// A local interface the kernel path serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIface {
    pub dev: String,
    pub ifindex: u32,
    /// A veth: frames for it go into its peer (`bpf_redirect_peer`);
    /// otherwise (a TAP QEMU holds) out of it (`bpf_redirect`).
    pub peer: bool,
    /// The ifindex of its hand-off TAP (what the program leaves to vnetd).
    pub handoff: u32,
}

/// Why the kernel path failed, or why it leaves something to the user
/// path. Its text is what the log and `show` say.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("vnetd was built without the eBPF object (clang was missing)")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("program {0} missing from the object")]
    NoProgram(String),
    #[error("map {0} missing")]
    NoMap(String),
    /// A program the kernel refused, or could not attach.
    #[error("{what}: {source}")]
    Program {
        what: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map that refused a read or write.
    #[error("{what}: {source}")]
    Map {
        what: String,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no route to {0} in this namespace's routes")]
    NoRoute(IpAddr),
    /// Something the kernel path leaves to the user path by design.
    #[error("{0}")]
    UserPath(&'static str),
    /// The kernel path failed to load earlier (why, as it was said then).
    #[error("{0}")]
    Unavailable(String),
    #[error("no bpffs directory for pins (--bpf-dir)")]
    NoPins,
    #[error("{} is not on a bpffs (mount one: mount -t bpf bpf {})", .0.display(), .0.parent().unwrap_or(.0).display())]
    NotBpffs(std::path::PathBuf),
    #[error("{}: {source}", path.display())]
    Pin {
        path: std::path::PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("{what}: {source}")]
    Link {
        what: String,
        #[source]
        source: aya::programs::links::LinkError,
    },
}

/// Why the kernel path cannot serve something.
pub type Reason = KernelError;

pub(crate) fn map_error(what: impl Into<String>) -> impl FnOnce(aya::maps::MapError) -> KernelError {
    let what = what.into();
    move |source| KernelError::Map { what, source }
}

pub(crate) fn program_error(
    what: impl Into<String>,
) -> impl FnOnce(aya::programs::ProgramError) -> KernelError {
    let what = what.into();
    move |source| KernelError::Program { what, source }
}

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KernelError {
    let what = what.into();
    move |source| KernelError::Io { what, source }
}

/// Whether frames for `dev` go into its peer (`bpf_redirect_peer`): a
/// veth, and only a veth; anything else (a TAP, a macvlan) has them sent
/// out of it (`bpf_redirect`). The kernel's answer in vnetd's own
/// namespace (issue 45: sysfs read under `nsenter --net` was another
/// namespace's, a TAP was taken for a veth, and every frame to its VM was
/// dropped). The positive test matters: `bpf_redirect_peer` cannot say it
/// failed (the helper only records the target; the device's lack of a
/// peer is found after the program returned, in `skb_do_redirect`, which
/// drops the frame), so a device is never sent there on a guess.
pub fn is_veth(dev: &str) -> bool {
    crate::sys::driver(dev).is_ok_and(|d| d == "veth")
}
