//! `show drops [N] [since SEQ] [json]`: the last drops vnetd recorded,
//! with their reasons (`vnetctl show drops`), or those numbered SEQ on
//! (what `vnetctl monitor drops` polls for).

pub use crate::recent::{DEFAULT_LAST, MAX_LAST};

/// What `show drops` asks for ([`crate::recent`]).
pub type DropsQuery = crate::recent::RecentQuery;
