//! One host's view of the cluster, sans-IO: it takes the store's events
//! (or a full listing, after compaction or an outage) and says what must
//! change in the host's links and routes.
//!
//! The derivation: a link to every other host with a record (a full
//! mesh; each link also carries the broadcast route, split horizon keeps
//! broadcasts from being relayed); a route for every MAC whose host is
//! another host with a record, to that host's link. A MAC of this host is
//! its own interface's (declared locally), never routed from the store.
//! Each event costs O(1), a host's arrival or departure O(its MACs): a
//! VM's move is one event and one route change everywhere.
//!
//! Memory: host names are interned once (a `u32` each); a MAC costs a
//! hash-map entry (MAC and host id) and its place in its host's list.

use crate::layout::{host_key, parse_key, prefix, usable, HostRecord, Key, MacRecord};
use crate::store::Event;
use crate::trust::{cert_id, NetworkPublic, TrustError};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

mod claims;
mod gateways;
mod kept;
mod pods;
mod relist;
mod vacated;
pub use kept::{Kept, KeptError};
pub use pods::{PodFacts, PodPlace};
use std::net::{IpAddr, SocketAddr};
use vnet_control::{canonical, PeerKey};
use vnet_wire::MacAddr;

/// Records held in quarantine for `show cluster` (all are counted).
pub const QUARANTINE_SHOWN: usize = 256;
/// Host records held back because their address is another host's.
const MAX_DUPLICATES: usize = 256;
/// Conflicts (two hosts claiming one MAC) held for `show cluster`.
pub const CONFLICTS_SHOWN: usize = 256;
/// The most a claim may raise a held MAC's epoch: a migration raises it
/// by one; a view that missed some (a relist after a compaction) sees a
/// few at once. A claim beyond is refused ([`RecordError::EpochJump`]):
/// taken, it would leave no higher epoch to move the MAC back with.
pub const MAX_EPOCH_STEP: u64 = 1 << 16;

/// A host as the view takes it: its record, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Where its links are received (a usable unicast address and port).
    pub addr: SocketAddr,
    /// Its static public key, when its links are secured.
    pub key: Option<PeerKey>,
    /// Its claim key, from its certificate, where the network has a key.
    pub claim_key: Option<[u8; 32]>,
    /// It relays between its secured peers (its record's `relay`).
    pub relay: bool,
    /// The groups its certificate allows its claims to name (signed
    /// networks; none: it may name none) ([`Member::mac_groups`]).
    pub groups: Box<[String]>,
    /// Its node gateway's address and MAC, as its record names them (in
    /// a signed network, signed by its claim key) ([`Member::gateways`]).
    pub gateway: Option<(IpAddr, MacAddr)>,
}

/// What must change on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A link to `host` (new or changed), or none any more.
    Link { host: String, peer: Option<Peer> },
    /// Frames to `mac` go to `host`'s link, or no longer to any link.
    Route { mac: MacAddr, host: Option<String> },
}

/// What this host requires of records, and how much it holds.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The network's key: host records need its certificate, MAC claims
    /// their claimant's signature, and every peer a static key.
    pub network_key: Option<NetworkPublic>,
    /// Every peer must have a static key (this host's links are secured).
    pub require_key: bool,
    /// This host has a static key, so it can make a secured link.
    pub have_key: bool,
    /// The vnet network (tenant number) the cluster's links carry: a
    /// claim for an interface of another network is refused.
    pub tenant: u32,
    /// The most hosts (names ever seen) and MACs the view holds.
    pub max_hosts: usize,
    pub max_macs: usize,
    /// The most revocations held, of hosts and of certificates each (a
    /// revocation beyond is refused, not held).
    pub max_revoked: usize,
    /// Kubernetes (`vnetd --kube`): other hosts' claims are bound to the
    /// API's pods, and MACs' groups are their pods' ([`Member::set_pods`]).
    pub kube: bool,
    /// Kubernetes: the most claims of one host that wait for the API
    /// (past it a claim is not kept waiting: `pods_waiting_dropped`).
    pub max_pod_waiting: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            network_key: None,
            require_key: false,
            have_key: false,
            tenant: 0,
            max_hosts: 65_536,
            max_macs: 4 << 20,
            max_revoked: 65_536,
            kube: false,
            max_pod_waiting: 1024,
        }
    }
}

/// Why a record was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not a record: {0}")]
    Json(String),
    #[error("`addr` {0} is not a unicast address and port")]
    Addr(SocketAddr),
    #[error("`public_key` is not a key (44 characters of base64)")]
    Key,
    #[error("`kinds`: at most 8 words of 1 to 16 letters")]
    Kinds,
    #[error("`gateway`: not a unicast address and MAC signed by the host's claim key")]
    Gateway,
    #[error("MAC {mac} is host `{host}`'s node gateway (it holds it and its record names it): no other host takes it")]
    GatewayMac { mac: MacAddr, host: String },
    #[error("the host has a key but this host has none (vnetd --key), so no secured link can be made")]
    NoOwnKey,
    #[error("this network's links are secured and the record has no `public_key`")]
    KeyRequired,
    #[error("this network has a network key and the record has no `cert`")]
    Unsigned,
    #[error("`cert`: {0}")]
    Cert(#[from] TrustError),
    #[error("`cert` is host `{host}`'s of network `{network}`")]
    CertFor { network: String, host: String },
    #[error("`cert` names another public key than the record's")]
    CertKey,
    #[error("`cert` does not allow address {0}")]
    CertAddr(IpAddr),
    #[error("`cert` expired at {0} (seconds since the epoch)")]
    CertExpired(u64),
    #[error("address {addr} is already host `{holder}`'s")]
    Duplicate { addr: IpAddr, holder: String },
    #[error("more than {0} hosts")]
    TooManyHosts(usize),
    #[error("more than {0} MACs")]
    TooManyMacs(usize),
    #[error("`host` or `iface` is not a name of 1 to 63 of A-Za-z0-9._-")]
    ClaimNames,
    #[error("`addrs`: more than {0} addresses, or one that is not unicast")]
    ClaimAddrs(usize),
    #[error("`groups`: more than {0} groups, or one that is not a name")]
    ClaimGroups(usize),
    #[error("`groups`: host `{host}`'s certificate does not allow group `{group}`")]
    GroupNotAllowed { group: String, host: String },
    #[error("host `{0}` has no valid record to check the claim against")]
    ClaimHost(String),
    #[error("the claim is not signed by host `{0}`'s claim key")]
    ClaimSignature(String),
    #[error("the claim names host `{named}` but is under host `{key}`'s key")]
    ClaimKeyHost { named: String, key: String },
    #[error("the claim ({at_ms}) is not newer than the one held ({held_ms})")]
    StaleClaim { at_ms: u64, held_ms: u64 },
    #[error("the claim is for network {network}; this cluster's links carry network {carried}")]
    ClaimNetwork { network: u32, carried: u32 },
    #[error("conflict: host `{claimant}` claims the MAC host `{holder}` holds (epoch {epoch}; only a migration, at a higher epoch, moves it)")]
    Conflict { holder: String, claimant: String, epoch: u64 },
    #[error("the claim's epoch {epoch} is more than {MAX_EPOCH_STEP} above the one held ({held})")]
    EpochJump { epoch: u64, held: u64 },
    #[error("revoked: {0}")]
    Revoked(String),
    #[error("`revoked`: {0}")]
    Revocation(TrustError),
    #[error("the revocation is not the one its key names")]
    RevocationKey,
    #[error("`policy`: {0}")]
    Policy(TrustError),
    #[error("`policy`: serial {serial} is not higher than the one held ({held})")]
    StalePolicy { serial: u64, held: u64 },
    #[error("the Kubernetes API's pods are not listed yet: the claim waits for them")]
    PodsNotListed,
    #[error("no pod the Kubernetes API shows has address {0} (yet): the claim waits for one")]
    PodUnknown(IpAddr),
    #[error("the Kubernetes API places the pod with address {addr} on node `{node}`, not `{host}`")]
    PodElsewhere { addr: IpAddr, node: String, host: String },
    #[error("its addresses are two pods' ({a}, {b}): a claim is one pod's interface")]
    PodsDiffer { a: String, b: String },
    #[error("host `{first}`'s claim of this MAC is older (etcd create revision) and waits for the Kubernetes API: `{claimant}`'s waits behind it")]
    PodReserved { first: String, claimant: String },
    #[error("the MAC is kept for node `{node}`, whose claim of it went while the Kubernetes API still places its pod there: `{claimant}`'s claim waits")]
    PodVacated { node: String, claimant: String },
    #[error("pod {pod} has MAC {mac} already: a pod has one MAC")]
    PodHasMac { pod: String, mac: MacAddr },
    #[error("host `{holder}` holds the MAC{}: on Kubernetes a pod does not move, and `{claimant}`'s claim takes it only when no pod backs the holder's", .pod.as_ref().map(|p| format!(" for pod {p}, which the API still places there")).unwrap_or_default())]
    PodStays { holder: String, claimant: String, pod: Option<String> },
}

/// What a member counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub events: u64,
    /// Records not taken (quarantined), and keys this version does not know.
    pub bad_records: u64,
    pub unknown_keys: u64,
    /// Of those, claims naming a group their host's certificate does not allow.
    pub groups_refused: u64,
    /// Of those, claims the Kubernetes API contradicts (`--kube`: another
    /// node's pod's address, two pods' addresses, a MAC a pod elsewhere
    /// still holds).
    pub pods_refused: u64,
    /// Kubernetes: claims not kept waiting for the API because their host
    /// has [`Policy::max_pod_waiting`] waiting already (or all hosts
    /// together `max_macs`): taken only when put again.
    pub pods_waiting_dropped: u64,
    /// Of those, claims of a MAC another live host holds as its node
    /// gateway ([`RecordError::GatewayMac`]).
    pub gateway_claims: u64,
    /// Full listings taken (start, compaction, the store back after an outage).
    pub relists: u64,
    /// Signed policies refused for a serial not above the one held (a
    /// rollback or a replay; also in `bad_records`).
    pub stale_policies: u64,
}

