//! What the daemon follows from the member's view, each when its version
//! moved: the network's kept trust state (written to disk), the claims'
//! groups, the signed policy and the claims' addresses.

use super::{kept, lock, Host};
use vnet_cluster::Change;
use vnet_wire::MacAddr;

impl Host {
    /// Writes the network's trust state when it moved (a newer policy
    /// taken, a revocation seen): a restart then goes back on neither.
    pub(super) fn keep(&mut self) {
        let version = self.member.kept_version();
        let Some(file) = self.cfg.kept_file.as_ref().filter(|_| version != self.kept_version) else { return };
        match kept::save(file, &self.member.kept()) {
            Ok(()) => {
                self.kept_version = version;
                self.kept_failed = None;
            }
            Err(e) => {
                let e = format!(
                    "{}: {e}; a restart may take an older policy or forget a revocation",
                    file.display()
                );
                if self.kept_failed.as_ref() != Some(&e) {
                    tracing::error!("cluster: {e}");
                    lock(&self.status).last_error = Some(e.clone());
                }
                self.kept_failed = Some(e);
            }
        }
    }

    /// The groups MACs are in by their claims (within what their holders'
    /// certificates allow), derived again when a batch changed something (a host, a
    /// claim's holder) or a claim's groups changed.
    pub(super) fn follow_groups(&mut self, changes: &[Change]) {
        let version = self.member.groups_version();
        if changes.is_empty() && version == self.groups_version {
            return;
        }
        self.groups_version = version;
        let groups = self.member.mac_groups();
        let mut d = lock(&self.daemon);
        if let Err(e) = d.set_cluster_groups(self.member.tenant(), groups) {
            tracing::warn!("cluster: the claims' groups could not be applied: {e}");
        }
    }

    /// The network's signed policy, enforced as the member takes it (a
    /// higher serial, signed by the network key).
    pub(super) fn follow_policy(&mut self) {
        let version = self.member.policy_version();
        if version == self.policy_version {
            return;
        }
        self.policy_version = version;
        let signed = self.member.signed_policy().map(|(serial, p)| (serial, p.clone()));
        lock(&self.status).policy_serial = signed.as_ref().map(|(serial, _)| *serial);
        if let Some((serial, _)) = &signed {
            tracing::info!(serial, "cluster: the network's signed policy taken");
        }
        if let Err(e) = lock(&self.daemon).set_cluster_policy(signed) {
            tracing::warn!("cluster: the network's signed policy could not be applied: {e}");
        }
    }

    /// The addresses the claims name: every VM of the network answered for
    /// at the edge. Derived again only when a claim's addresses or a host's
    /// liveness changed (`changes` has a link's; a move changes neither).
    pub(super) fn follow_neighbors(&mut self, changes: &[Change]) {
        let version = self.member.addrs_version();
        let hosts_changed = changes.iter().any(|c| matches!(c, vnet_cluster::member::Change::Link { .. }));
        if version == self.neighbors_version && !hosts_changed {
            return;
        }
        self.neighbors_version = version;
        let neighbors = self.member.neighbors();
        let conflicts = self.member.address_conflicts();
        if !conflicts.is_empty() {
            tracing::warn!(
                "cluster: {} address(es) claimed by more than one VM, answered by no host: {:?}",
                conflicts.len(),
                conflicts
            );
        }
        {
            let mut st = lock(&self.status);
            st.neighbors = neighbors.len();
            st.address_conflicts = conflicts.into_iter().map(|((n, ip), macs)| (n, ip, macs)).collect();
        }
        // Every claimed address with its claims' MACs, conflicts included.
        let mut claimed: std::collections::BTreeMap<_, Vec<MacAddr>> =
            neighbors.iter().map(|(k, m)| (*k, vec![*m])).collect();
        claimed.extend(self.member.address_conflicts());
        let mut d = lock(&self.daemon);
        if neighbors != *d.cluster_neighbors() {
            if let Err(e) = d.set_cluster_neighbors(neighbors) {
                tracing::warn!("cluster: the claims' addresses could not be answered for: {e}");
            }
        }
        // `neigh` lines made before the claim arrived, checked again.
        match d.withdraw_neighbors_claimed_elsewhere(&claimed) {
            Ok(gone) if !gone.is_empty() => {
                for n in &gone {
                    tracing::warn!(
                        "cluster: `neigh {} {} network {}` withdrawn: another host's VM claims {} \
                         (the line was made before its claim arrived)",
                        n.ip,
                        n.mac,
                        n.network,
                        n.ip
                    );
                }
                lock(&self.status).counters.neighbors_withdrawn += gone.len() as u64;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cluster: `neigh` lines claimed elsewhere could not be withdrawn: {e}"),
        }
    }
}
