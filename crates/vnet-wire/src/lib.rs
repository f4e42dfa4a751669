//! Typed, zero-copy views of what vnet puts on and takes off the wire.
//!
//! Every view follows one pattern (after smoltcp's `wire` module): a
//! `Packet<T: AsRef<[u8]>>` wraps the bytes, field offsets live in a private
//! `field` module, `new_checked()` validates lengths once, and after that no
//! accessor can panic. A separate `Repr` struct is the parsed, owned form with
//! `parse()` and `emit()`. Unknown values are data, not errors.
//!
//! The crate is sans-IO: it never touches a socket or a clock. Time is passed
//! in by the caller (see [`reasm::Reassembler`]), so reassembly can be tested
//! and fuzzed deterministically.
//!
//! Modules:
//! - [`mac`]: MAC addresses.
//! - [`ethernet`]: Ethernet II frames (the unit vnet routes).
//! - [`vnet`]: the `vnet` link format header (see `docs/wire.md`).
//! - [`frag`]: splitting a frame into underlay-sized `vnet` datagrams.
//! - [`reasm`]: bounded-memory reassembly of `vnet` fragments.
//! - [`virtio`]: the `virtio_net_hdr` offload metadata.
//! - [`offload`]: completing checksums and segmenting TCP in software.
//! - [`vxlan`]: the VXLAN header (RFC 7348), as Linux and Open vSwitch speak it.
//! - [`ip`]: what the data path reads of IPv4/IPv6/TCP/UDP (the flow key).
//! - [`arp`]: ARP and RARP bodies, and the RARP announcement of a moved VM.
//! - [`neigh`]: ARP requests and neighbour solicitations answered in place.
//! - [`classify`]: what a policy rule can see of a frame, or why not.

pub mod arp;
pub mod classify;
pub mod ethernet;
pub mod frag;
pub mod gro;
pub mod guard;
pub mod ip;
pub mod mac;
pub mod neigh;
pub mod offload;
pub mod reasm;
pub mod virtio;
pub mod vnet;
pub mod vxlan;

pub use ethernet::EthernetFrame;
pub use mac::MacAddr;

/// Errors from the wire views. Decoders return these; they never panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the header or the length it declares.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    /// A version we do not speak.
    #[error("unsupported version {0}")]
    Version(u8),
    /// A field holds a value the format forbids.
    #[error("malformed field `{0}`")]
    Malformed(&'static str),
}

pub type Result<T> = core::result::Result<T, Error>;