/// One host's view.
pub struct Member {
    prefix: String,
    network: String,
    me: String,
    policy: Policy,
    revision: u64,
    names: Vec<Box<str>>,
    ids: FxHashMap<Box<str>, u32>,
    records: Vec<Option<Peer>>,
    /// Which host holds each underlay address (links are told apart by it).
    by_ip: FxHashMap<IpAddr, u32>,
    /// Records whose address another host holds, taken when it is free,
    /// with their certificate's expiry (checked again when taken) and id.
    duplicates: Vec<(u32, Peer, Option<u64>, Option<String>)>,
    /// The MACs each host has (by host id).
    by_host: Vec<Vec<MacAddr>>,
    macs: FxHashMap<MacAddr, u32>,
    /// Signed networks: the time of the newest claim taken for each MAC
    /// and a hash of its claimant's name, kept after the claim goes (an old
    /// claim replayed is refused; the same claim seen again, as a relist
    /// does, is not).
    claimed_at: FxHashMap<MacAddr, (u64, u64)>,
    /// Signed networks: claims by hosts not (validly) known yet, by
    /// (host, MAC): each host's claim of a MAC waits on its own.
    /// With each claim's create revision.
    unverified: FxHashMap<(String, MacAddr), (u64, MacRecord)>,
    /// The addresses each claimed MAC's claim names (none: not kept).
    addrs: FxHashMap<MacAddr, Box<[IpAddr]>>,
    /// The groups each claimed MAC's claim names (none: not kept).
    claim_groups: FxHashMap<MacAddr, Box<[String]>>,
    /// Counts changes of `claim_groups` ([`Member::groups_version`]).
    groups_version: u64,
    /// Counts changes of `addrs` ([`Member::addrs_version`]).
    addrs_version: u64,
    /// Each MAC's epoch (its migration count), kept after its claim goes.
    epochs: FxHashMap<MacAddr, u64>,
    /// Claims of a held MAC by another host at no higher epoch, by MAC:
    /// (holder, claimant), at most [`CONFLICTS_SHOWN`].
    /// The claimant's claim is kept: it is taken if the holder's goes.
    /// With the claimant's claim's create revision.
    conflicts: BTreeMap<MacAddr, (String, String, u64, MacRecord)>,
    /// Signed networks: hosts and certificate ids revoked by the network
    /// key. Kept while the process runs, whatever happens to their keys (a
    /// writer to the store without the network key cannot take one back).
    revoked_hosts: rustc_hash::FxHashSet<Box<str>>,
    revoked_certs: rustc_hash::FxHashSet<Box<str>>,
    /// Signed networks: the policy taken (its serial and lines, and what
    /// they declare), kept when its key is deleted (only a higher serial,
    /// signed, changes it), and a count of its changes.
    net_policy: Option<NetPolicy>,
    policy_version: u64,
    /// Counts changes of what a host keeps on disk ([`Member::kept`]).
    kept_version: u64,
    /// Signed networks: each live host's certificate id (this one's too).
    cert_ids: FxHashMap<u32, String>,
    /// Kubernetes: the API's pods as last told (none: not yet), other
    /// hosts' claims waiting for them (or refused by them) by (host, MAC),
    /// and the claims taken that a pod backs, by MAC ([`pods`]); each
    /// with its create revision. Waiting claims are counted per host
    /// (each host's bounded), and each held MAC's claim's create revision
    /// is kept (claims of one MAC are ordered by it).
    pods: Option<std::sync::Arc<PodFacts>>,
    pod_waiting: BTreeMap<(MacAddr, String), (u64, MacRecord)>,
    waiting_per_host: FxHashMap<String, usize>,
    pod_claims: FxHashMap<MacAddr, PodClaim>,
    held_created: FxHashMap<MacAddr, u64>,
    /// Kubernetes: the MAC each pod's claim holds (one a pod).
    by_pod: FxHashMap<String, MacAddr>,
    /// Kubernetes: MACs whose pod's claim was deleted while the API still
    /// places the pod on its host: kept for that host ([`vacated`]).
    vacated: BTreeMap<MacAddr, PodClaim>,
    /// Keys whose record was not taken, and why (at most [`QUARANTINE_SHOWN`]).
    quarantine: BTreeMap<String, RecordError>,
    /// Signed networks: when each host's certificate expires (by host id).
    not_after: FxHashMap<u32, u64>,
    /// The wall clock (seconds since the epoch) as last told by
    /// [`Member::expire`]; 0 until then (no certificate counts as expired).
    now_s: u64,
    pub stats: MemberStats,
}

/// Kubernetes: another host's claim taken that a pod backs, with its
/// key's create revision and its pod (`NAMESPACE/NAME`).
#[derive(Debug, Clone)]
struct PodClaim {
    created: u64,
    pod: String,
    r: MacRecord,
}

/// The policy taken: its serial and lines, the signed value it came in
/// (kept on disk), and what it declares.
#[derive(Debug, Clone)]
struct NetPolicy {
    serial: u64,
    lines: String,
    signed: String,
    declared: std::sync::Arc<vnet_control::policy::Policies>,
}

impl Member {
    /// The view of host `me` in `network`, empty (at revision 0), taking
    /// records as the default [`Policy`] does (no network key).
    pub fn new(network: &str, me: &str) -> Self {
        Member::with_policy(network, me, Policy::default())
    }

    /// The view of host `me` in `network` under `policy`.
    pub fn with_policy(network: &str, me: &str, policy: Policy) -> Self {
        Member {
            prefix: prefix(network),
            network: network.to_string(),
            me: me.to_string(),
            policy,
            revision: 0,
            names: Vec::new(),
            ids: FxHashMap::default(),
            records: Vec::new(),
            by_ip: FxHashMap::default(),
            duplicates: Vec::new(),
            by_host: Vec::new(),
            macs: FxHashMap::default(),
            claimed_at: FxHashMap::default(),
            unverified: FxHashMap::default(),
            epochs: FxHashMap::default(),
            addrs: FxHashMap::default(),
            claim_groups: FxHashMap::default(),
            groups_version: 0,
            addrs_version: 0,
            conflicts: BTreeMap::new(),
            revoked_hosts: Default::default(),
            revoked_certs: Default::default(),
            net_policy: None,
            policy_version: 0,
            kept_version: 0,
            cert_ids: FxHashMap::default(),
            pods: None,
            pod_waiting: BTreeMap::new(),
            waiting_per_host: FxHashMap::default(),
            pod_claims: FxHashMap::default(),
            held_created: FxHashMap::default(),
            by_pod: FxHashMap::default(),
            vacated: BTreeMap::new(),
            quarantine: BTreeMap::new(),
            not_after: FxHashMap::default(),
            now_s: 0,
            stats: MemberStats::default(),
        }
    }

    /// The host this is the view of.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The prefix to watch.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The revision of the last event applied: the next watch starts after it.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Records not taken, by key, with the reason (the first
    /// [`QUARANTINE_SHOWN`]; `stats.bad_records` counts them all).
    pub fn quarantined(&self) -> impl Iterator<Item = (&str, &RecordError)> {
        self.quarantine.iter().map(|(k, e)| (k.as_str(), e))
    }

    fn id(&mut self, name: &str) -> Option<u32> {
        if let Some(&i) = self.ids.get(name) {
            return Some(i);
        }
        if self.names.len() >= self.policy.max_hosts {
            return None;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.ids.insert(name.into(), i);
        self.records.push(None);
        self.by_host.push(Vec::new());
        Some(i)
    }

    /// Whether MACs of host `h` are routed (another host, with a record).
    fn routed(&self, h: u32) -> bool {
        self.records[h as usize].is_some() && *self.names[h as usize] != *self.me
    }

    fn route(&self, mac: MacAddr, h: Option<u32>) -> Change {
        Change::Route { mac, host: h.map(|h| self.names[h as usize].to_string()) }
    }

    /// Where frames to `mac` go: the host's name, if routed.
    pub fn route_of(&self, mac: MacAddr) -> Option<&str> {
        let h = *self.macs.get(&mac)?;
        self.routed(h).then(|| &*self.names[h as usize])
    }

    /// The hosts this host has links to, with their records.
    pub fn links(&self) -> impl Iterator<Item = (&str, &Peer)> {
        self.names
            .iter()
            .zip(&self.records)
            .filter(|(n, _)| ***n != *self.me)
            .filter_map(|(n, r)| r.as_ref().map(|r| (&**n, r)))
    }

    /// The host whose key names `mac`, live or not (this one included).
    pub fn owner(&self, mac: MacAddr) -> Option<&str> {
        self.macs.get(&mac).map(|&h| &*self.names[h as usize])
    }

    /// Live hosts, this one included.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.names.iter().zip(&self.records).filter(|(_, r)| r.is_some()).map(|(n, _)| &**n)
    }

    /// Signed networks: each linked host's certificate expiry (seconds
    /// since the epoch), for hosts whose certificate has one.
    pub fn expiries(&self) -> impl Iterator<Item = (&str, u64)> {
        self.not_after.iter().map(|(&h, &t)| (&*self.names[h as usize], t))
    }

    /// Signed networks: each live host's certificate id (this one's too).
    pub fn cert_ids(&self) -> impl Iterator<Item = (&str, &str)> {
        self.cert_ids.iter().map(|(&h, id)| (&*self.names[h as usize], id.as_str()))
    }

    /// A MAC's epoch: its migration count as the store last said it.
    pub fn epoch(&self, mac: MacAddr) -> u64 {
        self.epochs.get(&mac).copied().unwrap_or(0)
    }

    /// The epoch a migration of `mac` here claims it at: one above the
    /// held one (at `u64::MAX` it stays there, and is a conflict).
    pub fn next_epoch(&self, mac: MacAddr) -> u64 {
        self.epoch(mac).saturating_add(1)
    }

    /// The vnet network (tenant number) the cluster's links carry.
    pub fn tenant(&self) -> u32 {
        self.policy.tenant
    }

    /// Whether `host` has a record (is live).
    pub fn live(&self, host: &str) -> bool {
        self.ids.get(host).is_some_and(|&h| self.records[h as usize].is_some())
    }

    /// MACs claimed by two hosts at one epoch: (MAC, holder, claimant).
    pub fn conflicts(&self) -> impl Iterator<Item = (MacAddr, &str, &str)> {
        self.conflicts.iter().map(|(m, (h, c, ..))| (*m, h.as_str(), c.as_str()))
    }

    /// Hosts and certificate ids revoked.
    pub fn revoked(&self) -> (usize, usize) {
        (self.revoked_hosts.len(), self.revoked_certs.len())
    }

    /// Whether the network's admin revoked this host itself (every
    /// certificate of it: `vnetctl network revoke`).
    pub fn revoked_self(&self) -> bool {
        self.revoked_hosts.contains(self.me.as_str())
    }

