//! From a member's changes to one transaction against the host's running
//! [`State`]: typed commands of the control language, which the daemon
//! applies like any other (atomically, on both paths), so cluster mode adds
//! no second way of changing the data path. The commands are built as
//! values, never as text: nothing a record says can become a command of its
//! own (a key with a newline in it was once a second line).
//!
//! The cluster owns the links named after other hosts and, on them, the
//! routes `any MAC -> link HOST` and the broadcast route; everything else
//! in the state (local interfaces, static links and routes) is left alone.
//! A batch may carry several changes for one MAC or host (a burst of
//! events): the last one wins. The transaction deletes routes first, then
//! links, then adds links, then routes, so it is valid as a whole.

use crate::member::{Change, Peer};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use vnet_control::ast::{Format, From, LinkRef, Ref, Target};
use vnet_control::{Cipher, Command, Located, PeerKey, RouteDef, Security, State, Transport};
use vnet_core::{MacSpec, Port};
use vnet_wire::MacAddr;

/// What protects the links to other hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protect {
    /// `encrypt` to a host whose record has a key, nothing to one without.
    #[default]
    AsKeyed,
    /// Nothing, whatever the record says.
    None,
    /// Every link authenticated (a host without a key gets no link).
    Auth,
    /// Every link encrypted (a host without a key gets no link).
    Encrypt,
}

/// How links to other hosts are declared (`--cluster-link-options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOptions {
    pub format: Format,
    pub network: u32,
    pub mtu: u32,
    pub protect: Protect,
    /// A secured link's AEAD (`cipher`).
    pub cipher: Cipher,
    /// `nat`: every secured link may cross NAT (it sends from the listening
    /// socket and follows its peer's authenticated address and port).
    pub nat: bool,
    /// `relay auto`: secured links go through a host whose record says it
    /// relays ([`LinkOptions::relay`], chosen by the cluster task) while
    /// their peer cannot be reached directly.
    pub relay_auto: bool,
    /// The relay's key as chosen now (not a word of the options).
    pub relay: Option<PeerKey>,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            format: Format::Vnet,
            network: 0,
            mtu: vnet_control::parse::DEFAULT_LINK_MTU,
            protect: Protect::AsKeyed,
            cipher: Cipher::Auto,
            nat: false,
            relay_auto: false,
            relay: None,
        }
    }
}

