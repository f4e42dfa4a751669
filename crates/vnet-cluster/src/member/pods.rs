//! Kubernetes (`vnetd --kube`): claims bound to the API server's pods.
//!
//! On Kubernetes a host's certificate and etcd user say which node it is;
//! what its claims may say is the API server's to say. A claim by another
//! host that names addresses is taken only if the API shows one pod with
//! every one of them, scheduled to that host (`spec.nodeName`, the node's
//! name being its host name): a node cannot claim another node's pod's
//! address, nor an address no pod has. A claim the API contradicts (the
//! address is another node's pod's, its addresses are two pods') is
//! quarantined and counted ([`super::MemberStats::pods_refused`]); one
//! the API does not know of yet (the kubelet reports a pod's address after
//! the CNI plugin claimed it) waits, and both are checked again whenever
//! the API's view changes ([`Member::set_pods`]). A claim taken stops
//! counting when the API stops backing it (its pod deleted, its address
//! given to a pod of another node): its MAC goes and the claim waits.
//!
//! A pod does not move from node to node: a MAC another live host holds
//! for a pod the API still places there is not taken by any claim,
//! whatever its epoch ([`RecordError::PodStays`]); a claim naming no
//! address (a node's own gateway interface, which is no pod) takes no
//! MAC from a live host either. A pod's claim takes a MAC from a live
//! holder only when the holder's claim is backed by no pod.
//!
//! Groups are the API's too: a MAC's groups are its pod's labels' as the
//! caller derived them (`groupLabels` in the pod's namespace), whatever
//! the claim names; a claim without a pod has none. The facts come from
//! the caller (vnetd's watch of the pods): nothing here does I/O.

use super::{Change, Member, PodClaim, RecordError};
use crate::layout::{claim_key, MacRecord};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use vnet_wire::MacAddr;

/// A pod as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlace {
    /// `NAMESPACE/NAME`.
    pub pod: String,
    /// The node it is scheduled to (`spec.nodeName`).
    pub node: String,
    /// Its addresses (`status.podIPs`).
    pub ips: Vec<IpAddr>,
    /// Its policy groups, from its labels (the caller's derivation).
    pub groups: Vec<String>,
    /// Being deleted (`metadata.deletionTimestamp`): its address may be
    /// another pod's already.
    pub terminating: bool,
}

/// Who has an address, by the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    Pod(usize),
    /// Pods of different nodes (none being deleted, or all): no one's.
    Ambiguous,
}

/// What the API says of the pods on the network's addresses: each
/// address's pod. Of pods sharing an address, one not being deleted wins
/// over those being deleted (the address was given again); two of the
/// same kind on different nodes make the address no one's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pods: Vec<PodPlace>,
    by_addr: BTreeMap<IpAddr, Placed>,
}

impl PodFacts {
    /// The facts of `pods` (pods on the node's network, with addresses:
    /// the caller leaves out host-network pods and finished ones).
    pub fn new(pods: impl IntoIterator<Item = PodPlace>) -> Self {
        let pods: Vec<PodPlace> = pods.into_iter().collect();
        let mut at: BTreeMap<IpAddr, Vec<usize>> = BTreeMap::new();
        for (i, p) in pods.iter().enumerate() {
            for ip in &p.ips {
                at.entry(vnet_control::canonical(*ip)).or_default().push(i);
            }
        }
        let by_addr = at
            .into_iter()
            .map(|(ip, all)| {
                let live: Vec<usize> = all.iter().copied().filter(|&i| !pods[i].terminating).collect();
                let some = if live.is_empty() { all } else { live };
                let first = &pods[some[0]];
                let one = some.iter().all(|&i| pods[i].node == first.node && pods[i].pod == first.pod);
                (ip, if one { Placed::Pod(some[0]) } else { Placed::Ambiguous })
            })
            .collect();
        PodFacts { pods, by_addr }
    }

    /// The pod the API gives `ip` to (`None`: none, or pods of two nodes).
    pub fn pod_at(&self, ip: IpAddr) -> Option<&PodPlace> {
        match self.by_addr.get(&vnet_control::canonical(ip))? {
            Placed::Pod(i) => self.pods.get(*i),
            Placed::Ambiguous => None,
        }
    }