    /// The whole view as changes: a link (or none) for every host ever
    /// seen, a route for every MAC. Applied to any state, it brings that
    /// state to the view (after a transaction that failed, say).
    pub fn full(&self, out: &mut Vec<Change>) {
        for (n, r) in self.names.iter().zip(&self.records) {
            if **n != *self.me {
                out.push(Change::Link { host: n.to_string(), peer: r.clone() });
            }
        }
        for &mac in self.macs.keys() {
            out.push(Change::Route { mac, host: self.route_of(mac).map(str::to_string) });
        }
    }

    /// Routes held (MACs of other live hosts).
    pub fn routes(&self) -> usize {
        self.macs.values().filter(|&&h| self.routed(h)).count()
    }

    /// The addresses live hosts' claims name, with their MAC, by (vnet
    /// network, address): what every host answers ARP and neighbour
    /// solicitations for (a MAC that moved is answered for as before: the
    /// claim names the MAC, wherever it is). An address that two live
    /// claims name is no one's ([`Member::address_conflicts`]): nobody
    /// answers for it, and its requests are flooded to whoever owns it.
    pub fn neighbors(&self) -> BTreeMap<(u32, IpAddr), MacAddr> {
        let (mut table, conflicts) = self.claimed_addrs();
        for (k, _) in conflicts {
            table.remove(&k);
        }
        table
    }

    /// The addresses that more than one live claim names, with their MACs
    /// (sorted): a host that claims another host's VM's address makes it
    /// a conflict, never its own.
    pub fn address_conflicts(&self) -> Vec<((u32, IpAddr), Vec<MacAddr>)> {
        self.claimed_addrs().1.into_iter().map(|(k, macs)| (k, macs.into_iter().collect())).collect()
    }

    /// Every live claim's addresses ([`crate::addrs::claimed`]).
    fn claimed_addrs(&self) -> crate::addrs::Claimed {
        let live = |mac: &MacAddr| self.macs.get(mac).is_some_and(|&h| self.records[h as usize].is_some());
        crate::addrs::claimed(self.addrs.iter().filter(|(m, _)| live(m)), self.policy.tenant)
    }

    /// Counts the changes of the claims' addresses: with the hosts' comings
    /// and goings (each a [`Change::Link`]), what changes
    /// [`Member::neighbors`] (a caller recomputes it only then).
    pub fn addrs_version(&self) -> u64 {
        self.addrs_version
    }

    /// Counts the changes of the claims' groups: with any other change of
    /// a batch, what changes [`Member::mac_groups`] (a claim whose holder
    /// stays and only its groups change moves no route).
    pub fn groups_version(&self) -> u64 {
        self.groups_version
    }

    /// MACs known, routed or not.
    pub fn macs(&self) -> usize {
        self.macs.len()
    }

    /// Applies one watch event; what must change is appended to `out`. A
    /// record that does not check is quarantined: counted, kept in
    /// [`Member::quarantined`], and otherwise as if it were not there.
    pub fn apply(&mut self, ev: &Event, out: &mut Vec<Change>) {
        self.stats.events += 1;
        self.revision = self.revision.max(ev.rev());
        let Some(key) = parse_key(&self.prefix, ev.key()) else {
            // Address allocations share the prefix; the daemon reads them.
            if ev.key().strip_prefix(self.prefix.as_str()).is_some_and(|r| r.starts_with("ipam/")) {
                return;
            }
            self.stats.unknown_keys += 1;
            return;
        };
        let taken = match (key, ev) {
            (Key::Host(name), Event::Put { value, .. }) => self.put_host_record(name, value, out),
            (Key::Host(name), Event::Delete { .. }) => {
                if let Some(&h) = self.ids.get(name) {
                    self.drop_host(h, out);
                }
                Ok(())
            }
            (Key::Claim { host, mac }, Event::Put { value, created, .. }) => {
                self.put_mac_record(host, mac, value, *created, out)
            }
            (Key::Claim { host, mac }, Event::Delete { .. }) => self.delete_claim(host, mac, out),
            (Key::RevokedHost(_) | Key::RevokedCert(_), Event::Put { value, .. }) => {
                self.put_revocation(ev.key(), value, out)
            }
            // A revocation stays while the process runs: deleting its key
            // (which needs no network key) takes nothing back.
            (Key::RevokedHost(_) | Key::RevokedCert(_), Event::Delete { .. }) => Ok(()),
            (Key::Policy, Event::Put { value, .. }) => self.put_policy(value),
            // So does a policy: its key deleted withdraws nothing (a policy
            // with no lines, signed, does).
            (Key::Policy, Event::Delete { .. }) => Ok(()),
        };
        match taken {
            Ok(()) => {
                self.quarantine.remove(ev.key());
            }
            Err(e) => {
                self.stats.bad_records += 1;
                self.stats.groups_refused += u64::from(matches!(e, RecordError::GroupNotAllowed { .. }));
                self.stats.pods_refused += u64::from(e.refused_by_api());
                self.count_gateway_claim(&e);
                self.hold(ev.key().to_string(), e);
            }
        }
    }

    /// Keeps `key` in quarantine with its reason: a key held already gets
    /// the new reason, a new one a place while fewer than
    /// [`QUARANTINE_SHOWN`] are held (the rest are counted only).
    fn hold(&mut self, key: String, e: RecordError) {
        if self.quarantine.len() < QUARANTINE_SHOWN || self.quarantine.contains_key(&key) {
            self.quarantine.insert(key, e);
        }
    }

    /// Tells the view the time (seconds since the epoch): a host whose
    /// certificate has expired by then is dropped (its links and routes go,
    /// its key is quarantined with the reason) until a record with a valid
    /// certificate comes. Cheap when nothing expires: one pass over the
    /// hosts with an expiry.
    pub fn expire(&mut self, now_s: u64, out: &mut Vec<Change>) {
        self.now_s = now_s;
        let gone: Vec<(u32, u64)> =
            self.not_after.iter().filter(|&(_, &t)| now_s > t).map(|(&h, &t)| (h, t)).collect();
        for (h, t) in gone {
            self.not_after.remove(&h);
            self.set_host(h, None, out);
            let key = host_key(&self.network, &self.names[h as usize]);
            self.stats.bad_records += 1;
            self.hold(key, RecordError::CertExpired(t));
        }
    }

    /// Host `h` goes: no link, no routes, nothing of it waiting.
    fn drop_host(&mut self, h: u32, out: &mut Vec<Change>) {
        self.duplicates.retain(|(d, ..)| *d != h);
        self.not_after.remove(&h);
        self.cert_ids.remove(&h);
        self.set_host(h, None, out);
    }

    /// The groups of each claimed MAC, for the network's policy: those its
    /// claim names (the claimant's interface's); in a signed network only
    /// those its holder's certificate allows now (a claim naming another is
    /// not taken, [`RecordError::GroupNotAllowed`]). This host's MACs too.
    /// On Kubernetes (`kube`), the groups of each MAC's pod by the API,
    /// whatever the claims name ([`Member::set_pods`]).
    pub fn mac_groups(&self) -> BTreeMap<MacAddr, Vec<String>> {
        if self.policy.kube {
            return self.pod_groups();
        }
        let signed = self.policy.network_key.is_some();
        let mut out = BTreeMap::new();
        for (m, gs) in &self.claim_groups {
            let Some(&h) = self.macs.get(m) else { continue };
            let allowed = self.records.get(h as usize).and_then(Option::as_ref).map(|p| &p.groups);
            let ok = |g: &&String| !signed || allowed.is_some_and(|a| a.contains(*g));
            let gs: Vec<String> = gs.iter().filter(ok).cloned().collect();
            if !gs.is_empty() {
                out.insert(*m, gs);
            }
        }
        out
    }

    /// Checks a host record's every field against the policy.
    fn check_host(
        &self,
        name: &str,
        value: &[u8],
    ) -> Result<(Peer, Option<u64>, Option<String>), RecordError> {
        let r: HostRecord = serde_json::from_slice(value).map_err(|e| RecordError::Json(e.to_string()))?;
        if !usable(r.addr) {
            return Err(RecordError::Addr(r.addr));
        }
        if r.kinds.len() > 8
            || r.kinds
                .iter()
                .any(|k| k.is_empty() || k.len() > 16 || !k.bytes().all(|b| b.is_ascii_lowercase()))
        {
            return Err(RecordError::Kinds);
        }
        let key = match &r.public_key {
            None => None,
            Some(k) => Some(PeerKey::from_base64(k).ok_or(RecordError::Key)?),
        };
        let mut claim_key = None;
        let mut not_after = None;
        let mut id = None;
        let mut groups = Box::default();
        if let Some(nk) = &self.policy.network_key {
            let text = r.cert.as_deref().ok_or(RecordError::Unsigned)?;
            let cert = nk.verify(text)?;
            if cert.network != self.network || cert.host != name {
                return Err(RecordError::CertFor { network: cert.network, host: cert.host });
            }
            if key != Some(cert.public_key) {
                return Err(RecordError::CertKey);
            }
            if !cert.allows(r.addr.ip()) {
                return Err(RecordError::CertAddr(r.addr.ip()));
            }
            if cert.expired(self.now_s) {
                return Err(RecordError::CertExpired(cert.not_after.unwrap_or(0)));
            }
            if self.revoked_hosts.contains(name) {
                return Err(RecordError::Revoked(format!("host `{name}` (every certificate of it)")));
            }
            let cid = cert_id(text);
            if self.revoked_certs.contains(cid.as_str()) {
                return Err(RecordError::Revoked(format!("certificate {cid}")));
            }
            not_after = cert.not_after;
            claim_key = Some(cert.claim_key);
            id = Some(cid);
            groups = cert.groups.into_boxed_slice();
        }
        let gateway = self.check_gateway(name, &r, claim_key)?;
        if name != self.me {
            let required = self.policy.require_key || self.policy.network_key.is_some();
            match key {
                None if required => return Err(RecordError::KeyRequired),
                Some(_) if !self.policy.have_key => return Err(RecordError::NoOwnKey),
                _ => {}
            }
        }
        Ok((Peer { addr: r.addr, key, claim_key, relay: r.relay, groups, gateway }, not_after, id))
    }

