//! What cluster mode gives the daemon, as one resource: its report, the
//! settings fixed at the start, the group authority of this host's
//! certificate, the other hosts' claimed addresses and groups, the
//! network's signed policy, and the tables built from them with the
//! state's own lines (built again only when an input changed); a new
//! state's interfaces checked against the group authority.

use crate::membership;
use std::sync::Arc;
use vnet_control::{Error, State};
use vnet_core::policy::isolation::LinkLocals;
use vnet_core::policy::PolicySet;
use vnet_engine::policy::Members;

/// What the IP source guard is built from, of each interface: its id,
/// MAC, network and `addresses`.
pub(super) type GuardInputs = Vec<(u32, Option<vnet_wire::MacAddr>, u32, Vec<std::net::IpAddr>)>;

/// The policy set last built and what it was built from: the declarations
/// (the state's and the cluster's signed policy, merged), the generation
/// of the cluster's groups, the interfaces' groups (`group G`), and the
/// generation of the NetworkPolicies' isolation, and the pods'
/// link-local addresses it was given.
pub(super) type PolicyBuilt =
    (vnet_control::policy::Policies, u64, Members, u64, Arc<LinkLocals>, Arc<PolicySet>);

/// The pods' link-local addresses last built, and what from: the engine's
/// `neigh` table and the isolation's generation.
pub(super) type LinkLocalsBuilt = (vnet_engine::plane::Neighbors, u64, Arc<LinkLocals>);

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
    /// The isolation's link-local addresses last built.
    pub(super) link_locals_built: Option<LinkLocalsBuilt>,
    /// The Kubernetes NetworkPolicies' isolation (`--kube-network-policy`).
    pub(super) isolation: Isolating,
}

impl Clustered {
    /// Refuses an interface in a group this host's certificate does not
    /// allow (signed cluster mode; `at`: where an interface was declared).
    pub(super) fn check_groups(
        &self,
        next: &State,
        at: &dyn Fn(&str) -> vnet_control::Pos,
    ) -> Result<(), Error> {
        let Some((network, allowed)) = &self.group_authority else { return Ok(()) };
        let Some((name, g)) = not_allowed(next, *network, allowed) else { return Ok(()) };
        let list = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
        Err(Error::new(
            at(name),
            format!("for interface {name}, a group this host's certificate allows ({list})"),
            format!("group `{g}`: sign a certificate with it (`vnetctl sign ... groups`)"),
        ))
    }
}

/// The first interface of vnet network `network` in `state` in a group
/// `allowed` does not name, and that group.
fn not_allowed<'a>(state: &'a State, network: u32, allowed: &[String]) -> Option<(&'a str, &'a str)> {
    state
        .interfaces
        .values()
        .filter(|i| i.network == network)
        .find_map(|i| i.groups.iter().find(|g| !allowed.contains(g)).map(|g| (i.name.as_str(), g.as_str())))
}

#[cfg(test)]
mod tests {
    /// Signed cluster mode: an interface of the cluster's network may be
    /// only in groups the host's certificate allows (none: none); other
    /// networks' interfaces, and interfaces in no group, are not its.
    #[test]
    fn an_interface_may_be_only_in_groups_the_certificate_allows() {
        let text = "interface a tap ta mac 52:54:00:00:00:01 group web\n\
                    interface b tap tb mac 52:54:00:00:00:02\n\
                    interface c tap tc mac 52:54:00:00:00:03 network 4 group db\n";
        let state = vnet_control::State::default().apply_all(&vnet_control::parse(text).unwrap()).unwrap();
        let web = vec!["web".to_string()];
        assert_eq!(super::not_allowed(&state, 0, &web), None, "within the set");
        assert_eq!(super::not_allowed(&state, 0, &[]), Some(("a", "web")), "a certificate with no groups");
        assert_eq!(super::not_allowed(&state, 4, &web), Some(("c", "db")), "the attacker's case");
        assert_eq!(super::not_allowed(&state, 4, &["db".into()]), None, "its positive control");
        assert_eq!(super::not_allowed(&state, 7, &[]), None, "no interface of that network");
    }
}
