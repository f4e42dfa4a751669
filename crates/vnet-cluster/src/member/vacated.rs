//! Kubernetes (`vnetd --kube`): a pod's MAC kept for its node while its
//! claim is gone.
//!
//! A node's claim of its pod's MAC can go while the pod stays: its key
//! expires with its lease (vnetd stopped longer than the lease's TTL, the
//! lease lost) and comes back when the node puts it again, with a new
//! create revision. Meanwhile another node's claim of the MAC that waited
//! behind it (one naming no address, or one of its own pods' addresses)
//! would take it, and the rightful node's claim, younger now, would wait
//! behind the thief's for good. So when a claim a pod backs is deleted
//! and the API still places that pod on the claim's node, the MAC is kept
//! for that node with the claim's create revision: no other node's claim
//! takes it ([`RecordError::PodReserved`]); the node's own claim taken
//! again has its old create revision; the MAC goes free when the API no
//! longer places the pod there ([`Member::set_pods`]). Bounded: per node
//! as the waiting claims ([`crate::Policy::max_pod_waiting`]), in all by
//! `max_macs`; one not kept is counted in `pods_waiting_dropped`.

use super::{Member, PodClaim, RecordError};
use vnet_wire::MacAddr;

impl Member {
    /// `mac`'s claim `c`, which its pod backed, deleted: kept for its host
    /// while the API places the pod there (and there is room).
    pub(super) fn vacate(&mut self, mac: MacAddr, c: PodClaim) {
        if !self.still_placed(&c) {
            return;
        }
        let n = self.vacated.values().filter(|v| v.r.host == c.r.host).count();
        if !self.vacated.contains_key(&mac)
            && (n >= self.policy.max_pod_waiting || self.vacated.len() >= self.policy.max_macs)
        {
            self.stats.pods_waiting_dropped += 1;
            return;
        }
        self.vacated.insert(mac, c);
    }

    /// Whether the API places `c`'s pod on its host with its addresses.
    fn still_placed(&self, c: &PodClaim) -> bool {
        matches!(self.backing(&c.r), Ok(Some(p)) if p == c.pod)
    }

    /// The error for `host`'s claim of `mac` when the MAC is kept for
    /// another host.
    pub(super) fn vacated_for(&self, mac: MacAddr, host: &str) -> Option<RecordError> {
        let c = self.vacated.get(&mac).filter(|c| c.r.host != host)?;
        Some(RecordError::PodReserved { first: c.r.host.clone(), claimant: host.to_string() })
    }

    /// `host`'s claim of `mac`'s create revision: `created`, or the kept
    /// one when the MAC is kept for `host` (its claim's, before it went).
    pub(super) fn vacated_created(&self, mac: MacAddr, host: &str, created: u64) -> u64 {
        match self.vacated.get(&mac).filter(|c| c.r.host == host && c.created != 0) {
            Some(c) if created == 0 || c.created < created => c.created,
            _ => created,
        }
    }

    /// `host`'s claim of `mac` taken: the MAC is kept no more.
    pub(super) fn unvacate(&mut self, mac: MacAddr, host: &str) {
        if self.vacated.get(&mac).is_some_and(|c| c.r.host == host) {
            self.vacated.remove(&mac);
        }
    }

    /// The API changed: MACs whose pod it no longer places on their host
    /// go free.
    pub(super) fn prune_vacated(&mut self) {
        if self.vacated.is_empty() {
            return;
        }
        let gone: Vec<MacAddr> =
            self.vacated.iter().filter(|(_, c)| !self.still_placed(c)).map(|(m, _)| *m).collect();
        for m in gone {
            self.vacated.remove(&m);
        }
    }

    /// Counts a claim refused for another host's gateway MAC.
    pub(super) fn count_gateway_claim(&mut self, e: &RecordError) {
        self.stats.gateway_claims += u64::from(matches!(e, RecordError::GatewayMac { .. }));
    }

    /// MACs kept for their pods' nodes.
    pub fn vacated(&self) -> usize {
        self.vacated.len()
    }
}
