//! The `neigh` table the engine answers from: the state's own lines and,
//! in cluster mode, the addresses other hosts' claims name; and the IP
//! source guard the state's lines and `addresses` make.

use super::clustered::GuardInputs;
use super::Daemon;
use std::sync::Arc;
use vnet_control::{Error, State};

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
