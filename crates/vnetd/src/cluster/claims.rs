//! This host's claims of its interfaces' MACs, each under its own key
//! (`/vnet/NET/claims/HOST/MAC`, [`vnet_cluster::layout::claim_key`]):
//! claimed, put back, released, and given up when another host's claim
//! came first.

use super::error::{etcd, SessionError};
use super::{facts_of, lock, Facts, Host, Published};
use crate::membership;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::collections::BTreeMap;
use std::time::Instant;
use vnet_cluster::layout::{claim_key, parse_key, Key};
use vnet_cluster::{Event, MacRecord};
use vnet_wire::MacAddr;

impl Host {
    /// The MAC whose claim by this host `e` (already applied) changed or
    /// deleted while the view still gives it to this host: another
    /// writer's doing (a forged claim in a signed network, a deletion),
    /// not a move (a move's claim is taken, and the MAC is no longer ours)
    /// nor the echo of this host's own put (an older revision).
    pub(super) fn foreign_change_to_a_claim(&self, e: &Event) -> Option<MacAddr> {
        let Some(Key::Claim { host, mac }) = parse_key(self.member.prefix(), e.key()) else { return None };
        if host != self.cfg.host {
            return None;
        }
        let p = self.published.get(&mac)?;
        let changed = match e {
            Event::Put { value, rev, .. } => *rev > p.rev && *value != p.value,
            Event::Delete { rev, .. } => *rev > p.rev,
        };
        (changed && self.ours(mac)).then_some(mac)
    }

    /// Whether the store gives `mac` to this host (or to no host).
    pub(super) fn ours(&self, mac: MacAddr) -> bool {
        self.member.owner(mac).is_none_or(|o| o == self.member.me())
    }

    /// Puts this host's claim of `mac` for `iface` at `epoch` (the epoch
    /// the view holds, or above it for a migration), under this host's own
    /// key. `fresh` (no one held it): of two hosts claiming one MAC at
    /// once, each puts its own key; the one put first holds it in every
    /// view (the watch brings both in the store's order, so the caller
    /// does not take a fresh claim before the watch brings it), and the
    /// other gives its key up ([`Host::give_up_lost_claims`]).
    pub(super) async fn put_mac(
        &mut self,
        c: &mut Client,
        lease: i64,
        mac: MacAddr,
        iface: &str,
        epoch: u64,
        fresh: bool,
    ) -> Result<Option<Event>, SessionError> {
        let facts = facts_of(lock(&self.daemon).state(), self.member.tenant(), mac);
        let key = claim_key(&self.cfg.network, &self.cfg.host, mac);
        let value = self.mac_value(mac, iface, epoch, &facts);
        let put = PutOptions::new().with_lease(lease);
        let what = if fresh { "claim" } else { "put" };
        let r = self
            .wait(c.put(key.clone(), value.clone(), Some(put)))
            .await
            .map_err(etcd(format!("{what} {mac}")))?;
        let rev = r.header().map_or(0, |h| h.revision().max(0) as u64);
        if let Some(p) = self.published.get_mut(&mac) {
            p.value = value.clone();
            p.rev = rev;
            p.facts = facts;
        }
        // Its create revision: this put's when fresh (no one held it, so
        // the key is new), else not known here (0: the view keeps the one
        // the watch brought).
        let created = if fresh { rev } else { 0 };
        Ok(Some(Event::Put { key, value, rev, created }))
    }

    /// The value of a MAC's key naming this host and interface `iface`:
    /// the cluster's vnet network, `epoch`, the VM's addresses and groups,
    /// stamped with the time and, with a claim key, signed.
    pub(super) fn mac_value(&self, mac: MacAddr, iface: &str, epoch: u64, facts: &Facts) -> Vec<u8> {
        let mut r = MacRecord {
            host: self.cfg.host.clone(),
            iface: iface.to_string(),
            at_ms: membership::now_ms(),
            network: self.member.tenant(),
            epoch,
            addrs: facts.0.clone(),
            groups: facts.1.clone(),
            sig: None,
        };
        r.sig = self.cfg.claim_key.as_ref().map(|k| k.sign(&self.cfg.network, mac, &r));
        r.to_json()
    }

