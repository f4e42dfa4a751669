//! The vnet routing core: which ports receive a frame.
//!
//! This is VNET/P's `vnet_core.c` decision, kept to the letter and made fast.
//! A route is `src-spec dst-spec -> port`, optionally limited to frames that
//! arrived from one port. For a frame every route is classed by how its two
//! MAC specs match ([`spec`]), the class pair gives a priority from the
//! Palacios table, and every route tied at the highest priority receives
//! the frame. That is how broadcast fans out and how a specific route beats
//! a default one.
//!
//! Two things are added to the paper's linear scan:
//! - [`table::RouteTable`] indexes routes by the addresses they name, so a
//!   miss examines only routes that could match (a handful, not 100k).
//! - [`cache::RouteCache`], one per data-path worker, remembers decisions by
//!   `(ingress, src, dst)` in a fixed array. A new table carries a new
//!   generation number; a cache that sees it drops its entries in O(1). A
//!   route change therefore never takes a lock the data path waits on: the
//!   control plane builds a new table and publishes it, the workers pick it
//!   up at their next frame.
//!
//! Two rules protect the overlay from itself and are applied after the
//! priority decision: a frame never goes back out the port it came in on,
//! and a frame that came from a link is not sent on to other links (split
//! horizon: in a full mesh every host already got a group frame from the
//! sender, and forwarding it would loop; a unicast frame from one peer must
//! not leave on another host's link as if it were this host's own). A
//! unicast route that names the ingress link in its `from` opts in to
//! transit (a relay). A link that is an edge of the overlay (a physical
//! LAN reached directly, `RouteTable::with_edge_links`) is exempt, as an
//! interface is.
//!
//! The crate is sans-IO and `#![deny(unsafe_code)]`: frames and time come in,
//! decisions go out.

pub mod cache;
pub mod drop;
pub mod policy;
pub use vnet_model::spec;
pub mod stats;
pub mod table;

pub use cache::RouteCache;
pub use drop::DropReason;
pub use spec::{priority, Class, MacSpec};
pub use stats::Counters;
pub use table::{AnySource, Decision, Port, Route, RouteTable, SourceFilter};