impl LinkOptions {
    /// The options of a `udp` link line, e.g. `network 7 mtu 9000 security
    /// encrypt` (`format vnet` unless they name another; no `peer-key`,
    /// which each host's record gives). Errors point into `words`.
    pub fn parse(words: &str) -> Result<LinkOptions, vnet_control::Error> {
        const HEAD: &str = "link probe udp 127.0.0.1:9 ";
        // `relay auto`: the relay comes from the records, not the words.
        let relay_auto =
            words.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w == ["relay", "auto"]);
        let stripped;
        let words = if relay_auto {
            stripped = words.replacen("relay auto", "", 1);
            stripped.as_str()
        } else {
            words
        };
        if words.split_whitespace().any(|x| x == "relay") {
            let column = words.find("relay").map_or(1, |i| i as u32 + 1);
            return Err(vnet_control::Error::new(
                vnet_control::Pos { line: 1, column },
                "`relay auto` (a relay from the records: a host that runs vnetd --relay)",
                "`relay` with a key",
            ));
        }
        let said = |w: &str| words.split_whitespace().any(|x| x == w);
        let at = |e: vnet_control::Error| {
            let column = e.pos.column.saturating_sub(HEAD.len() as u32).max(1);
            vnet_control::Error { pos: vnet_control::Pos { line: 1, column }, ..e }
        };
        if said("peer-key") {
            let column = words.find("peer-key").map_or(1, |i| i as u32 + 1);
            return Err(vnet_control::Error::new(
                vnet_control::Pos { line: 1, column },
                "link options without `peer-key` (each host's record gives its key)",
                "`peer-key`",
            ));
        }
        // A `security` word needs a key to parse; a placeholder stands in.
        let key = if (said("security") && !said("none")) || said("cipher") || said("nat") {
            format!(" peer-key {}", PeerKey([0; 32]))
        } else {
            String::new()
        };
        let cmds = vnet_control::parse(&format!("{HEAD}{words}{key}")).map_err(at)?;
        let Some(Command::Link {
            transport: Transport::Udp { format, network, security, cipher, nat, .. },
            mtu,
            ..
        }) = cmds.into_iter().next().map(|c| c.item)
        else {
            return Err(vnet_control::Error::new(Default::default(), "udp link options", words));
        };
        let protect = match security {
            Security::Auth(_) => Protect::Auth,
            Security::Encrypt(_) => Protect::Encrypt,
            Security::None if said("security") => Protect::None,
            Security::None => Protect::AsKeyed,
        };
        let format = if said("format") { format } else { Format::Vnet };
        if (nat || relay_auto) && !said("security") {
            // `nat` and relays are secured links' (the peer is known by its key).
            return Ok(LinkOptions {
                format,
                network,
                mtu,
                protect: Protect::Encrypt,
                cipher,
                nat,
                relay_auto,
                relay: None,
            });
        }
        Ok(LinkOptions { format, network, mtu, protect, cipher, nat, relay_auto, relay: None })
    }

    /// Whether every peer must have a key.
    pub fn require_key(&self) -> bool {
        matches!(self.protect, Protect::Auth | Protect::Encrypt)
    }

    /// The link to `peer`: `None` when the options require a key it lacks.
    pub fn transport(&self, peer: &Peer) -> Option<Transport> {
        let security = match (self.protect, peer.key) {
            (Protect::None, _) | (Protect::AsKeyed, None) => Security::None,
            (Protect::Auth, Some(k)) => Security::Auth(k),
            (Protect::Encrypt | Protect::AsKeyed, Some(k)) => Security::Encrypt(k),
            (Protect::Auth | Protect::Encrypt, None) => return None,
        };
        let format = if security == Security::None { self.format } else { Format::Vnet };
        Some(Transport::Udp {
            remote: peer.addr,
            format,
            network: self.network,
            security,
            cipher: if security == Security::None { Cipher::Auto } else { self.cipher },
            nat: self.nat && security != Security::None,
            // Never through the peer itself.
            relay: self.relay.filter(|r| security != Security::None && Some(*r) != peer.key),
        })
    }
}

fn cmd(item: Command) -> Located<Command> {
    Located { pos: Default::default(), item }
}

fn by<T>(by: T) -> Ref<T> {
    Ref { pos: Default::default(), by }
}

fn delete_route(id: u32) -> Located<Command> {
    cmd(Command::DeleteRoute(by(id)))
}

/// `route any DST -> link|interface NAME`.
fn route_to(dst: MacAddr, to: Target) -> Located<Command> {
    cmd(Command::Route { src: MacSpec::Any, dst: MacSpec::Addr(dst), to, from: From::Any })
}

fn to_link(name: &str) -> Target {
    Target::Link(by(LinkRef::Name(name.to_string())))
}

/// What [`plan`] makes of a batch: the transaction, and the hosts whose
/// records could not apply, with why (quarantined: every other record
/// applies).
#[derive(Debug, Default)]
pub struct Planned {
    pub cmds: Vec<Located<Command>>,
    pub refused: Vec<(String, String)>,
}

/// [`plan`]'s transaction, where every link named after a host is the
/// cluster's (a state with no static links of hosts' names: the tests').
pub fn transaction(state: &State, changes: &[Change], opts: &LinkOptions) -> Vec<Located<Command>> {
    plan(state, changes, opts, &|_| true).cmds
}

