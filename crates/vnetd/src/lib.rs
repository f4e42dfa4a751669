//! vnetd: the vnet host daemon, as a library (the `vnetd` binary is a thin
//! wrapper, and `vnetctl` uses the [`client`]). Routing and encapsulation
//! are the sans-IO `vnet_engine`; this crate is the I/O around it.
//!
//! - [`daemon`]: declared state to resources, atomically.
//! - [`workers`]: the worker threads and their one poll/yield loop.
//! - [`dataplane`]: the sources workers read into the engine.
//! - [`shared`]: the plane, counters and clock every thread shares.
//! - [`drops`]: both paths' drops gathered for `show drops` and `monitor`.
//! - [`flowlog`]: flow logs (`--flow-log`), both paths' flows as JSON lines.
//! - [`iface`]: interface kinds (`tap`, `netdev`, `vhost`), each a port.
//! - [`link`]: link transports (`udp`) and the host's link sockets.
//! - [`kernel`]: the eBPF fast path.
//! - [`paths`]: which socket paths and devices config may claim.
//! - [`settings`]: how vnetd runs (one struct, its flags), given to [`Daemon::new`].
//! - [`cluster`]: cluster mode, the etcd watch that programs this host;
//!   [`membership`]: what it reports; [`ipam`]: addresses it allocates.
//!   [`kube_pods`]: the API's pods its claims are bound to (`--kube`).
//! - [`handshakes`]: secured links' handshake timestamps, kept across restarts.
//! - [`control`]: the control endpoint and its line protocol.
//! - [`client`], [`relocate`], [`keys`], [`docs`]: re-exported from
//!   `vnet_client` (the control client, `move`, key files, man pages).
//! - [`sys`]: the only module with `unsafe` (ioctls, `setns`, sockets).

pub mod cluster;
pub mod control;
pub mod daemon;
pub mod dataplane;
pub mod drops;
pub mod flowlog;
pub mod handover;
pub mod handshakes;
pub mod iface;
pub mod ipam;
pub mod kernel;
pub mod kube;
pub mod kube_pods;
pub mod link;
pub mod listing;
pub mod membership;
pub mod netpol;
pub mod paths;
pub mod settings;
pub mod shared;
pub mod sys;
pub mod web;
pub mod workers;

pub use control::Endpoint;
pub use daemon::Daemon;
pub use settings::Settings;
/// The client side, in its own crate (`vnetctl` links it without the daemon).
pub use vnet_client::{client, docs, keys, relocate};