    /// Pods known.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

impl RecordError {
    /// A claim the API contradicts (counted in `pods_refused`), as
    /// opposed to one waiting for the API to hear of its pod.
    pub fn refused_by_api(&self) -> bool {
        matches!(
            self,
            RecordError::PodElsewhere { .. }
                | RecordError::PodsDiffer { .. }
                | RecordError::PodStays { .. }
                | RecordError::PodHasMac { .. }
        )
    }
}

impl Member {
    /// Kubernetes: the API's pods as they are now. Claims taken that the
    /// API no longer backs go (their routes, addresses and groups) and
    /// wait, as does the younger of two claims one pod now backs; claims
    /// that waited are checked again, each MAC's oldest first (by create
    /// revision); every MAC's groups are derived anew. Before the first
    /// call every other host's claim naming an address waits
    /// ([`RecordError::PodsNotListed`]).
    pub fn set_pods(&mut self, facts: Arc<PodFacts>, out: &mut Vec<Change>) {
        if self.pods.as_deref() == Some(&*facts) {
            return;
        }
        self.pods = Some(facts);
        self.groups_version += 1;
        let mut gone: Vec<(MacAddr, RecordError)> = Vec::new();
        let mut kept: Vec<(u64, MacAddr, String)> = Vec::new();
        for (mac, c) in &self.pod_claims {
            match self.backing(&c.r) {
                Ok(Some(pod)) => kept.push((c.created, *mac, pod)),
                Ok(None) => {}
                Err(e) => gone.push((*mac, e)),
            }
        }
        // One MAC a pod: the oldest claim keeps it.
        kept.sort_unstable();
        self.by_pod.clear();
        for (_, mac, pod) in kept {
            match self.by_pod.get(&pod) {
                Some(&first) => gone.push((mac, RecordError::PodHasMac { pod, mac: first })),
                None => {
                    if let Some(c) = self.pod_claims.get_mut(&mac) {
                        c.pod.clone_from(&pod);
                    }
                    self.by_pod.insert(pod, mac);
                }
            }
        }
        gone.sort_unstable_by_key(|(m, _)| *m);
        for (mac, e) in gone {
            let Some(c) = self.pod_claims.remove(&mac) else { continue };
            self.delete_mac(mac, out);
            self.stats.pods_refused += u64::from(matches!(e, RecordError::PodHasMac { .. }));
            self.hold(claim_key(&self.network, &c.r.host, mac), e);
            self.wait_for_pod(mac, &c.r, c.created);
        }
        self.prune_vacated();
        let waiting = std::mem::take(&mut self.pod_waiting);
        self.waiting_per_host.clear();
        let mut waiting: Vec<((MacAddr, String), (u64, MacRecord))> = waiting.into_iter().collect();
        waiting.sort_unstable_by(|a, b| (a.0 .0, a.1 .0, &a.0 .1).cmp(&(b.0 .0, b.1 .0, &b.0 .1)));
        for ((mac, host), (created, r)) in waiting {
            self.retake(&host, mac, r, created, out);
        }
    }

    /// Whether this view binds claims to the API's pods (`--kube`).
    pub fn bound_to_pods(&self) -> bool {
        self.policy.kube
    }

    /// The API's pods as last told (none: not yet).
    pub fn pods(&self) -> Option<&PodFacts> {
        self.pods.as_deref()
    }

    /// Claims waiting for the API (or refused by it), of all hosts.
    pub fn pods_waiting(&self) -> usize {
        self.pod_waiting.len()
    }