/// The transaction that makes `state` follow `changes`; empty when nothing
/// is to change. `owned` says which of the state's links the cluster made:
/// a host whose name is a link of the configuration's own, or whose address
/// a link that stays reaches already (two links a receiver could not tell
/// apart), is refused, not applied, and the rest of the batch applies
/// (one such record used to make the whole view fail, again and again).
/// Linear in the state's routes and the changes (indexes are built once),
/// so a relist of 100000 MACs costs one pass, not one per MAC.
pub fn plan(state: &State, changes: &[Change], opts: &LinkOptions, owned: &dyn Fn(&str) -> bool) -> Planned {
    let mut links: BTreeMap<&str, Option<Transport>> = BTreeMap::new();
    let mut routes: BTreeMap<MacAddr, Option<&str>> = BTreeMap::new();
    for c in changes {
        match c {
            Change::Link { host, peer } => {
                links.insert(host, peer.as_ref().and_then(|p| opts.transport(p)));
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
    let mut refused = Vec::new();
    let mut blocked: BTreeSet<&str> = BTreeSet::new();
    for (&host, transport) in &links {
        let Some(l) = state.link_by_name(host) else {
            if let Some(t) = transport {
                add_links.push((host, *t));
            }
            continue;
        };
        if !owned(host) {
            // A host gone whose name a static link has: nothing of ours to remove.
            if transport.is_some() {
                let why = format!("host `{host}` has the name of a link of this host's own configuration");
                refused.push((host.to_string(), why));
            }
            blocked.insert(host);
            continue;
        }
        if *transport == Some(l.transport) && l.mtu == opts.mtu {
            continue;
        }
        let to_link = by_link.get(&l.id).map_or(&[][..], Vec::as_slice);
        del_routes.extend(to_link.iter().map(|r| r.id));
        remade.insert(host);
        if let Some(t) = transport {
            add_links.push((host, *t));
            // The unicast routes to the re-made link come back below.
            for m in to_link.iter().filter(|r| r.src == MacSpec::Any).filter_map(|r| r.dst.addr()) {
                if !m.is_group() {
                    routes.entry(m).or_insert(Some(host));
                }
            }
        }
    }
    keep_distinct(state, &remade, &mut add_links, (&mut refused, &mut blocked));
    let made = |h: &str| !blocked.contains(h) && links.get(h).map_or(names.contains(h), Option::is_some);
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
        // The link is there after the transaction: as the batch says, else as the state has it.
        if let Some(h) = host.filter(|h| made(h) && !already) {
            add_routes.push(route_to(mac, to_link(h)));
        }
    }
    let mut t: Vec<Located<Command>> = del_routes.into_iter().map(delete_route).collect();
    t.extend(remade.iter().map(|l| cmd(Command::DeleteLink(by(LinkRef::Name(l.to_string()))))));
    for (host, transport) in add_links {
        t.push(cmd(Command::Link { name: Some(host.to_string()), transport, mtu: opts.mtu }));
        t.push(route_to(MacAddr::BROADCAST, to_link(host)));
    }
    t.extend(add_routes);
    Planned { cmds: t, refused }
}

/// Keeps the new links `add` a receiver can tell apart from every link
/// of `state` that stays (not `remade`) and from each other; refuses the
/// rest, their hosts `blocked`.
fn keep_distinct<'a>(
    state: &'a State,
    remade: &BTreeSet<&str>,
    add: &mut Vec<(&'a str, Transport)>,
    (refused, blocked): (&mut Vec<(String, String)>, &mut BTreeSet<&'a str>),
) {
    let key =
        |t: &Transport| vnet_control::LinkDef { id: 0, name: String::new(), transport: *t, mtu: 0 }.rx_key();
    let mut keys: FxHashMap<vnet_control::RxKey, &str> = state
        .links
        .values()
        .filter(|l| !remade.contains(l.name.as_str()))
        .map(|l| (l.rx_key(), l.name.as_str()))
        .collect();
    add.retain(|(host, t)| match keys.get(&key(t)) {
        Some(other) => {
            let why = format!("host `{host}`'s address {} is reached by link `{other}` already", t.peer());
            refused.push((host.to_string(), why));
            blocked.insert(host);
            false
        }
        None => {
            keys.insert(key(t), host);
            true
        }
    });
}

/// The routes of this host's own interfaces: a local interface of the
/// cluster's network with a declared MAC gets `route any MAC -> interface
/// NAME` and the broadcast route while the store names this host (or no
/// host) for the MAC; once another host holds the MAC (the VM moved
/// there, or it claimed it first), both go, and the member routes the MAC
/// to that host's link. Interfaces of other networks are left alone
/// (networks may share MACs). Run after [`transaction`], against the same
/// state: it touches only routes to interfaces.
pub fn local(state: &State, member: &crate::Member) -> Vec<Located<Command>> {
    // The `any MAC -> interface` routes by (interface, MAC): one pass.
    let mut to_iface: FxHashMap<(u32, MacAddr), Vec<u32>> = FxHashMap::default();
    for r in state.routes.values() {
        if let (Port::Interface(i), MacSpec::Any, MacSpec::Addr(d)) = (r.to, r.src, r.dst) {
            to_iface.entry((i, d)).or_default().push(r.id);
        }
    }
    let mut t = Vec::new();
    // A standby interface waits for its VM unrouted (vnetd routes it when
    // the VM arrives, and claims it).
    for i in state.interfaces.values().filter(|i| !i.standby && i.network == member.tenant()) {
        let Some(mac) = i.mac else { continue };
        let mine = member.owner(mac).is_none_or(|o| o == member.me());
        for dst in [mac, MacAddr::BROADCAST] {
            let have = to_iface.get(&(i.id, dst)).map_or(&[][..], Vec::as_slice);
            if mine && have.is_empty() {
                let iface = Target::Interface(by(vnet_control::ast::IfaceRef::Name(i.name.clone())));
                t.push(route_to(dst, iface));
            } else if !mine {
                t.extend(have.iter().map(|&id| delete_route(id)));
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host at 10.0.0.2:9000 with no key.
    fn keyless_peer() -> Peer {
        Peer {
            addr: "10.0.0.2:9000".parse().unwrap(),
            key: None,
            claim_key: None,
            relay: false,
            groups: Box::default(),
            gateway: None,
        }
    }
    use crate::layout::fixtures::Claims;
    use crate::layout::fixtures::{host, moved, vm};
    use crate::layout::{host_key, HostRecord};
    use crate::{MemStore, Member};
    use vnet_control::PeerKey;

    fn mac(i: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, i])
    }

    /// Applies the store's news to `m` and `state`; returns the transaction.
    fn step(m: &mut Member, s: &MemStore, state: &mut State) -> Vec<Located<Command>> {
        let mut out = Vec::new();
        let evs: Vec<_> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            m.apply(e, &mut out);
        }
        let t = transaction(state, &out, &LinkOptions::default());
        *state = state.apply_all(&t).unwrap_or_else(|e| panic!("{e}\n{t:?}"));
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

    /// Host `a`'s state (its VM's interface), an empty store, and its view.
    fn host_a() -> (State, MemStore, Member) {
        let base = "listen udp 127.0.0.1:0\ninterface vm tap t mac 52:54:00:00:00:01\n";
        let state = State::default().apply_all(&vnet_control::parse(base).unwrap()).unwrap();
        (state, MemStore::new(), Member::new("n", "a"))
    }

    #[test]
    fn the_state_follows_the_store_through_joins_moves_and_deaths() {
        let (mut state, mut s, mut m) = host_a();
        let leases: Vec<u64> = (0..3).map(|_| s.grant(10, 0)).collect();
        for (i, h) in ["a", "b", "c"].iter().enumerate() {
            s.put(&host_key("n", h), host(i as u8 + 1), Some(leases[i]));
            s.put_claim(mac(i as u8 + 1), vm(h), Some(leases[i]));
        }
        step(&mut m, &s, &mut state);
        assert_eq!(state.links.len(), 2);
        let want: BTreeMap<_, _> = [(mac(2), "b".to_string()), (mac(3), "c".to_string())].into();
        assert_eq!(routed(&state), want);
        // Nothing new: nothing to do.
        assert!(step(&mut m, &s, &mut state).is_empty());
        // b's VM moves to c, then back, then to c again in one batch: one route change.
        for (epoch, h) in ["c", "b", "c"].into_iter().enumerate() {
            s.put_claim(mac(2), moved(h, epoch as u64 + 1), Some(leases[2]));
        }
        let t = step(&mut m, &s, &mut state);
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(routed(&state)[&mac(2)], "c");
        // b changes address: its link is made anew, its routes with it.
        s.put_claim(mac(4), vm("b"), Some(leases[1]));
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
    fn a_record_colliding_with_a_static_link_is_refused_and_every_other_applies() {
        // Issue 44, findings 2 and 3: a static link of a host's name was
        // remade with the record's address; a host at a static link's
        // address made the whole transaction fail, every time.
        let base = "listen udp 127.0.0.1:0\nlink b udp 192.0.2.7:9000\nlink far udp 10.0.0.3:9000\n";
        let mut state = State::default().apply_all(&vnet_control::parse(base).unwrap()).unwrap();
        let statics: BTreeSet<String> = state.links.values().map(|l| l.name.clone()).collect();
        let mut s = MemStore::new();
        let mut m = Member::new("n", "a");
        let lease = s.grant(10, 0);
        for (i, h) in ["a", "b", "c", "d"].iter().enumerate() {
            s.put(&host_key("n", h), host(i as u8 + 1), Some(lease));
            s.put_claim(mac(i as u8 + 1), vm(h), Some(lease));
        }
        let mut out = Vec::new();
        let evs: Vec<_> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
        for e in &evs {
            m.apply(e, &mut out);
        }
        let p = plan(&state, &out, &LinkOptions::default(), &|h| !statics.contains(h));
        let refused: BTreeMap<_, _> = p.refused.iter().cloned().collect();
        assert_eq!(refused.keys().collect::<Vec<_>>(), vec!["b", "c"], "{refused:?}");
        assert!(
            refused["b"].contains("own configuration") && refused["c"].contains("link `far`"),
            "{refused:?}"
        );
        state = state.apply_all(&p.cmds).unwrap_or_else(|e| panic!("{e}\n{:?}", p.cmds));
        assert_eq!(
            state.link_by_name("b").unwrap().remote(),
            Some("192.0.2.7:9000".parse().unwrap()),
            "kept"
        );
        assert_eq!(
            state.link_by_name("d").unwrap().remote(),
            Some("10.0.0.4:9000".parse().unwrap()),
            "linked"
        );
        let want: BTreeMap<_, _> = [(mac(4), "d".to_string())].into();
        assert_eq!(routed(&state), want, "b's and c's MACs go to no static link");
        // b leaves: the static link stays, and nothing is refused any more.
        let gone = [Change::Link { host: "b".into(), peer: None }];
        let p = plan(&state, &gone, &LinkOptions::default(), &|h| !statics.contains(h));
        assert!(p.cmds.is_empty() && p.refused.is_empty(), "{:?} {:?}", p.cmds, p.refused);
    }

    #[test]
    fn a_local_interface_is_routed_while_its_mac_is_ours_and_yields_when_another_host_claims_it() {
        let (mut state, mut s, mut m) = host_a();
        let la = s.grant(10, 0);
        let lb = s.grant(10, 0);
        s.put(&host_key("n", "a"), host(1), Some(la));
        s.put(&host_key("n", "b"), host(2), Some(lb));
        s.put_claim(mac(1), vm("a"), Some(la));
        let sync = |m: &mut Member, s: &MemStore, state: &mut State| {
            let mut t = step(m, s, state);
            let l = local(state, m);
            *state = state.apply_all(&l).unwrap_or_else(|e| panic!("{e}\n{l:?}"));
            t.extend(l);
            t
        };
        sync(&mut m, &s, &mut state);
        let vm_id = state.iface_by_name("vm").unwrap().id;
        let to_vm = |state: &State| state.routes.values().filter(|r| r.to == Port::Interface(vm_id)).count();
        assert_eq!(to_vm(&state), 2, "unicast and broadcast");
        assert!(local(&state, &m).is_empty(), "nothing twice");
        // b claims the MAC at the epoch a holds it: a conflict, nothing moves.
        s.put_claim(mac(1), vm("b"), Some(lb));
        let t = sync(&mut m, &s, &mut state);
        assert!(t.is_empty() && to_vm(&state) == 2, "{t:?}");
        assert_eq!(m.conflicts().collect::<Vec<_>>(), [(mac(1), "a", "b")]);
        // The VM moves to b (a migration: epoch 1): its routes leave the
        // interface for b's link, in one step.
        s.put_claim(mac(1), moved("b", 1), Some(lb));
        let t = sync(&mut m, &s, &mut state);
        assert_eq!(to_vm(&state), 0, "{t:?}");
        assert_eq!(routed(&state)[&mac(1)], "b");
        assert_eq!(m.conflicts().count(), 0);
        // a claiming again at the epoch it knew (restarted with the VM in
        // its config) takes nothing back.
        s.put_claim(mac(1), moved("a", 1), Some(la));
        sync(&mut m, &s, &mut state);
        assert_eq!((to_vm(&state), routed(&state)[&mac(1)].as_str()), (0, "b"));
        // And back, by a migration.
        s.put_claim(mac(1), moved("a", 2), Some(la));
        sync(&mut m, &s, &mut state);
        assert_eq!(to_vm(&state), 2);
        assert!(!routed(&state).contains_key(&mac(1)));
    }

    #[test]
    fn claims_of_another_network_are_refused_and_its_interfaces_left_alone() {
        // Issue 44, finding 5: claims carried no network, and a claim of a
        // MAC took the routes of a local interface of any network.
        let base = "listen udp 127.0.0.1:0\ninterface v7 tap t7 mac 52:54:00:00:00:01 network 7\n\
                    interface v8 tap t8 mac 52:54:00:00:00:01 network 8\n";
        let mut state = State::default().apply_all(&vnet_control::parse(base).unwrap()).unwrap();
        let mut s = MemStore::new();
        let mut m = Member::with_policy("n", "a", crate::Policy { tenant: 7, ..Default::default() });
        s.put(&host_key("n", "a"), host(1), None);
        s.put(&host_key("n", "b"), host(2), None);
        let claim = |h: &str, network: u32, epoch: u64| {
            crate::MacRecord { host: h.into(), iface: "vm".into(), network, epoch, ..Default::default() }
                .to_json()
        };
        s.put_claim(mac(1), claim("a", 7, 0), None);
        let opts = LinkOptions { network: 7, ..LinkOptions::default() };
        let sync = |m: &mut Member, s: &MemStore, state: &mut State| {
            let mut out = Vec::new();
            let evs: Vec<_> = s.watch(m.prefix(), m.revision() + 1).unwrap().cloned().collect();
            for e in &evs {
                m.apply(e, &mut out);
            }
            let mut t = transaction(state, &out, &opts);
            *state = state.apply_all(&t).unwrap_or_else(|e| panic!("{e}\n{t:?}"));
            let l = local(state, m);
            *state = state.apply_all(&l).unwrap_or_else(|e| panic!("{e}\n{l:?}"));
            t.extend(l);
        };
        sync(&mut m, &s, &mut state);
        let to = |state: &State, name: &str| {
            let id = state.iface_by_name(name).unwrap().id;
            state.routes.values().filter(|r| r.to == Port::Interface(id)).count()
        };
        assert_eq!(
            (to(&state, "v7"), to(&state, "v8")),
            (2, 0),
            "only network 7's interface is the cluster's"
        );
        // b claims the MAC for network 8, even as a migration: refused.
        s.put_claim(mac(1), claim("b", 8, 5), None);
        sync(&mut m, &s, &mut state);
        assert_eq!(to(&state, "v7"), 2);
        assert!(m.quarantined().any(|(_, e)| e.to_string().contains("network 8")));
        // A migration in network 7 moves network 7's interface only.
        s.put_claim(mac(1), claim("b", 7, 1), None);
        sync(&mut m, &s, &mut state);
        assert_eq!(to(&state, "v7"), 0);
        assert_eq!(routed(&state)[&mac(1)], "b");
        assert_eq!(state.iface_by_name("v8").unwrap().network, 8, "left alone");
    }

    #[test]
    fn link_options_parse_with_positions_and_security_needs_no_key() {
        let o = LinkOptions::parse("").unwrap();
        assert_eq!(o, LinkOptions::default());
        let o = LinkOptions::parse("security encrypt network 7 mtu 9000").unwrap();
        assert_eq!((o.protect, o.network, o.mtu, o.require_key()), (Protect::Encrypt, 7, 9000, true));
        assert_eq!(LinkOptions::parse("format raw").unwrap().format, Format::Raw);
        assert_eq!(LinkOptions::parse("security none").unwrap().protect, Protect::None);
        let e = LinkOptions::parse("mtu 9000 peer-key x").unwrap_err();
        assert_eq!((e.pos.line, e.pos.column), (1, 10));
        let e = LinkOptions::parse("mtu 1").unwrap_err();
        assert_eq!(e.pos.column, 5, "{e}");
        // Issue 45: cluster links across NATs.
        let o = LinkOptions::parse("nat relay auto mtu 1400").unwrap();
        assert!(o.nat && o.relay_auto && o.require_key() && o.mtu == 1400, "{o:?}");
        let e = LinkOptions::parse(&format!("nat relay {}", PeerKey([3; 32]))).unwrap_err();
        assert!(e.to_string().contains("relay auto"), "{e}");
        let (k, r) = (PeerKey([1; 32]), PeerKey([2; 32]));
        let peer = |key| Peer {
            addr: "10.0.0.2:9000".parse().unwrap(),
            key: Some(key),
            claim_key: None,
            relay: false,
            groups: Box::default(),
            gateway: None,
        };
        let with = LinkOptions { relay: Some(r), ..o };
        assert!(
            matches!(with.transport(&peer(k)), Some(Transport::Udp { nat: true, relay: Some(x), .. }) if x == r)
        );
        assert!(
            matches!(with.transport(&peer(r)), Some(Transport::Udp { relay: None, .. })),
            "never through the peer itself"
        );
        // A keyless host gets no link where every link is secured.
        let keyless = keyless_peer();
        assert_eq!(LinkOptions::parse("security auth").unwrap().transport(&keyless), None);
    }

    /// `Member::full` restated to a state that holds it already changes
    /// nothing; with another MTU in the options, every cluster link is made
    /// again with it, and nothing else changes.
    #[test]
    fn the_full_view_changes_nothing_held_and_remakes_links_of_another_mtu() {
        let (mut state, mut s, mut m) = host_a();
        for (i, h) in ["a", "b", "c"].iter().enumerate() {
            s.put(&host_key("n", h), host(i as u8 + 1), None);
            s.put_claim(mac(i as u8 + 1), vm(h), None);
        }
        step(&mut m, &s, &mut state);
        let mut full = Vec::new();
        m.full(&mut full);
        assert_eq!(
            full.iter().filter(|c| matches!(c, Change::Link { .. })).count(),
            2,
            "b and c, not a: {full:?}"
        );
        assert_eq!(full.iter().filter(|c| matches!(c, Change::Route { .. })).count(), 3, "{full:?}");
        assert!(transaction(&state, &full, &LinkOptions::default()).is_empty());
        let big = LinkOptions { mtu: 9000, ..LinkOptions::default() };
        let t = transaction(&state, &full, &big);
        let next = state.apply_all(&t).unwrap();
        assert!(next.links.values().all(|l| l.mtu == 9000), "{t:?}");
        assert_eq!(routed(&next), routed(&state), "the same routes, over the links made again");
    }

    /// Edges of the options mutation testing found unchecked: where a
    /// keyed `relay` is pointed at, `relay` alone is no `relay auto`,
    /// `nat` under an explicit `security`, and what a plain link to a
    /// keyless or a keyed peer carries.
    #[test]
    fn link_options_at_their_edges() {
        let e = LinkOptions::parse(&format!("mtu 1400 relay {}", PeerKey([3; 32]))).unwrap_err();
        assert_eq!(e.pos.column, 10, "{e}");
        let o = LinkOptions::parse("network 7 mtu 1400").unwrap();
        assert_eq!(
            (o.relay_auto, o.nat, o.protect),
            (false, false, Protect::AsKeyed),
            "no `relay auto` said"
        );
        // `nat` with `security auth` keeps auth (only a bare `nat` means encrypt).
        let o = LinkOptions::parse("nat security auth").unwrap();
        assert_eq!((o.protect, o.nat), (Protect::Auth, true));
        let o = LinkOptions::parse("nat").unwrap();
        assert_eq!((o.protect, o.nat, o.relay_auto), (Protect::Encrypt, true, false));
        let o = LinkOptions::parse("relay auto").unwrap();
        assert_eq!(
            (o.protect, o.nat, o.relay_auto),
            (Protect::Encrypt, false, true),
            "a relay is a secured link's"
        );
        assert!(!LinkOptions::parse("").unwrap().require_key());
        assert!(!LinkOptions::parse("security none").unwrap().require_key());
        let keyless = keyless_peer();
        let keyed = Peer { key: Some(PeerKey([1; 32])), ..keyless.clone() };
        // A plain link keeps its format and the automatic cipher, and no NAT.
        let plain = LinkOptions {
            format: Format::Raw,
            cipher: Cipher::Aes256Gcm,
            nat: true,
            ..LinkOptions::default()
        };
        let Some(Transport::Udp { format, cipher, nat, security, .. }) = plain.transport(&keyless) else {
            panic!()
        };
        assert_eq!((format, cipher, nat, security), (Format::Raw, Cipher::Auto, false, Security::None));
        // A keyed peer: secured, `vnet`, the cipher and NAT as asked.
        let Some(Transport::Udp { format, cipher, nat, security, .. }) = plain.transport(&keyed) else {
            panic!()
        };
        assert_eq!((format, cipher, nat), (Format::Vnet, Cipher::Aes256Gcm, true));
        assert!(matches!(security, Security::Encrypt(_)));
    }

    #[test]
    fn nothing_a_record_says_becomes_a_command_of_its_own() {
        // The cluster's commands are values: a record's fields reach the
        // daemon only as the typed fields they checked into.
        let base = "listen udp 127.0.0.1:0\n";
        let state = State::default().apply_all(&vnet_control::parse(base).unwrap()).unwrap();
        let mut s = MemStore::new();
        let mut m = Member::with_policy("n", "a", crate::Policy { have_key: true, ..Default::default() });
        let evil = format!("{}\ninterface pbinj tap pbinj0", PeerKey([1; 32]));
        let v = HostRecord {
            addr: "10.0.0.2:9000".parse().unwrap(),
            kinds: vec![],
            public_key: Some(evil),
            cert: None,
            relay: false,
            gateway: None,
        };
        s.put(&host_key("n", "b"), v.to_json(), None);
        let mut out = Vec::new();
        let evs: Vec<_> = s.watch(m.prefix(), 1).unwrap().cloned().collect();
        for e in &evs {
            m.apply(e, &mut out);
        }
        assert!(transaction(&state, &out, &LinkOptions::default()).is_empty());
        assert_eq!(m.stats.bad_records, 1);
    }
}
