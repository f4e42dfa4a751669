//! Each host writes only its own keys: a simulator of hosts doing what
//! vnetd does against the store (its record, its claims, a migration in
//! and out, its address allocations, a lost race of each), where every
//! write goes through a check against [`host_grants`] of the host making
//! it, as the host's etcd role would check it. With the members of every
//! host following the store, it also checks the rules that keep one
//! holder per MAC and per address when each host writes under its own
//! prefix: two hosts claiming one MAC (the first in the store holds it,
//! in every view; the other gives its claim up), a move between hosts
//! (the destination's claim at the higher epoch, the source deleting its
//! own), two hosts allocating one address (the key created first holds
//! it).

use vnet_cluster::ipam::{self, Allocation, Pool};
use vnet_cluster::layout::{claim_key, granted, host_grants, host_key, HostRecord, MacRecord};
use vnet_cluster::{Event, MemStore, Member};
use vnet_wire::MacAddr;

const NET: &str = "lab";

/// The store, with every write checked against its writer's grants.
struct Checked {
    s: MemStore,
    /// Every (writer, key) written, for the positive control.
    writes: Vec<(String, String)>,
}

impl Checked {
    fn allowed(&mut self, host: &str, key: &str) {
        assert!(granted(&host_grants(NET, host), key, true), "{host} wrote {key}, which it is not granted");
        self.writes.push((host.to_string(), key.to_string()));
    }

    fn put(&mut self, host: &str, key: &str, value: Vec<u8>) -> u64 {
        self.allowed(host, key);
        self.s.put(key, value, None).unwrap()
    }

    fn delete(&mut self, host: &str, key: &str, expected: &[u8]) -> Option<u64> {
        self.allowed(host, key);
        self.s.delete_if(key, Some(expected))
    }
}

/// A host as vnetd runs it: its name, its view, what it claimed.
struct Host {
    name: String,
    view: Member,
    claims: Vec<(MacAddr, Vec<u8>)>,
}

impl Host {
    fn new(i: u8) -> Host {
        let name = format!("h{i}");
        Host { view: Member::new(NET, &name), name, claims: Vec::new() }
    }

    /// Its record (`put_host`).
    fn join(&mut self, st: &mut Checked, i: u8) {
        let addr = format!("10.0.0.{i}:9000").parse().unwrap();
        let r = HostRecord {
            addr,
            kinds: vec!["udp".into()],
            public_key: None,
            cert: None,
            relay: false,
            gateway: None,
        };
        st.put(&self.name.clone(), &host_key(NET, &self.name), r.to_json());
    }

    /// A claim of `mac` at `epoch` (`put_mac`).
    fn claim(&mut self, st: &mut Checked, mac: MacAddr, epoch: u64, at_ms: u64) {
        let r =
            MacRecord { host: self.name.clone(), iface: "vm0".into(), at_ms, epoch, ..Default::default() };
        let value = r.to_json();
        st.put(&self.name.clone(), &claim_key(NET, &self.name, mac), value.clone());
        self.claims.retain(|(m, _)| *m != mac);
        self.claims.push((mac, value));
    }

    /// Its claim of `mac` deleted (`publish`'s release, `give_up_lost_claims`).
    fn release(&mut self, st: &mut Checked, mac: MacAddr) {
        let Some(i) = self.claims.iter().position(|(m, _)| *m == mac) else { return };
        let (_, value) = self.claims.remove(i);
        st.delete(&self.name.clone(), &claim_key(NET, &self.name, mac), &value);
    }

    /// The view brought up to the store, and claims lost to another
    /// host's given up, as vnetd's `on_events` does.
    fn sync(&mut self, st: &mut Checked) {
        let evs: Vec<Event> =
            st.s.watch(self.view.prefix(), self.view.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            self.view.apply(e, &mut Vec::new());
        }
        let lost: Vec<MacAddr> =
            self.view.conflicts().filter(|(_, _, c)| *c == self.name).map(|(m, _, _)| m).collect();
        for mac in lost {
            self.release(st, mac);
        }
    }

    /// An address from `pool` for `owner` (vnetd's `ipam::add`): the
    /// first free one, put under this host's prefix; given up and the next
    /// tried when another host's key for it was created first.
    fn allocate(
        &mut self,
        st: &mut Checked,
        pool: &Pool,
        owner: &str,
        taken: &mut Vec<std::net::IpAddr>,
    ) -> std::net::IpAddr {
        loop {
            let set = taken.iter().copied().collect();
            let a = pool.candidates("same start for everyone", &set, 1)[0];
            taken.push(a);
            let key = ipam::key(NET, &self.name, pool, a);
            let value = Allocation { host: self.name.clone(), owner: owner.into() }.to_json();
            st.put(&self.name.clone(), &key, value.clone());
            if holder(st, pool, a).as_deref() == Some(self.name.as_str()) {
                return a;
            }
            st.delete(&self.name.clone(), &key, &value);
        }
    }
}