    /// Takes `r` again (a claim that waited), keeping the quarantine true.
    pub(super) fn retake(
        &mut self,
        host: &str,
        mac: MacAddr,
        r: MacRecord,
        created: u64,
        out: &mut Vec<Change>,
    ) {
        let key = claim_key(&self.network, host, mac);
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

    /// The claims of `mac` that waited, taken again, oldest first.
    pub(super) fn retake_waiting(&mut self, mac: MacAddr, out: &mut Vec<Change>) {
        let mut waited: Vec<(u64, String, MacRecord)> = self
            .pod_waiting
            .range((mac, String::new())..)
            .take_while(|((m, _), _)| *m == mac)
            .map(|((_, h), (c, r))| (*c, h.clone(), r.clone()))
            .collect();
        waited.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        for (created, h, r) in waited {
            self.unwait(mac, &h);
            self.retake(&h, mac, r, created, out);
        }
    }

    /// The pod that backs claim `r` by the API: `None` for a claim naming
    /// no address (no pod's); an error when the API does not place one
    /// pod with all its addresses on the claimant's node.
    pub(super) fn backing(&self, r: &MacRecord) -> Result<Option<String>, RecordError> {
        if r.addrs.is_empty() {
            return Ok(None);
        }
        let Some(facts) = self.pods.as_deref() else { return Err(RecordError::PodsNotListed) };
        let mut pod: Option<&PodPlace> = None;
        for &addr in &r.addrs {
            let Some(p) = facts.pod_at(addr) else { return Err(RecordError::PodUnknown(addr)) };
            if p.node != r.host {
                return Err(RecordError::PodElsewhere { addr, node: p.node.clone(), host: r.host.clone() });
            }
            match pod {
                Some(q) if q.pod != p.pod => {
                    return Err(RecordError::PodsDiffer { a: q.pod.clone(), b: p.pod.clone() })
                }
                _ => pod = Some(p),
            }
        }
        Ok(pod.map(|p| p.pod.clone()))
    }

    /// Kubernetes: whether claim `r` of `mac` (checked, signed; its key
    /// created at revision `created`, 0 when not known) may be taken by
    /// the API's pods and the order of the MAC's claims; what it must
    /// wait for or why it is refused otherwise (the claim then waits,
    /// checked again on the API's next change or when the MAC's holder
    /// goes). Returns whether it takes the MAC from a live holder (a move
    /// the epochs are not asked about). This host's own claims are its
    /// interfaces' (it knows them; the API may not have their pods'
    /// addresses yet): backed when they name an address, never made to
    /// wait; they take a MAC only from a holder no pod backs or a younger
    /// claim, and otherwise meet the epochs (a conflict).
    pub(super) fn check_pod_claim(
        &mut self,
        mac: MacAddr,
        r: &MacRecord,
        created: u64,
    ) -> Result<bool, RecordError> {
        let own = r.host == self.me;
        let pod = match own {
            true => (!r.addrs.is_empty()).then(String::new),
            false => self.backing(r).inspect_err(|_| self.wait_for_pod(mac, r, created))?,
        };
        let takes = self.holder_gives_way(mac, r, created, pod.as_deref())?;
        if !own {
            // A MAC kept for its pod's node while its claim is gone.
            if let Some(e) = self.vacated_for(mac, &r.host) {
                self.wait_for_pod(mac, r, created);
                return Err(e);
            }
            // An older claim of the MAC waiting for the API holds it for itself.
            if let Some(first) = self.reserved_by(mac, &r.host, created) {
                self.wait_for_pod(mac, r, created);
                return Err(RecordError::PodReserved { first, claimant: r.host.clone() });
            }
            // One MAC a pod: another MAC its pod's claim holds stays.
            let other = pod.as_ref().and_then(|p| self.by_pod.get(p)).copied().filter(|&m| m != mac);
            if let (Some(pod), Some(other)) = (pod, other) {
                self.wait_for_pod(mac, r, created);
                return Err(RecordError::PodHasMac { pod, mac: other });
            }
        }
        if takes {
            // The holder's claim gives way: it waits (taken again if this one goes).
            if let Some(c) = self.pod_claims.get(&mac).filter(|c| c.r.host != r.host).cloned() {
                let e =
                    RecordError::PodStays { holder: r.host.clone(), claimant: c.r.host.clone(), pod: None };
                self.hold(claim_key(&self.network, &c.r.host, mac), e);
                self.wait_for_pod(mac, &c.r, c.created);
            }
        }
        Ok(takes)
    }

    /// Kubernetes: whether a live other host holding `mac` gives it to
    /// claim `r` (of `pod`, `None`: no pod's): only to a pod's claim,
    /// from a holder whose claim no pod backs or is younger, never from
    /// this host. Another host's claim it does not go to waits (an
    /// error); this host's meets the epochs.
    fn holder_gives_way(
        &mut self,
        mac: MacAddr,
        r: &MacRecord,
        created: u64,
        pod: Option<&str>,
    ) -> Result<bool, RecordError> {
        let Some(&h) = self.macs.get(&mac) else { return Ok(false) };
        let holder = &*self.names[h as usize];
        if holder == r.host || self.records[h as usize].is_none() {
            return Ok(false);
        }
        let held = self.pod_claims.get(&mac).filter(|c| c.r.host == holder);
        let younger = created != 0 && self.held_created.get(&mac).is_some_and(|&c| c > created);
        if pod.is_some() && holder != self.me && (held.is_none() || younger) {
            return Ok(true);
        }
        if r.host == self.me {
            return Ok(false);
        }
        let pod = held.map(|c| c.pod.clone());
        let e = RecordError::PodStays { holder: holder.to_string(), claimant: r.host.clone(), pod };
        self.wait_for_pod(mac, r, created);
        Err(e)
    }

    /// A claim's create revision: `created`, or when not known (0, this
    /// host's own put again) the one kept for `host`'s claim holding `mac`.
    pub(super) fn created_of(&self, mac: MacAddr, host: &str, created: u64) -> u64 {
        match created {
            0 => self.held_created.get(&mac).copied().filter(|_| self.owner(mac) == Some(host)).unwrap_or(0),
            c => c,
        }
    }

    /// Kubernetes: the host whose claim of `mac`, older than `created`,
    /// waits for the API to hear of its pod (not one the API refuses):
    /// it holds the MAC against `host`'s younger claim.
    fn reserved_by(&self, mac: MacAddr, host: &str, created: u64) -> Option<String> {
        let waits = |w: &MacRecord| {
            matches!(self.backing(w), Err(RecordError::PodsNotListed | RecordError::PodUnknown(_)))
        };
        self.pod_waiting
            .range((mac, String::new())..)
            .take_while(|((m, _), _)| *m == mac)
            .find(|((_, h), (c, w))| h != host && *c != 0 && *c < created && waits(w))
            .map(|((_, h), _)| h.clone())
    }

    /// Kubernetes: `r` taken; another host's claim a pod backs is kept
    /// with its pod (the pod's MAC), this host's and those naming no
    /// address are not; the claim's create revision is kept.
    pub(super) fn hold_pod_claim(&mut self, mac: MacAddr, r: &MacRecord, created: u64) {
        self.unwait(mac, &r.host);
        self.unvacate(mac, &r.host);
        if let Some(c) = self.pod_claims.remove(&mac) {
            if self.by_pod.get(&c.pod) == Some(&mac) {
                self.by_pod.remove(&c.pod);
            }
        }
        self.held_created.insert(mac, created);
        let pod = match r.host != self.me {
            true => self.backing(r).ok().flatten(),
            false => None,
        };
        if let Some(pod) = pod {
            self.by_pod.insert(pod.clone(), mac);
            self.pod_claims.insert(mac, PodClaim { created, pod, r: r.clone() });
        }
    }

    /// Kubernetes: `r` waits for the API (a place while its host has fewer
    /// than `max_pod_waiting` waiting and all hosts fewer than
    /// `max_macs`; its own earlier claim it replaces; else counted in
    /// `pods_waiting_dropped`).
    pub(super) fn wait_for_pod(&mut self, mac: MacAddr, r: &MacRecord, created: u64) {
        let k = (mac, r.host.clone());
        if let Some(w) = self.pod_waiting.get_mut(&k) {
            *w = (created, r.clone());
            return;
        }
        let n = self.waiting_per_host.get(&r.host).copied().unwrap_or(0);
        if n >= self.policy.max_pod_waiting || self.pod_waiting.len() >= self.policy.max_macs {
            self.stats.pods_waiting_dropped += 1;
            return;
        }
        self.pod_waiting.insert(k, (created, r.clone()));
        *self.waiting_per_host.entry(r.host.clone()).or_default() += 1;
    }

    /// Kubernetes: `host`'s claim of `mac` waits no more.
    pub(super) fn unwait(&mut self, mac: MacAddr, host: &str) {
        if self.pod_waiting.is_empty() || self.pod_waiting.remove(&(mac, host.to_string())).is_none() {
            return;
        }
        if let Some(n) = self.waiting_per_host.get_mut(host) {
            *n -= 1;
            if *n == 0 {
                self.waiting_per_host.remove(host);
            }
        }
    }

    /// Kubernetes: the groups of each MAC whose claim a pod backs: its
    /// pod's, by the API (this host's MACs too).
    pub(super) fn pod_groups(&self) -> BTreeMap<MacAddr, Vec<String>> {
        let mut out = BTreeMap::new();
        let Some(facts) = self.pods.as_deref() else { return out };
        for (mac, addrs) in &self.addrs {
            let Some(&h) = self.macs.get(mac) else { continue };
            let host = &*self.names[h as usize];
            let pod = addrs.first().and_then(|a| facts.pod_at(*a)).filter(|p| p.node == host);
            let Some(p) = pod.filter(|p| addrs.iter().all(|a| facts.pod_at(*a) == Some(*p))) else {
                continue;
            };
            if !p.groups.is_empty() {
                out.insert(*mac, p.groups.clone());
            }
        }
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::tests::{mac, signed_cert, signed_record, signed_view, sync};
    use super::*;
    use crate::layout::fixtures::Claims;
    use crate::layout::host_key;
    use crate::store::MemStore;
    use crate::trust::{ClaimKey, NetworkKey};
    use crate::Policy;

    pub(crate) fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 244, 0, last])
    }

