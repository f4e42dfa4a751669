//! A host's MAC claims as a [`Member`] takes them: a record parsed and
//! checked, a claim taken, waiting for its host, moved by a migration, or
//! deleted, and the routes that follow.

use super::{Change, Member, RecordError, CONFLICTS_SHOWN, MAX_EPOCH_STEP};
use crate::layout::{claim_key, valid_name, MacRecord};
use crate::trust::verify_claim;
use rustc_hash::FxHashMap;
use std::net::IpAddr;
use vnet_wire::MacAddr;

impl Member {
    /// Parses a MAC record (its key created at revision `created`) and
    /// takes it as a claim ([`Member::take_claim`]).
    pub(super) fn put_mac_record(
        &mut self,
        host: &str,
        mac: MacAddr,
        value: &[u8],
        created: u64,
        out: &mut Vec<Change>,
    ) -> Result<(), RecordError> {
        let r: MacRecord = serde_json::from_slice(value).map_err(|e| RecordError::Json(e.to_string()))?;
        if r.host != host {
            return Err(RecordError::ClaimKeyHost { named: r.host, key: host.to_string() });
        }
        self.take_claim(mac, r, created, out)
    }

    /// Host `host`'s claim of `mac` deleted: if it held the MAC, the MAC
    /// goes, and another host's claim held as a conflict is taken now
    /// (checked again); else it was that conflict, or waiting, and goes.
    pub(super) fn delete_claim(
        &mut self,
        host: &str,
        mac: MacAddr,
        out: &mut Vec<Change>,
    ) -> Result<(), RecordError> {
        if !self.unverified.is_empty() {
            self.unverified.remove(&(host.to_string(), mac));
        }
        self.unwait(mac, host);
        if self.conflicts.get(&mac).is_some_and(|(_, c, ..)| c == host) {
            self.conflicts.remove(&mac);
            return Ok(());
        }
        if self.owner(mac) != Some(host) {
            return Ok(());
        }
        // Kubernetes: a pod's MAC stays its node's while the API places it there.
        let backed = self.pod_claims.get(&mac).filter(|c| c.r.host == host).cloned();
        self.delete_mac(mac, out);
        if let Some(c) = backed {
            self.vacate(mac, c);
        }
        // Kubernetes: the claims that waited for this holder's to go, the
        // oldest (by create revision) first.
        self.retake_waiting(mac, out);
        let Some((_, claimant, created, r)) = self.conflicts.remove(&mac) else { return Ok(()) };
        let key = claim_key(&self.network, &claimant, mac);
        match self.take_claim(mac, r, created, out) {
            Ok(()) => {
                self.quarantine.remove(&key);
            }
            Err(e) => {
                self.stats.bad_records += 1;
                self.count_gateway_claim(&e);
                self.hold(key, e);
            }
        }
        Ok(())
    }

