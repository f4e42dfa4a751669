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
//! takes it ([`RecordError::PodVacated`]); the node's own claim taken
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
        Some(RecordError::PodVacated { node: c.r.host.clone(), claimant: host.to_string() })
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

#[cfg(test)]
mod tests {
    use super::super::gateways::tests::record;
    use super::super::pods::tests::{claim, kube_view, pod, store, why};
    use super::super::pods::{PodFacts, PodPlace};
    use super::super::tests::{mac, sync};
    use crate::layout::fixtures::Claims;
    use crate::layout::{claim_key, host_key};
    use crate::trust::NetworkKey;
    use std::sync::Arc;

    fn facts(pods: &[PodPlace]) -> Arc<PodFacts> {
        Arc::new(PodFacts::new(pods.iter().cloned()))
    }

    /// The review's two holes, the rightful node's (h3's) claim of its
    /// pod p's MAC (7) gone with its lease while the pod stays: a thief
    /// (h2) waiting with a claim of the MAC naming (a) h2's own pod q's
    /// address, (b) no address, with h2's record naming the MAC as its
    /// gateway. The MAC is kept for h3: h2's claim waits, and h3's claim
    /// put again (a new key, younger than h2's) takes it; h2's gateway
    /// record protects nothing. When the API drops p, the MAC goes free.
    /// Positive control: h3's bound of kept MACs full (1, spent on pod
    /// r's MAC 8 first), the MAC is not kept: h2 takes it, and h3's claim
    /// put again is refused while the thief holds the MAC.
    #[test]
    fn a_pods_mac_is_kept_for_its_node_while_its_claim_is_gone() {
        let nk = NetworkKey::generate().unwrap();
        let pods = [pod("p", "h3", 7, &[]), pod("q", "h2", 5, &[]), pod("r", "h3", 8, &[])];
        for gateway in [false, true] {
            for kept in [true, false] {
                let mut s = store(&nk);
                s.put_claim(mac(8), claim(3, mac(8), 0, &[8], &[]), None);
                s.put_claim(mac(7), claim(3, mac(7), 0, &[7], &[]), None);
                let thief: &[u8] = if gateway { &[] } else { &[5] };
                if gateway {
                    s.put(&host_key("n", "h2"), record(Some(&nk), 2, Some((mac(7), Some(2)))), None);
                }
                s.put_claim(mac(7), claim(2, mac(7), 0, thief, &[]), None);
                let mut m = kube_view(&nk, "h1");
                m.policy.max_pod_waiting = 1;
                m.set_pods(facts(&pods), &mut Vec::new());
                sync(&mut m, &s);
                assert_eq!(m.route_of(mac(7)), Some("h3"));
                if !kept {
                    s.delete_if(&claim_key("n", "h3", mac(8)), None);
                }
                // h3's lease lapses: its key of MAC 7 goes, then comes back.
                s.delete_if(&claim_key("n", "h3", mac(7)), None);
                sync(&mut m, &s);
                let held = if kept { None } else { Some("h2") };
                assert_eq!(m.route_of(mac(7)), held, "gateway {gateway}, kept {kept}");
                s.put_claim(mac(7), claim(3, mac(7), 0, &[7], &[]), None);
                sync(&mut m, &s);
                if !kept {
                    assert_eq!(m.route_of(mac(7)), Some("h2"), "control: the thief holds the MAC");
                    continue;
                }
                assert_eq!((m.route_of(mac(7)), m.vacated()), (Some("h3"), 0), "gateway {gateway}");
                assert_eq!(m.stats.gateway_claims, 0);
                assert_eq!(m.pods_waiting(), 1, "h2's claim waits");
                // Deleted again, and the API drops p: the MAC is free.
                s.delete_if(&claim_key("n", "h3", mac(7)), None);
                sync(&mut m, &s);
                assert_eq!((m.route_of(mac(7)), m.vacated()), (None, 1));
                assert!(why(&m, "h2", mac(7)).contains("kept for node `h3`"), "{}", why(&m, "h2", mac(7)));
                m.set_pods(facts(&pods[1..]), &mut Vec::new());
                assert_eq!((m.route_of(mac(7)), m.vacated()), (Some("h2"), 0), "p gone: h2's claim counts");
            }
        }
    }

    /// A node gateway's MAC (h2's, named in its record, held by h2's claim
    /// naming no address) yields to the claim the API backs that is older:
    /// h3's claim of its pod's MAC, put while h3's record was gone (its
    /// lease lapsed) and taken when the record comes back. Positive
    /// control: h3's claim younger than h2's (the case the gateway rule is
    /// for), refused and counted on that path, waits; h2's record naming
    /// the gateway no more, it is taken. A claim not signed by h3's key
    /// counts no gateway claim.
    #[test]
    fn a_gateways_mac_yields_to_an_older_claim_the_api_backs() {
        let nk = NetworkKey::generate().unwrap();
        for older in [true, false] {
            let mut s = store(&nk);
            let r3 = s.range("/vnet/n/hosts/h3").0[0].1.clone();
            s.delete_if(&host_key("n", "h3"), None);
            let y = claim(3, mac(7), 0, &[7], &[]);
            if older {
                s.put_claim(mac(7), y.clone(), None);
            }
            s.put(&host_key("n", "h2"), record(Some(&nk), 2, Some((mac(7), Some(2)))), None);
            s.put_claim(mac(7), claim(2, mac(7), 0, &[], &[]), None);
            if !older {
                s.put_claim(mac(7), y, None);
            }
            s.put(&host_key("n", "h3"), r3.clone(), None);
            let mut m = kube_view(&nk, "h1");
            m.set_pods(facts(&[pod("p", "h3", 7, &[])]), &mut Vec::new());
            sync(&mut m, &s);
            if older {
                assert_eq!(m.route_of(mac(7)), Some("h3"), "{}", why(&m, "h3", mac(7)));
                assert_eq!(m.stats.gateway_claims, 0);
                continue;
            }
            assert_eq!((m.route_of(mac(7)), m.stats.gateway_claims), (Some("h2"), 1));
            assert!(why(&m, "h3", mac(7)).contains("node gateway"), "{}", why(&m, "h3", mac(7)));
            // A write with h3's etcd credential only: no gateway claim counted.
            let mut forged: crate::layout::MacRecord =
                serde_json::from_slice(&claim(3, mac(7), 1, &[7], &[])).unwrap();
            forged.at_ms += 1;
            s.put_claim(mac(7), forged.to_json(), None);
            sync(&mut m, &s);
            assert!(why(&m, "h3", mac(7)).contains("not signed"), "{}", why(&m, "h3", mac(7)));
            assert_eq!(m.stats.gateway_claims, 1);
            s.put_claim(mac(7), claim(3, mac(7), 0, &[7], &[]), None);
            sync(&mut m, &s);
            assert_eq!((m.route_of(mac(7)), m.stats.gateway_claims), (Some("h2"), 2));
            // h2's record without the gateway: h3's waiting claim is taken.
            s.put(&host_key("n", "h2"), record(Some(&nk), 2, None), None);
            sync(&mut m, &s);
            assert_eq!(m.route_of(mac(7)), Some("h3"), "{}", why(&m, "h3", mac(7)));
        }
    }
}
