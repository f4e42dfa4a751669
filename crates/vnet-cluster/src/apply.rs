//! From a member's changes to one transaction of the control language,
//! against the host's running [`State`]: the daemon applies it like any
//! other (atomically, on both paths), so cluster mode adds no second way
//! of changing the data path.
//!
//! The cluster owns the links named after other hosts and, on them, the
//! routes `any MAC -> link HOST` and the broadcast route; everything else
//! in the state (local interfaces, static links and routes) is left alone.
//! A batch may carry several changes for one MAC or host (a burst of
//! events): the last one wins. The transaction deletes routes first, then
//! links, then adds links, then routes, so it is valid as a whole.

use crate::member::Change;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use vnet_control::{RouteDef, State, Transport};
use vnet_core::{MacSpec, Port};
use vnet_wire::MacAddr;

/// How links to other hosts are declared.
#[derive(Debug, Clone, Default)]
pub struct LinkOptions {
    /// Extra words after `link NAME udp ADDR` (e.g. `format vnet network 7`).
    pub extra: String,
}

/// The transaction (control-language lines) that makes `state` follow
/// `changes`; empty when nothing is to change. Linear in the state's routes
/// and the changes (indexes are built once), so a relist of 100000 MACs
/// costs one pass, not one per MAC.
pub fn transaction(state: &State, changes: &[Change], opts: &LinkOptions) -> String {
    let mut links: BTreeMap<&str, Option<&crate::HostRecord>> = BTreeMap::new();
    let mut routes: BTreeMap<MacAddr, Option<&str>> = BTreeMap::new();
    for c in changes {
        match c {
            Change::Link { host, record } => {
                links.insert(host, record.as_ref());
            }
            Change::Route { mac, host } => {
                routes.insert(*mac, host.as_deref());
            }
        }
    }
    // The state's routes by link, and its `any MAC` routes by MAC.
    let mut by_link: FxHashMap<u32, Vec<&RouteDef>> = FxHashMap::default();
    let mut by_mac: FxHashMap<MacAddr, Vec<&RouteDef>> = FxHashMap::default();
    for r in state.routes.values() {
        if let Port::Link(id) = r.to {
            by_link.entry(id).or_default().push(r);
        }
        if let (MacSpec::Any, MacSpec::Addr(m)) = (r.src, r.dst) {
            by_mac.entry(m).or_default().push(r);
        }
    }
    let names: FxHashSet<&str> = state.links.values().map(|l| l.name.as_str()).collect();
    let mut del_routes = BTreeSet::new();
    // Links deleted (and, when they have a record, made anew).
    let mut remade: BTreeSet<&str> = BTreeSet::new();
    let mut add_links = Vec::new();
    for (&host, record) in &links {
        let Some(l) = state.link_by_name(host) else {
            if let Some(r) = record {
                add_links.push(link_lines(host, r, opts));
            }
            continue;
        };
        if record.is_some_and(|r| l.remote() == Some(r.addr) && same_key(&l.transport, r)) {
            continue;
        }
        let to_link = by_link.get(&l.id).map_or(&[][..], Vec::as_slice);
        del_routes.extend(to_link.iter().map(|r| r.id));
        remade.insert(host);
        if let Some(r) = record {
            add_links.push(link_lines(host, r, opts));
            // The unicast routes to the re-made link come back below.
            for m in to_link.iter().filter(|r| r.src == MacSpec::Any).filter_map(|r| r.dst.addr()) {
                if !m.is_group() {
                    routes.entry(m).or_insert(Some(host));
                }
            }
        }
    }
    // Routes: whatever routed the MAC to a link goes; the new one comes.
    let mut add_routes = Vec::new();
    for (&mac, host) in &routes {
        let mut already = false;
        for r in by_mac.get(&mac).map_or(&[][..], Vec::as_slice) {
            let Port::Link(id) = r.to else { continue };
            let to = state.links.get(&id).map(|l| l.name.as_str());
            if *host == to && to.is_some_and(|t| !remade.contains(t)) {
                already = true;
            } else {
                del_routes.insert(r.id);
            }
        }
        if let Some(h) = host {
            // The link is there after the transaction: as the batch says, else as the state has it.
            let exists = links.get(h).map_or(names.contains(h), Option::is_some);
            if exists && !already {
                add_routes.push(format!("route any {mac} -> link {h}"));
            }
        }
    }
    let mut t = String::new();
    for id in del_routes {
        t.push_str(&format!("delete route {id}\n"));
    }
    for l in &remade {
        t.push_str(&format!("delete link {l}\n"));
    }
    for l in add_links {
        t.push_str(&l);
    }
    for r in add_routes {
        t.push_str(&r);
        t.push('\n');
    }
    t
}

