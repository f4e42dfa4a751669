//! Node gateways (vnet-cni's `isDefaultGateway`) as the hosts' records
//! name them: the only addresses `--kube-network-policy` may take as
//! translators of Services, and MACs no other host takes.
//!
//! A host's record names at most one gateway, its address and MAC, signed
//! in a signed network by the host's claim key (which the host's etcd
//! credential alone cannot sign with): a value in the store that a writer
//! without the host's private key puts there is no gateway. Only a live
//! host's gateway counts; the daemon then keeps of these only the one
//! whose address the host holds in the IPAM as the winning allocation of
//! its gateway owner (`vnetd` `ipam.rs`).
//!
//! A MAC a live host holds and its record names as its gateway does not
//! move: another host's claim of it is refused and counted
//! ([`super::MemberStats::gateway_claims`]), whatever its epoch. On
//! Kubernetes (`kube`) only while the holder's claim names no address
//! and is not younger than the claim if the API backs it (an older pod
//! claim takes the MAC); the refused claim waits, taken again when the
//! holder's record or claim changes. A host names its gateway only once it
//! holds its MAC (vnetd), so naming another's MAC (a thief's record)
//! protects nothing the namer does not hold. The gateway's address needs
//! no rule here on Kubernetes (`kube`): a claim naming an address counts
//! only for a pod the API places on the claimant, and a gateway is no pod
//! (such a claim waits, [`RecordError::PodUnknown`]).

use super::{Member, RecordError};
use crate::layout::{HostRecord, MacRecord};
use crate::trust::verify_gateway;
use std::net::IpAddr;
use vnet_wire::MacAddr;

impl Member {
    /// Host `name`'s record's gateway, checked: a unicast address and MAC
    /// and, where the network has a key, the signature of `claim_key` (its
    /// certificate's).
    pub(super) fn check_gateway(
        &self,
        name: &str,
        r: &HostRecord,
        claim_key: Option<[u8; 32]>,
    ) -> Result<Option<(IpAddr, MacAddr)>, RecordError> {
        let Some(g) = &r.gateway else { return Ok(None) };
        let a = g.addr;
        let broadcast = matches!(a, IpAddr::V4(v4) if v4.is_broadcast());
        if a.is_unspecified() || a.is_multicast() || a.is_loopback() || broadcast {
            return Err(RecordError::Gateway);
        }
        if g.mac.0[0] & 1 != 0 || g.mac == MacAddr::default() {
            return Err(RecordError::Gateway);
        }
        if self.policy.network_key.is_some() {
            let key = claim_key.ok_or(RecordError::Gateway)?;
            if !verify_gateway(&key, (&self.network, name), g.mac, a, g.sig.as_deref()) {
                return Err(RecordError::Gateway);
            }
        }
        Ok(Some((a, g.mac)))
    }