    /// Claims the MACs of interfaces (of the cluster's network) declared
    /// since the last look and releases those of interfaces deleted since.
    /// A MAC another live host holds is claimed only by a migration (an
    /// interface activated from standby: its VM arrived, or `activate`),
    /// at the epoch above the held one; otherwise it is a conflict, shown
    /// in `show cluster` and tried again as the view changes (the holder
    /// may release it), never taken for being newer.
    pub(super) async fn publish(&mut self, c: &mut Client, lease: i64) -> Result<(), SessionError> {
        let tenant = self.member.tenant();
        type Now = (u32, String, bool, Facts);
        let now: BTreeMap<MacAddr, Now> = {
            let d = lock(&self.daemon);
            // A standby interface's MAC is claimed when its VM arrives.
            let active = d.state().interfaces.values().filter(|i| !i.standby && i.network == tenant);
            active
                .filter_map(|i| {
                    let mac = i.mac?;
                    Some((mac, (i.id, i.name.clone(), d.moved_in(i.id), facts_of(d.state(), tenant, mac))))
                })
                .collect()
        };
        let gone: Vec<MacAddr> = self
            .published
            .iter()
            .filter(|(m, p)| now.get(m).is_none_or(|(id, ..)| *id != p.iface))
            .map(|(m, _)| *m)
            .collect();
        for mac in gone {
            let Some(p) = self.published.remove(&mac) else { continue };
            // Deleted only while it still names this host: a VM that moved
            // away belongs to its new host.
            let key = claim_key(&self.cfg.network, &self.cfg.host, mac);
            let txn = Txn::new()
                .when([Compare::value(key.clone(), CompareOp::Equal, p.value)])
                .and_then([TxnOp::delete(key, None)]);
            self.wait(c.txn(txn)).await.map_err(etcd(format!("release {mac}")))?;
            lock(&self.status).counters.macs_released += 1;
        }
        let mut unclaimed = BTreeMap::new();
        let me = self.cfg.host.clone();
        for (mac, (id, name, migration, facts)) in now {
            // Claimed already; put again when its addresses or groups changed.
            let again = match self.published.get(&mac) {
                Some(p) if p.iface == id && p.facts == facts => continue,
                Some(p) => p.iface == id,
                None => false,
            };
            let owner = self.member.owner(mac).map(str::to_string);
            let held_elsewhere = owner.as_deref().is_some_and(|o| o != me && self.member.live(o));
            if held_elsewhere && !migration {
                let holder = owner.unwrap_or_default();
                if !self.unclaimed.contains_key(&mac) {
                    tracing::warn!(%mac, interface = %name, %holder, "cluster: conflict: host {holder} holds this MAC; \
                        interface {name} is not claimed nor routed here until it releases it (a migration here, \
                        `vnetctl move`, takes it; delete one of the two interfaces to settle it)");
                    lock(&self.status).counters.conflicts += 1;
                }
                unclaimed.insert(mac, (holder, name));
                continue;
            }
            // A migration claims one epoch up (saturating: never a panic).
            let epoch = if migration { self.member.next_epoch(mac) } else { self.member.epoch(mac) };
            let t0 = Instant::now();
            let fresh = owner.is_none() && !migration;
            let Some(put) = self.put_mac(c, lease, mac, &name, epoch, fresh).await? else {
                // Another host's claim came first: the watch brings it.
                unclaimed.insert(mac, (String::new(), name));
                continue;
            };
            let value = match &put {
                Event::Put { value, .. } => value.clone(),
                Event::Delete { .. } => Vec::new(),
            };
            self.published.insert(mac, Published { iface: id, name, value, facts, rev: put.rev() });
            if again {
                continue;
            }
            lock(&self.daemon).claimed(id);
            lock(&self.status).counters.macs_claimed += 1;
            // The host takes its own claim at once rather than when the
            // watch brings it back (a fresh one in the store's order, when
            // the watch brings it), and, if the VM moved here, says so.
            if !fresh {
                let mut changes = Vec::new();
                self.member.apply(&put, &mut changes);
                self.converge(&changes, 1, t0);
            }
            if held_elsewhere || (migration && owner.is_some_and(|o| o != me)) {
                let said = lock(&self.daemon).announce(mac);
                lock(&self.status).counters.announces += 1;
                tracing::info!(%mac, "cluster: a migration brought this MAC here (epoch {epoch}); {}", said.trim_end());
            }
        }
        self.unclaimed = unclaimed;
        self.unclaimed_rev = self.member.revision();
        let mut s = lock(&self.status);
        s.owned = self.published.keys().filter(|&&m| self.ours(m)).count();
        s.unclaimed = self.unclaimed.iter().map(|(m, (h, i))| (*m, h.clone(), i.clone())).collect();
        Ok(())
    }

    /// Claims of this host that lost to another host's (two hosts claimed
    /// one MAC at once: the other was first in the store): the key is given
    /// up, the interface is in conflict (not claimed, not routed here) and
    /// is claimed again once the holder releases the MAC.
    pub(super) async fn give_up_lost_claims(&mut self, c: &mut Client) -> Result<(), SessionError> {
        let me = self.cfg.host.clone();
        let lost: Vec<(MacAddr, String)> = self
            .member
            .conflicts()
            .filter(|(m, _, claimant)| *claimant == me && self.published.contains_key(m))
            .map(|(m, holder, _)| (m, holder.to_string()))
            .collect();
        for (mac, holder) in lost {
            let Some(p) = self.published.remove(&mac) else { continue };
            let key = claim_key(&self.cfg.network, &me, mac);
            let txn = Txn::new()
                .when([Compare::value(key.clone(), CompareOp::Equal, p.value)])
                .and_then([TxnOp::delete(key, None)]);
            self.wait(c.txn(txn)).await.map_err(etcd(format!("give up {mac}")))?;
            tracing::warn!(%mac, interface = %p.name, %holder, "cluster: conflict: host {holder} claimed this MAC first; \
                this host's claim is given up until it releases it");
            lock(&self.status).counters.conflicts += 1;
            self.unclaimed.insert(mac, (holder, p.name));
        }
        Ok(())
    }
}
