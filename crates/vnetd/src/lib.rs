//! vnetd: the vnet host daemon, as a library (the `vnetd` binary is a thin
//! wrapper, and `vnetctl` uses the [`client`]).
//!
//! - [`daemon`]: declared state to resources, atomically.
//! - [`dataplane`]: the workers that move frames.
//! - [`control`]: the control endpoint and its line protocol.
//! - [`client`]: a blocking client of that protocol.
//! - [`sys`]: the only module with `unsafe` (ioctls, `setns`).

pub mod client;
pub mod control;
pub mod daemon;
pub mod dataplane;
pub mod kernel;
pub mod relocate;
pub mod sys;
pub mod vhost;

pub use control::Endpoint;
pub use daemon::Daemon;