    fn put_host_record(
        &mut self,
        name: &str,
        value: &[u8],
        out: &mut Vec<Change>,
    ) -> Result<(), RecordError> {
        // A record that does not check changes nothing: a host keeps the
        // last record of it that did (so a writer without the network key
        // cannot re-point or unsecure a link), until its key is deleted
        // (its lease ran out) or a good record comes.
        let (peer, not_after, id) = self.check_host(name, value)?;
        let Some(h) = self.id(name) else { return Err(RecordError::TooManyHosts(self.policy.max_hosts)) };
        self.duplicates.retain(|(d, ..)| *d != h);
        let ip = canonical(peer.addr.ip());
        if let Some(&holder) = self.by_ip.get(&ip).filter(|&&g| g != h) {
            // Parked: not linked, so nothing of it expires until it is taken.
            self.not_after.remove(&h);
            self.set_host(h, None, out);
            if self.duplicates.len() < MAX_DUPLICATES {
                self.duplicates.push((h, peer, not_after, id));
            }
            return Err(RecordError::Duplicate { addr: ip, holder: self.names[holder as usize].to_string() });
        }
        match not_after {
            Some(t) => self.not_after.insert(h, t),
            None => self.not_after.remove(&h),
        };
        match id {
            Some(id) => self.cert_ids.insert(h, id),
            None => self.cert_ids.remove(&h),
        };
        self.set_host(h, Some(peer), out);
        Ok(())
    }

