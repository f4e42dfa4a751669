//! vnet's cluster control plane, sans-IO (`docs/CLUSTER.md`).
//!
//! Membership and addresses live in a store (etcd in production, the
//! in-memory [`store::MemStore`] here and in the simulator), one key per
//! host under its lease and one per VM MAC ([`layout`]). Every host keeps a
//! [`member::Member`]: it takes the store's watch events in revision order,
//! or a full listing after a compaction or an outage, and says which links
//! and routes must change ([`member::Change`]); the daemon applies them as
//! one transaction of the control language's atomic kind, built as typed
//! commands ([`apply`]). Every record is checked field by field before it
//! counts; one that does not check is quarantined while the rest applies.
//! Where the network has a key, host records need its certificate and MAC
//! claims their claimant's signature ([`trust`]). Addresses for containers
//! are allocated under the same prefix, one key per address ([`ipam`]);
//! an address two claims name is no one's ([`addrs`]).
//! Nothing here does
//! I/O or keeps time: the same code runs under the daemon, the simulator of
//! a thousand hosts (`tests/scale.rs`) and the unit tests.

pub mod addrs;
pub mod apply;
pub mod ipam;
pub mod layout;
pub mod member;
pub mod store;
pub mod trust;

pub use layout::{HostRecord, MacRecord};
pub use member::{Change, Member, MemberStats, Peer, Policy, RecordError};
pub use store::{Compacted, Event, MemStore};