    /// Takes a MAC claim if it checks: names and network; where the
    /// network has a key, the claimant's signature, groups its certificate
    /// allows, no older than the claim held (a replay); its epoch: a claim by another
    /// host than a live holder is taken only at a higher epoch (a
    /// migration), and at the same epoch is a conflict, held and shown,
    /// that moves nothing.
    ///
    /// On Kubernetes (`kube`), another host's claim must also be its pod's
    /// by the API, and claims of one MAC are ordered by `created` (their
    /// key's etcd create revision, 0 when not known) ([`super::pods`]);
    /// the certificate's groups are not asked (the API's are the MAC's).
    pub(super) fn take_claim(
        &mut self,
        mac: MacAddr,
        r: MacRecord,
        created: u64,
        out: &mut Vec<Change>,
    ) -> Result<(), RecordError> {
        if !valid_name(&r.host) || !(r.iface.is_empty() || valid_name(&r.iface)) {
            return Err(RecordError::ClaimNames);
        }
        if r.network != self.policy.tenant {
            return Err(RecordError::ClaimNetwork { network: r.network, carried: self.policy.tenant });
        }
        let unicast = |a: &IpAddr| !(a.is_unspecified() || a.is_multicast() || *a == IpAddr::from([255; 4]));
        if r.addrs.len() > crate::layout::MAX_ADDRS || !r.addrs.iter().all(unicast) {
            return Err(RecordError::ClaimAddrs(crate::layout::MAX_ADDRS));
        }
        let name = |g: &String| vnet_control::request::Name::new(g).is_ok();
        if r.groups.len() > crate::layout::MAX_GROUPS || !r.groups.iter().all(name) {
            return Err(RecordError::ClaimGroups(crate::layout::MAX_GROUPS));
        }
        let mut stamp = None;
        if self.policy.network_key.is_some() {
            let peer = self.ids.get(r.host.as_str()).and_then(|&h| self.records[h as usize].as_ref());
            let Some(claim_key) = peer.and_then(|p| p.claim_key) else {
                self.wait_for_host(mac, &r, created);
                return Err(RecordError::ClaimHost(r.host));
            };
            // Only groups the holder's certificate allows (tried again when
            // its record, a new certificate, comes).
            let disallowed = match self.policy.kube {
                true => None,
                false => r.groups.iter().find(|g| peer.is_none_or(|p| !p.groups.contains(g))).cloned(),
            };
            // This host's claim replaces its own waiting one, no other's.
            self.unverified.remove(&(r.host.clone(), mac));
            if !verify_claim(&claim_key, &self.network, mac, &r) {
                return Err(RecordError::ClaimSignature(r.host));
            }
            if let Some(group) = disallowed {
                self.wait_for_host(mac, &r, created);
                return Err(RecordError::GroupNotAllowed { group, host: r.host });
            }
            let (held_ms, held_by) = self.claimed_at.get(&mac).copied().unwrap_or((0, 0));
            let claimant = name_hash(&r.host);
            // A replay is the same host's older claim (only it writes its
            // keys); another host's claim is judged by the epoch below.
            if held_by == claimant && r.at_ms < held_ms {
                return Err(RecordError::StaleClaim { at_ms: r.at_ms, held_ms });
            }
            stamp = Some((r.at_ms, claimant));
        }
        // Kubernetes: a pod's claim may take a MAC from a live holder that
        // no pod backs, or whose claim is younger (checked there), whatever
        // the epochs.
        let created = self.created_of(mac, &r.host, created);
        let created = match self.policy.kube {
            true => self.vacated_created(mac, &r.host, created),
            false => created,
        };
        // After the signature: a write without the host's key counts no
        // gateway claim.
        self.check_gateway_claim(mac, &r, created)?;
        let pod_move = self.policy.kube && self.check_pod_claim(mac, &r, created)?;
        let held = self.epoch(mac);
        if let Some(&h) = self.macs.get(&mac).filter(|_| !pod_move) {
            if r.epoch > held.saturating_add(MAX_EPOCH_STEP) {
                return Err(RecordError::EpochJump { epoch: r.epoch, held });
            }
            // A lower epoch never moves a MAC (its holder's record briefly
            // absent or not); the same one only from a holder not live.
            let holder = &*self.names[h as usize];
            let live = self.records[h as usize].is_some();
            if holder != r.host && (r.epoch < held || (r.epoch == held && live)) {
                let (holder, claimant) = (holder.to_string(), r.host.clone());
                if self.conflicts.len() < CONFLICTS_SHOWN || self.conflicts.contains_key(&mac) {
                    self.conflicts.insert(mac, (holder.clone(), claimant.clone(), created, r));
                }
                return Err(RecordError::Conflict { holder, claimant, epoch: held });
            }
        }
        if !self.macs.contains_key(&mac) && self.macs.len() >= self.policy.max_macs {
            return Err(RecordError::TooManyMacs(self.policy.max_macs));
        }
        let Some(h) = self.id(&r.host) else { return Err(RecordError::TooManyHosts(self.policy.max_hosts)) };
        if let Some(stamp) = stamp {
            self.claimed_at.insert(mac, stamp);
        }
        if self.epochs.contains_key(&mac) || (r.epoch != 0 && self.epochs.len() < self.policy.max_macs) {
            self.epochs.insert(mac, r.epoch);
        }
        self.conflicts.remove(&mac);
        if self.policy.kube {
            self.hold_pod_claim(mac, &r, created);
        }
        keep_per_mac(&mut self.claim_groups, mac, r.groups, &mut self.groups_version);
        keep_per_mac(&mut self.addrs, mac, r.addrs, &mut self.addrs_version);
        self.put_mac(mac, h, out);
        Ok(())
    }

