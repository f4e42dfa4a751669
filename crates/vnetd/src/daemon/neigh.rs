//! The `neigh` table the engine answers from: the state's own lines and,
//! in cluster mode, the addresses other hosts' claims name.

use super::*;

impl Daemon {
    /// The addresses the cluster's claims name, as last set.
    pub fn cluster_neighbors(&self) -> &vnet_control::neigh::Table {
        &self.cluster_neighbors
    }

    /// Cluster mode: answers for `table` (the claims' addresses) from now
    /// on; the plane is published again with them.
    pub fn set_cluster_neighbors(&mut self, table: vnet_control::neigh::Table) -> Result<(), Error> {
        self.cluster_neighbors = table;
        self.apply(&[])
    }

    /// What the engine answers for under `state`: its lines, and the
    /// cluster's addresses where no line of its own names them.
    pub(super) fn neighbors_of(&self, state: &State) -> vnet_engine::plane::Neighbors {
        let mut t: vnet_control::neigh::Table = self.cluster_neighbors.clone();
        t.extend(state.neighbors.0.iter().map(|(k, v)| (*k, *v)));
        Arc::new(t.into_iter().collect())
    }
}