    /// Every live host's node gateway (this host's too): its name, address
    /// and MAC, by name.
    pub fn gateways(&self) -> Vec<(&str, IpAddr, MacAddr)> {
        let mut out: Vec<(&str, IpAddr, MacAddr)> = self
            .records
            .iter()
            .enumerate()
            .filter_map(|(h, p)| {
                let (a, m) = p.as_ref()?.gateway?;
                Some((&*self.names[h], a, m))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether claim `r` of `mac` (its key created at revision `created`)
    /// may stand: not if another live host holds `mac` and its record
    /// names it as its gateway, and on Kubernetes the holder's claim names
    /// no address and is not younger than `r` if a pod backs `r` (then
    /// `r` waits, taken again when the holder's record or claim changes).
    pub(super) fn check_gateway_claim(
        &mut self,
        mac: MacAddr,
        r: &MacRecord,
        created: u64,
    ) -> Result<(), RecordError> {
        let Some(&h) = self.macs.get(&mac) else { return Ok(()) };
        let holder = &*self.names[h as usize];
        let gateway = self.records[h as usize].as_ref().and_then(|p| p.gateway);
        if holder == r.host || gateway.is_none_or(|(_, m)| m != mac) {
            return Ok(());
        }
        let e = RecordError::GatewayMac { mac, host: holder.to_string() };
        if !self.policy.kube {
            return Err(e);
        }
        if self.addrs.contains_key(&mac) || self.pod_claim_older(mac, r, created) {
            return Ok(());
        }
        self.wait_for_pod(mac, r, created);
        Err(e)
    }

    /// Kubernetes: whether `r` is a claim the API backs (this host's: one
    /// naming an address) whose key was created before the holder's of
    /// `mac` (both known).
    fn pod_claim_older(&self, mac: MacAddr, r: &MacRecord, created: u64) -> bool {
        let backed = match r.host == self.me {
            true => !r.addrs.is_empty(),
            false => matches!(self.backing(r), Ok(Some(_))),
        };
        let held = self.held_created.get(&mac).copied().unwrap_or(0);
        backed && created != 0 && held != 0 && created < held
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::tests::{mac, signed_cert, signed_view, sync};
    use super::*;
    use crate::layout::fixtures::Claims;
    use crate::layout::{claim_key, host_key, Gateway};
    use crate::store::MemStore;
    use crate::trust::{ClaimKey, NetworkKey};

    fn gw_ip() -> IpAddr {
        IpAddr::from([10, 244, 0, 200])
    }

    /// Host `h{h}`'s record (certified by `nk` when given), naming
    /// gateway (`gw_ip`, `mac(7)`) signed by host `h{signer}`'s claim key.
    pub(crate) fn record(nk: Option<&NetworkKey>, h: u8, gateway: Option<(MacAddr, Option<u8>)>) -> Vec<u8> {
        let gateway = gateway.map(|(m, signer)| Gateway {
            addr: gw_ip(),
            mac: m,
            sig: signer
                .map(|s| ClaimKey::derive(&[s; 32]).unwrap().sign_gateway("n", &format!("h{h}"), m, gw_ip())),
        });
        HostRecord {
            addr: format!("10.0.0.{h}:9000").parse().unwrap(),
            kinds: vec![],
            public_key: Some(vnet_control::PeerKey([h; 32]).to_string()),
            cert: nk.map(|nk| signed_cert(nk, h, h, None)),
            relay: false,
            gateway,
        }
        .to_json()
    }

    fn claim(h: u8, m: MacAddr, epoch: u64, addrs: &[IpAddr]) -> Vec<u8> {
        let mut r = MacRecord {
            host: format!("h{h}"),
            iface: "vc0".into(),
            at_ms: 1000 + epoch,
            epoch,
            addrs: addrs.to_vec(),
            ..Default::default()
        };
        r.sig = Some(ClaimKey::derive(&[h; 32]).unwrap().sign("n", m, &r));
        r.to_json()
    }

    fn why(m: &Member, key: &str) -> String {
        m.quarantined().find(|(q, _)| *q == key).map(|(_, e)| e.to_string()).unwrap_or_default()
    }

    /// A gateway counts only signed by its host's claim key: h2's record
    /// naming a gateway signed by another key (h3's: a writer with h2's
    /// etcd credential only), or unsigned, is refused and names none;
    /// signed by h2, it is h2's, and it goes with h2's record. A record
    /// from before (no `gateway`) is taken and names none. Positive
    /// control: in an open network (no network key) the unsigned one is
    /// taken as written, as every record there is.
    #[test]
    fn a_gateway_counts_only_signed_by_its_hosts_claim_key_and_while_its_host_lives() {
        let nk = NetworkKey::generate().unwrap();
        let mut m = signed_view(&nk, "h1");
        let mut s = MemStore::new();
        let k2 = host_key("n", "h2");
        s.put(&k2, record(Some(&nk), 2, None), None);
        sync(&mut m, &s);
        assert!(m.live("h2") && m.gateways().is_empty(), "an older record: taken, no gateway");
        for forged in [Some(3), None] {
            s.put(&k2, record(Some(&nk), 2, Some((mac(7), forged))), None);
            sync(&mut m, &s);
            assert!(m.gateways().is_empty(), "forged by {forged:?}: {:?}", m.gateways());
            assert!(why(&m, &k2).contains("`gateway`"), "{}", why(&m, &k2));
        }
        s.put(&k2, record(Some(&nk), 2, Some((mac(7), Some(2)))), None);
        sync(&mut m, &s);
        assert_eq!(m.gateways(), [("h2", gw_ip(), mac(7))]);
        s.delete_if(&k2, None);
        sync(&mut m, &s);
        assert!(m.gateways().is_empty(), "h2 gone, its gateway too");
        // The control: no network key, the unsigned gateway is taken.
        let mut open = Member::with_policy("n", "h1", crate::Policy { have_key: true, ..Default::default() });
        s.put(&k2, record(None, 2, Some((mac(7), None))), None);
        sync(&mut open, &s);
        assert_eq!(open.gateways(), [("h2", gw_ip(), mac(7))]);
    }

    /// h3's gateway MAC (mac 7, held by h3): h2's claim of it at a
    /// higher epoch (a migration, else) and h2's claim after naming it in
    /// its own record are refused and counted; h3 keeps it. h2's record
    /// naming h3's other MAC (8, no gateway) protects nothing: h3 keeps it
    /// and h2's claim of it is the conflict it always was. Positive
    /// control: h3's record without the gateway, the same migration moves
    /// the MAC to h2.
    #[test]
    fn a_claim_of_a_live_hosts_gateway_mac_is_refused_and_counted() {
        let nk = NetworkKey::generate().unwrap();
        for guarded in [true, false] {
            let mut m = signed_view(&nk, "h1");
            let mut s = MemStore::new();
            s.put(&host_key("n", "h2"), record(Some(&nk), 2, None), None);
            let gw = guarded.then_some((mac(7), Some(3)));
            s.put(&host_key("n", "h3"), record(Some(&nk), 3, gw), None);
            s.put_claim(mac(7), claim(3, mac(7), 0, &[]), None);
            s.put_claim(mac(8), claim(3, mac(8), 0, &[]), None);
            sync(&mut m, &s);
            assert_eq!(m.route_of(mac(7)), Some("h3"));
            s.put_claim(mac(7), claim(2, mac(7), 1, &[]), None);
            sync(&mut m, &s);
            if !guarded {
                assert_eq!(m.route_of(mac(7)), Some("h2"), "control: a migration moves it");
                continue;
            }
            assert_eq!((m.route_of(mac(7)), m.stats.gateway_claims), (Some("h3"), 1));
            let w = why(&m, &claim_key("n", "h2", mac(7)));
            assert!(w.contains("is host `h3`'s node gateway"), "{w}");
            // A thief's record copying h3's gateway: still h3's.
            s.put(&host_key("n", "h2"), record(Some(&nk), 2, Some((mac(7), Some(2)))), None);
            s.put_claim(mac(7), claim(2, mac(7), 2, &[]), None);
            sync(&mut m, &s);
            assert_eq!((m.route_of(mac(7)), m.stats.gateway_claims), (Some("h3"), 2));
            // Naming h3's MAC 8 protects nothing for h2, nor takes it.
            s.put(&host_key("n", "h2"), record(Some(&nk), 2, Some((mac(8), Some(2)))), None);
            s.put_claim(mac(8), claim(3, mac(8), 0, &[]), None);
            s.put_claim(mac(8), claim(2, mac(8), 0, &[]), None);
            sync(&mut m, &s);
            assert_eq!((m.route_of(mac(8)), m.stats.gateway_claims), (Some("h3"), 2));
            let mut fresh = signed_view(&nk, "h1");
            sync(&mut fresh, &s);
            assert_eq!(
                (fresh.route_of(mac(7)), fresh.route_of(mac(8))),
                (Some("h3"), Some("h3")),
                "a new view"
            );
        }
    }

    /// On Kubernetes (`kube`), a pod's claim takes a MAC from a live
    /// holder no pod backs (a node's gateway interface): h2's pod's claim
    /// of h3's gateway MAC. Refused and counted where h3's record names
    /// it; the control, h3's record without it, lets the pod's claim take
    /// it (the review's finding).
    #[test]
    fn a_pods_claim_takes_no_live_nodes_gateway_mac() {
        use super::super::{PodFacts, PodPlace};
        let nk = NetworkKey::generate().unwrap();
        let pod_ip = IpAddr::from([10, 244, 0, 4]);
        for guarded in [true, false] {
            let mut m = signed_view(&nk, "h1");
            m.policy.kube = true;
            let mut s = MemStore::new();
            s.put(&host_key("n", "h2"), record(Some(&nk), 2, None), None);
            let gw = guarded.then_some((mac(7), Some(3)));
            s.put(&host_key("n", "h3"), record(Some(&nk), 3, gw), None);
            s.put_claim(mac(7), claim(3, mac(7), 0, &[]), None);
            sync(&mut m, &s);
            let d = PodPlace {
                pod: "default/d".into(),
                node: "h2".into(),
                ips: vec![pod_ip],
                groups: vec![],
                terminating: false,
            };
            m.set_pods(std::sync::Arc::new(PodFacts::new([d])), &mut Vec::new());
            s.put_claim(mac(7), claim(2, mac(7), 0, &[pod_ip]), None);
            sync(&mut m, &s);
            match guarded {
                true => assert_eq!((m.route_of(mac(7)), m.stats.gateway_claims), (Some("h3"), 1)),
                false => assert_eq!(m.route_of(mac(7)), Some("h2"), "control: the pod's claim takes it"),
            }
        }
    }
}