    pub(crate) fn pod(name: &str, node: &str, last: u8, groups: &[&str]) -> PodPlace {
        PodPlace {
            pod: format!("default/{name}"),
            node: node.into(),
            ips: vec![ip(last)],
            groups: groups.iter().map(|g| g.to_string()).collect(),
            terminating: false,
        }
    }

    /// Host `h{h}`'s signed claim of `m` at `epoch`, naming `addrs` (the
    /// last bytes of 10.244.0.x) and `groups`.
    pub(crate) fn claim(h: u8, m: MacAddr, epoch: u64, addrs: &[u8], groups: &[&str]) -> Vec<u8> {
        let mut r = MacRecord {
            host: format!("h{h}"),
            iface: "vc0".into(),
            at_ms: 1000 + epoch,
            epoch,
            addrs: addrs.iter().map(|a| ip(*a)).collect(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        r.sig = Some(ClaimKey::derive(&[h; 32]).unwrap().sign("n", m, &r));
        r.to_json()
    }

    /// Three signed hosts, as `network approve` certifies Kubernetes nodes
    /// (no group in any certificate).
    pub(crate) fn store(nk: &NetworkKey) -> MemStore {
        let mut s = MemStore::new();
        for h in 1..=3 {
            s.put(&host_key("n", &format!("h{h}")), signed_record(h, h, &signed_cert(nk, h, h, None)), None);
        }
        s
    }

    pub(crate) fn kube_view(nk: &NetworkKey, me: &str) -> Member {
        let mut m = signed_view(nk, me);
        m.policy.kube = true;
        m
    }

    pub(crate) fn why(m: &Member, h: &str, mac: MacAddr) -> String {
        let k = claim_key("n", h, mac);
        m.quarantined().find(|(q, _)| *q == k).map(|(_, e)| e.to_string()).unwrap_or_default()
    }

    /// A stolen node credential (h2's claim key and etcd user) claims
    /// another node's pod's address, an address no pod has, a pod's MAC
    /// another node holds (at a higher epoch), and puts its own pod in
    /// `db`: with the API's pods bound (`kube`), none of it counts. The
    /// address of another node's pod is refused and counted, the unknown
    /// one waits, the MAC stays its holder's, and the pod's groups are
    /// its labels' by the API. Positive control: the same claims in a
    /// view without the binding (nor the certificates' groups) are taken
    /// as written: h2 holds b's MAC, b's address is answered with h2's
    /// MAC, and h2's pod is in `default.db`.
    #[test]
    fn a_nodes_claims_count_only_for_pods_the_api_places_on_it() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        s.put_claim(mac(2), claim(2, mac(2), 0, &[2], &["default.db"]), None);
        s.put_claim(mac(3), claim(3, mac(3), 0, &[3], &[]), None);
        let facts = Arc::new(PodFacts::new([
            pod("a", "h2", 2, &["default.web"]),
            pod("b", "h3", 3, &["default.db"]),
        ]));
        let mut m = kube_view(&nk, "h1");
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(2)), m.route_of(mac(3))), (None, None), "before the API's pods");
        assert!(why(&m, "h2", mac(2)).contains("not listed yet"), "{:?}", why(&m, "h2", mac(2)));
        let mut out = Vec::new();
        m.set_pods(facts.clone(), &mut out);
        assert_eq!((m.route_of(mac(2)), m.route_of(mac(3))), (Some("h2"), Some("h3")), "{out:?}");
        assert_eq!(m.mac_groups().get(&mac(2)), Some(&vec!["default.web".to_string()]), "the API's groups");
        assert_eq!(m.mac_groups().get(&mac(3)), Some(&vec!["default.db".to_string()]));
        assert_eq!(why(&m, "h2", mac(2)), "", "taken: out of quarantine");
        // The attacks, by h2.
        s.put_claim(mac(9), claim(2, mac(9), 0, &[3], &["default.db"]), None);
        s.put_claim(mac(8), claim(2, mac(8), 0, &[99], &[]), None);
        s.put_claim(mac(3), claim(2, mac(3), 5, &[2], &[]), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(9)), None);
        assert!(why(&m, "h2", mac(9)).contains("on node `h3`, not `h2`"), "{}", why(&m, "h2", mac(9)));
        assert_eq!(m.route_of(mac(8)), None);
        assert!(why(&m, "h2", mac(8)).contains("no pod"), "{}", why(&m, "h2", mac(8)));
        assert_eq!(m.route_of(mac(3)), Some("h3"), "the MAC stays its pod's node's");
        assert!(why(&m, "h2", mac(3)).contains("default/b"), "{}", why(&m, "h2", mac(3)));
        assert_eq!(m.stats.pods_refused, 2, "another node's address, another node's pod's MAC");
        assert_eq!(m.neighbors().get(&(0, ip(3))), Some(&mac(3)), "b's address is answered with b's MAC");
        assert!(!m.mac_groups().contains_key(&mac(9)));
        // On the holder's own node too, db's MAC stays its own.
        let mut holder = kube_view(&nk, "h3");
        sync(&mut holder, &s);
        holder.set_pods(facts.clone(), &mut Vec::new());
        assert_eq!(holder.owner(mac(3)), Some("h3"));
        assert!(why(&holder, "h2", mac(3)).contains("a pod does not move"), "{}", why(&holder, "h2", mac(3)));
        // A relist judges the same way (the API's pods kept).
        let (kvs, rev) = s.range(m.prefix());
        m.relist(&kvs, rev, &mut Vec::new());
        assert_eq!(
            (m.route_of(mac(3)), m.route_of(mac(9)), m.route_of(mac(2))),
            (Some("h3"), None, Some("h2"))
        );
        // The positive control: not bound to the API.
        let mut plain = Member::with_policy("n", "h1", Policy { have_key: true, ..Policy::default() });
        sync(&mut plain, &s);
        assert_eq!((plain.route_of(mac(3)), plain.route_of(mac(9))), (Some("h2"), Some("h2")));
        assert_eq!(plain.neighbors().get(&(0, ip(3))), Some(&mac(9)), "b's address answered with h2's MAC");
        assert_eq!(plain.mac_groups().get(&mac(2)), Some(&vec!["default.db".to_string()]));
        assert_eq!(plain.stats.pods_refused, 0);
    }

    /// The API moves an address: pod b (h3) deleted and its address given
    /// to pod c on h2. h3's claim naming it no longer counts (its MAC
    /// goes), and h2's claim of it, refused before, is taken now. A claim
    /// naming no address (a node's gateway) is taken without groups, and
    /// no claim moves it from its live host but a pod's.
    #[test]
    fn an_address_moves_with_the_api_and_a_gateways_mac_only_to_a_pod() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        s.put_claim(mac(3), claim(3, mac(3), 0, &[3], &[]), None);
        s.put_claim(mac(9), claim(2, mac(9), 0, &[3], &[]), None);
        s.put_claim(mac(7), claim(3, mac(7), 0, &[], &["default.db"]), None);
        let mut m = kube_view(&nk, "h1");
        sync(&mut m, &s);
        m.set_pods(Arc::new(PodFacts::new([pod("b", "h3", 3, &[])])), &mut Vec::new());
        assert_eq!(
            (m.route_of(mac(3)), m.route_of(mac(9)), m.route_of(mac(7))),
            (Some("h3"), None, Some("h3"))
        );
        assert!(!m.mac_groups().contains_key(&mac(7)), "no pod, no group, whatever the claim names");
        let mut b = pod("b", "h3", 3, &[]);
        b.terminating = true;
        let c = pod("c", "h2", 3, &["default.web"]);
        let mut out = Vec::new();
        m.set_pods(Arc::new(PodFacts::new([b, c, pod("d", "h2", 4, &[])])), &mut out);
        assert_eq!((m.route_of(mac(3)), m.route_of(mac(9))), (None, Some("h2")), "{out:?}");
        assert_eq!(m.neighbors().get(&(0, ip(3))), Some(&mac(9)));
        assert_eq!(m.mac_groups().get(&mac(9)), Some(&vec!["default.web".to_string()]));
        // The gateway's MAC: h2's claim without an address at a higher
        // epoch is refused; h2's pod d's claim of it is taken.
        s.put_claim(mac(7), claim(2, mac(7), 3, &[], &[]), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(7)), Some("h3"));
        assert!(why(&m, "h2", mac(7)).contains("a pod does not move"), "{}", why(&m, "h2", mac(7)));
        s.put_claim(mac(7), claim(2, mac(7), 0, &[4], &[]), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(7)), Some("h2"), "{:?}", why(&m, "h2", mac(7)));
        // Its claim deleted by h3, the waiting claim of b's old MAC by
        // nobody: h3's claim of mac 3 waits, quarantined.
        assert!(why(&m, "h3", mac(3)).contains("not `h3`"), "{}", why(&m, "h3", mac(3)));
    }

    /// Of pods sharing an address, the one not being deleted has it; two
    /// live pods of two nodes make it no one's; a pod's own two addresses
    /// are one pod's.
    #[test]
    fn an_address_is_the_pod_not_being_deleted_and_two_nodes_pods_make_it_no_ones() {
        let mut old = pod("old", "h3", 5, &[]);
        old.terminating = true;
        let f = PodFacts::new([old.clone(), pod("new", "h2", 5, &[])]);
        assert_eq!(f.pod_at(ip(5)).map(|p| p.pod.as_str()), Some("default/new"));
        let f = PodFacts::new([old.clone()]);
        assert_eq!(f.pod_at(ip(5)).map(|p| p.node.as_str()), Some("h3"), "only the deleted one: its");
        let f = PodFacts::new([pod("x", "h2", 6, &[]), pod("y", "h3", 6, &[])]);
        assert_eq!(f.pod_at(ip(6)), None);
        assert_eq!(f.len(), 2);
        let mut two = pod("two", "h2", 7, &[]);
        two.ips.push("fd00::7".parse().unwrap());
        let f = PodFacts::new([two]);
        assert_eq!(f.pod_at("fd00::7".parse().unwrap()).map(|p| p.pod.as_str()), Some("default/two"));
        // A claim naming two pods' addresses is refused.
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        s.put_claim(mac(4), claim(2, mac(4), 0, &[7, 8], &[]), None);
        let mut m = kube_view(&nk, "h1");
        m.set_pods(
            Arc::new(PodFacts::new([pod("p", "h2", 7, &[]), pod("q", "h2", 8, &[])])),
            &mut Vec::new(),
        );
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(4)), None);
        assert!(why(&m, "h2", mac(4)).contains("two pods'"), "{}", why(&m, "h2", mac(4)));
        assert_eq!(m.stats.pods_refused, 1);
    }

    /// The store's events since the view's revision, as a view would take
    /// them that did not know the keys' create revisions (0): the guard
    /// off, for the controls.
    fn sync_unordered(m: &mut Member, s: &MemStore) {
        let evs: Vec<crate::store::Event> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
        for e in evs {
            let e = match e {
                crate::store::Event::Put { key, value, rev, .. } => {
                    crate::store::Event::Put { key, value, rev, created: 0 }
                }
                d => d,
            };
            m.apply(&e, &mut Vec::new());
        }
    }

    /// The review's hole: a new pod's MAC, claimed by its node (h3) before
    /// the API gives the pod's address, is claimed by a stolen node
    /// credential (h2) right after, (a) naming h2's own pod's address
    /// (which the API backs) and (b) naming none. Each younger claim
    /// waits behind the older one that waits for the API (`PodReserved`),
    /// holds nothing, and when the API places the pod on h3, h3's claim
    /// takes the MAC and h2's stay refused; a relist (by create revision)
    /// judges the same. Positive control: the same events taken without
    /// the keys' create revisions (the order this guard adds) let h2 hold
    /// the MAC of (a), and h3's rightful claim is then refused while h2's
    /// pod lives.
    #[test]
    fn a_claim_waiting_for_the_api_holds_its_mac_against_younger_claims() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        // h2's pod q (10.244.0.5), with no claim of its own: the thief's to spend.
        let before = Arc::new(PodFacts::new([pod("q", "h2", 5, &[])]));
        let after = Arc::new(PodFacts::new([
            pod("q", "h2", 5, &[]),
            pod("p", "h3", 7, &["default.db"]),
            pod("r", "h3", 8, &[]),
        ]));
        s.put_claim(mac(7), claim(3, mac(7), 0, &[7], &[]), None);
        s.put_claim(mac(8), claim(3, mac(8), 0, &[8], &[]), None);
        s.put_claim(mac(7), claim(2, mac(7), 0, &[5], &[]), None);
        s.put_claim(mac(8), claim(2, mac(8), 0, &[], &[]), None);
        let mut m = kube_view(&nk, "h1");
        m.set_pods(before.clone(), &mut Vec::new());
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(7)), m.route_of(mac(8))), (None, None), "reserved: no one holds them");
        for mc in [mac(7), mac(8)] {
            assert!(why(&m, "h3", mc).contains("no pod"), "{}", why(&m, "h3", mc));
            assert!(why(&m, "h2", mc).contains("`h3`'s claim of this MAC is older"), "{}", why(&m, "h2", mc));
        }
        assert_eq!(m.pods_waiting(), 4);
        m.set_pods(after.clone(), &mut Vec::new());
        assert_eq!((m.route_of(mac(7)), m.route_of(mac(8))), (Some("h3"), Some("h3")));
        assert_eq!(m.neighbors().get(&(0, ip(7))), Some(&mac(7)));
        assert_eq!(m.mac_groups().get(&mac(7)), Some(&vec!["default.db".to_string()]));
        assert!(why(&m, "h2", mac(7)).contains("a pod does not move"), "{}", why(&m, "h2", mac(7)));
        // A relist takes each MAC's claims by create revision: the same.
        let (kvs, rev) = s.range(m.prefix());
        let created: Vec<u64> = kvs.iter().map(|(k, _)| s.created(k).unwrap()).collect();
        m.relist_created(&kvs, &created, rev, &mut Vec::new());
        assert_eq!((m.route_of(mac(7)), m.route_of(mac(8))), (Some("h3"), Some("h3")));
        // The control: the same race, the create revisions not known.
        let mut plain = kube_view(&nk, "h1");
        plain.set_pods(before, &mut Vec::new());
        sync_unordered(&mut plain, &s);
        assert_eq!(plain.route_of(mac(7)), Some("h2"), "without the order, h2 holds the new pod's MAC");
        plain.set_pods(after, &mut Vec::new());
        assert_eq!(plain.route_of(mac(7)), Some("h2"), "{}", why(&plain, "h3", mac(7)));
        assert!(
            why(&plain, "h3", mac(7)).contains("host `h2` holds the MAC"),
            "{}",
            why(&plain, "h3", mac(7))
        );
        assert_eq!(
            plain.neighbors().get(&(0, ip(5))),
            Some(&mac(7)),
            "q's address answered with the stolen MAC"
        );
    }

    /// A thief's claim first, at a higher epoch, naming the new pod's
    /// address before the API has it: it reserves the MAC while both
    /// wait, and when the API places the pod on h3, it is refused (the
    /// API contradicts it: it never holds the MAC) and h3's younger claim
    /// at epoch 0 takes it. On h3 itself, a thief's claim naming no
    /// address that came first gives way to h3's own claim of its pod.
    #[test]
    fn the_claim_the_api_backs_wins_over_an_older_one_it_contradicts_whatever_its_epoch() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        s.put_claim(mac(7), claim(2, mac(7), 9, &[7], &[]), None);
        s.put_claim(mac(7), claim(3, mac(7), 0, &[7], &[]), None);
        let mut m = kube_view(&nk, "h1");
        m.set_pods(Arc::new(PodFacts::new([])), &mut Vec::new());
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(7)), None);
        assert!(why(&m, "h3", mac(7)).contains("no pod"), "{}", why(&m, "h3", mac(7)));
        m.set_pods(Arc::new(PodFacts::new([pod("p", "h3", 7, &[])])), &mut Vec::new());
        assert_eq!(m.route_of(mac(7)), Some("h3"), "{}", why(&m, "h3", mac(7)));
        assert!(why(&m, "h2", mac(7)).contains("on node `h3`, not `h2`"), "{}", why(&m, "h2", mac(7)));
        // h3's own view: h2's claim of mac 9 without an address came
        // first and was taken; h3's claim of its pod's MAC takes it.
        s.put_claim(mac(9), claim(2, mac(9), 0, &[], &[]), None);
        let mut own = kube_view(&nk, "h3");
        sync(&mut own, &s);
        assert_eq!(own.owner(mac(9)), Some("h2"));
        s.put_claim(mac(9), claim(3, mac(9), 0, &[6], &[]), None);
        sync(&mut own, &s);
        assert_eq!(own.owner(mac(9)), Some("h3"), "{}", why(&own, "h3", mac(9)));
        assert_eq!(own.conflicts().count(), 0, "no conflict: h3 gives up nothing");
    }

    /// One MAC a pod: a node's second claim for a pod whose claim holds a
    /// MAC already is refused (counted), so a node cannot spend its own
    /// pod's address on a MAC it steals. Positive control: the same
    /// claim, put again once the pod's first claim is gone, is taken.
    #[test]
    fn a_pod_has_one_mac() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        s.put_claim(mac(50), claim(2, mac(50), 0, &[5], &[]), None);
        let mut m = kube_view(&nk, "h1");
        m.set_pods(Arc::new(PodFacts::new([pod("q", "h2", 5, &[])])), &mut Vec::new());
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(50)), Some("h2"));
        s.put_claim(mac(51), claim(2, mac(51), 0, &[5], &[]), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(51)), None);
        assert!(
            why(&m, "h2", mac(51)).contains("has MAC 52:54:00:00:00:32 already"),
            "{}",
            why(&m, "h2", mac(51))
        );
        assert_eq!(m.stats.pods_refused, 1);
        assert_eq!(m.neighbors().get(&(0, ip(5))), Some(&mac(50)));
        // The control: q's first claim gone, the same claim is taken.
        s.delete_claims(mac(50));
        s.put_claim(mac(51), claim(2, mac(51), 0, &[5], &[]), None);
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(50)), m.route_of(mac(51))), (None, Some("h2")));
    }

    /// Claims waiting for the API are bounded per node: h2 fills its own
    /// bound (the rest dropped, counted) and h3's claim still waits and is
    /// taken when the API shows its pod. Positive control: bounded only in
    /// total, h2's claims fill it and h3's is dropped, never taken.
    #[test]
    fn claims_waiting_for_the_api_are_bounded_per_node() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = store(&nk);
        for i in 20..23u8 {
            s.put_claim(mac(i.into()), claim(2, mac(i.into()), 0, &[i], &[]), None);
        }
        s.put_claim(mac(7), claim(3, mac(7), 0, &[7], &[]), None);
        let facts = Arc::new(PodFacts::new([pod("p", "h3", 7, &[])]));
        let view = |per_node: usize| {
            let mut m = kube_view(&nk, "h1");
            m.policy.max_pod_waiting = per_node;
            m.policy.max_macs = 3;
            m.set_pods(Arc::new(PodFacts::new([])), &mut Vec::new());
            sync(&mut m, &s);
            m
        };
        let mut m = view(2);
        assert_eq!((m.pods_waiting(), m.stats.pods_waiting_dropped), (3, 1), "h2's third dropped, h3's kept");
        m.set_pods(facts.clone(), &mut Vec::new());
        assert_eq!(m.route_of(mac(7)), Some("h3"));
        let mut plain = view(usize::MAX);
        assert_eq!((plain.pods_waiting(), plain.stats.pods_waiting_dropped), (3, 1), "h3's dropped");
        plain.set_pods(facts, &mut Vec::new());
        assert_eq!(plain.route_of(mac(7)), None, "h3's claim starved by h2's");
    }
}
