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

use crate::layout::{parse_key, prefix, HostRecord, Key, MacRecord};
use crate::store::Event;
use rustc_hash::FxHashMap;
use vnet_wire::MacAddr;

/// What must change on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A link to `host` with this record (new or changed), or none any more.
    Link { host: String, record: Option<HostRecord> },
    /// Frames to `mac` go to `host`'s link, or no longer to any link.
    Route { mac: MacAddr, host: Option<String> },
}

/// What a member counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub events: u64,
    /// Values that did not parse (ignored), and keys this version does not know.
    pub bad_records: u64,
    pub unknown_keys: u64,
    /// Full listings taken (start, compaction, the store back after an outage).
    pub relists: u64,
}

/// One host's view.
pub struct Member {
    prefix: String,
    me: String,
    revision: u64,
    names: Vec<Box<str>>,
    ids: FxHashMap<Box<str>, u32>,
    records: Vec<Option<HostRecord>>,
    /// The MACs each host has (by host id).
    by_host: Vec<Vec<MacAddr>>,
    macs: FxHashMap<MacAddr, u32>,
    pub stats: MemberStats,
}

impl Member {
    /// The view of host `me` in `network`, empty (at revision 0).
    pub fn new(network: &str, me: &str) -> Self {
        Member::watching(prefix(network), me)
    }

