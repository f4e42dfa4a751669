//! Cluster mode (`vnetd --cluster etcd:URL[,URL...] --network NAME`): the
//! host programs itself from etcd, as flannel's and Calico's agents do.
//!
//! One task, on the control plane's runtime, holds a session with etcd:
//!
//! 1. a lease with the configured TTL, kept alive every third of it (a
//!    host that dies stops keeping it, and etcd deletes its keys);
//! 2. a full listing of the network's prefix, taken into the sans-IO
//!    [`Member`] view; the host's record and the MACs of its interfaces
//!    (each declared `mac`) are put under the lease;
//! 3. a watch of the prefix from the listed revision: each response's
//!    events go through the view (every record checked, a bad one
//!    quarantined and counted), and what changes becomes one transaction
//!    of typed commands ([`vnet_cluster::apply`]), applied like any other,
//!    so both data paths follow atomically. A transaction the daemon
//!    refuses is retried as the whole view, with a backoff, and each
//!    distinct error is logged once;
//! 4. every [`LOCAL_POLL`], the daemon's state is checked for interfaces
//!    declared or deleted since (a relocated VM's new interface): a new
//!    one's MAC is claimed at once, a deleted one's released if the key is
//!    still this host's. A `standby` interface (a live migration's
//!    destination) is claimed only once its VM arrived and it became
//!    active, at the epoch above the held one (a migration: announced with
//!    a RARP); a MAC another live host holds is otherwise not claimed (a
//!    conflict, shown, tried again as the view changes);
//! 5. with `nat` link options, the address its peers reflect (behind a NAT
//!    that keeps the port) goes into its record.
//!
//! Any failure of the session (etcd unreachable, the watch closed, the
//! lease lost) leaves the data path as it is; the task says so in
//! [`membership`](crate::membership) and starts a new session after a
//! backoff. While the task waits (on etcd, or between sessions), local
//! interfaces declared meanwhile are routed within [`LOCAL_POLL`], and
//! published when the store is back: a host's own VMs never wait for it. A compaction that overtakes the watch is answered by listing
//! again, inside the session. A new session lists again, so a change
//! made while the host was away converges when it is back.

mod claims;
mod config;
mod error;
mod follow;
pub mod kept;

pub use config::{
    advertised, check_name, load_trust, parse_endpoints, Config, ConfigError, EndpointsError, Store,
    StoreAuth,
};
use error::{etcd, refused_client_certificate, SessionError};

use crate::daemon::Daemon;
use crate::membership::{self, Convergence, Health};
use etcd_client::{Client, EventType, PutOptions, WatchOptions};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use vnet_cluster::apply::{local, plan};
use vnet_cluster::layout::host_key;
use vnet_cluster::{Change, Event, HostRecord, Member, Policy};
use vnet_wire::MacAddr;

