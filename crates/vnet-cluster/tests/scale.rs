//! A thousand hosts and a hundred thousand VMs, in memory: the store is
//! [`MemStore`] (etcd's semantics), each host's view a [`Member`]. Every
//! member sees the same event stream, so a sample of members (observers)
//! stands for all of them; `VNET_SCALE_OBSERVERS=1000` runs every one.
//! Sizes: `VNET_SCALE_HOSTS` (1000) and `VNET_SCALE_VMS` (100 per host).
//!
//! Measured and printed (`--nocapture`), for `docs/CLUSTER.md`: the events
//! and changes each observer handles and the time it takes, to converge
//! from nothing, after a host joins, after a host dies (its lease expires),
//! after a VM moves, and after a compaction forces a full listing; the
//! memory a view of 100k MACs holds; route lookups at 100k routes. Each
//! step checks every observer against the truth in the store.

use std::time::Instant;
use vnet_cluster::layout::{claim_key, host_key, parse_key, HostRecord, Key, MacRecord};
use vnet_cluster::{Change, Event, MemStore, Member};
use vnet_wire::MacAddr;

const NET: &str = "scale";
const SEC: u64 = 1_000_000_000;
const TTL: u64 = 10 * SEC;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn name(h: usize) -> String {
    format!("h{h:04}")
}

fn mac(h: usize, v: usize) -> MacAddr {
    let (h, v) = (h as u32, v as u16);
    MacAddr([0x52, 0x54, (h >> 8) as u8, h as u8, (v >> 8) as u8, v as u8])
}

fn record(h: usize) -> Vec<u8> {
    let addr = format!("10.{}.{}.{}:9000", h >> 16 & 255, h >> 8 & 255, h & 255).parse().unwrap();
    HostRecord { addr, kinds: vec!["udp".into()], public_key: None, cert: None, relay: false, gateway: None }
        .to_json()
}

/// Puts host `h` and its `vms` MACs under a new lease; returns the lease.
fn join(s: &mut MemStore, h: usize, vms: usize, now: u64) -> u64 {
    let lease = s.grant(TTL, now);
    s.put(&host_key(NET, &name(h)), record(h), Some(lease));
    for v in 0..vms {
        let r = MacRecord { host: name(h), iface: format!("vm{v}"), ..Default::default() };
        s.put(&claim_key(NET, &name(h), mac(h, v)), r.to_json(), Some(lease));
    }
    lease
}

/// Brings `m` up to the store's revision; returns (events, changes).
fn sync(m: &mut Member, s: &MemStore) -> (usize, usize) {
    let mut out = Vec::new();
    let mut n = 0;
    let prefix = m.prefix().to_string();
    match s.watch(&prefix, m.revision() + 1) {
        Ok(evs) => {
            let evs: Vec<&Event> = evs.collect();
            for e in evs {
                m.apply(e, &mut out);
                n += 1;
            }
        }
        Err(_) => {
            let (kvs, rev) = s.range(&prefix);
            n = kvs.len();
            m.relist(&kvs, rev, &mut out);
        }
    }
    (n, out.len())
}

