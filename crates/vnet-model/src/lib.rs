//! What a vnet route names, below both the control language (vnet-control,
//! which declares routes) and the routing core (vnet-core, which looks them
//! up): which MACs a route matches and the Palacios priority of a match
//! ([`spec`]), and the ports a frame enters and leaves by ([`port`]). Kept
//! apart so a crate that only speaks the control language (vnet-client,
//! vnet-cni, the libvirt hook) links no part of the data path.

pub mod port;
pub mod spec;

pub use port::{Port, SourceFilter};
pub use spec::{priority, Class, MacSpec};