    /// Signed networks: `r` waits for its host's record (a place while
    /// fewer than `max_macs` wait; its own earlier claim it replaces).
    fn wait_for_host(&mut self, mac: MacAddr, r: &MacRecord, created: u64) {
        let k = (r.host.clone(), mac);
        if self.unverified.len() < self.policy.max_macs || self.unverified.contains_key(&k) {
            self.unverified.insert(k, (created, r.clone()));
        }
    }

    /// Signed networks: claims that waited for `host`'s record are checked
    /// now, in MAC order.
    pub(super) fn take_unverified(&mut self, host: &str, out: &mut Vec<Change>) {
        if self.unverified.is_empty() {
            return;
        }
        let mut waiting: Vec<(MacAddr, u64, MacRecord)> = self
            .unverified
            .iter()
            .filter(|((h, _), _)| h == host)
            .map(|((_, m), (c, r))| (*m, *c, r.clone()))
            .collect();
        waiting.sort_unstable_by_key(|(m, ..)| *m);
        for (mac, created, r) in waiting {
            let key = claim_key(&self.network, &r.host, mac);
            match self.take_claim(mac, r, created, out) {
                Ok(()) => {
                    self.quarantine.remove(&key);
                }
                Err(e) => {
                    self.count_gateway_claim(&e);
                    self.hold(key, e);
                }
            }
        }
    }

    fn put_mac(&mut self, mac: MacAddr, h: u32, out: &mut Vec<Change>) {
        let old = self.macs.insert(mac, h);
        if old == Some(h) {
            return;
        }
        if let Some(o) = old {
            let list = &mut self.by_host[o as usize];
            if let Some(i) = list.iter().position(|&m| m == mac) {
                list.swap_remove(i);
            }
        }
        self.by_host[h as usize].push(mac);
        let (before, after) = (old.filter(|&o| self.routed(o)), Some(h).filter(|&h| self.routed(h)));
        if before != after {
            out.push(self.route(mac, after));
        }
    }

    pub(super) fn delete_mac(&mut self, mac: MacAddr, out: &mut Vec<Change>) {
        self.held_created.remove(&mac);
        if let Some(c) = self.pod_claims.remove(&mac) {
            if self.by_pod.get(&c.pod) == Some(&mac) {
                self.by_pod.remove(&c.pod);
            }
        }
        keep_per_mac(&mut self.claim_groups, mac, Vec::new(), &mut self.groups_version);
        keep_per_mac(&mut self.addrs, mac, Vec::new(), &mut self.addrs_version);
        let Some(o) = self.macs.remove(&mac) else { return };
        let list = &mut self.by_host[o as usize];
        if let Some(i) = list.iter().position(|&m| m == mac) {
            list.swap_remove(i);
        }
        if self.routed(o) {
            out.push(self.route(mac, None));
        }
    }
}

/// A host name's hash, for [`Member`]'s claim times (a collision only
/// lets a tie of equal times through, and only between signed claims).
fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(name)
}

/// Keeps what a claim says of `mac` (`v`; nothing when empty) in `map`,
/// counting a change in `version`.
fn keep_per_mac<T: PartialEq>(
    map: &mut FxHashMap<MacAddr, Box<[T]>>,
    mac: MacAddr,
    v: Vec<T>,
    version: &mut u64,
) {
    let v = (!v.is_empty()).then(|| v.into_boxed_slice());
    if map.get(&mac) != v.as_ref() {
        *version += 1;
        match v {
            Some(v) => map.insert(mac, v),
            None => map.remove(&mac),
        };
    }
}
