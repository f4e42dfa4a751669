//! vnet's forwarding engine: everything the data path decides, nothing it
//! does to a device. Frames and datagrams come in as bytes with the time
//! passed in; they leave through [`Port`]s, a small trait that TAPs,
//! netdevs, vhost-user rings, link sockets and the simulator's recording
//! ports all implement. The engine knows none of them, so it can be unit
//! tested, fuzzed and run as many hosts in one process ([`sim`], and
//! `tests/netsim.rs`).
//!
//! Written by hand rather than taken from a library because it is the
//! product: Palacios routing semantics over offload-carrying frames, and
//! vnet's link formats, with no allocation and no lock per frame.
//!
//! Its modules in layers, each using only those before it (no import
//! cycle; `scripts/shape.py` checks):
//!
//! - [`secure`]: authenticated and encrypted links (Noise IK sessions,
//!   AEAD per datagram, replay window, rekeying); [`dispatch`] (the
//!   adaptive notify/poll decision, VNET/P's modes), [`flow`] (the inner
//!   flow hash), [`matrix`], [`pmtu`].
//! - [`port`]: the port trait and the payload it is given; the datagram
//!   sender trait. [`drops`]: every drop's reason, counted, and the last
//!   drops of each worker. [`global`]: the daemon-wide counters.
//! - [`codec`]: one module per link kind, each with its encapsulation and
//!   its facts (overhead, offloads, keepalives), sending through a small
//!   context the link builds; [`relay`]: wrapping for a relay.
//! - [`link::Link`]: a link; it dispatches to its kind's codec with an
//!   exhaustive `match`, so a new kind is a variant and a module.
//! - [`policy`]: the policy set built from the state's `rule` lines.
//! - [`plane`]: the immutable snapshot a worker reads (route table, ports,
//!   links).
//! - [`forward`]: the per-worker [`Forwarder`]: route, then deliver to
//!   offload-capable ports from the untouched frame and to plain ports from
//!   a frame finished once in software.
//! - [`rx`]: datagrams from links to frames (attribution, checks,
//!   opening, reassembly), one direction through its files.
//! - [`trace`]: `vnetctl trace`'s dry run: a frame through the decisions
//!   [`forward`] makes (the same functions), each recorded, nothing sent.
//! - [`sim`]: many hosts in one process on a virtual clock and a faulty wire.
//!
//! Dependencies run one way: `vnet-wire` (views) and `vnet-core` (routing)
//! below, `vnetd` (devices, sockets, threads) above.

pub mod codec;
pub mod dispatch;
pub mod drops;
pub mod flow;
pub mod forward;
pub mod global;
pub mod link;
pub mod matrix;
pub mod plane;
pub mod pmtu;
pub mod policy;
pub mod port;
pub mod relay;
pub mod rx;
pub mod secure;
pub mod sim;
pub mod trace;

pub use dispatch::{DispatchStats, Dispatcher, CONTENDED};
pub use forward::Forwarder;
pub use global::Global;
pub use link::Link;
pub use plane::{Iface, Plane};
pub use port::{DatagramTx, Payload, Port};
pub use rx::{Receiver, Via};
pub use secure::{Identity, SecureLink};

/// Largest frame read from an interface or received from a link.
pub const MAX_FRAME: usize = vnet_wire::vnet::MAX_FRAME_LEN as usize;
/// A frame buffer: a `virtio_net_hdr` and a largest frame, with slack.
pub const BUF: usize = vnet_wire::virtio::LEN + MAX_FRAME + 256;
// vnetd reads a header and a largest frame into one (every queue and worker
// holds one): room for both, and no more than a page beyond.
const _: () =
    assert!(BUF >= vnet_wire::virtio::LEN + MAX_FRAME && BUF <= vnet_wire::virtio::LEN + MAX_FRAME + 4096);
/// Most datagrams in one GSO send, and most payload bytes in one send.
pub const GSO_MAX_SEGS: usize = 64;
pub const GSO_MAX_BYTES: usize = 65_000;
/// Most datagrams one frame becomes (a 64 KB frame at the smallest MTU).
pub const MAX_SEGS: usize = 160;
