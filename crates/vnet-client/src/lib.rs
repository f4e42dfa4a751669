//! What a client of vnetd needs, without the daemon: `vnetctl` links this
//! crate, not `vnetd` (so none of aya, vhost, tokio or etcd).
//!
//! - [`endpoint`]: where a control endpoint is (`unix:`, `tcp:`, `tls:`)
//!   and the token file a `tcp:` client presents.
//! - [`find`]: which vnetd to talk to when not told (`vnetd@NAME`'s socket).
//! - [`client`]: a blocking client of the control protocol, sending
//!   [`request`]s built from typed values.
//! - [`drops`]: drops (`show drops json`) as lines of text.
//! - [`relocate`]: `vnetctl move`, a VM's relocation between two hosts.
//! - [`keys`]: key and secret files (`vnetctl genkey`, `pubkey`).
//! - [`tls`]: a host's certificate, key and CA as rustls configurations.
//! - [`docs`]: man pages and shell completions for the package.
//! - [`sys`]: the only module with `unsafe`.

pub mod client;
pub mod docs;
pub mod drops;
pub mod endpoint;
pub mod find;
pub mod flows;
pub mod keys;
pub mod relocate;
pub mod sys;
pub mod tls;
pub mod utc;

pub use client::Client;
pub use endpoint::{Endpoint, DEFAULT_ENDPOINT};
/// Typed requests (`vnet_control::request`), for the clients that build them.
pub use vnet_control::request;