/// Every observer against the store: each MAC of another live host routed
/// to it, nothing else.
fn check(obs: &[Member], s: &MemStore) {
    let (kvs, _) = s.range(&vnet_cluster::layout::prefix(NET));
    let p = vnet_cluster::layout::prefix(NET);
    let live: std::collections::HashSet<&str> = kvs
        .iter()
        .filter_map(|(k, _)| match parse_key(&p, k) {
            Some(Key::Host(h)) => Some(h),
            _ => None,
        })
        .collect();
    // Each MAC's holder: of its claims, the one at the highest epoch.
    let mut holders: std::collections::BTreeMap<MacAddr, (u64, String)> = Default::default();
    for (k, v) in &kvs {
        if let Some(Key::Claim { mac, .. }) = parse_key(&p, k) {
            let r: MacRecord = serde_json::from_slice(v).unwrap();
            if holders.get(&mac).is_none_or(|(e, _)| *e < r.epoch) {
                holders.insert(mac, (r.epoch, r.host));
            }
        }
    }
    for m in obs {
        let mut want = 0;
        for (mac, (_, h)) in &holders {
            let h = h.as_str();
            let expect = (live.contains(h) && h != m.me()).then_some(h);
            assert_eq!(m.route_of(*mac), expect, "{} on {mac}", m.me());
            want += usize::from(expect.is_some());
        }
        assert_eq!(m.routes(), want);
        let links = live.len() - usize::from(live.contains(m.me()));
        assert_eq!(m.links().count(), links, "a link to every other live host");
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Brings every observer up to the store and checks them; returns the
/// first one's (events, changes, milliseconds).
fn sync_all(obs: &mut [Member], s: &MemStore) -> (usize, usize, f64) {
    let t = Instant::now();
    let (ev, ch) = sync(&mut obs[0], s);
    let took = ms(t);
    for o in &mut obs[1..] {
        sync(o, s);
    }
    check(obs, s);
    (ev, ch, took)
}

#[test]
fn a_thousand_hosts_and_a_hundred_thousand_vms_converge() {
    let (hosts, vms) = (env("VNET_SCALE_HOSTS", 1000), env("VNET_SCALE_VMS", 100));
    // Debug builds (`cargo test`) check fewer observers; release as many as asked.
    let n_obs = env("VNET_SCALE_OBSERVERS", if cfg!(debug_assertions) { 3 } else { 8 }).clamp(1, hosts);
    let mut s = MemStore::new();
    let mut now = 0;
    let mut leases: Vec<u64> = (0..hosts).map(|h| join(&mut s, h, vms, now)).collect();
    // Observers spread over the hosts.
    let ids: Vec<usize> = (0..n_obs).map(|i| i * hosts / n_obs).collect();
    let mut obs: Vec<Member> = ids.iter().map(|&h| Member::new(NET, &name(h))).collect();
    println!(
        "scale: {hosts} hosts x {vms} VMs = {} MACs, {} keys, {n_obs} observers",
        hosts * vms,
        s.revision()
    );

    // From nothing: every key once.
    let (ev, ch, first_ms) = sync_all(&mut obs, &s);
    let routes = obs[0].routes();
    println!(
        "scale: start: {ev} events, {ch} changes, {first_ms:.0} ms per host; {routes} routes, {} links",
        obs[0].links().count()
    );
    assert_eq!(routes, (hosts - 1) * vms);

    // Memory of a view: the RSS growth of building more of them, per view.
    let rss = || {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 4096
    };
    let before = rss();
    let extra: Vec<Member> = (0..4)
        .map(|i| {
            let mut m = Member::new(NET, &name(hosts - 1 - i));
            sync(&mut m, &s);
            m
        })
        .collect();
    let per_view = rss().saturating_sub(before) / extra.len() as u64;
    drop(extra);
    println!(
        "scale: memory: {:.1} MB per host's view of {} MACs ({} bytes a MAC)",
        per_view as f64 / 1e6,
        hosts * vms,
        per_view / (hosts * vms) as u64
    );

    // A host joins.
    let t0 = s.revision();
    leases.push(join(&mut s, hosts, vms, now));
    let (ev, ch, join_ms) = sync_all(&mut obs, &s);
    println!(
        "scale: join: {} revisions, {ev} events, {ch} changes (1 link + {vms} routes), {join_ms:.2} ms",
        s.revision() - t0
    );
    assert_eq!((ev, ch), (vms + 1, vms + 1));

    // A VM moves (its new host writes its key, a migration: epoch 1): one event, one change.
    let m = mac(1, 0);
    let r = MacRecord { host: name(2), iface: "vm99".into(), epoch: 1, ..Default::default() };
    s.put(&claim_key(NET, &name(2), m), r.to_json(), Some(leases[2]));
    let (ev, ch, move_ms) = sync_all(&mut obs, &s);
    let move_us = move_ms * 1e3;
    let moved =
        obs.iter().filter(|o| o.route_of(m) == Some(name(2).as_str()) || o.route_of(m).is_none()).count();
    assert_eq!(moved, obs.len());
    println!("scale: move: {ev} event, {ch} change, {move_us:.1} us per host");
    assert_eq!((ev, ch), (1, 1));
    // The source deletes its own claim: one event, nothing changes.
    s.delete_if(&claim_key(NET, &name(1), m), None);
    assert_eq!(sync_all(&mut obs, &s).1, 0);

    // A host dies: its keepalives stop, its lease expires, all its keys go in one revision.
    let dead = hosts / 2 + 1;
    now += TTL / 2;
    for (h, &l) in leases.iter().enumerate() {
        if h != dead {
            s.keepalive(l, now);
        }
    }
    now += TTL / 2 + 1;
    let gone = s.expire(now);
    let (ev, ch, leave_ms) = sync_all(&mut obs, &s);
    println!("scale: leave: 1 revision, {gone} keys, {ev} events, {ch} changes, {leave_ms:.2} ms");
    assert_eq!((ev, ch), (vms + 1, vms + 1));

    // Observers away while 10 VMs move and a host joins; history compacted:
    // they list again and converge.
    for v in 0..10 {
        let r = MacRecord { host: name(3), iface: format!("m{v}"), epoch: 1, ..Default::default() };
        s.put(&claim_key(NET, &name(3), mac(4, v)), r.to_json(), Some(leases[3]));
        s.delete_if(&claim_key(NET, &name(4), mac(4, v)), None);
    }
    leases.push(join(&mut s, hosts + 1, vms, now));
    s.compact(s.revision());
    let (ev, ch, relist_ms) = sync_all(&mut obs, &s);
    println!("scale: relist after compaction: {ev} keys, {ch} changes, {relist_ms:.0} ms");
    assert_eq!(ch, 10 + 1 + vms);

    // Route lookups at this size: the engine's table built from a view.
    let o = &obs[0];
    let mut hosts_ix: Vec<&str> = o.links().map(|(h, _)| h).collect();
    hosts_ix.sort_unstable();
    let mut routes = Vec::new();
    let p = vnet_cluster::layout::prefix(NET);
    for (k, _) in s.range(&p).0 {
        if let Some(Key::Claim { mac, .. }) = parse_key(&p, &k) {
            if let Some(h) = o.route_of(mac) {
                let link = hosts_ix.binary_search(&h).unwrap() as u32;
                let id = routes.len() as u32;
                routes.push(vnet_core::Route::new(
                    id,
                    vnet_core::MacSpec::Any,
                    vnet_core::MacSpec::Addr(mac),
                    vnet_core::Port::Link(link),
                    vnet_core::SourceFilter::Any,
                ));
            }
        }
    }
    let n = routes.len();
    let macs: Vec<MacAddr> = routes
        .iter()
        .map(|r| match r.dst {
            vnet_core::MacSpec::Addr(m) => m,
            _ => MacAddr::ZERO,
        })
        .collect();
    let table = vnet_core::RouteTable::new(1, routes);
    let mut out = Vec::new();
    let src = mac(0, 0);
    let ingress = vnet_core::Port::Interface(0);
    let rounds = 2_000_000usize;
    let t = Instant::now();
    let mut hit = 0usize;
    for i in 0..rounds {
        // A pseudo-random walk over the MACs (no cache help).
        let d = macs[i.wrapping_mul(2_654_435_761) % macs.len()];
        table.lookup(ingress, src, d, &mut out);
        hit += out.len();
    }
    let ns = t.elapsed().as_nanos() as f64 / rounds as f64;
    assert_eq!(hit, rounds);
    let mut cache = vnet_core::RouteCache::new(4096);
    let t = Instant::now();
    for i in 0..rounds {
        // 1000 flows: what a busy host's cache sees.
        let d = macs[(i % 1000).wrapping_mul(97) % macs.len()];
        cache.lookup(&table, ingress, src, d, &mut out);
    }
    let cns = t.elapsed().as_nanos() as f64 / rounds as f64;
    println!(
        "scale: lookup at {n} routes: {ns:.0} ns ({:.1} M/s) uncached, {cns:.0} ns ({:.1} M/s) through the cache",
        1e3 / ns,
        1e3 / cns
    );
    let _ = Change::Route { mac: src, host: None };
}

/// A signed network of a thousand hosts: every record carries the network
/// key's certificate and every claim its host's signature. Forged records
/// (an unsigned host, a host re-pointed elsewhere without a certificate for
/// it, a claim of another host's MAC signed by the wrong key, a replayed
/// old claim, a record with a newline in its key) are quarantined and
/// counted on every observer while every valid record applies.
#[test]
fn a_signed_network_of_a_thousand_hosts_takes_signed_records_and_quarantines_the_rest() {
    use vnet_cluster::trust::{CertBody, ClaimKey, NetworkKey};
    use vnet_cluster::Policy;
    use vnet_control::PeerKey;
    let (hosts, vms) = (env("VNET_SCALE_HOSTS", 1000), env("VNET_SCALE_SIGNED_VMS", 5));
    let nk = NetworkKey::generate().unwrap();
    let claim = |h: usize| {
        ClaimKey::derive(&[
            (h % 251) as u8 + 1,
            (h / 251) as u8,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
            7,
        ])
        .unwrap()
    };
    let static_key = |h: usize| {
        PeerKey([
            (h % 251) as u8,
            (h / 251) as u8,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
            9,
        ])
    };
    let addr = |h: usize| format!("10.{}.{}.{}:9000", h >> 16 & 255, h >> 8 & 255, h & 255);
    let signed_until = |h: usize, at: &str, not_after: Option<u64>| {
        let body = CertBody {
            network: NET.into(),
            host: name(h),
            public_key: static_key(h).to_string(),
            claim_key: claim(h).public_base64(),
            addrs: vec![at.split(':').next().unwrap().to_string()],
            groups: Vec::new(),
            not_after,
        };
        let cert = nk.sign(&body).unwrap();
        HostRecord {
            addr: at.parse().unwrap(),
            kinds: vec![],
            public_key: Some(static_key(h).to_string()),
            cert: Some(cert),
            relay: false,
            gateway: None,
        }
    };
    let signed = |h: usize, at: &str| signed_until(h, at, None);
    let claim_at = |h: usize, mac: MacAddr, at_ms: u64, key: &ClaimKey, epoch: u64| {
        let mut r = MacRecord { host: name(h), iface: "vm0".into(), at_ms, epoch, ..Default::default() };
        r.sig = Some(key.sign(NET, mac, &r));
        r.to_json()
    };
    let claim_of = |h: usize, mac: MacAddr, at_ms: u64, key: &ClaimKey| claim_at(h, mac, at_ms, key, 0);
    let mut s = MemStore::new();
    let claims: Vec<ClaimKey> = (0..hosts).map(claim).collect();
    for (h, key) in claims.iter().enumerate() {
        s.put(&host_key(NET, &name(h)), signed(h, &addr(h)).to_json(), None);
        for v in 0..vms {
            s.put(&claim_key(NET, &name(h), mac(h, v)), claim_of(h, mac(h, v), 1000, key), None);
        }
    }
    let policy = Policy { network_key: Some(nk.public()), have_key: true, ..Policy::default() };
    let mut obs: Vec<Member> =
        [0, hosts / 2].iter().map(|&h| Member::with_policy(NET, &name(h), policy.clone())).collect();
    let t = Instant::now();
    for o in &mut obs {
        sync(o, &s);
    }
    println!(
        "signed: {hosts} hosts x {vms} VMs verified and converged in {:.0} ms per observer",
        ms(t) / 2.0
    );
    check(&obs, &s);
    // Listing the same store again (a new session, a compaction) changes
    // nothing: a signed claim seen again is the claim held, not a stale one.
    for o in &mut obs {
        let (kvs, rev) = s.range(o.prefix());
        let mut out = Vec::new();
        o.relist(&kvs, rev, &mut out);
        assert!(out.is_empty(), "a relist of the same store changed {} things: {:?}", out.len(), &out[..1]);
    }
    // The forgeries.
    let victim = mac(3, 0);
    let mut plain = signed(5, &addr(5));
    plain.cert = None;
    s.put(&host_key(NET, &name(5)), plain.to_json(), None); // unsigned
    let mut moved = signed(6, &addr(6));
    moved.addr = "6.6.6.6:9000".parse().unwrap();
    s.put(&host_key(NET, &name(6)), moved.to_json(), None); // re-pointed, old certificate
    let mut injected = signed(7, &addr(7));
    injected.public_key = Some(format!("{}\nlink spy udp 6.6.6.6:9000", static_key(7)));
    s.put(&host_key(NET, &name(7)), injected.to_json(), None); // a newline in the key
    s.put(&claim_key(NET, &name(8), victim), claim_of(8, victim, 2000, &claims[9]), None); // signed by another host
    s.put(&host_key(NET, "intruder"), signed(hosts + 1, "10.250.0.1:9000").to_json(), None); // certificate of another name
    for o in &mut obs {
        let before = o.stats.bad_records;
        sync(o, &s);
        assert_eq!(o.stats.bad_records - before, 5, "{:?}", o.quarantined().collect::<Vec<_>>());
        assert_eq!(o.route_of(victim), Some(name(3).as_str()).filter(|n| *n != o.me()), "the victim stays");
        // The forged records are ignored: each host keeps its last signed record.
        assert!(o.links().all(|(n, _)| n != "intruder"));
        for h in [5, 6, 7] {
            let link = o.links().find(|(n, _)| *n == name(h)).map(|(_, p)| p.addr.to_string());
            assert!(name(h) == o.me() || link == Some(addr(h)), "host {h}: {link:?}");
        }
        assert!(o.links().all(|(_, p)| p.addr.ip().to_string() != "6.6.6.6"));
    }
    // Issue 44, finding 5: a claim by another host, signed and newer but
    // no migration (the same epoch), is a conflict: nothing moves.
    s.put(&claim_key(NET, &name(9), victim), claim_of(9, victim, 3000, &claims[9]), None);
    for o in &mut obs {
        sync(o, &s);
        assert_eq!(
            o.route_of(victim),
            Some(name(3).as_str()).filter(|n| *n != o.me()),
            "taken by being newer"
        );
        assert_eq!(o.conflicts().collect::<Vec<_>>(), [(victim, name(3).as_str(), name(9).as_str())]);
    }
    // A migration (a higher epoch, signed by the new host) applies, and
    // the source deletes its own claim; the old claim put again does not
    // take it back (a conflict).
    s.put(&claim_key(NET, &name(9), victim), claim_at(9, victim, 3001, &claims[9], 1), None);
    s.delete_if(&claim_key(NET, &name(3), victim), None);
    for o in &mut obs {
        sync(o, &s);
        assert_eq!(o.route_of(victim), Some(name(9).as_str()).filter(|n| *n != o.me()));
        assert_eq!(o.conflicts().count(), 0, "the migration settled it");
    }
    s.put(&claim_key(NET, &name(3), victim), claim_of(3, victim, 1000, &claims[3]), None);
    for o in &mut obs {
        sync(o, &s);
        assert_eq!(o.route_of(victim), Some(name(9).as_str()).filter(|n| *n != o.me()));
        assert!(o
            .quarantined()
            .any(|(k, e)| k.ends_with(&victim.to_string()) && e.to_string().contains("conflict")));
    }
    // The old host claiming again, newer but at the epoch it knew (a
    // restart with the VM still in its config): it does not take the VM back.
    s.put(&claim_key(NET, &name(3), victim), claim_at(3, victim, 4000, &claims[3], 1), None);
    for o in &mut obs {
        sync(o, &s);
        assert_eq!(o.route_of(victim), Some(name(9).as_str()).filter(|n| *n != o.me()), "taken back");
        assert!(o
            .quarantined()
            .any(|(k, e)| k.ends_with(&victim.to_string()) && e.to_string().contains("conflict")));
    }
    // A claim of another vnet network is refused, whoever signs it.
    let other_net = {
        let mut r =
            MacRecord { host: name(4), iface: "vm0".into(), at_ms: 5000, network: 8, ..Default::default() };
        r.sig = Some(claims[4].sign(NET, mac(4, 0), &r));
        r.to_json()
    };
    s.put(&claim_key(NET, &name(4), mac(4, 0)), other_net, None);
    for o in &mut obs {
        sync(o, &s);
        assert_eq!(o.route_of(mac(4, 0)), Some(name(4).as_str()).filter(|n| *n != o.me()));
        assert!(o
            .quarantined()
            .any(|(k, e)| k.ends_with(&mac(4, 0).to_string()) && e.to_string().contains("network 8")));
    }
    // The genuine records back: quarantine empties of them, links return.
    for h in [5, 6, 7] {
        s.put(&host_key(NET, &name(h)), signed(h, &addr(h)).to_json(), None);
    }
    for o in &mut obs {
        sync(o, &s);
        assert_eq!(o.links().count(), hosts - 1);
        assert!(
            !o.quarantined().any(|(k, _)| k.contains("/hosts/h")),
            "{:?}",
            o.quarantined().collect::<Vec<_>>()
        );
    }
    // Expiry: host 10's certificate runs until t = 5000 s. Before, it is
    // linked; after, every host drops it (links and routes) until a renewed
    // certificate comes; a record with an expired certificate is refused.
    let ten = name(10);
    s.put(&host_key(NET, &ten), signed_until(10, &addr(10), Some(5000)).to_json(), None);
    for o in obs.iter_mut().filter(|o| o.me() != ten) {
        sync(o, &s);
        let mut out = Vec::new();
        o.expire(4999, &mut out);
        assert!(out.is_empty() && o.links().any(|(n, _)| n == ten));
        o.expire(5001, &mut out);
        assert!(!o.links().any(|(n, _)| n == ten), "an expired host stays linked");
        assert!(out.iter().any(|c| matches!(c, Change::Link { host, peer: None } if *host == ten)));
        assert!(o
            .quarantined()
            .any(|(k, e)| k.ends_with(&format!("/hosts/{ten}")) && e.to_string().contains("expired")));
    }
    s.put(&host_key(NET, &ten), signed_until(10, &addr(10), Some(4000)).to_json(), None);
    for o in obs.iter_mut().filter(|o| o.me() != ten) {
        sync(o, &s);
        assert!(!o.links().any(|(n, _)| n == ten), "a record with an expired certificate was taken");
    }
    s.put(&host_key(NET, &ten), signed_until(10, &addr(10), Some(90_000)).to_json(), None);
    for o in obs.iter_mut().filter(|o| o.me() != ten) {
        sync(o, &s);
        assert!(o.links().any(|(n, _)| n == ten), "the renewed certificate was not taken");
    }
    // Issue 44, finding 4: a record parked behind another host's address
    // keeps its certificate's expiry; expired while it waited, it is not
    // taken when the address frees (it was, unchecked, and never expired).
    let (eleven, twelve) = (name(11), name(12));
    s.put(&host_key(NET, &twelve), signed_until(12, &addr(11), Some(100_000)).to_json(), None);
    for o in obs.iter_mut().filter(|o| o.me() != eleven && o.me() != twelve) {
        sync(o, &s);
        let mut out = Vec::new();
        o.expire(100_001, &mut out);
        assert!(!o.links().any(|(n, _)| n == twelve), "parked behind host 11's address");
    }
    s.delete_if(&host_key(NET, &eleven), None);
    for o in obs.iter_mut().filter(|o| o.me() != eleven && o.me() != twelve) {
        sync(o, &s);
        assert!(!o.links().any(|(n, _)| n == twelve), "an expired certificate came back through the queue");
        assert!(o
            .quarantined()
            .any(|(k, e)| k.ends_with(&format!("/hosts/{twelve}")) && e.to_string().contains("expired")));
    }
    // Issue 44, finding 9: revocation. Host 13 revoked (every certificate
    // of it): every host drops its link and routes at once, its record
    // (even re-signed) is refused from then on, and deleting the
    // revocation's key (no network key needed) takes nothing back.
    use vnet_cluster::trust::{cert_id, Revocation};
    let (thirteen, fourteen) = (name(13), name(14));
    let revoke = |host: &str, cert: Option<String>| {
        let r = Revocation { network: NET.into(), host: host.into(), cert, at: 1 };
        (r.key(), nk.revoke(&r).unwrap().into_bytes())
    };
    let (key, value) = revoke(&thirteen, None);
    s.put(&key, value, None);
    let others = |o: &&mut Member| o.me() != thirteen && o.me() != fourteen;
    for o in obs.iter_mut().filter(others) {
        let mut out = Vec::new();
        let evs: Vec<_> = s.watch(o.prefix(), o.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            o.apply(e, &mut out);
        }
        assert!(out.contains(&Change::Link { host: thirteen.clone(), peer: None }), "{out:?}");
        assert!(!o.links().any(|(n, _)| n == thirteen));
        assert_eq!(o.revoked(), (1, 0));
    }
    s.put(&host_key(NET, &thirteen), signed_until(13, &addr(13), Some(200_000)).to_json(), None);
    s.delete_if(&key, None);
    for o in obs.iter_mut().filter(others) {
        sync(o, &s);
        assert!(!o.links().any(|(n, _)| n == thirteen), "a revoked host came back");
        assert!(o
            .quarantined()
            .any(|(k, e)| k.ends_with(&format!("/hosts/{thirteen}")) && e.to_string().contains("revoked")));
    }
    // One certificate revoked: host 14 goes; with a new certificate, it is back.
    let old = signed_until(14, &addr(14), Some(300_000));
    s.put(&host_key(NET, &fourteen), old.to_json(), None);
    for o in obs.iter_mut().filter(others) {
        sync(o, &s);
        assert!(o.links().any(|(n, _)| n == fourteen));
    }
    let (key, value) = revoke(&fourteen, Some(cert_id(old.cert.as_deref().unwrap())));
    s.put(&key, value, None);
    // And a revocation signed by another key is refused, and does nothing.
    let forged = {
        let r = Revocation { network: NET.into(), host: name(15), cert: None, at: 1 };
        NetworkKey::generate().unwrap().revoke(&r).unwrap().into_bytes()
    };
    s.put(&vnet_cluster::layout::revoked_host_key(NET, &name(15)), forged, None);
    for o in obs.iter_mut().filter(others) {
        sync(o, &s);
        assert!(!o.links().any(|(n, _)| n == fourteen), "a revoked certificate stayed");
        assert!(o.links().any(|(n, _)| *n == name(15)) || o.me() == name(15), "a forged revocation took");
    }
    s.put(&host_key(NET, &fourteen), signed_until(14, &addr(14), Some(300_001)).to_json(), None);
    for o in obs.iter_mut().filter(others) {
        sync(o, &s);
        assert!(
            o.links().any(|(n, _)| n == fourteen),
            "a new certificate of a host whose old one was revoked"
        );
    }
}
