//! `show flows [N] [since SEQ] [json]`: the last flow records vnetd's flow
//! log wrote (`vnetd --flow-log`), or those numbered SEQ on (what `vnetctl
//! monitor flows` polls for).

pub use crate::recent::{DEFAULT_LAST, MAX_LAST};

/// What `show flows` asks for ([`crate::recent`]).
pub type FlowsQuery = crate::recent::RecentQuery;
