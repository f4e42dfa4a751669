//! A full listing taken as the view ([`Member::relist`]).
//!
//! A listing comes in key order, and every `claims/` key sorts before
//! every `hosts/` key: taken as it comes, each claim would be judged
//! before any host is live, and of two hosts' claims of one MAC the one
//! whose host's name sorts last would hold it, whatever its epoch. So
//! the records that claims are judged against (hosts, revocations, the
//! policy) are taken first, then each MAC's claims by epoch, lowest
//! first: a higher epoch moves the MAC (a migration) and one at the
//! same epoch is a conflict, as in a watch. Of claims at one epoch, the
//! host that held the MAC before the relist is taken first, so a
//! relist keeps a holder; in a view that starts empty, the one listed
//! first (a tie of two hosts' claims is a conflict either way). On
//! Kubernetes (`kube`) each MAC's claims are taken in the order their
//! keys were created (etcd's create revision), as a watch brings them.

use super::{Change, Member, Peer};
use crate::layout::{parse_key, Key, MacRecord};
use crate::store::Event;
use rustc_hash::FxHashMap;
use vnet_wire::MacAddr;

impl Member {
    /// Replaces the view by a full listing at revision `rev` (after a
    /// compaction, or when the store is back): what differs from the view
    /// held is appended to `out`, so the host converges without a restart.
    /// The listing is taken in [`Member::listing_order`], so the holder
    /// of each MAC is what the epoch rule says, whatever the hosts' names.
    pub fn relist(&mut self, kvs: &[(String, Vec<u8>)], rev: u64, out: &mut Vec<Change>) {
        self.relist_created(kvs, &[], rev, out)
    }

    /// [`Member::relist`] with each key's create revision (`created[i]`
    /// is `kvs[i]`'s; a key without one is taken as not known, 0), which
    /// orders competing claims on Kubernetes.
    pub fn relist_created(
        &mut self,
        kvs: &[(String, Vec<u8>)],
        created: &[u64],
        rev: u64,
        out: &mut Vec<Change>,
    ) {
        let mut next = Member::with_policy(&self.network, &self.me, self.policy.clone());
        next.stats = self.stats;
        next.claimed_at = std::mem::take(&mut self.claimed_at);
        next.epochs = std::mem::take(&mut self.epochs);
        next.revoked_hosts = std::mem::take(&mut self.revoked_hosts);
        next.revoked_certs = std::mem::take(&mut self.revoked_certs);
        // The policy too: a listing with an older one (or none) goes back
        // on nothing, and a newer one is a change past the version the
        // daemon enforces (versions are counted across relists).
        next.net_policy = self.net_policy.take();
        next.policy_version = self.policy_version;
        next.kept_version = self.kept_version;
        next.now_s = self.now_s;
        // Kubernetes: the API's pods are the caller's, not the store's.
        next.pods = self.pods.take();
        // And the MACs kept for their pods' nodes (the store has no trace).
        next.vacated = std::mem::take(&mut self.vacated);
        next.stats.relists += 1;
        let mut ignored = Vec::new();
        let created_of = |i: usize| created.get(i).copied().unwrap_or(0);
        for i in self.listing_order(kvs, &created_of) {
            let (k, v) = &kvs[i];
            next.apply(
                &Event::Put { key: k.clone(), value: v.clone(), rev, created: created_of(i) },
                &mut ignored,
            );
        }
        next.revision = rev;
        // The addresses were derived anew: a version past the old one.
        next.addrs_version = self.addrs_version + 1;
        next.groups_version = self.groups_version + 1;
        // Links: gone, new or changed.
        let old_links: FxHashMap<&str, &Peer> = self.links().collect();
        let new_links: FxHashMap<&str, &Peer> = next.links().collect();
        for (h, r) in &new_links {
            if old_links.get(h) != Some(r) {
                out.push(Change::Link { host: h.to_string(), peer: Some((*r).clone()) });
            }
        }
        let mut gone = Vec::new();
        for h in old_links.keys().filter(|h| !new_links.contains_key(*h)) {
            gone.push(Change::Link { host: h.to_string(), peer: None });
        }
        // Routes: by MAC, old target against new.
        let known = self.macs.keys().copied();
        let new = next.macs.keys().copied().filter(|m| !self.macs.contains_key(m));
        for mac in known.chain(new) {
            let (a, b) = (self.route_of(mac), next.route_of(mac));
            if a != b {
                out.push(Change::Route { mac, host: b.map(str::to_string) });
            }
        }
        out.extend(gone);
        *self = next;
    }