/// The routes of this host's own interfaces: a local interface with a
/// declared MAC gets `route any MAC -> interface NAME` and the broadcast
/// route while the store names this host (or no host) for the MAC; once
/// another host claims the MAC (the VM moved there), both go, and the
/// member routes the MAC to that host's link. Run after [`transaction`],
/// against the same state: it touches only routes to interfaces.
pub fn local(state: &State, member: &crate::Member) -> String {
    // The `any MAC -> interface` routes by (interface, MAC): one pass.
    let mut to_iface: FxHashMap<(u32, MacAddr), Vec<u32>> = FxHashMap::default();
    for r in state.routes.values() {
        if let (Port::Interface(i), MacSpec::Any, MacSpec::Addr(d)) = (r.to, r.src, r.dst) {
            to_iface.entry((i, d)).or_default().push(r.id);
        }
    }
    let mut t = String::new();
    for i in state.interfaces.values() {
        let Some(mac) = i.mac else { continue };
        let mine = member.owner(mac).is_none_or(|o| o == member.me());
        for dst in [mac, MacAddr::BROADCAST] {
            let have = to_iface.get(&(i.id, dst)).map_or(&[][..], Vec::as_slice);
            if mine && have.is_empty() {
                t.push_str(&format!("route any {dst} -> interface {}\n", i.name));
            } else if !mine {
                for &id in have {
                    t.push_str(&format!("delete route {id}\n"));
                }
            }
        }
    }
    t
}

fn same_key(t: &Transport, r: &crate::HostRecord) -> bool {
    match t {
        Transport::Udp { security, .. } => {
            let have = match security {
                vnet_control::Security::None => None,
                vnet_control::Security::Auth(k) | vnet_control::Security::Encrypt(k) => Some(k.to_string()),
            };
            have == r.public_key
        }
        _ => false,
    }
}