    /// An empty view of host `me` under key prefix `prefix`.
    fn watching(prefix: String, me: &str) -> Self {
        Member {
            prefix,
            me: me.to_string(),
            revision: 0,
            names: Vec::new(),
            ids: FxHashMap::default(),
            records: Vec::new(),
            by_host: Vec::new(),
            macs: FxHashMap::default(),
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

    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.ids.insert(name.into(), i);
        self.records.push(None);
        self.by_host.push(Vec::new());
        i
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
    pub fn links(&self) -> impl Iterator<Item = (&str, &HostRecord)> {
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

    /// The whole view as changes: a link (or none) for every host ever
    /// seen, a route for every MAC. Applied to any state, it brings that
    /// state to the view (after a transaction that failed, say).
    pub fn full(&self, out: &mut Vec<Change>) {
        for (n, r) in self.names.iter().zip(&self.records) {
            if **n != *self.me {
                out.push(Change::Link { host: n.to_string(), record: r.clone() });
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

    /// MACs known, routed or not.
    pub fn macs(&self) -> usize {
        self.macs.len()
    }

    /// Applies one watch event; what must change is appended to `out`.
    pub fn apply(&mut self, ev: &Event, out: &mut Vec<Change>) {
        self.stats.events += 1;
        self.revision = self.revision.max(ev.rev());
        let Some(key) = parse_key(&self.prefix, ev.key()) else {
            self.stats.unknown_keys += 1;
            return;
        };
        match (key, ev) {
            (Key::Host(name), Event::Put { value, .. }) => {
                match serde_json::from_slice::<HostRecord>(value) {
                    Ok(r) => self.put_host(name, r, out),
                    Err(_) => self.stats.bad_records += 1,
                }
            }
            (Key::Host(name), Event::Delete { .. }) => self.delete_host(name, out),
            (Key::Mac(mac), Event::Put { value, .. }) => match serde_json::from_slice::<MacRecord>(value) {
                Ok(r) if crate::layout::valid_name(&r.host) => self.put_mac(mac, &r.host, out),
                _ => self.stats.bad_records += 1,
            },
            (Key::Mac(mac), Event::Delete { .. }) => self.delete_mac(mac, out),
        }
    }

    fn put_host(&mut self, name: &str, r: HostRecord, out: &mut Vec<Change>) {
        let h = self.id(name);
        let was = self.routed(h);
        if self.records[h as usize].as_ref() == Some(&r) {
            return;
        }
        self.records[h as usize] = Some(r.clone());
        if name == self.me {
            return;
        }
        out.push(Change::Link { host: name.to_string(), record: Some(r) });
        if !was {
            for &m in &self.by_host[h as usize] {
                out.push(self.route(m, Some(h)));
            }
        }
    }

    fn delete_host(&mut self, name: &str, out: &mut Vec<Change>) {
        let Some(&h) = self.ids.get(name) else { return };
        let was = self.routed(h);
        self.records[h as usize] = None;
        if was {
            for &m in &self.by_host[h as usize] {
                out.push(self.route(m, None));
            }
            out.push(Change::Link { host: name.to_string(), record: None });
        }
    }

    fn put_mac(&mut self, mac: MacAddr, host: &str, out: &mut Vec<Change>) {
        let h = self.id(host);
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

    fn delete_mac(&mut self, mac: MacAddr, out: &mut Vec<Change>) {
        let Some(o) = self.macs.remove(&mac) else { return };
        let list = &mut self.by_host[o as usize];
        if let Some(i) = list.iter().position(|&m| m == mac) {
            list.swap_remove(i);
        }
        if self.routed(o) {
            out.push(self.route(mac, None));
        }
    }

    /// Replaces the view by a full listing at revision `rev` (after a
    /// compaction, or when the store is back): what differs from the view
    /// held is appended to `out`, so the host converges without a restart.
    pub fn relist(&mut self, kvs: &[(String, Vec<u8>)], rev: u64, out: &mut Vec<Change>) {
        let mut next = Member::watching(self.prefix.clone(), &self.me);
        next.stats = self.stats;
        next.stats.relists += 1;
        let mut ignored = Vec::new();
        for (k, v) in kvs {
            next.apply(&Event::Put { key: k.clone(), value: v.clone(), rev }, &mut ignored);
        }
        next.revision = rev;
        // Links: gone, new or changed.
        let old_links: FxHashMap<&str, &HostRecord> = self.links().collect();
        let new_links: FxHashMap<&str, &HostRecord> = next.links().collect();
        for (h, r) in &new_links {
            if old_links.get(h) != Some(r) {
                out.push(Change::Link { host: h.to_string(), record: Some((*r).clone()) });
            }
        }
        let mut gone = Vec::new();
        for h in old_links.keys().filter(|h| !new_links.contains_key(*h)) {
            gone.push(Change::Link { host: h.to_string(), record: None });
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{host_key, mac_key};
    use crate::store::MemStore;

    fn mac(i: u32) -> MacAddr {
        let b = i.to_be_bytes();
        MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
    }

    fn host(i: u8) -> Vec<u8> {
        HostRecord { addr: format!("10.0.0.{i}:9000").parse().unwrap(), kinds: vec![], public_key: None }
            .to_json()
    }

    fn vm(h: &str) -> Vec<u8> {
        MacRecord { host: h.into(), iface: "vm0".into() }.to_json()
    }

    fn sync(m: &mut Member, s: &MemStore) -> Vec<Change> {
        let mut out = Vec::new();
        let evs: Vec<Event> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            m.apply(e, &mut out);
        }
        out
    }

    #[test]
    fn hosts_macs_and_moves_become_links_and_routes() {
        let mut s = MemStore::new();
        let mut a = Member::new("n", "a");
        let la = s.grant(10, 0);
        s.put(&host_key("n", "a"), host(1), Some(la));
        s.put(&mac_key("n", mac(1)), vm("a"), Some(la));
        // b's MAC before b's host record: known, not routed yet.
        let lb = s.grant(10, 0);
        s.put(&mac_key("n", mac(2)), vm("b"), Some(lb));
        let c = sync(&mut a, &s);
        assert!(c.is_empty(), "{c:?}");
        s.put(&host_key("n", "b"), host(2), Some(lb));
        let c = sync(&mut a, &s);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(a.route_of(mac(2)), Some("b"));
        assert_eq!(a.route_of(mac(1)), None, "our own MAC is never routed");
        // A move: one event, one route change.
        let lc = s.grant(10, 0);
        s.put(&host_key("n", "c"), host(3), Some(lc));
        sync(&mut a, &s);
        s.put(&mac_key("n", mac(2)), vm("c"), Some(lc));
        let c = sync(&mut a, &s);
        assert_eq!(c, vec![Change::Route { mac: mac(2), host: Some("c".into()) }]);
        // b's lease expires: its link goes, no route pointed at it any more.
        s.keepalive(la, 5);
        s.keepalive(lc, 5);
        s.expire(12);
        let c = sync(&mut a, &s);
        assert_eq!(c, vec![Change::Link { host: "b".into(), record: None }]);
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
            s.put(&mac_key("n", mac(i.into())), vm(&format!("h{i}")), None);
        }
        sync(&mut a, &s);
        // Changes while a is away, then history compacted.
        s.delete_if(&host_key("n", "h1"), None);
        s.put(&mac_key("n", mac(2)), vm("h3"), None);
        s.put(&host_key("n", "h9"), host(9), None);
        s.compact(s.revision());
        assert!(s.watch(a.prefix(), a.revision() + 1).is_err());
        let (kvs, rev) = s.range(a.prefix());
        let mut out = Vec::new();
        a.relist(&kvs, rev, &mut out);
        assert_eq!(a.route_of(mac(1)), None);
        assert_eq!(a.route_of(mac(2)), Some("h3"));
        assert!(out.contains(&Change::Link { host: "h1".into(), record: None }));
        assert!(out.contains(&Change::Route { mac: mac(2), host: Some("h3".into()) }));
        assert!(out.iter().any(|c| matches!(c, Change::Link { host, record: Some(_) } if host == "h9")));
        assert_eq!(a.revision(), rev);
        assert_eq!(a.stats.relists, 1);
    }
}
