//! The `neigh` table the engine answers from: the state's own lines and,
//! in cluster mode, the addresses other hosts' claims name; and the IP
//! source guard the state's lines and `addresses` make.

use super::clustered::GuardInputs;
use super::Daemon;
use std::collections::BTreeMap;
use std::sync::Arc;
use vnet_control::{Command, Error, Located, State};

impl Daemon {
    /// The addresses the cluster's claims name, as last set.
    pub fn cluster_neighbors(&self) -> &vnet_control::neigh::Table {
        &self.cluster.neighbors
    }

    /// Cluster mode: answers for `table` (the claims' addresses) from now
    /// on; the plane is published again with them.
    pub fn set_cluster_neighbors(&mut self, table: vnet_control::neigh::Table) -> Result<(), Error> {
        self.cluster.neighbors = table;
        self.cluster.neighbors_gen += 1;
        self.apply(&[])
    }

    /// Cluster mode, when the claims' addresses changed: withdraws the
    /// `neigh` lines [`claimed_elsewhere`] names (made before the claim
    /// arrived: the config read at start, before the first listing), as
    /// `delete neigh` would. Returns them (the caller counts and logs).
    pub fn withdraw_neighbors_claimed_elsewhere(
        &mut self,
        claimed: &BTreeMap<(u32, std::net::IpAddr), Vec<vnet_wire::MacAddr>>,
    ) -> Result<Vec<vnet_control::neigh::Neigh>, Error> {
        let gone = claimed_elsewhere(&self.state, claimed);
        if gone.is_empty() {
            return Ok(gone);
        }
        let pos = vnet_control::Pos::default();
        let cmds: Vec<Located<Command>> = gone
            .iter()
            .map(|n| Located {
                pos,
                item: Command::DeleteNeigh(vnet_control::ast::Ref { pos, by: (n.ip, n.network) }),
            })
            .collect();
        self.apply(&cmds)?;
        Ok(gone)
    }

    /// What the engine answers for under `state`: its lines, and the
    /// cluster's addresses where no line of its own names them. Built
    /// again only when either changed (a route change, a move, keeps the
    /// table: the kernel path then writes nothing of it either).
    pub(super) fn neighbors_of(&mut self, state: &State) -> vnet_engine::plane::Neighbors {
        let gen = self.cluster.neighbors_gen;
        if let Some((lines, g, built)) = &self.cluster.neighbors_built {
            if *g == gen && *lines == state.neighbors {
                return built.clone();
            }
        }
        let mut t: vnet_control::neigh::Table = self.cluster.neighbors.clone();
        t.extend(state.neighbors.0.iter().map(|(k, v)| (*k, *v)));
        let built: vnet_engine::plane::Neighbors = Arc::new(t.into_iter().collect());
        self.cluster.neighbors_built = Some((state.neighbors.clone(), gen, built.clone()));
        built
    }

    /// The IP source guard under `state` (`vnet_engine::plane::guards`):
    /// each interface's `addresses` and the `neigh` lines naming its MAC
    /// (vnet-cni's for the addresses it gives, a claim's, a person's).
    /// Built again only when either changed.
    pub(super) fn guards_of(&mut self, state: &State) -> vnet_engine::plane::Guards {
        let inputs: GuardInputs =
            state.interfaces.values().map(|i| (i.id, i.mac, i.network, i.addresses.clone())).collect();
        if let Some((i, n, built)) = &self.cluster.guards_built {
            if *i == inputs && *n == state.neighbors {
                return built.clone();
            }
        }
        let built = vnet_engine::plane::guards(state);
        self.cluster.guards_built = Some((inputs, state.neighbors.clone(), built.clone()));
        built
    }
}

/// The `neigh` lines of `state` that the claims (`claimed`: each claimed
/// address, conflicts included, with the MACs of every live claim naming
/// it) give to another MAC, where the line's MAC is no interface of this
/// host's: the lines `check_neighbors` refuses when made after the claim
/// (this host's edge would answer another host's VM's address with the
/// wrong MAC). A line for this host's own VM's MAC stays: its claim makes
/// the address a conflict no host answers for, and withdrawing it would
/// let another host, by claiming the address, take it from this host's
/// VM's source guard too.
fn claimed_elsewhere(
    state: &State,
    claimed: &BTreeMap<(u32, std::net::IpAddr), Vec<vnet_wire::MacAddr>>,
) -> Vec<vnet_control::neigh::Neigh> {
    let local = |m: &vnet_wire::MacAddr| state.interfaces.values().any(|i| i.mac.as_ref() == Some(m));
    state
        .neighbors
        .0
        .iter()
        .filter(|(k, mac)| !local(mac) && claimed.get(k).is_some_and(|macs| macs.iter().any(|m| m != *mac)))
        .map(|((network, ip), mac)| vnet_control::neigh::Neigh { ip: *ip, mac: *mac, network: *network })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    /// A line made before the owner's claim arrived: one answering another
    /// host's VM's address with another MAC is withdrawn once the claim
    /// names it (alone, or beside another claim: a conflict). The positive
    /// controls: the same lines with no claim naming their addresses, a
    /// line with the claim's own MAC, and a line for this host's own VM
    /// (in a conflict) all stay.
    #[test]
    fn a_line_for_an_address_another_hosts_vm_claims_is_withdrawn_when_the_claim_arrives() {
        let text = "interface a tap ta mac 52:54:00:00:00:01\n\
                    neigh 10.0.0.5 52:54:00:00:00:99\n\
                    neigh 10.0.0.6 52:54:00:00:00:01\n\
                    neigh 10.0.0.7 52:54:00:00:00:98\n\
                    neigh 10.0.0.8 52:54:00:00:00:97\n\
                    neigh 10.0.0.9 52:54:00:00:00:96 network 4\n";
        let state = vnet_control::State::default().apply_all(&vnet_control::parse(text).unwrap()).unwrap();
        let mac = |s: &str| -> vnet_wire::MacAddr { s.parse().unwrap() };
        let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
        assert!(super::claimed_elsewhere(&state, &BTreeMap::new()).is_empty(), "no claim: every line stays");
        let owner = mac("52:54:00:00:00:02");
        let claimed: BTreeMap<_, _> = [
            ((0, ip("10.0.0.5")), vec![owner]),
            ((0, ip("10.0.0.6")), vec![mac("52:54:00:00:00:01"), owner]),
            ((0, ip("10.0.0.8")), vec![mac("52:54:00:00:00:97")]),
            ((0, ip("10.0.0.9")), vec![owner]),
            ((4, ip("10.0.0.7")), vec![owner]),
        ]
        .into();
        let gone = super::claimed_elsewhere(&state, &claimed);
        let gone: Vec<_> = gone.iter().map(|n| (n.network, n.ip.to_string(), n.mac)).collect();
        assert_eq!(gone, [(0, "10.0.0.5".to_string(), mac("52:54:00:00:00:99"))]);
        // Beside another claim of the address (a conflict), the same.
        let mut conflict = claimed.clone();
        conflict.insert((0, ip("10.0.0.7")), vec![owner, mac("52:54:00:00:00:03")]);
        assert_eq!(super::claimed_elsewhere(&state, &conflict).len(), 2);
    }
}