/// How often the daemon's interfaces are compared with what was published.
pub const LOCAL_POLL: Duration = Duration::from_millis(20);
/// The longest wait between two sessions.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The first and the longest wait before a refused transaction is retried.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// Runs cluster mode for ever (the caller's runtime ends it).
pub async fn run(
    cfg: Config,
    daemon: Arc<Mutex<Daemon>>,
    status: membership::Shared,
    mut ipam: Option<crate::ipam::Receiver>,
) {
    {
        let mut s = lock(&status);
        s.network = cfg.network.clone();
        s.host = cfg.host.clone();
        s.endpoints = cfg.store.endpoints.clone();
        s.ttl_s = lease_ttl(cfg.ttl);
    }
    let policy = Policy {
        network_key: cfg.network_key,
        require_key: cfg.link_options.require_key(),
        tenant: cfg.link_options.network,
        have_key: lock(&daemon).public_key().is_some(),
        kube: cfg.kube_pods.is_some(),
        ..Policy::default()
    };
    let mut member = Member::with_policy(&cfg.network, &cfg.host, policy);
    if let Some(k) = &cfg.kept {
        // Checked when read, at the start: this does not fail.
        if let Err(e) = member.restore(k) {
            tracing::error!("cluster: the kept trust state: {e}");
        }
        tracing::info!(
            serial = k.serial,
            revoked_hosts = k.revoked_hosts.len(),
            revoked_certs = k.revoked_certs.len(),
            "cluster: the network's trust state kept by the last run is held"
        );
    }
    let mut host = Host::new(member, cfg, daemon, status);
    let mut backoff = Duration::from_millis(100);
    let mut said = None;
    loop {
        let started = Instant::now();
        let e = host.session(&mut ipam).await;
        let mut fix = e.permanent(&host.cfg.store, &host.cfg.network);
        let e = e.said();
        if fix.is_none() && e.contains("connection closed") {
            fix = refused_client_certificate(&host.cfg.store).await;
        }
        {
            let mut s = lock(&host.status);
            s.counters.store_errors += 1;
            match &fix {
                // Said once, in one sentence: retrying will not mend it.
                Some(fix) => {
                    if said.as_ref() != Some(fix) {
                        tracing::error!(network = %host.cfg.network, "cluster: {fix}");
                        crate::handover::notify(&format!("STATUS=cluster: {fix}"));
                    }
                    s.set_health(Health::Failed, Some(fix.clone()));
                }
                None => {
                    tracing::warn!(network = %host.cfg.network, "cluster: {e}; the data path keeps its last state");
                    s.set_health(Health::Down, Some(e));
                }
            }
        }
        said = fix.clone();
        host.next_endpoint();
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        if fix.is_some() {
            // Someone must fix it; a fixed setting is tried every 10 s.
            backoff = Duration::from_secs(10);
        }
        // Meanwhile, interfaces declared or deleted get their local routes
        // (the store hears of them when it is back).
        host.wait(tokio::time::sleep(backoff)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The next `ipam` request, or never (static mode has none).
async fn next_request(rx: &mut Option<crate::ipam::Receiver>) -> Option<crate::ipam::Request> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The API's pods when they change (`--kube`), or never.
async fn next_pods(
    rx: &mut Option<crate::kube_pods::Receiver>,
) -> Option<Arc<vnet_cluster::member::PodFacts>> {
    let Some(rx) = rx else { return std::future::pending().await };
    if rx.changed().await.is_err() {
        return std::future::pending().await;
    }
    rx.borrow_and_update().clone()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A MAC this host put in the store: the interface it put it for, and the
/// value it put (released only while the store still holds that value).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    iface: u32,
    name: String,
    value: Vec<u8>,
    /// The addresses and groups the claim names (the `neigh` lines for
    /// the MAC, its interface's groups).
    facts: Facts,
    /// The store's revision of this host's last put of it: a watch event
    /// after it with another value is another writer's.
    rev: u64,
}

/// A refused transaction: when the whole view is tried again, and the wait after that.
#[derive(Debug, Clone, Copy)]
struct Retry {
    at: Instant,
    backoff: Duration,
}

struct Host {
    cfg: Config,
    daemon: Arc<Mutex<Daemon>>,
    status: membership::Shared,
    member: Member,
    published: BTreeMap<MacAddr, Published>,
    /// Local interfaces whose MAC another live host holds (a conflict: not
    /// claimed, not routed here), with that host; tried again whenever the
    /// view has moved on ([`Host::unclaimed_rev`]).
    unclaimed: BTreeMap<MacAddr, (String, String)>,
    /// The view's revision when `unclaimed` was last made.
    unclaimed_rev: u64,
    /// `nat` links: this host's public address as its peers see it (behind
    /// a NAT), with its listening port; advertised in its record instead of
    /// the listening address, where its certificate allows it.
    reflected: Option<SocketAddr>,
    /// The reflected address the certificate was found not to name.
    unnamed: Option<std::net::IpAddr>,
    /// `relay auto`: the relay its links go through now (a host whose record
    /// says it relays); when it changes, the whole view is planned again.
    relay_key: Option<vnet_control::PeerKey>,
    /// The lease of the last session, reused if still alive.
    lease: Option<i64>,
    /// Which of the store's endpoints the next session talks to: one at a
    /// time, the next after a session ends (etcd-client's channel over
    /// several fails as a whole while any one of them refuses connections,
    /// etcdv3/etcd-client#39: a cluster with a member down was unreachable).
    endpoint: usize,
    /// The last transaction was refused: the next one brings the whole view.
    retry: Option<Retry>,
    /// The last error logged (the same one is not logged again).
    logged: Option<String>,
    /// Hosts whose records could not apply (a link of theirs would take a
    /// static link's name or address), with why.
    refused: BTreeMap<String, String>,
    /// The daemon's generation when local interfaces were last routed.
    seen: u64,
    /// This host's node gateway (address, MAC) as its own IPAM allocations
    /// hold it ([`crate::ipam::own_gateway`]), and the one its record
    /// last named, signed ([`Host::named_gateway`]).
    gateway: Option<(std::net::IpAddr, MacAddr)>,
    named: Option<(std::net::IpAddr, MacAddr)>,
    /// The host record this host last put: another writer's change to it
    /// (or its deletion) is undone at once.
    own: Vec<u8>,
    /// The member's addresses version the daemon's `neigh` answers follow.
    neighbors_version: u64,
    /// The member's signed policy version the daemon enforces.
    policy_version: u64,
    /// The member's claim groups version the daemon's groups follow.
    groups_version: u64,
    /// The member's kept state version last written to disk, and the last
    /// write error (logged once).
    kept_version: u64,
    kept_failed: Option<String>,
}

impl Host {
    /// A host with `member` as its view, nothing published yet.
    fn new(member: Member, cfg: Config, daemon: Arc<Mutex<Daemon>>, status: membership::Shared) -> Host {
        Host {
            member,
            cfg,
            daemon,
            status,
            published: BTreeMap::new(),
            unclaimed: BTreeMap::new(),
            unclaimed_rev: 0,
            reflected: None,
            unnamed: None,
            relay_key: None,
            lease: None,
            endpoint: 0,
            retry: None,
            logged: None,
            refused: BTreeMap::new(),
            seen: u64::MAX,
            own: Vec::new(),
            gateway: None,
            named: None,
            neighbors_version: 0,
            policy_version: 0,
            groups_version: 0,
            kept_version: 0,
            kept_failed: None,
        }
    }

    /// The next session talks to the next of the store's endpoints (this
    /// one may be a member that is down).
    fn next_endpoint(&mut self) {
        self.endpoint = (self.endpoint + 1) % self.cfg.store.endpoints.len().max(1);
    }

    /// One session with etcd; returns why it ended.
    async fn session(&mut self, ipam: &mut Option<crate::ipam::Receiver>) -> SessionError {
        match self.session_inner(ipam).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn session_inner(
        &mut self,
        ipam: &mut Option<crate::ipam::Receiver>,
    ) -> Result<std::convert::Infallible, SessionError> {
        let ttl = lease_ttl(self.cfg.ttl);
        let (mut c, lease) = self.connect(ttl).await?;
        let (mut keeper, mut kept) = self.wait(c.lease_keep_alive(lease)).await.map_err(etcd("keepalive"))?;
        let (network, me) = (self.cfg.network.clone(), self.cfg.host.clone());
        self.gateway =
            self.wait(crate::ipam::own_gateway(&mut c, &network, &me)).await.map_err(etcd("own gateway"))?;
        let mut rev = self.announce(&mut c, lease).await?;
        let kept_addresses = self
            .wait(crate::ipam::keep(&mut c, &network, &me, lease))
            .await
            .map_err(etcd("keep addresses"))?;
        if kept_addresses > 0 {
            tracing::info!(
                addresses = kept_addresses,
                "cluster: this host's addresses are under its new lease"
            );
        }
        let prefix = self.member.prefix().to_string();
        let own_key = host_key(&self.cfg.network, &self.cfg.host);
        let watch_opts = |rev: u64| WatchOptions::new().with_prefix().with_start_revision(rev as i64 + 1);
        let mut watch =
            self.wait(c.watch(prefix.clone(), Some(watch_opts(rev)))).await.map_err(etcd("watch"))?;
        let mut keep_every = tokio::time::interval(Duration::from_millis(ttl * 1000 / 3));
        let mut local_every = tokio::time::interval(LOCAL_POLL);
        local_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = u64::MAX;
        let mut expire_every = Instant::now();
        let activated = lock(&self.daemon).shared().activated.clone();
        let mut pods = self.cfg.kube_pods.clone();
        loop {
            tokio::select! {
                Some(facts) = next_pods(&mut pods) => {
                    // The API's pods changed: other hosts' claims judged anew.
                    let (t0, mut changes) = (Instant::now(), Vec::new());
                    self.member.set_pods(facts, &mut changes);
                    self.converge(&changes, 0, t0);
                    self.release_pins();
                }
                _ = activated.notified() => {
                    // A migrated VM arrived here: its claim goes out now.
                    seen = lock(&self.daemon).generation();
                    self.publish(&mut c, lease).await?;
                }
                msg = watch.message() => {
                    let resp = msg.map_err(etcd("watch"))?.ok_or(SessionError::WatchClosed)?;
                    if resp.compact_revision() > 0 {
                        tracing::info!(compacted = resp.compact_revision(), "cluster: the watch fell behind compaction; listing again");
                        rev = self.relist(&mut c).await?;
                        watch = c.watch(prefix.clone(), Some(watch_opts(rev))).await.map_err(etcd("watch"))?;
                        continue;
                    }
                    if resp.canceled() {
                        return Err(SessionError::WatchCanceled(resp.cancel_reason().to_string()));
                    }
                    self.on_events(&mut c, lease, &resp, &own_key).await?;
                }
                Some(req) = next_request(ipam) => self.on_ipam(&mut c, lease, req).await?,
                _ = keep_every.tick() => {
                    keeper.keep_alive().await.map_err(etcd("keepalive"))?;
                }
                k = kept.message() => {
                    match k.map_err(etcd("keepalive"))? {
                        Some(r) if r.ttl() > 0 => {}
                        _ => {
                            self.lease = None;
                            return Err(SessionError::LeaseExpired);
                        }
                    }
                }
                _ = local_every.tick() => {
                    if expire_every.elapsed() >= Duration::from_secs(1) {
                        expire_every = Instant::now();
                        self.expire_certificates();
                    }
                    if self.reflect() || self.named_gateway() != self.named {
                        self.put_host(&mut c, lease).await?;
                    }
                    let generation = lock(&self.daemon).generation();
                    let unsettled = !self.unclaimed.is_empty() && self.member.revision() != self.unclaimed_rev;
                    if generation != seen || unsettled {
                        seen = generation;
                        self.publish(&mut c, lease).await?;
                    }
                    if self.retry.is_some_and(|r| Instant::now() >= r.at) {
                        self.converge(&[], 0, Instant::now());
                    }
                }
            }
        }
    }

    /// Connects to etcd and takes the lease this host's records live under
    /// (the one it held, if etcd still has it; else a new one, counted).
    async fn connect(&mut self, ttl: u64) -> Result<(Client, i64), SessionError> {
        let opts = self
            .cfg
            .store
            .connect_options()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(ttl.clamp(2, 5)))
            .with_keep_alive(Duration::from_secs(ttl.div_ceil(3).max(1)), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        let endpoints = &self.cfg.store.endpoints;
        let endpoint = endpoints.get(self.endpoint).or(endpoints.first()).cloned().unwrap_or_default();
        let mut c = self.wait(Client::connect([endpoint], Some(opts))).await.map_err(etcd("connect"))?;
        let alive = match self.lease {
            Some(id) => self.wait(lease_alive(&mut c, id)).await,
            None => false,
        };
        let lease = match self.lease {
            Some(id) if alive => id,
            _ => {
                let id = self.wait(c.lease_grant(ttl as i64, None)).await.map_err(etcd("lease grant"))?.id();
                if self.lease.is_some() {
                    lock(&self.status).counters.leases_lost += 1;
                }
                id
            }
        };
        self.lease = Some(lease);
        lock(&self.status).lease = Some(lease);
        Ok((c, lease))
    }

    /// Puts this host's record and claims (back) under `lease` after a
    /// fresh list of the network; returns the revision listed.
    async fn announce(&mut self, c: &mut Client, lease: i64) -> Result<u64, SessionError> {
        self.expire_certificates();
        let rev = self.relist(c).await?;
        self.put_host(c, lease).await?;
        // Every MAC this host still holds goes (back) under the lease.
        let held: Vec<(MacAddr, String)> = self
            .published
            .iter()
            .filter(|(m, _)| self.ours(**m))
            .map(|(m, p)| (*m, p.name.clone()))
            .collect();
        for (mac, name) in held {
            let epoch = self.member.epoch(mac);
            self.put_mac(c, lease, mac, &name, epoch, false).await?;
        }
        self.publish(c, lease).await?;
        lock(&self.status).set_health(Health::Up, None);
        tracing::info!(network = %self.cfg.network, host = %self.cfg.host, revision = rev, "cluster: watching");
        Ok(rev)
    }

    /// One watch response: its events applied to the view and converged,
    /// and what another writer changed of this host's own (its claims, its
    /// record) put back.
    async fn on_events(
        &mut self,
        c: &mut Client,
        lease: i64,
        resp: &etcd_client::WatchResponse,
        own_key: &str,
    ) -> Result<(), SessionError> {
        let t0 = Instant::now();
        let mut changes = Vec::new();
        let mut n = 0;
        let mut own_changed = false;
        let mut restore = Vec::new();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let (Ok(key), rev) = (kv.key_str(), kv.mod_revision().max(0) as u64) else {
                lock(&self.status).counters.bad_records += 1;
                continue;
            };
            let e = match ev.event_type() {
                EventType::Put => {
                    let created = kv.create_revision().max(0) as u64;
                    Event::Put { key: key.to_string(), value: kv.value().to_vec(), rev, created }
                }
                EventType::Delete => Event::Delete { key: key.to_string(), rev },
            };
            own_changed |=
                e.key() == own_key && !matches!(&e, Event::Put { value, .. } if *value == self.own);
            self.member.apply(&e, &mut changes);
            if let Some(mac) = self.foreign_change_to_a_claim(&e) {
                restore.push(mac);
            }
            n += 1;
        }
        self.converge(&changes, n, t0);
        self.give_up_lost_claims(c).await?;
        for mac in restore {
            let Some(name) = self.published.get(&mac).map(|p| p.name.clone()) else { continue };
            tracing::warn!(%mac, "cluster: this host's claim was changed or deleted by another writer; putting it back");
            lock(&self.status).counters.records_restored += 1;
            let epoch = self.member.epoch(mac);
            let Some(put) = self.put_mac(c, lease, mac, &name, epoch, false).await? else { continue };
            let mut again = Vec::new();
            self.member.apply(&put, &mut again);
            self.converge(&again, 1, Instant::now());
        }
        if own_changed {
            tracing::warn!(key = %own_key, "cluster: this host's record was changed by another writer; putting it back");
            lock(&self.status).counters.records_restored += 1;
            self.put_host(c, lease).await?;
        }
        Ok(())
    }

    /// Drops hosts whose certificate has expired (signed networks).
    fn expire_certificates(&mut self) {
        let mut changes = Vec::new();
        self.member.expire(membership::now_ms() / 1000, &mut changes);
        if !changes.is_empty() {
            tracing::warn!(
                "cluster: a host's certificate expired; its links and routes are gone until it is renewed"
            );
            self.converge(&changes, 0, Instant::now());
        }
    }

    /// Awaits `fut` (a request to etcd, which may hang while the store is
    /// unreachable) and meanwhile routes interfaces declared or deleted
    /// locally, so that the host's own VMs never wait for the store.
    async fn wait<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        let mut every = tokio::time::interval(LOCAL_POLL);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                _ = every.tick() => self.route_local(),
            }
        }
    }

    /// Routes local interfaces if the daemon's state changed since the last look.
    fn route_local(&mut self) {
        let generation = lock(&self.daemon).generation();
        if generation != self.seen {
            self.converge(&[], 0, Instant::now());
            self.seen = lock(&self.daemon).generation();
        }
    }

    /// Lists the prefix into the view and converges; returns the revision.
    async fn relist(&mut self, c: &mut Client) -> Result<u64, SessionError> {
        let t0 = Instant::now();
        let prefix = self.member.prefix().to_string();
        let (listed, rev) = self.wait(crate::listing::list(c, &prefix)).await.map_err(etcd("list"))?;
        let rev = rev.max(0) as u64;
        let (kvs, created): (Vec<(String, Vec<u8>)>, Vec<u64>) = listed
            .into_iter()
            .filter_map(|kv| {
                let created = kv.create_revision().max(0) as u64;
                Some(((kv.key_str().ok()?.to_string(), kv.value().to_vec()), created))
            })
            .unzip();
        let mut changes = Vec::new();
        self.member.relist_created(&kvs, &created, rev, &mut changes);
        lock(&self.status).counters.relists += 1;
        self.converge(&changes, kvs.len() as u64, t0);
        self.release_pins();
        Ok(rev)
    }

    /// A hand-over's pinned programs forwarded with the predecessor's
    /// maps until this vnetd's held the store's view (the other hosts'
    /// links and routes): now they do. With `--kube`, also the API's pods
    /// (until they are listed, no other node's pod is routed here).
    fn release_pins(&mut self) {
        if self.retry.is_some() || (self.member.bound_to_pods() && self.member.pods().is_none()) {
            return;
        }
        if let Some(said) = lock(&self.daemon).release_pins() {
            tracing::info!("{said} (after the store's view was applied)");
        }
    }

    /// `nat` links: whether this host's public address, as a peer reflects
    /// it (a relay's reflection first: a public host sees the NAT's address
    /// as it is), is news to advertise; its certificate must allow it, and
    /// the NAT must keep the listening port.
    fn reflect(&mut self) -> bool {
        if !self.cfg.link_options.nat || self.cfg.advertise.is_some() {
            return false;
        }
        let (seen, listen) = {
            let d = lock(&self.daemon);
            (d.reflections(), d.state().listen)
        };
        let relays: Vec<&str> = self.member.links().filter(|(_, p)| p.relay).map(|(n, _)| n).collect();
        let pick = seen.iter().find(|(n, _)| relays.contains(&n.as_str())).or(seen.first());
        // Only a NAT that keeps the port (one that forwards it, or
        // preserves it) gives an address others can send to first; behind
        // one that picks a port per destination (symmetric), the record
        // keeps the host's own address: its peers learn its mapping from
        // its own datagrams, and two such hosts go through a relay.
        let Some(seen) = pick.map(|(_, a)| *a).filter(|a| a.port() == listen.port()) else { return false };
        let ip = vnet_control::canonical(seen.ip());
        let addr = SocketAddr::new(ip, listen.port());
        let news = self.reflected != Some(addr) && !(ip == listen.ip() && self.reflected.is_none());
        // An address the certificate was found not to name is not checked
        // again each tick (an Ed25519 verification every 20 ms).
        if !news || self.unnamed == Some(ip) {
            return false;
        }
        let allowed = match (&self.cfg.network_key, &self.cfg.cert) {
            (Some(nk), Some(cert)) => nk.verify(cert).is_ok_and(|c| c.allows(ip)),
            _ => true,
        };
        if !allowed {
            if self.unnamed.is_none() {
                tracing::warn!(%ip, "cluster: peers see this host at {ip} (behind a NAT), which its certificate does not name: \
                    its record keeps its own address (sign its certificate with addr {ip}/32 too)");
            }
            self.unnamed = Some(ip);
            return false;
        }
        tracing::info!(%addr, "cluster: peers see this host at {addr} (behind a NAT): its record says so");
        self.reflected = Some(addr);
        true
    }

    async fn put_host(&mut self, c: &mut Client, lease: i64) -> Result<(), SessionError> {
        let record = {
            let d = lock(&self.daemon);
            let addr = match self.reflected {
                Some(a) => a,
                None => advertised(self.cfg.advertise, d.state().listen)
                    .map_err(|e| SessionError::NoAddress(e.to_string()))?,
            };
            HostRecord {
                addr,
                kinds: vec!["udp".into()],
                public_key: d.public_key(),
                cert: self.cfg.cert.clone(),
                relay: self.cfg.relay,
                gateway: self.named_gateway().map(|(addr, mac)| vnet_cluster::layout::Gateway {
                    addr,
                    mac,
                    sig: self
                        .cfg
                        .claim_key
                        .as_ref()
                        .map(|k| k.sign_gateway(&self.cfg.network, &self.cfg.host, mac, addr)),
                }),
            }
        };
        self.named = record.gateway.as_ref().map(|g| (g.addr, g.mac));
        let (key, value) = (host_key(&self.cfg.network, &self.cfg.host), record.to_json());
        let r = self
            .wait(c.put(key.clone(), value.clone(), Some(PutOptions::new().with_lease(lease))))
            .await
            .map_err(etcd("put host"))?;
        self.own = value.clone();
        // Taken at once (its claims are checked against it), not when the watch brings it.
        let rev = r.header().map_or(0, |h| h.revision().max(0) as u64);
        let mut changes = Vec::new();
        self.member.apply(&Event::Put { key, value, rev, created: 0 }, &mut changes);
        self.converge(&changes, 1, Instant::now());
        Ok(())
    }

    /// Serves one `ipam` request against etcd.
    async fn on_ipam(
        &mut self,
        c: &mut Client,
        lease: i64,
        req: crate::ipam::Request,
    ) -> Result<(), SessionError> {
        let (network, me) = (self.cfg.network.clone(), self.cfg.host.clone());
        let mut races = 0;
        let signed = self.signed_gateways(&req.op);
        let r = crate::ipam::serve(c, (&network, &me, lease), &req.op, &signed, &mut races).await;
        lock(&self.status).counters.address_races += races;
        if req.op.moves_gateway() && r.is_ok() {
            self.refresh_gateway(c, lease).await?;
        }
        // The client may have given up waiting.
        let _ = req.reply.send(r);
        Ok(())
    }

    /// The live hosts' gateways as their records name them, for a request
    /// of the translators (none for another request).
    fn signed_gateways(&self, op: &crate::ipam::Op) -> Vec<crate::ipam::Signed> {
        if *op != crate::ipam::Op::Gateways {
            return Vec::new();
        }
        let all = self.member.gateways().into_iter();
        let held = |host: &str, mac| self.member.owner(mac) == Some(host);
        all.map(|(host, addr, mac)| crate::ipam::Signed {
            host: host.to_string(),
            addr,
            mac,
            mac_held: held(host, mac),
        })
        .collect()
    }

    /// Reads this host's gateway from its allocations again; its record
    /// is put again if what it names changes.
    async fn refresh_gateway(&mut self, c: &mut Client, lease: i64) -> Result<(), SessionError> {
        let (network, me) = (self.cfg.network.clone(), self.cfg.host.clone());
        let now = self.wait(crate::ipam::own_gateway(c, &network, &me)).await.map_err(etcd("own gateway"))?;
        if now != self.gateway {
            tracing::info!(gateway = ?now, "cluster: this host's node gateway (its record names it once it holds the MAC)");
            self.gateway = now;
        }
        if self.named_gateway() != self.named {
            self.put_host(c, lease).await?;
        }
        Ok(())
    }

    /// The gateway this host's record names: its own, once the view gives
    /// this host its MAC (its claim taken), so a record never protects a
    /// MAC its host does not hold (`vnet_cluster::member` `gateways`).
    fn named_gateway(&self) -> Option<(std::net::IpAddr, MacAddr)> {
        self.gateway.filter(|(_, m)| self.member.owner(*m) == Some(self.member.me()))
    }

    /// Brings the daemon to the view: `changes` (or, after a refused
    /// transaction, the whole view) and the local interfaces' routes, as
    /// one transaction.
    fn converge(&mut self, changes: &[Change], events: u64, t0: Instant) {
        let mut all = Vec::new();
        // `relay auto`: the first host by name whose record says it relays
        // (none when this host is one: its links are its own way through).
        let relay = match self.cfg.link_options.relay_auto && !self.cfg.relay {
            true => self.member.links().filter(|(_, p)| p.relay).find_map(|(_, p)| p.key),
            false => None,
        };
        let relay_changed = relay != self.relay_key;
        if relay_changed {
            tracing::info!(relay = ?relay.map(|k| k.to_string()), "cluster: links behind NATs now go through this relay");
            self.relay_key = relay;
        }
        // After a refused transaction, or while a host is refused (what
        // stood in its way may have gone), or when the relay changed, the
        // whole view.
        let changes = if self.retry.is_some() || !self.refused.is_empty() || relay_changed {
            self.member.full(&mut all);
            &all[..]
        } else {
            changes
        };
        let mut d = lock(&self.daemon);
        let mut s = lock(&self.status);
        let ours = s.links.clone();
        let opts = vnet_cluster::apply::LinkOptions { relay, ..self.cfg.link_options };
        let planned = plan(d.state(), changes, &opts, &|h| ours.contains(h));
        let mut cmds = planned.cmds;
        cmds.extend(local(d.state(), &self.member));
        s.counters.events += events;
        s.counters.bad_records = self.member.stats.bad_records;
        s.counters.stale_policies = self.member.stats.stale_policies;
        s.counters.groups_refused = self.member.stats.groups_refused;
        s.counters.pods_refused = self.member.stats.pods_refused;
        s.counters.pods_waiting_dropped = self.member.stats.pods_waiting_dropped;
        s.counters.gateway_claims = self.member.stats.gateway_claims;
        s.quarantined = self.member.quarantined().map(|(k, e)| (k.to_string(), e.to_string())).collect();
        // The hosts refused as of this batch: a host whose record the batch
        // carries is judged anew.
        let before = self.refused.clone();
        for c in changes {
            if let vnet_cluster::member::Change::Link { host, .. } = c {
                self.refused.remove(host.as_str());
            }
        }
        for (host, why) in planned.refused {
            if before.get(&host) != Some(&why) {
                tracing::warn!(%host, "cluster: not linked: {why}");
            }
            self.refused.insert(host, why);
        }
        s.quarantined.extend(self.refused.iter().map(|(h, why)| (format!("host {h}"), why.clone())));
        s.revision = self.member.revision();
        if !cmds.is_empty() {
            s.counters.transactions += 1;
            match d.apply(&cmds) {
                Ok(()) => {
                    self.retry = None;
                    self.logged = None;
                    note_links(&mut s.links, &cmds);
                }
                Err(e) => {
                    s.counters.transaction_errors += 1;
                    let e = format!("transaction: {e}");
                    if self.logged.as_deref() != Some(&e) {
                        tracing::error!(
                            commands = cmds.len(),
                            "cluster: {e}; retrying the whole view with a backoff"
                        );
                    }
                    self.logged = Some(e.clone());
                    s.last_error = Some(e);
                    let backoff = self.retry.map_or(RETRY_FIRST, |r| (r.backoff * 2).min(RETRY_MAX));
                    self.retry = Some(Retry { at: Instant::now() + backoff, backoff });
                }
            }
            s.last = Some(Convergence {
                at_ms: membership::now_ms(),
                revision: self.member.revision(),
                events,
                lines: cmds.len(),
                took_us: t0.elapsed().as_micros() as u64,
            });
        }
        s.hosts = self.member.hosts().map(str::to_string).collect();
        s.hosts.sort();
        s.expiries = self.member.expiries().map(|(h, t)| (h.to_string(), t)).collect();
        s.cert_ids = self.member.cert_ids().map(|(h, id)| (h.to_string(), id.to_string())).collect();
        s.conflicts = self.member.conflicts().map(|(m, h, c)| (m, h.to_string(), c.to_string())).collect();
        s.revoked = self.member.revoked();
        self.note_revoked(&d, &mut s);
        s.macs = self.member.macs();
        s.routes = self.member.routes();
        drop((d, s));
        self.follow_neighbors(changes);
        self.follow_policy();
        self.follow_groups(changes);
        self.keep();
    }

    /// Whether the network's admin revoked this host: said once in the
    /// log, then in `show cluster` and as its links' reason to be down.
    fn note_revoked(&self, d: &Daemon, s: &mut membership::Status) {
        let revoked = self.member.revoked_self();
        if revoked && !s.revoked_self {
            tracing::error!("{}", membership::revoked_text(&s.network));
            d.shared().revoked.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        s.revoked_self = revoked;
    }
}

/// What a claim says of its VM: its addresses and its groups.
type Facts = (Vec<std::net::IpAddr>, Vec<String>);

/// The addresses `state` declares for `mac` in vnet network `tenant` (its
/// `neigh` lines) and the groups of the interface holding it, at most
/// what a claim names.
fn facts_of(state: &vnet_control::State, tenant: u32, mac: MacAddr) -> Facts {
    let mine = state.neighbors.0.iter().filter(|((n, _), m)| *n == tenant && **m == mac);
    let addrs = mine.map(|((_, ip), _)| *ip).take(vnet_cluster::layout::MAX_ADDRS).collect();
    let iface = state.interfaces.values().find(|i| i.mac == Some(mac) && i.network == tenant);
    let groups = iface.map(|i| i.groups.iter().take(vnet_cluster::layout::MAX_GROUPS).cloned().collect());
    (addrs, groups.unwrap_or_default())
}

/// Keeps `links` (the links the cluster made) as `cmds`, applied, leave them.
fn note_links(
    links: &mut std::collections::BTreeSet<String>,
    cmds: &[vnet_control::Located<vnet_control::Command>],
) {
    use vnet_control::ast::LinkRef;
    use vnet_control::Command;
    for c in cmds {
        match &c.item {
            Command::Link { name: Some(n), .. } => {
                links.insert(n.clone());
            }
            Command::DeleteLink(r) => {
                if let LinkRef::Name(n) = &r.by {
                    links.remove(n);
                }
            }
            _ => {}
        }
    }
}

/// The lease's TTL, in seconds, for a host that must be gone within `ttl`:
/// a second shorter, because etcd expires leases on a 500 ms tick and the
/// others still have to hear of it (at least 1 s).
pub fn lease_ttl(ttl: Duration) -> u64 {
    ttl.as_secs().saturating_sub(1).max(1)
}

/// Whether lease `id` is still alive in etcd.
async fn lease_alive(c: &mut Client, id: i64) -> bool {
    c.lease_time_to_live(id, None).await.is_ok_and(|r| r.ttl() > 0)
}