/// The host whose key for `a` was created first (vnetd's `ipam::holder`).
fn holder(st: &Checked, pool: &Pool, a: std::net::IpAddr) -> Option<String> {
    let (kvs, _) = st.s.range(&ipam::prefix(NET));
    let name = ipam::pool_name(pool);
    let keys: Vec<(String, i64)> = kvs
        .iter()
        .filter_map(|(k, _)| {
            let (h, p, b) = ipam::parse_key(NET, k)?;
            (p == name && b == a).then(|| (h.to_string(), st.s.created(k).unwrap() as i64))
        })
        .collect();
    ipam::winner(keys.iter().map(|(h, r)| (h.as_str(), *r))).map(str::to_string)
}

fn mac(i: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, i])
}

#[test]
fn every_key_a_host_writes_is_in_its_grants_and_one_holder_per_mac_and_address() {
    let mut st = Checked { s: MemStore::new(), writes: Vec::new() };
    let mut hosts: Vec<Host> = (1..=3).map(Host::new).collect();
    for (i, h) in hosts.iter_mut().enumerate() {
        h.join(&mut st, i as u8 + 1);
    }
    let sync_all = |hosts: &mut Vec<Host>, st: &mut Checked| {
        for h in hosts.iter_mut() {
            h.sync(st);
        }
    };
    sync_all(&mut hosts, &mut st);
    // Two hosts claim one MAC at once (h2 first in the store).
    hosts[1].claim(&mut st, mac(1), 0, 1000);
    hosts[2].claim(&mut st, mac(1), 0, 999);
    sync_all(&mut hosts, &mut st);
    for h in &hosts {
        assert_eq!(h.view.owner(mac(1)), Some("h2"), "{}'s view", h.name);
    }
    // h3 gave its claim up (its key is gone); the conflict is settled everywhere.
    assert!(st.s.range(&claim_key(NET, "h3", mac(1))).0.is_empty());
    sync_all(&mut hosts, &mut st);
    assert!(hosts.iter().all(|h| h.view.conflicts().count() == 0));
    assert_eq!(hosts[0].view.route_of(mac(1)), Some("h2"));
    // A move to h3: its claim at the higher epoch, then h2 deletes its own.
    hosts[2].claim(&mut st, mac(1), 1, 2000);
    sync_all(&mut hosts, &mut st);
    assert_eq!(hosts[0].view.route_of(mac(1)), Some("h3"));
    hosts[1].release(&mut st, mac(1));
    sync_all(&mut hosts, &mut st);
    for h in &hosts {
        assert_eq!((h.view.owner(mac(1)), h.view.epoch(mac(1))), (Some("h3"), 1), "{}'s view", h.name);
    }
    // A view listed afresh (a restart) agrees.
    let mut fresh = Member::new(NET, "h1");
    let (kvs, rev) = st.s.range(fresh.prefix());
    fresh.relist(&kvs, rev, &mut Vec::new());
    assert_eq!(fresh.route_of(mac(1)), Some("h3"));
    // Two hosts allocate from one pool at once: both pick .1; h1's key
    // was created first, h2 gives its up and takes the next.
    let pool = Pool::new("10.88.0.0/29", None).unwrap();
    let a1 = hosts[0].allocate(&mut st, &pool, "n/c1/eth0", &mut Vec::new());
    let seen_by_h2 = Vec::new(); // h2 listed the pool before h1's key was there
    let mut taken = seen_by_h2;
    let a2 = hosts[1].allocate(&mut st, &pool, "n/c2/eth0", &mut taken);
    assert_ne!(a1, a2);
    assert_eq!(holder(&st, &pool, a1).as_deref(), Some("h1"));
    assert_eq!(holder(&st, &pool, a2).as_deref(), Some("h2"));
    let (kvs, _) = st.s.range(&ipam::prefix(NET));
    assert_eq!(kvs.len(), 2, "the lost key was given up: {kvs:?}");
    // Every write was in its writer's grants (checked as it was made);
    // the positive control: none of them is in another host's grants,
    // and no host is granted the policy or a revocation.
    assert!(st.writes.len() >= 12, "{}", st.writes.len());
    for (writer, key) in &st.writes {
        for h in ["h1", "h2", "h3"].iter().filter(|h| *h != writer) {
            assert!(!granted(&host_grants(NET, h), key, true), "{h} could write {writer}'s {key}");
            assert!(granted(&host_grants(NET, h), key, false), "{h} reads {key}");
        }
    }
    for key in [vnet_cluster::layout::policy_key(NET), vnet_cluster::layout::revoked_host_key(NET, "h2")] {
        assert!(!granted(&host_grants(NET, "h2"), &key, true), "{key}");
    }
    // A name that is another's prefix gets nothing of it (h1 and h10).
    assert!(!granted(&host_grants(NET, "h1"), &claim_key(NET, "h10", mac(1)), true));
    assert!(!granted(&host_grants(NET, "h1"), &host_key(NET, "h10"), true));
}