    /// The order a listing is taken in: every key but claims as listed,
    /// then the claims by MAC, each MAC's by (epoch, not this view's
    /// holder, place in the listing); on Kubernetes by create revision.
    /// Only a MAC claimed more than once has its claims' epochs read.
    fn listing_order(&self, kvs: &[(String, Vec<u8>)], created: &dyn Fn(usize) -> u64) -> Vec<usize> {
        let mut order = Vec::with_capacity(kvs.len());
        let mut claims: Vec<(MacAddr, usize)> = Vec::new();
        for (i, (k, _)) in kvs.iter().enumerate() {
            match parse_key(&self.prefix, k) {
                Some(Key::Claim { mac, .. }) => claims.push((mac, i)),
                _ => order.push(i),
            }
        }
        claims.sort_unstable();
        for same in claims.chunk_by(|a, b| a.0 == b.0) {
            let mut ranked: Vec<((u64, bool), usize)> = same
                .iter()
                .map(|&(mac, i)| {
                    if same.len() == 1 {
                        return ((0, false), i);
                    }
                    if self.policy.kube {
                        return ((created(i), false), i);
                    }
                    let (k, v) = &kvs[i];
                    let epoch = serde_json::from_slice::<MacRecord>(v).map_or(0, |r| r.epoch);
                    let held = matches!(parse_key(&self.prefix, k),
                        Some(Key::Claim { host, .. }) if self.owner(mac) == Some(host));
                    ((epoch, !held), i)
                })
                .collect();
            ranked.sort_unstable();
            order.extend(ranked.into_iter().map(|(_, i)| i));
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{mac, signed_cert, signed_record, signed_view, sync};
    use super::super::*;
    use crate::layout::fixtures::{host, moved, vm, Claims};
    use crate::layout::{claim_key, host_key, MacRecord};
    use crate::store::MemStore;
    use crate::trust::{ClaimKey, NetworkKey};

    fn relisted(m: &mut Member, s: &MemStore) -> Vec<Change> {
        let (kvs, rev) = s.range(m.prefix());
        let mut out = Vec::new();
        m.relist(&kvs, rev, &mut out);
        out
    }

    fn fresh(me: &str, s: &MemStore) -> Member {
        let mut m = Member::new("n", me);
        relisted(&mut m, s);
        m
    }

    /// A migration window: the source `h2` still claims the MAC at epoch
    /// 4, the destination `h1` (whose name sorts first) at 5. A host that
    /// watched it, relisting, and a host that starts route it to `h1`
    /// at epoch 5; the source's key deleted then changes nothing.
    #[test]
    fn a_relist_in_a_migration_window_routes_to_the_destination() {
        let mut s = MemStore::new();
        for i in 1..=3 {
            s.put(&host_key("n", &format!("h{i}")), host(i), None);
        }
        s.put_claim(mac(7), moved("h2", 4), None);
        let mut watched = Member::new("n", "h3");
        sync(&mut watched, &s);
        s.put_claim(mac(7), moved("h1", 5), None);
        sync(&mut watched, &s);
        assert_eq!((watched.route_of(mac(7)), watched.epoch(mac(7))), (Some("h1"), 5));
        let out = relisted(&mut watched, &s);
        assert_eq!((watched.route_of(mac(7)), watched.epoch(mac(7))), (Some("h1"), 5), "{out:?}");
        assert!(out.is_empty(), "the relist moved {out:?}");
        let mut started = fresh("h3", &s);
        assert_eq!((started.route_of(mac(7)), started.epoch(mac(7))), (Some("h1"), 5));
        s.delete_if(&claim_key("n", "h2", mac(7)), None);
        assert!(sync(&mut started, &s).is_empty());
        assert_eq!(started.route_of(mac(7)), Some("h1"));
    }

    /// An attacker `h9` (its name sorts after the victim `h1`'s) claims
    /// the victim's MACs at the same epoch and at a lower one: the victim
    /// holds them in the view that watched it, after its relist, and in a
    /// view that starts; the same-epoch claim is a conflict. A lower
    /// epoch takes nothing either while the holder's record is briefly
    /// absent (positive control: a higher epoch, a migration, does).
    #[test]
    fn another_hosts_claim_at_no_higher_epoch_takes_no_mac_at_a_relist() {
        let mut s = MemStore::new();
        for i in [1, 5, 9] {
            s.put(&host_key("n", &format!("h{i}")), host(i), None);
        }
        s.put_claim(mac(7), moved("h1", 2), None);
        s.put_claim(mac(8), moved("h1", 3), None);
        let mut watched = Member::new("n", "h5");
        sync(&mut watched, &s);
        s.put_claim(mac(7), moved("h9", 2), None);
        s.put_claim(mac(8), moved("h9", 1), None);
        sync(&mut watched, &s);
        fn held(m: &Member) -> (Option<&str>, Option<&str>, u64, u64) {
            (m.route_of(mac(7)), m.route_of(mac(8)), m.epoch(mac(7)), m.epoch(mac(8)))
        }
        assert_eq!(held(&watched), (Some("h1"), Some("h1"), 2, 3));
        relisted(&mut watched, &s);
        assert_eq!(held(&watched), (Some("h1"), Some("h1"), 2, 3), "after a relist");
        let mut started = fresh("h5", &s);
        assert_eq!(held(&started), (Some("h1"), Some("h1"), 2, 3), "a host that starts");
        assert!(started.conflicts().any(|c| c == (mac(7), "h1", "h9")));
        // The victim's record briefly absent: a lower epoch takes nothing.
        s.delete_if(&host_key("n", "h1"), None);
        s.put_claim(mac(8), moved("h9", 2), None);
        sync(&mut started, &s);
        assert_eq!(started.owner(mac(8)), Some("h1"));
        s.put(&host_key("n", "h1"), host(1), None);
        sync(&mut started, &s);
        assert_eq!(started.route_of(mac(8)), Some("h1"));
        // Positive control: a migration (a higher epoch) takes it.
        s.put_claim(mac(8), moved("h9", 4), None);
        sync(&mut started, &s);
        assert_eq!(started.route_of(mac(8)), Some("h9"));
    }

    fn signed_claim(h: u8, signer: u8, m: MacAddr, epoch: u64) -> Vec<u8> {
        let mut r = MacRecord {
            host: format!("h{h}"),
            iface: "vm0".into(),
            at_ms: 1000,
            epoch,
            ..Default::default()
        };
        r.sig = Some(ClaimKey::derive(&[signer; 32]).unwrap().sign("n", m, &r));
        r.to_json()
    }

    /// Signed network: two hosts' claims of one MAC at one epoch are both
    /// kept, the first holding and the other a conflict, whether they
    /// waited for their hosts' records (a watch) or came in a listing.
    #[test]
    fn two_hosts_signed_claims_of_one_mac_are_a_conflict_after_a_relist() {
        let nk = NetworkKey::generate().unwrap();
        let record = |h: u8| signed_record(h, h, &signed_cert(&nk, h, h, None));
        let mut s = MemStore::new();
        s.put(&host_key("n", "h2"), record(2), None);
        s.put_claim(mac(9), signed_claim(1, 1, mac(9), 0), None);
        s.put_claim(mac(9), signed_claim(3, 3, mac(9), 0), None);
        let mut watched = signed_view(&nk, "h2");
        sync(&mut watched, &s);
        s.put(&host_key("n", "h1"), record(1), None);
        s.put(&host_key("n", "h3"), record(3), None);
        sync(&mut watched, &s);
        assert_eq!(watched.route_of(mac(9)), Some("h1"), "both waited: the first holds");
        assert_eq!(watched.conflicts().collect::<Vec<_>>(), [(mac(9), "h1", "h3")]);
        let mut started = signed_view(&nk, "h2");
        relisted(&mut started, &s);
        assert_eq!(started.route_of(mac(9)), Some("h1"));
        assert_eq!(started.conflicts().collect::<Vec<_>>(), [(mac(9), "h1", "h3")]);
        relisted(&mut watched, &s);
        assert_eq!(watched.conflicts().collect::<Vec<_>>(), [(mac(9), "h1", "h3")]);
    }

    /// Signed network: a known host's claim with a bad signature removes
    /// no other host's waiting claim (positive control: a host's own key
    /// put again replaces its waiting claim).
    #[test]
    fn a_bad_signature_removes_no_other_hosts_waiting_claim() {
        let nk = NetworkKey::generate().unwrap();
        let record = |h: u8| signed_record(h, h, &signed_cert(&nk, h, h, None));
        let mut s = MemStore::new();
        s.put(&host_key("n", "h1"), record(1), None);
        s.put(&host_key("n", "h2"), record(2), None);
        let mut m = signed_view(&nk, "h2");
        // h3's claims wait for its record.
        s.put_claim(mac(9), signed_claim(3, 3, mac(9), 0), None);
        s.put_claim(mac(10), signed_claim(3, 3, mac(10), 0), None);
        sync(&mut m, &s);
        // h1, known, claims mac 9 with h2's key: refused.
        let bad = m.stats.bad_records;
        s.put_claim(mac(9), signed_claim(1, 2, mac(9), 0), None);
        // Control: h3's own key of mac 10 replaced by a bad claim.
        s.put_claim(mac(10), signed_claim(3, 2, mac(10), 0), None);
        sync(&mut m, &s);
        assert_eq!(m.stats.bad_records, bad + 2);
        s.put(&host_key("n", "h3"), record(3), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(9)), Some("h3"), "h3's waiting claim is taken with its record");
        assert_eq!(m.route_of(mac(10)), None, "control: the bad claim replaced h3's own");
    }

    /// An epoch of u64::MAX panics nowhere: taken where the MAC is free,
    /// a conflict at the same epoch, the next migration's epoch saturates,
    /// a relist takes it; a jump far past the held epoch is refused
    /// (positive control: the next epoch, a migration, is taken).
    #[test]
    fn an_epoch_of_u64_max_panics_nowhere_and_jumps_are_refused() {
        let mut s = MemStore::new();
        for i in 1..=3 {
            s.put(&host_key("n", &format!("h{i}")), host(i), None);
        }
        s.put_claim(mac(5), moved("h1", u64::MAX), None);
        let mut m = Member::new("n", "h3");
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(5)), m.epoch(mac(5))), (Some("h1"), u64::MAX));
        assert_eq!(m.next_epoch(mac(5)), u64::MAX, "the next migration's epoch");
        s.put_claim(mac(5), moved("h2", u64::MAX), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(5)), Some("h1"));
        relisted(&mut m, &s);
        assert_eq!(m.route_of(mac(5)), Some("h1"));
        // h1 holds mac 6 at epoch 0; h2's claim at u64::MAX would lock it
        // (no higher epoch to move it back with): refused.
        s.put_claim(mac(6), vm("h1"), None);
        sync(&mut m, &s);
        s.put_claim(mac(6), moved("h2", u64::MAX), None);
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(6)), m.epoch(mac(6))), (Some("h1"), 0));
        assert_eq!(fresh("h3", &s).route_of(mac(6)), Some("h1"), "nor at a relist");
        s.put_claim(mac(6), moved("h2", 1), None);
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(6)), m.epoch(mac(6))), (Some("h2"), 1));
    }
}