/// The lines of a link to `host`, with its broadcast route.
fn link_lines(host: &str, r: &crate::HostRecord, opts: &LinkOptions) -> String {
    let key = r.public_key.as_ref().map(|k| format!(" peer-key {k}")).unwrap_or_default();
    let extra = if opts.extra.is_empty() { String::new() } else { format!(" {}", opts.extra) };
    format!("link {host} udp {}{extra}{key}\nroute any {} -> link {host}\n", r.addr, MacAddr::BROADCAST)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{host_key, mac_key, HostRecord, MacRecord};
    use crate::{MemStore, Member};

    fn mac(i: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, i])
    }

    fn host(i: u8) -> Vec<u8> {
        HostRecord { addr: format!("10.0.0.{i}:9000").parse().unwrap(), kinds: vec![], public_key: None }
            .to_json()
    }

    fn vm(h: &str) -> Vec<u8> {
        MacRecord { host: h.into(), iface: "vm0".into() }.to_json()
    }

    /// Applies the store's news to `m` and `state`; returns the transaction.
    fn step(m: &mut Member, s: &MemStore, state: &mut State) -> String {
        let mut out = Vec::new();
        let evs: Vec<_> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            m.apply(e, &mut out);
        }
        let t = transaction(state, &out, &LinkOptions::default());
        let cmds = vnet_control::parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        *state = state.apply_all(&cmds).unwrap_or_else(|e| panic!("{e}\n{t}"));
        t
    }

    /// The unicast routes of the state: MAC -> link name.
    fn routed(state: &State) -> BTreeMap<MacAddr, String> {
        state
            .routes
            .values()
            .filter_map(|r| {
                let m = r.dst.addr().filter(|m| !m.is_group())?;
                let Port::Link(id) = r.to else { return None };
                Some((m, state.links[&id].name.clone()))
            })
            .collect()
    }

    #[test]
    fn the_state_follows_the_store_through_joins_moves_and_deaths() {
        let base = "listen udp 127.0.0.1:0\ninterface vm tap t mac 52:54:00:00:00:01\n";
        let mut state = State::default().apply_all(&vnet_control::parse(base).unwrap()).unwrap();
        let mut s = MemStore::new();
        let mut m = Member::new("n", "a");
        let leases: Vec<u64> = (0..3).map(|_| s.grant(10, 0)).collect();
        for (i, h) in ["a", "b", "c"].iter().enumerate() {
            s.put(&host_key("n", h), host(i as u8 + 1), Some(leases[i]));
            s.put(&mac_key("n", mac(i as u8 + 1)), vm(h), Some(leases[i]));
        }
        step(&mut m, &s, &mut state);
        assert_eq!(state.links.len(), 2);
        let want: BTreeMap<_, _> = [(mac(2), "b".to_string()), (mac(3), "c".to_string())].into();
        assert_eq!(routed(&state), want);
        // Nothing new: nothing to do.
        assert_eq!(step(&mut m, &s, &mut state), "");
        // b's VM moves to c, then back, then to c again in one batch: one route change.
        for h in ["c", "b", "c"] {
            s.put(&mac_key("n", mac(2)), vm(h), Some(leases[2]));
        }
        let t = step(&mut m, &s, &mut state);
        assert_eq!(t.lines().count(), 2, "{t}");
        assert_eq!(routed(&state)[&mac(2)], "c");
        // b changes address: its link is made anew, its routes with it.
        s.put(&mac_key("n", mac(4)), vm("b"), Some(leases[1]));
        step(&mut m, &s, &mut state);
        s.put(&host_key("n", "b"), host(9), Some(leases[1]));
        step(&mut m, &s, &mut state);
        assert_eq!(state.link_by_name("b").unwrap().remote(), Some("10.0.0.9:9000".parse().unwrap()));
        assert_eq!(routed(&state)[&mac(4)], "b");
        // c dies: its link and every route to it go; a's own MAC never was routed.
        s.keepalive(leases[0], 5);
        s.keepalive(leases[1], 5);
        s.expire(12);
        step(&mut m, &s, &mut state);
        assert!(state.link_by_name("c").is_none());
        let want: BTreeMap<_, _> = [(mac(4), "b".to_string())].into();
        assert_eq!(routed(&state), want);
        assert_eq!(state.interfaces.len(), 1, "local interfaces are left alone");
    }

    #[test]
    fn a_local_interface_is_routed_while_its_mac_is_ours_and_yields_when_another_host_claims_it() {
        let base = "listen udp 127.0.0.1:0\ninterface vm tap t mac 52:54:00:00:00:01\n";
        let mut state = State::default().apply_all(&vnet_control::parse(base).unwrap()).unwrap();
        let mut s = MemStore::new();
        let mut m = Member::new("n", "a");
        let la = s.grant(10, 0);
        let lb = s.grant(10, 0);
        s.put(&host_key("n", "a"), host(1), Some(la));
        s.put(&host_key("n", "b"), host(2), Some(lb));
        s.put(&mac_key("n", mac(1)), vm("a"), Some(la));
        let sync = |m: &mut Member, s: &MemStore, state: &mut State| {
            let t = step(m, s, state);
            let l = local(state, m);
            *state =
                state.apply_all(&vnet_control::parse(&l).unwrap()).unwrap_or_else(|e| panic!("{e}\n{l}"));
            t + &l
        };
        sync(&mut m, &s, &mut state);
        let vm_id = state.iface_by_name("vm").unwrap().id;
        let to_vm = |state: &State| state.routes.values().filter(|r| r.to == Port::Interface(vm_id)).count();
        assert_eq!(to_vm(&state), 2, "unicast and broadcast");
        assert_eq!(local(&state, &m), "", "nothing twice");
        // The VM moves to b: its routes leave the interface for b's link, in one step.
        s.put(&mac_key("n", mac(1)), vm("b"), Some(lb));
        let t = sync(&mut m, &s, &mut state);
        assert_eq!(to_vm(&state), 0, "{t}");
        assert_eq!(routed(&state)[&mac(1)], "b");
        // And back.
        s.put(&mac_key("n", mac(1)), vm("a"), Some(la));
        sync(&mut m, &s, &mut state);
        assert_eq!(to_vm(&state), 2);
        assert!(!routed(&state).contains_key(&mac(1)));
    }
}