    /// Host `h`'s record becomes `peer`: links, routes and the address index follow.
    fn set_host(&mut self, h: u32, peer: Option<Peer>, out: &mut Vec<Change>) {
        let old = self.records[h as usize].clone();
        if old == peer {
            return;
        }
        // A gateway no more (or its host gone): claims of its MAC refused
        // for it are taken again.
        let old_gateway = old.as_ref().and_then(|o| o.gateway).map(|(_, m)| m);
        let gateway_freed =
            old_gateway.filter(|&m| peer.as_ref().and_then(|p| p.gateway).map(|(_, g)| g) != Some(m));
        let was = self.routed(h);
        let freed = old.as_ref().map(|o| canonical(o.addr.ip()));
        if let Some(ip) = freed {
            if self.by_ip.get(&ip) == Some(&h) {
                self.by_ip.remove(&ip);
            }
        }
        if let Some(p) = &peer {
            self.by_ip.insert(canonical(p.addr.ip()), h);
        }
        let name = self.names[h as usize].to_string();
        self.records[h as usize] = peer.clone();
        if name != self.me {
            match &peer {
                Some(_) => {
                    out.push(Change::Link { host: name.clone(), peer });
                    if !was {
                        for &m in &self.by_host[h as usize] {
                            out.push(self.route(m, Some(h)));
                        }
                    }
                }
                // The record goes: there was one (`old != peer`), so the
                // host (not this one) was routed.
                None => {
                    for &m in &self.by_host[h as usize] {
                        out.push(self.route(m, None));
                    }
                    out.push(Change::Link { host: name.clone(), peer: None });
                }
            }
        }
        if self.records[h as usize].is_some() {
            self.take_unverified(&name, out);
        }
        if let Some(m) = gateway_freed.filter(|_| self.policy.kube) {
            self.retake_waiting(m, out);
        }
        // An address freed: a record that waited for it is taken now.
        // Its certificate is checked again: one that expired while it
        // waited is dropped, quarantined with that reason.
        if let Some(ip) = freed.filter(|ip| !self.by_ip.contains_key(ip)) {
            while let Some(i) = self.duplicates.iter().position(|(_, p, ..)| canonical(p.addr.ip()) == ip) {
                let (d, p, not_after, id) = self.duplicates.swap_remove(i);
                let key = format!("{}hosts/{}", self.prefix, self.names[d as usize]);
                if let Some(t) = not_after.filter(|&t| self.now_s > t) {
                    self.stats.bad_records += 1;
                    self.hold(key, RecordError::CertExpired(t));
                    continue;
                }
                self.quarantine.remove(&key);
                if let Some(t) = not_after {
                    self.not_after.insert(d, t);
                }
                if let Some(id) = id {
                    self.cert_ids.insert(d, id);
                }
                self.set_host(d, Some(p), out);
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::fixtures::Claims;
    use crate::layout::fixtures::{host, vm};
    use crate::layout::host_key;
    use crate::store::MemStore;

    pub(super) fn mac(i: u32) -> MacAddr {
        let b = i.to_be_bytes();
        MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
    }

    pub(super) fn sync(m: &mut Member, s: &MemStore) -> Vec<Change> {
        let mut out = Vec::new();
        let evs: Vec<Event> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            m.apply(e, &mut out);
        }
        out
    }

    /// The addresses a claim names are every host's `neigh` answers while
    /// its host lives; a claim naming too many, or one that is not
    /// unicast, is quarantined; a migration's claim names the addresses
    /// anew; a deleted claim takes its addresses with it.
    #[test]
    fn a_claims_addresses_are_answered_for_while_its_host_lives() {
        use crate::layout::{fixtures, MacRecord, MAX_ADDRS};
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let claim = |h: &str, epoch: u64, addrs: &[&str]| {
            let addrs = addrs.iter().map(|a| ip(a)).collect();
            MacRecord { host: h.into(), iface: "vm0".into(), epoch, addrs, ..Default::default() }.to_json()
        };
        let mut m = Member::new("n", "h1");
        let mut s = MemStore::new();
        for h in [2u8, 3] {
            s.put(&host_key("n", &format!("h{h}")), fixtures::host(h), None);
        }
        s.put_claim(mac(2), claim("h2", 0, &["10.244.0.2", "fd00::2"]), None);
        sync(&mut m, &s);
        let want = |pairs: &[(&str, u32)]| -> BTreeMap<(u32, IpAddr), MacAddr> {
            pairs.iter().map(|(a, i)| ((0, ip(a)), mac(*i))).collect()
        };
        assert_eq!(m.neighbors(), want(&[("10.244.0.2", 2), ("fd00::2", 2)]));
        // Refused: too many, a multicast one, the broadcast.
        let many: Vec<String> = (0..=MAX_ADDRS).map(|i| format!("10.244.1.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for (i, bad) in [&many[..], &["224.0.0.1"], &["255.255.255.255"]].iter().enumerate() {
            let k = crate::layout::claim_key("n", "h3", mac(10 + i as u32));
            s.put(&k, claim("h3", 0, bad), None);
            sync(&mut m, &s);
            assert!(
                m.quarantined().any(|(q, e)| *q == k && matches!(e, RecordError::ClaimAddrs(_))),
                "{bad:?}"
            );
        }
        assert_eq!(m.neighbors().len(), 2);
        // The MAC migrates to h3 with one address: the answer names it.
        s.put_claim(mac(2), claim("h3", 1, &["10.244.0.2"]), None);
        sync(&mut m, &s);
        assert_eq!(m.neighbors(), want(&[("10.244.0.2", 2)]));
        // h3 goes: its claims are not answered for.
        s.delete_if(&host_key("n", "h3"), None);
        sync(&mut m, &s);
        assert!(m.neighbors().is_empty());
        s.put(&host_key("n", "h3"), fixtures::host(3), None);
        sync(&mut m, &s);
        assert_eq!(m.neighbors().len(), 1);
        s.delete_claims(mac(2));
        sync(&mut m, &s);
        assert!(m.neighbors().is_empty(), "the claim went with its addresses");
    }

    /// Two live claims naming one address: neither is answered for (the
    /// request is flooded to whoever has it), and the conflict is
    /// reported; once one claim lets go, the other's answer is back.
    #[test]
    fn an_address_two_claims_name_is_a_conflict_no_host_answers_for() {
        use crate::layout::{fixtures, MacRecord};
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let claim = |h: &str, addrs: &[&str]| {
            let addrs = addrs.iter().map(|a| ip(a)).collect();
            MacRecord { host: h.into(), iface: "vm0".into(), addrs, ..Default::default() }.to_json()
        };
        let mut m = Member::new("n", "h1");
        let mut s = MemStore::new();
        for h in [2u8, 3] {
            s.put(&host_key("n", &format!("h{h}")), fixtures::host(h), None);
        }
        s.put_claim(mac(2), claim("h2", &["10.244.0.2", "10.244.0.20"]), None);
        sync(&mut m, &s);
        assert_eq!(m.neighbors().len(), 2, "the positive control: h2's addresses answered for");
        assert!(m.address_conflicts().is_empty());
        // h3 claims one of h2's VM's addresses for its own VM.
        s.put_claim(mac(3), claim("h3", &["10.244.0.2"]), None);
        sync(&mut m, &s);
        let held: Vec<_> = m.neighbors().into_iter().collect();
        assert_eq!(held, vec![((0, ip("10.244.0.20")), mac(2))], "the disputed address is no one's");
        assert_eq!(m.address_conflicts(), vec![((0, ip("10.244.0.2")), vec![mac(2), mac(3)])]);
        // h3's claim goes: h2's answer is back.
        s.delete_claims(mac(3));
        sync(&mut m, &s);
        assert_eq!(m.neighbors().get(&(0, ip("10.244.0.2"))), Some(&mac(2)));
        assert!(m.address_conflicts().is_empty());
    }

    /// The groups a claim names are the MAC's groups for every host's
    /// policy (no network key: as written); a claim naming too many, or
    /// one that is not a name, is quarantined; a deleted claim takes them.
    #[test]
    fn a_claims_groups_are_its_macs_groups_for_every_host() {
        use crate::layout::{fixtures, MacRecord, MAX_GROUPS};
        let claim = |h: &str, groups: &[&str]| {
            let groups = groups.iter().map(|g| g.to_string()).collect();
            MacRecord { host: h.into(), iface: "vm0".into(), groups, ..Default::default() }.to_json()
        };
        let mut m = Member::new("n", "h1");
        let mut s = MemStore::new();
        s.put(&host_key("n", "h2"), fixtures::host(2), None);
        s.put_claim(mac(2), claim("h2", &["web", "front"]), None);
        s.put_claim(mac(3), claim("h2", &[]), None);
        sync(&mut m, &s);
        let want: BTreeMap<MacAddr, Vec<String>> =
            [(mac(2), vec!["web".to_string(), "front".to_string()])].into();
        assert_eq!(m.mac_groups(), want);
        // The holder's claim again with other groups: no route moves, the
        // groups version says so.
        let v = m.groups_version();
        s.put_claim(mac(3), claim("h2", &["db"]), None);
        sync(&mut m, &s);
        assert!(m.groups_version() > v);
        assert_eq!(m.mac_groups().get(&mac(3)), Some(&vec!["db".to_string()]));
        s.put_claim(mac(3), claim("h2", &[]), None);
        sync(&mut m, &s);
        let v = m.groups_version();
        s.put_claim(mac(3), claim("h2", &[]), None);
        sync(&mut m, &s);
        assert_eq!(m.groups_version(), v, "the same claim again changes nothing");
        let many: Vec<String> = (0..=MAX_GROUPS).map(|i| format!("g{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for (i, bad) in [&many[..], &["1st"], &["web\nlink x"]].iter().enumerate() {
            let k = crate::layout::claim_key("n", "h2", mac(10 + i as u32));
            s.put(&k, claim("h2", bad), None);
            sync(&mut m, &s);
            assert!(
                m.quarantined().any(|(q, e)| *q == k && matches!(e, RecordError::ClaimGroups(_))),
                "{bad:?}"
            );
        }
        assert_eq!(m.mac_groups(), want);
        s.delete_claims(mac(2));
        sync(&mut m, &s);
        assert!(m.mac_groups().is_empty());
    }

    /// A signed network's hosts as a view reports them: each linked host's
    /// certificate id and expiry; a certificate that expires drops its host
    /// (counted, quarantined); a revocation of one certificate drops the host
    /// holding it, one of a host drops it whatever its certificate, and
    /// each is counted.
    #[test]
    fn a_signed_view_reports_certificates_and_drops_expired_and_revoked_hosts() {
        use crate::layout::{revoked_cert_key, revoked_host_key};
        use crate::trust::{cert_id, NetworkKey, Revocation};
        let nk = NetworkKey::generate().unwrap();
        let cert = |h: u8, not_after: Option<u64>| signed_cert(&nk, h, h, not_after);
        let record = |h: u8, cert: &str| signed_record(h, h, cert);
        let mut m = signed_view(&nk, "h1");
        let mut s = MemStore::new();
        let certs: Vec<String> =
            [(1, None), (2, Some(2_000)), (3, None), (4, None)].iter().map(|&(h, t)| cert(h, t)).collect();
        for (i, c) in certs.iter().enumerate() {
            s.put(&host_key("n", &format!("h{}", i + 1)), record(i as u8 + 1, c), None);
        }
        m.expire(1_000, &mut Vec::new());
        sync(&mut m, &s);
        assert_eq!(m.links().count(), 3);
        assert!(m.live("h2") && m.live("h1") && !m.live("h9"));
        let mut ids: Vec<(String, String)> = m.cert_ids().map(|(h, i)| (h.into(), i.into())).collect();
        ids.sort();
        let want: Vec<(String, String)> =
            (1..=4).map(|h| (format!("h{h}"), cert_id(&certs[h - 1]))).collect();
        assert_eq!(ids, want, "every live host's certificate, this one's too");
        assert_eq!(m.expiries().collect::<Vec<_>>(), [("h2", 2_000)]);
        // h2's certificate is valid through its last second, then expires.
        let bad = m.stats.bad_records;
        let mut out = Vec::new();
        m.expire(2_000, &mut out);
        assert!(out.is_empty() && m.live("h2"));
        m.expire(2_001, &mut out);
        assert_eq!(out, vec![Change::Link { host: "h2".into(), peer: None }]);
        assert!(!m.live("h2") && m.expiries().next().is_none());
        assert_eq!(m.stats.bad_records, bad + 1);
        assert!(m.quarantined().any(|(k, _)| k == host_key("n", "h2")));
        // h3's certificate revoked (by its id), then h4 whatever its certificate.
        let at = 1;
        let r3 = Revocation { network: "n".into(), host: "h3".into(), cert: Some(cert_id(&certs[2])), at };
        s.put(&revoked_cert_key("n", &cert_id(&certs[2])), nk.revoke(&r3).unwrap().into_bytes(), None);
        let r4 = Revocation { network: "n".into(), host: "h4".into(), cert: None, at };
        s.put(&revoked_host_key("n", "h4"), nk.revoke(&r4).unwrap().into_bytes(), None);
        let out = sync(&mut m, &s);
        assert_eq!(out.iter().filter(|c| matches!(c, Change::Link { peer: None, .. })).count(), 2, "{out:?}");
        assert_eq!(m.revoked(), (1, 1));
        assert!(!m.live("h3") && !m.live("h4") && m.links().count() == 0);
        assert_eq!(m.stats.bad_records, bad + 3, "the expiry and the two revoked hosts");
        // A revocation of a certificate h1 does not hold leaves h1 alone
        // (it is this host: nothing to drop, nothing counted).
        let other = Revocation { network: "n".into(), host: "h1".into(), cert: Some("0".repeat(32)), at };
        s.put(&revoked_cert_key("n", &"0".repeat(32)), nk.revoke(&other).unwrap().into_bytes(), None);
        sync(&mut m, &s);
        assert_eq!((m.revoked(), m.stats.bad_records), ((1, 2), bad + 3));
        assert!(m.live("h1"));
        // Held revocations are bounded: at one of each, another host's
        // revocation is refused (counted), the one held again is no news.
        let policy =
            Policy { network_key: Some(nk.public()), have_key: true, max_revoked: 1, ..Policy::default() };
        let mut small = Member::with_policy("n", "h1", policy);
        let mut st = MemStore::new();
        st.put(&revoked_host_key("n", "h4"), nk.revoke(&r4).unwrap().into_bytes(), None);
        let r5 = Revocation { network: "n".into(), host: "h5".into(), cert: None, at };
        st.put(&revoked_host_key("n", "h5"), nk.revoke(&r5).unwrap().into_bytes(), None);
        st.put(&revoked_host_key("n", "h4"), nk.revoke(&r4).unwrap().into_bytes(), None);
        sync(&mut small, &st);
        assert_eq!((small.revoked(), small.stats.bad_records), ((1, 0), 1), "h5 refused, h4 again taken");
        // At the bound of certificates too: the one held again is taken,
        // another refused.
        let rc = |id: &str| Revocation { network: "n".into(), host: "h7".into(), cert: Some(id.into()), at };
        let (x, y) = ("1".repeat(32), "2".repeat(32));
        st.put(&revoked_cert_key("n", &x), nk.revoke(&rc(&x)).unwrap().into_bytes(), None);
        st.put(&revoked_cert_key("n", &x), nk.revoke(&rc(&x)).unwrap().into_bytes(), None);
        sync(&mut small, &st);
        assert_eq!((small.revoked(), small.stats.bad_records), ((1, 1), 1));
        st.put(&revoked_cert_key("n", &y), nk.revoke(&rc(&y)).unwrap().into_bytes(), None);
        sync(&mut small, &st);
        assert_eq!((small.revoked(), small.stats.bad_records), ((1, 1), 2));
        // A revocation under another key than its own is refused (room for it).
        let (before, held) = (m.stats.bad_records, m.revoked());
        s.put(&revoked_host_key("n", "h6"), nk.revoke(&r5).unwrap().into_bytes(), None);
        sync(&mut m, &s);
        assert_eq!((m.stats.bad_records, m.revoked()), (before + 1, held));
    }

    /// The network's policy: taken only signed by the network key, for this
    /// network, with lines that are policy, rule and group lines, and a
    /// serial higher than the one held; the same one again (a relist) is no
    /// change; deleting its key withdraws nothing; an unsigned network
    /// takes none.
    #[test]
    fn a_signed_policy_is_taken_by_serial_and_only_from_the_network_key() {
        use crate::layout::policy_key;
        use crate::trust::{NetworkKey, PolicyBody};
        let nk = NetworkKey::generate().unwrap();
        let body = |serial: u64, lines: &str| PolicyBody { network: "n".into(), serial, lines: lines.into() };
        let signed = |b: &PolicyBody| nk.sign_policy(b).unwrap().into_bytes();
        let mut m = signed_view(&nk, "h1");
        let mut s = MemStore::new();
        let k = policy_key("n");
        s.put(&k, signed(&body(5, "policy default deny\nrule web allow proto tcp port 80\n")), None);
        sync(&mut m, &s);
        let (serial, p) = m.signed_policy().unwrap();
        assert_eq!((serial, p.rules.len(), m.policy_version()), (5, 1, 1));
        // Again, as a relist brings it: no change.
        s.put(&k, signed(&body(5, "policy default deny\nrule web allow proto tcp port 80\n")), None);
        sync(&mut m, &s);
        assert_eq!((m.policy_version(), m.stats.bad_records), (1, 0));
        let refused = |m: &mut Member, s: &mut MemStore, value: Vec<u8>| {
            let bad = m.stats.bad_records;
            s.put(&k, value, None);
            sync(m, s);
            assert_eq!(
                (m.stats.bad_records, m.policy_version()),
                (bad + 1, 1),
                "{:?}",
                m.quarantined().last()
            );
        };
        // Older, or the same serial with other lines: a replay.
        refused(&mut m, &mut s, signed(&body(4, "")));
        refused(&mut m, &mut s, signed(&body(5, "")));
        // Another key's, another network's, tampered, or not a policy.
        let other = NetworkKey::generate().unwrap();
        refused(&mut m, &mut s, other.sign_policy(&body(9, "")).unwrap().into_bytes());
        let elsewhere = PolicyBody { network: "m".into(), ..body(9, "") };
        refused(&mut m, &mut s, nk.sign_policy(&elsewhere).unwrap().into_bytes());
        let mut t = signed(&body(9, "rule a allow\n"));
        t[3] ^= 1;
        refused(&mut m, &mut s, t);
        refused(&mut m, &mut s, b"policy default allow".to_vec());
        // Deleted: still enforced.
        s.delete_if(&k, None);
        sync(&mut m, &s);
        assert_eq!(m.signed_policy().unwrap().0, 5);
        // Withdrawn by a higher serial with no lines.
        s.put(&k, signed(&body(6, "")), None);
        sync(&mut m, &s);
        let (serial, p) = m.signed_policy().unwrap();
        assert_eq!((serial, p.networks().len(), m.policy_version()), (6, 0, 2));
        // A network without a key takes no policy.
        let mut plain = Member::new("n", "h1");
        sync(&mut plain, &s);
        assert!(plain.signed_policy().is_none() && plain.stats.bad_records >= 1);
    }

    /// A relist (a compaction, the store back, a lease revoked) goes only
    /// forward: a newer policy it brings is a change the daemon sees (its
    /// version moves past the one enforced), an older one is refused and
    /// counted, and a listing without the policy's key withdraws nothing.
    #[test]
    fn a_relist_never_takes_an_older_policy_and_a_newer_one_is_a_change() {
        use crate::layout::policy_key;
        use crate::trust::{NetworkKey, PolicyBody};
        let nk = NetworkKey::generate().unwrap();
        let signed = |serial: u64| {
            let b = PolicyBody { network: "n".into(), serial, lines: format!("rule r{serial} allow\n") };
            nk.sign_policy(&b).unwrap().into_bytes()
        };
        let mut m = signed_view(&nk, "h1");
        let mut s = MemStore::new();
        s.put(&policy_key("n"), signed(5), None);
        sync(&mut m, &s);
        let enforced = m.policy_version();
        // Newer, at a relist: the daemon must see a new version.
        s.put(&policy_key("n"), signed(6), None);
        let (kvs, rev) = s.range(m.prefix());
        m.relist(&kvs, rev, &mut Vec::new());
        assert_eq!(m.signed_policy().map(|(s, _)| s), Some(6));
        assert_ne!(m.policy_version(), enforced, "a newer policy taken at a relist goes unenforced");
        let enforced = m.policy_version();
        // Older (a rollback), at a relist: refused, counted, 6 kept.
        s.put(&policy_key("n"), signed(4), None);
        let (kvs, rev) = s.range(m.prefix());
        let bad = m.stats.bad_records;
        m.relist(&kvs, rev, &mut Vec::new());
        assert_eq!(m.signed_policy().map(|(s, _)| s), Some(6));
        assert_eq!((m.policy_version(), m.stats.bad_records), (enforced, bad + 1));
        // Deleted, at a relist: 6 kept.
        s.delete_if(&policy_key("n"), None);
        let (kvs, rev) = s.range(m.prefix());
        m.relist(&kvs, rev, &mut Vec::new());
        assert_eq!(m.signed_policy().map(|(s, _)| s), Some(6));
        assert_eq!(m.policy_version(), enforced);
    }

    /// Groups with an authority (issue 66, finding 5): a certificate's
    /// groups are the set its host's claims may name. A claim within it
    /// counts; one naming another group is quarantined with the group and
    /// the host, counted, and its MAC is in no group (not even `web`, which
    /// it may name) and not routed: the attacker whose certificate allows
    /// `web` claiming a VM in `db` does not meet `from group db`. Positive
    /// controls: the same claims in a network without a key are taken as
    /// written, and a new certificate allowing `db` takes the waiting claim.
    #[test]
    fn a_claim_may_name_only_groups_its_hosts_certificate_allows() {
        use crate::layout::MacRecord;
        use crate::trust::{CertBody, ClaimKey, NetworkKey};
        use base64::Engine as _;
        let nk = NetworkKey::generate().unwrap();
        let cert = |h: u8, groups: &[&str]| {
            let body = CertBody {
                network: "n".into(),
                host: format!("h{h}"),
                public_key: vnet_control::PeerKey([h; 32]).to_string(),
                claim_key: ClaimKey::derive(&[h; 32]).unwrap().public_base64(),
                addrs: vec![format!("10.0.0.{h}")],
                groups: groups.iter().map(|g| g.to_string()).collect(),
                not_after: None,
            };
            nk.sign(&body).unwrap()
        };
        let claim = |h: u8, m: MacAddr, at_ms: u64, epoch: u64, groups: &[&str]| {
            let groups = groups.iter().map(|g| g.to_string()).collect();
            let mut r = MacRecord {
                host: format!("h{h}"),
                iface: "vm0".into(),
                at_ms,
                epoch,
                groups,
                ..Default::default()
            };
            r.sig = Some(ClaimKey::derive(&[h; 32]).unwrap().sign("n", m, &r));
            r.to_json()
        };
        let gs = |g: &[&str]| g.iter().map(|g| g.to_string()).collect::<Vec<_>>();
        let mut s = MemStore::new();
        s.put(&host_key("n", "h1"), signed_record(1, 1, &cert(1, &["web"])), None);
        s.put(&host_key("n", "h2"), signed_record(2, 2, &cert(2, &["db", "backup"])), None);
        s.put(&host_key("n", "h3"), signed_record(3, 3, &cert(3, &[])), None);
        s.put(&host_key("n", "h4"), signed_record(4, 4, &cert(4, &["web"])), None);
        s.put_claim(mac(1), claim(1, mac(1), 1000, 0, &["web"]), None);
        s.put_claim(mac(2), claim(2, mac(2), 1000, 0, &["db"]), None);
        s.put_claim(mac(3), claim(3, mac(3), 1000, 0, &["db"]), None);
        s.put_claim(mac(4), claim(4, mac(4), 1000, 0, &["web", "db"]), None);
        s.put_claim(mac(5), claim(4, mac(5), 1000, 0, &["web"]), None);
        s.put_claim(mac(6), claim(3, mac(6), 1000, 0, &[]), None);
        // The positive control first: no network key, no authority.
        let mut plain = Member::with_policy("n", "h1", Policy { have_key: true, ..Policy::default() });
        sync(&mut plain, &s);
        let g = plain.mac_groups();
        assert_eq!((g.get(&mac(3)), g.get(&mac(4))), (Some(&gs(&["db"])), Some(&gs(&["web", "db"]))));
        assert_eq!(plain.stats.groups_refused, 0);
        let mut m = signed_view(&nk, "h1");
        sync(&mut m, &s);
        let g = m.mac_groups();
        assert_eq!(g.get(&mac(1)), Some(&gs(&["web"])), "this host's own VM");
        assert_eq!(g.get(&mac(2)), Some(&gs(&["db"])), "within its certificate's set");
        assert_eq!(g.get(&mac(5)), Some(&gs(&["web"])), "the attacker's host, within its set");
        assert!(!g.contains_key(&mac(3)) && !g.contains_key(&mac(4)), "{g:?}");
        assert!(
            g.iter().all(|(k, v)| *k == mac(2) || !v.contains(&"db".to_string())),
            "only h2's VM is in db: {g:?}"
        );
        assert_eq!(
            (m.route_of(mac(4)), m.route_of(mac(6))),
            (None, Some("h3")),
            "refused, not routed; a claim with no group is fine"
        );
        assert_eq!(m.stats.groups_refused, 2);
        let q: BTreeMap<&str, String> = m.quarantined().map(|(k, e)| (k, e.to_string())).collect();
        let why = &q[crate::layout::claim_key("n", "h4", mac(4)).as_str()];
        assert!(why.contains("host `h4`") && why.contains("group `db`"), "{why}");
        assert!(q[crate::layout::claim_key("n", "h3", mac(3)).as_str()].contains("host `h3`"), "{q:?}");
        // h4's certificate renewed to allow db: its waiting claim is taken.
        s.put(&host_key("n", "h4"), signed_record(4, 4, &cert(4, &["web", "db"])), None);
        sync(&mut m, &s);
        assert_eq!(m.mac_groups().get(&mac(4)), Some(&gs(&["web", "db"])));
        assert_eq!(m.route_of(mac(4)), Some("h4"));
        assert!(!m.quarantined().any(|(k, _)| k == crate::layout::claim_key("n", "h4", mac(4))));
        // h2's renewed without db: its MAC keeps its route, not the group.
        s.put(&host_key("n", "h2"), signed_record(2, 2, &cert(2, &["backup"])), None);
        sync(&mut m, &s);
        assert!(!m.mac_groups().contains_key(&mac(2)) && m.route_of(mac(2)) == Some("h2"));
        // mac 5 migrates to h3 naming web: refused, it stays h4's.
        s.put_claim(mac(5), claim(3, mac(5), 2000, 1, &["web"]), None);
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(5)), m.stats.groups_refused), (Some("h4"), 3));
        // A certificate naming a group that is no name is refused when signed.
        let mut bad: CertBody = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(cert(4, &[]).split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        bad.groups = vec!["no name".into()];
        assert!(nk.sign(&bad).is_err());
        // h1 goes (its record deleted): its MACs lose their groups.
        s.delete_if(&host_key("n", "h1"), None);
        sync(&mut m, &s);
        assert!(!m.mac_groups().contains_key(&mac(1)), "{:?}", m.mac_groups());
    }

    /// Signed claims: one that comes before its host's record waits and is
    /// taken with the record; an older claim of the same host is a
    /// replay; a migration (a higher epoch, a newer
    /// claim) moves the MAC; another host at the same epoch is a conflict;
    /// a deleted claim takes the route away.
    #[test]
    fn signed_claims_wait_for_their_host_refuse_replays_and_move_only_by_migration() {
        use crate::layout::MacRecord;
        use crate::trust::{ClaimKey, NetworkKey};
        let nk = NetworkKey::generate().unwrap();
        let ck = |h: u8| ClaimKey::derive(&[h; 32]).unwrap();
        let record = |h: u8| signed_record(h, h, &signed_cert(&nk, h, h, None));
        let claim = |h: u8, at_ms: u64, epoch: u64| {
            let mut r =
                MacRecord { host: format!("h{h}"), iface: "vm0".into(), at_ms, epoch, ..Default::default() };
            r.sig = Some(ck(h).sign("n", mac(9), &r));
            r.to_json()
        };
        let mut m = signed_view(&nk, "h1");
        let mut s = MemStore::new();
        s.put(&host_key("n", "h1"), record(1), None);
        s.put(&host_key("n", "h2"), record(2), None);
        // h3's claim before h3's record: held, not routed, until the record.
        s.put_claim(mac(9), claim(3, 1000, 0), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(9)), None);
        s.put(&host_key("n", "h3"), record(3), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(9)), Some("h3"), "taken with h3's record");
        let bad = m.stats.bad_records;
        // A replay: h3's older claim (under h3's key: only h3, or the
        // admin, writes there).
        s.put_claim(mac(9), claim(3, 900, 0), None);
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(9)), m.stats.bad_records), (Some("h3"), bad + 1));
        // h3 again at its own time: no news, no refusal.
        s.put_claim(mac(9), claim(3, 1000, 0), None);
        sync(&mut m, &s);
        assert_eq!(m.stats.bad_records, bad + 1);
        // A migration to h2: a newer claim at a higher epoch.
        s.put_claim(mac(9), claim(2, 2000, 1), None);
        sync(&mut m, &s);
        assert_eq!((m.route_of(mac(9)), m.epoch(mac(9))), (Some("h2"), 1));
        // h3 at the same epoch, later: a conflict, nothing moves.
        s.put_claim(mac(9), claim(3, 3000, 1), None);
        sync(&mut m, &s);
        assert_eq!(m.route_of(mac(9)), Some("h2"));
        assert_eq!(m.conflicts().collect::<Vec<_>>(), [(mac(9), "h2", "h3")]);
        // The holder's claim deleted: the conflicting claim, still in the
        // store under h3's key, is taken (checked again).
        s.delete_if(&crate::layout::claim_key("n", "h2", mac(9)), None);
        let out = sync(&mut m, &s);
        assert_eq!(
            out,
            vec![
                Change::Route { mac: mac(9), host: None },
                Change::Route { mac: mac(9), host: Some("h3".into()) }
            ]
        );
        assert_eq!(m.conflicts().count(), 0);
        // Every claim deleted: no route.
        s.delete_claims(mac(9));
        let out = sync(&mut m, &s);
        assert_eq!(out, vec![Change::Route { mac: mac(9), host: None }]);
        assert_eq!(m.route_of(mac(9)), None);
    }

    /// A host at an address another host holds waits, parked (counted,
    /// not linked), and is linked when the holder frees the address; a
    /// host that moves to a free address frees its old one.
    #[test]
    fn a_host_at_a_held_address_waits_for_it() {
        let mut m = Member::new("n", "a");
        let mut s = MemStore::new();
        s.put(&host_key("n", "b"), host(2), None);
        s.put(&host_key("n", "c"), host(2), None);
        sync(&mut m, &s);
        assert!(m.live("b") && !m.live("c"));
        assert_eq!(m.stats.bad_records, 1);
        // b moves to .3: .2 is c's now.
        s.put(&host_key("n", "b"), host(3), None);
        let out = sync(&mut m, &s);
        assert!(m.live("b") && m.live("c"), "{out:?}");
        assert_eq!(m.links().count(), 2);
        // b goes: its address is free, nobody waits for it.
        s.delete_if(&host_key("n", "b"), None);
        sync(&mut m, &s);
        assert!(!m.live("b") && m.live("c"));
    }

    /// A relist of a store a host left: that host's link goes, with its
    /// routes; the hosts that stayed change nothing.
    #[test]
    fn a_relist_drops_only_the_hosts_gone() {
        let mut s = MemStore::new();
        let mut m = Member::new("n", "a");
        for (i, h) in ["b", "c"].iter().enumerate() {
            s.put(&host_key("n", h), host(i as u8 + 2), None);
            s.put_claim(mac(i as u32 + 2), vm(h), None);
        }
        sync(&mut m, &s);
        s.delete_if(&host_key("n", "c"), None);
        let (kvs, rev) = s.range(m.prefix());
        let mut out = Vec::new();
        m.relist(&kvs, rev, &mut out);
        assert_eq!(
            out,
            vec![Change::Route { mac: mac(3), host: None }, Change::Link { host: "c".into(), peer: None }]
        );
    }

    /// Every event is counted; the quarantine shows at most
    /// [`QUARANTINE_SHOWN`] keys and counts the rest; a view watches its own
    /// network's prefix only.
    #[test]
    fn events_are_counted_the_quarantine_is_bounded_and_the_prefix_is_the_networks() {
        let mut s = MemStore::new();
        let mut m = Member::new("n", "a");
        let n = QUARANTINE_SHOWN + 10;
        for i in 0..n {
            s.put(&host_key("n", &format!("h{i}")), b"junk".to_vec(), None);
        }
        s.put(&host_key("other", "x"), host(9), None);
        sync(&mut m, &s);
        assert_eq!(m.prefix(), "/vnet/n/");
        assert_eq!((m.stats.events, m.stats.bad_records, m.stats.unknown_keys), (n as u64, n as u64, 0));
        assert_eq!(m.quarantined().count(), QUARANTINE_SHOWN);
    }

    /// What a view holds for records it cannot take yet is bounded: hosts
    /// parked at a held address, claims waiting for their host's record,
    /// epochs (kept only for MACs that migrated).
    #[test]
    fn what_waits_is_bounded_and_epochs_are_kept_only_for_migrations() {
        let mut m = Member::new("n", "a");
        let mut s = MemStore::new();
        for i in 0..MAX_DUPLICATES + 5 {
            s.put(&host_key("n", &format!("h{i}")), host(2), None);
        }
        sync(&mut m, &s);
        assert_eq!(m.duplicates.len(), MAX_DUPLICATES);
        // Conflicts shown: at most CONFLICTS_SHOWN (h1 and h2 live, at .1 and .3).
        s.put(&host_key("n", "h1"), host(1), None);
        s.put(&host_key("n", "h2"), host(3), None);
        let n = CONFLICTS_SHOWN as u32 + 5;
        for i in 100..100 + n {
            s.put_claim(mac(i), vm("h1"), None);
        }
        sync(&mut m, &s);
        for i in 100..100 + n {
            s.put_claim(mac(i), vm("h2"), None);
        }
        sync(&mut m, &s);
        assert_eq!(m.conflicts().count(), CONFLICTS_SHOWN);
        // Epochs: none for a first claim, one for a migration.
        s.put_claim(mac(1), vm("h0"), None);
        sync(&mut m, &s);
        assert!(m.epochs.is_empty());
        s.put_claim(mac(1), crate::layout::fixtures::moved("h0", 1), None);
        sync(&mut m, &s);
        assert_eq!(m.epoch(mac(1)), 1);
        // Epochs held are bounded by max_macs (they outlive the claims).
        let mut m = Member::with_policy("n", "a", Policy { max_macs: 2, ..Policy::default() });
        let mut s = MemStore::new();
        s.put(&host_key("n", "b"), host(2), None);
        for i in 1..=3 {
            s.put_claim(mac(i), crate::layout::fixtures::moved("b", 1), None);
            sync(&mut m, &s);
            s.delete_claims(mac(i));
            sync(&mut m, &s);
        }
        assert_eq!((m.epoch(mac(1)), m.epoch(mac(2)), m.epoch(mac(3))), (1, 1, 0));
        // Signed: claims waiting for a record, at most max_macs of them.
        let nk = crate::trust::NetworkKey::generate().unwrap();
        let policy =
            Policy { network_key: Some(nk.public()), have_key: true, max_macs: 2, ..Policy::default() };
        let mut m = Member::with_policy("n", "a", policy);
        let mut s = MemStore::new();
        for i in 0..4 {
            s.put_claim(mac(i), vm("h9"), None);
        }
        sync(&mut m, &s);
        assert_eq!(m.unverified.len(), 2);
        assert_eq!(m.stats.bad_records, 4);
    }

    /// A host parked at a held address whose certificate expires while it
    /// waits is dropped when the address frees (counted, quarantined); one
    /// whose certificate is still valid at that second is taken.
    #[test]
    fn a_parked_host_whose_certificate_expired_is_not_taken() {
        let nk = crate::trust::NetworkKey::generate().unwrap();
        for (now, taken) in [(2_001, false), (2_000, true)] {
            let mut m = signed_view(&nk, "h1");
            let mut s = MemStore::new();
            s.put(&host_key("n", "h2"), signed_record(2, 2, &signed_cert(&nk, 2, 2, None)), None);
            s.put(&host_key("n", "h3"), signed_record(3, 2, &signed_cert(&nk, 3, 2, Some(2_000))), None);
            m.expire(1_000, &mut Vec::new());
            sync(&mut m, &s);
            assert!(m.live("h2") && !m.live("h3"), "h3 parked");
            m.expire(now, &mut Vec::new());
            let bad = m.stats.bad_records;
            s.delete_if(&host_key("n", "h2"), None);
            let out = sync(&mut m, &s);
            assert_eq!(m.live("h3"), taken, "at {now}: {out:?}");
            assert_eq!(m.stats.bad_records, bad + u64::from(!taken), "at {now}");
            let held = m
                .quarantined()
                .any(|(k, e)| k == host_key("n", "h3") && matches!(e, RecordError::CertExpired(2_000)));
            assert_eq!(held, !taken);
        }
    }

    /// A claim deleted leaves its host's other MACs routed to it, and the
    /// host's going takes exactly those; a host that never had a link
    /// going changes nothing; a revocation of a host with no record
    /// drops nobody, even while another host is parked.
    #[test]
    fn deletions_take_away_exactly_what_they_name() {
        let mut m = Member::new("n", "a");
        let mut s = MemStore::new();
        s.put(&host_key("n", "b"), host(2), None);
        s.put(&host_key("n", "c"), host(2), None);
        s.put_claim(mac(1), vm("b"), None);
        s.put_claim(mac(2), vm("b"), None);
        sync(&mut m, &s);
        s.delete_claims(mac(1));
        assert_eq!(sync(&mut m, &s), vec![Change::Route { mac: mac(1), host: None }]);
        // c, parked at b's address, goes: it never had a link.
        s.delete_if(&host_key("n", "c"), None);
        assert_eq!(sync(&mut m, &s), vec![]);
        s.delete_if(&host_key("n", "b"), None);
        assert_eq!(
            sync(&mut m, &s),
            vec![Change::Route { mac: mac(2), host: None }, Change::Link { host: "b".into(), peer: None }]
        );
        // Signed: h4 known and gone, h3 parked; h4's revocation drops nobody.
        let nk = crate::trust::NetworkKey::generate().unwrap();
        let mut m = signed_view(&nk, "h1");
        let mut s = MemStore::new();
        s.put(&host_key("n", "h2"), signed_record(2, 2, &signed_cert(&nk, 2, 2, None)), None);
        s.put(&host_key("n", "h3"), signed_record(3, 2, &signed_cert(&nk, 3, 2, None)), None);
        s.put(&host_key("n", "h4"), signed_record(4, 4, &signed_cert(&nk, 4, 4, None)), None);
        sync(&mut m, &s);
        s.delete_if(&host_key("n", "h4"), None);
        sync(&mut m, &s);
        let bad = m.stats.bad_records;
        let r = crate::trust::Revocation { network: "n".into(), host: "h4".into(), cert: None, at: 1 };
        s.put(&crate::layout::revoked_host_key("n", "h4"), nk.revoke(&r).unwrap().into_bytes(), None);
        assert_eq!(sync(&mut m, &s), vec![]);
        assert_eq!((m.stats.bad_records, m.revoked()), (bad, (1, 0)));
        assert!(m.live("h2") && !m.live("h3"));
        // Another host's revocation is not this host's; its own is.
        assert!(!m.revoked_self());
        let r = crate::trust::Revocation { network: "n".into(), host: "h1".into(), cert: None, at: 1 };
        s.put(&crate::layout::revoked_host_key("n", "h1"), nk.revoke(&r).unwrap().into_bytes(), None);
        sync(&mut m, &s);
        assert!(m.revoked_self());
    }

    /// A record's kinds: at most 8, each 1-16 lowercase letters.
    #[test]
    fn a_records_kinds_are_bounded_words() {
        use crate::layout::HostRecord;
        let with = |kinds: Vec<String>| {
            let mut m = Member::new("n", "a");
            let mut s = MemStore::new();
            let r = HostRecord {
                addr: "10.0.0.2:9000".parse().unwrap(),
                kinds,
                public_key: None,
                cert: None,
                relay: false,
                gateway: None,
            };
            s.put(&host_key("n", "b"), r.to_json(), None);
            sync(&mut m, &s);
            m.live("b")
        };
        let k = |n: usize, w: &str| vec![w.to_string(); n];
        assert!(with(k(8, "vxlan")) && with(k(1, &"x".repeat(16))));
        assert!(!with(k(9, "vxlan")), "9 kinds");
        assert!(!with(k(1, &"x".repeat(17))), "a kind of 17");
        assert!(!with(k(1, "")), "an empty kind");
        assert!(!with(k(1, "Vxlan")), "upper case");
        assert!(!with(vec!["vxlan".into(), "tcp9".into()]), "a digit");
    }

    /// Host `h{h}`'s certificate in network `n` (static key `[h; 32]`,
    /// claim key from `[h; 32]`, address 10.0.0.`ip`), expiring at
    /// `not_after`.
    pub(super) fn signed_cert(
        nk: &crate::trust::NetworkKey,
        h: u8,
        ip: u8,
        not_after: Option<u64>,
    ) -> String {
        let body = crate::trust::CertBody {
            network: "n".into(),
            host: format!("h{h}"),
            public_key: vnet_control::PeerKey([h; 32]).to_string(),
            claim_key: crate::trust::ClaimKey::derive(&[h; 32]).unwrap().public_base64(),
            addrs: vec![format!("10.0.0.{ip}")],
            groups: Vec::new(),
            not_after,
        };
        nk.sign(&body).unwrap()
    }

    /// Host `h{h}`'s record at 10.0.0.`ip`:9000 with certificate `cert`.
    pub(super) fn signed_record(h: u8, ip: u8, cert: &str) -> Vec<u8> {
        crate::layout::HostRecord {
            addr: format!("10.0.0.{ip}:9000").parse().unwrap(),
            kinds: vec![],
            public_key: Some(vnet_control::PeerKey([h; 32]).to_string()),
            cert: Some(cert.to_string()),
            relay: false,
            gateway: None,
        }
        .to_json()
    }

    /// A view of network `n` signed by `nk`, as host `me`.
    pub(super) fn signed_view(nk: &crate::trust::NetworkKey, me: &str) -> Member {
        Member::with_policy(
            "n",
            me,
            Policy { network_key: Some(nk.public()), have_key: true, ..Policy::default() },
        )
    }

    #[test]
    fn hosts_macs_and_moves_become_links_and_routes() {
        let mut s = MemStore::new();
        let mut a = Member::new("n", "a");
        let la = s.grant(10, 0);
        s.put(&host_key("n", "a"), host(1), Some(la));
        s.put_claim(mac(1), vm("a"), Some(la));
        // b's MAC before b's host record: known, not routed yet.
        let lb = s.grant(10, 0);
        s.put_claim(mac(2), vm("b"), Some(lb));
        let c = sync(&mut a, &s);
        assert!(c.is_empty(), "{c:?}");
        s.put(&host_key("n", "b"), host(2), Some(lb));
        let c = sync(&mut a, &s);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(a.route_of(mac(2)), Some("b"));
        assert_eq!(a.route_of(mac(1)), None, "our own MAC is never routed");
        // A move (a migration: the epoch above the one held): one event, one route change.
        let lc = s.grant(10, 0);
        s.put(&host_key("n", "c"), host(3), Some(lc));
        sync(&mut a, &s);
        s.put_claim(mac(2), crate::layout::fixtures::moved("c", 1), Some(lc));
        let c = sync(&mut a, &s);
        assert_eq!(c, vec![Change::Route { mac: mac(2), host: Some("c".into()) }]);
        // b's lease expires: its link goes, no route pointed at it any more.
        s.keepalive(la, 5);
        s.keepalive(lc, 5);
        s.expire(12);
        let c = sync(&mut a, &s);
        assert_eq!(c, vec![Change::Link { host: "b".into(), peer: None }]);
        assert_eq!(a.links().count(), 1);
        // Junk values and unknown keys are counted, nothing else.
        s.put(&host_key("n", "d"), b"not json".to_vec(), None);
        s.put("/vnet/n/other/x", vec![], None);
        assert!(sync(&mut a, &s).is_empty());
        assert_eq!((a.stats.bad_records, a.stats.unknown_keys), (1, 1));
    }

    #[test]
    fn a_relist_after_compaction_converges_to_the_same_view() {
        let mut s = MemStore::new();
        let mut a = Member::new("n", "a");
        for i in 0..5u8 {
            s.put(&host_key("n", &format!("h{i}")), host(i), None);
            s.put_claim(mac(i.into()), vm(&format!("h{i}")), None);
        }
        sync(&mut a, &s);
        // Changes while a is away, then history compacted.
        s.delete_if(&host_key("n", "h1"), None);
        s.put_claim(mac(2), crate::layout::fixtures::moved("h3", 1), None);
        s.put(&host_key("n", "h9"), host(9), None);
        s.compact(s.revision());
        assert!(s.watch(a.prefix(), a.revision() + 1).is_err());
        let (kvs, rev) = s.range(a.prefix());
        let mut out = Vec::new();
        a.relist(&kvs, rev, &mut out);
        assert_eq!(a.route_of(mac(1)), None);
        assert_eq!(a.route_of(mac(2)), Some("h3"));
        assert!(out.contains(&Change::Link { host: "h1".into(), peer: None }));
        assert!(out.contains(&Change::Route { mac: mac(2), host: Some("h3".into()) }));
        assert!(out.iter().any(|c| matches!(c, Change::Link { host, peer: Some(_) } if host == "h9")));
        assert_eq!(a.revision(), rev);
        assert_eq!(a.stats.relists, 1);
    }

    fn keyed(i: u8, key: &str) -> Vec<u8> {
        let addr = format!("10.0.0.{i}:9000").parse().unwrap();
        HostRecord {
            addr,
            kinds: vec![],
            public_key: Some(key.into()),
            cert: None,
            relay: false,
            gateway: None,
        }
        .to_json()
    }

    #[test]
    fn a_bad_record_is_quarantined_and_every_other_change_still_applies() {
        let mut s = MemStore::new();
        let mut a = Member::with_policy("n", "a", Policy { have_key: true, ..Policy::default() });
        let key = PeerKey([5; 32]).to_string();
        s.put(&host_key("n", "b"), host(2), None);
        s.put_claim(mac(2), vm("b"), None);
        // The injection: a key followed by a newline and two lines of the control language.
        let injected = format!("{key}\nlink spy udp 6.6.6.6:9000\nroute any any -> link spy");
        s.put(&host_key("n", "x"), keyed(9, &injected), None);
        s.put(&host_key("n", "y"), keyed(10, "not base64!"), None);
        s.put(&host_key("n", "z"), br#"{"addr":"0.0.0.0:9000"}"#.to_vec(), None);
        s.put(&host_key("n", "w"), br#"{"addr":"10.0.0.11:0"}"#.to_vec(), None);
        s.put(&host_key("n", "dup"), host(2), None); // b's address
        s.put_claim(mac(3), br#"{"host":"a/b"}"#.to_vec(), None);
        s.put(&host_key("n", "c"), keyed(3, &key), None);
        let c = sync(&mut a, &s);
        // b and c apply, with b's MAC; nothing of the rest.
        let linked: Vec<&str> = a.links().map(|(n, _)| n).collect();
        assert_eq!(linked, ["b", "c"], "{c:?}");
        assert_eq!(a.route_of(mac(2)), Some("b"));
        assert_eq!(a.links().find(|(n, _)| *n == "c").unwrap().1.key, Some(PeerKey([5; 32])));
        assert_eq!(a.stats.bad_records, 6);
        let q: BTreeMap<&str, String> = a.quarantined().map(|(k, e)| (k, e.to_string())).collect();
        assert!(q["/vnet/n/hosts/x"].contains("not a key"), "{q:?}");
        assert!(q["/vnet/n/hosts/z"].contains("not a unicast address"), "{q:?}");
        assert!(q["/vnet/n/hosts/dup"].contains("already host `b`'s"), "{q:?}");
        assert!(q.contains_key("/vnet/n/claims/x/52:54:00:00:00:03"), "{q:?}");
        // b leaves: the duplicate waiting for its address takes it.
        s.delete_if(&host_key("n", "b"), None);
        let c = sync(&mut a, &s);
        assert!(c.contains(&Change::Link { host: "b".into(), peer: None }), "{c:?}");
        assert!(
            c.iter().any(|c| matches!(c, Change::Link { host, peer: Some(_) } if host == "dup")),
            "{c:?}"
        );
        assert!(!a.quarantined().any(|(k, _)| k.ends_with("/dup")));
        // A fixed record leaves quarantine.
        s.put(&host_key("n", "x"), keyed(9, &key), None);
        sync(&mut a, &s);
        assert!(a.links().any(|(n, _)| n == "x") && !a.quarantined().any(|(k, _)| k.ends_with("/x")));
    }

    #[test]
    fn keyed_peers_need_a_key_here_and_a_secured_network_needs_keyed_peers() {
        let mut s = MemStore::new();
        s.put(&host_key("n", "b"), keyed(2, &PeerKey([5; 32]).to_string()), None);
        s.put(&host_key("n", "c"), host(3), None);
        let mut keyless = Member::new("n", "a");
        sync(&mut keyless, &s);
        assert_eq!(keyless.links().map(|(n, _)| n).collect::<Vec<_>>(), ["c"]);
        assert!(keyless.quarantined().any(|(_, e)| *e == RecordError::NoOwnKey));
        let policy = Policy { have_key: true, require_key: true, ..Policy::default() };
        let mut secured = Member::with_policy("n", "a", policy);
        sync(&mut secured, &s);
        assert_eq!(secured.links().map(|(n, _)| n).collect::<Vec<_>>(), ["b"]);
        assert!(secured.quarantined().any(|(_, e)| *e == RecordError::KeyRequired));
    }

    #[test]
    fn what_a_view_holds_is_bounded() {
        let mut s = MemStore::new();
        let policy = Policy { max_hosts: 4, max_macs: 3, ..Policy::default() };
        let mut a = Member::with_policy("n", "a", policy);
        for i in 0..10u8 {
            s.put(&host_key("n", &format!("h{i}")), host(i + 1), None);
            s.put_claim(mac(i.into()), vm("h0"), None);
        }
        sync(&mut a, &s);
        assert_eq!(a.hosts().count(), 4);
        assert_eq!(a.macs(), 3);
        assert_eq!(a.stats.bad_records, 6 + 7);
        assert!(a.quarantined().count() <= QUARANTINE_SHOWN);
    }
}
