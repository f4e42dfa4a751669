//! What cluster mode gives the daemon, as one resource: its report, the
//! settings fixed at the start, the group authority of this host's
//! certificate, the other hosts' claimed addresses and groups, the
//! network's signed policy, and the tables built from them with the
//! state's own lines (built again only when an input changed).

use crate::membership;
use std::sync::Arc;
use vnet_core::policy::PolicySet;
use vnet_engine::policy::Members;

/// What the IP source guard is built from, of each interface: its id,
/// MAC, network and `addresses`.
pub(super) type GuardInputs = Vec<(u32, Option<vnet_wire::MacAddr>, u32, Vec<std::net::IpAddr>)>;

/// The policy set last built and what it was built from: the declarations
/// (the state's and the cluster's signed policy, merged), the generation
/// of the cluster's groups, the interfaces' groups (`group G`), and the
/// generation of the NetworkPolicies' isolation.
pub(super) type PolicyBuilt = (vnet_control::policy::Policies, u64, Members, u64, Arc<PolicySet>);

/// `--kube-network-policy`: the isolation in force (its network), a count
/// of its changes, and the watch's and translation's state.
#[derive(Debug, Default)]
pub(super) struct Isolating {
    pub(super) current: Option<(u32, Arc<vnet_core::policy::Isolation>)>,
    pub(super) generation: u64,
    pub(super) status: serde_json::Value,
}

/// Cluster mode's inputs, and the tables built with them.
#[derive(Default)]
pub(super) struct Clustered {
    /// Cluster mode's report, when the daemon runs in it.
    pub(super) status: Option<membership::Shared>,
    /// Cluster settings are taken at start: once vnetd runs, a transaction
    /// that changes the `cluster` line is refused.
    pub(super) fixed: bool,
    /// Signed cluster mode: the cluster's vnet network and the groups this
    /// host's certificate lets its interfaces there be in.
    pub(super) group_authority: Option<(u32, Vec<String>)>,
    /// The addresses other hosts' claims name (`neigh` answers beside the
    /// state's own lines), and a count of their changes.
    pub(super) neighbors: vnet_control::neigh::Table,
    pub(super) neighbors_gen: u64,
    /// The groups each MAC is in by its claim, and a count of their changes.
    pub(super) groups: (Members, u64),
    /// The network's signed policy (its serial, what it declares),
    /// enforced with the state's own lines.
    pub(super) policy: Option<(u64, Arc<vnet_control::policy::Policies>)>,
    /// The engine's `neigh` table last built, for the state's lines and
    /// the cluster's table of that generation.
    pub(super) neighbors_built: Option<(vnet_control::neigh::Neighbors, u64, vnet_engine::plane::Neighbors)>,
    /// The IP source guard last built, and what it was built from.
    pub(super) guards_built:
        Option<(GuardInputs, vnet_control::neigh::Neighbors, vnet_engine::plane::Guards)>,
    /// The policy set last built, and what it was built from.
    pub(super) policy_built: Option<PolicyBuilt>,
    /// The Kubernetes NetworkPolicies' isolation (`--kube-network-policy`).
    pub(super) isolation: Isolating,
}
