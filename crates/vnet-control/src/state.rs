//! The declared state of one vnetd, and how commands change it.
//!
//! [`State`] is plain data: what interfaces, links and routes exist, by id.
//! The daemon turns it into open devices, sockets and a route table; this
//! module only checks and records. [`State::apply_all`] is the atomic form:
//! it works on a copy and returns it only if every command succeeded.

use crate::ast::{Command, Datapath, From, IfaceRef, LinkRef, Located, Ref, Target, TlsFiles, Transport};
use crate::transport::DEFAULT_PORT;
pub use crate::transport::{canonical, RxKey, Via};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use vnet_model::{MacSpec, Port, SourceFilter};
use vnet_wire::MacAddr;

pub use crate::ast::Format as LinkFormat;

pub use crate::ast::{IfaceKind, Mode};

/// A local interface: a TAP vnetd holds, or a netdev it attaches to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceDef {
    pub id: u32,
    pub name: String,
    pub kind: IfaceKind,
    pub dev: String,
    pub mac: Option<MacAddr>,
    pub mtu: Option<u32>,
    pub netns: Option<String>,
    pub mode: Mode,
    pub queues: u32,
    /// Pass checksum and segmentation offloads through (`virtio_net_hdr`).
    pub offload: bool,
    pub datapath: Datapath,
    /// Broadcast and multicast frames a second the VM may send (0: no limit).
    pub broadcast_limit: u32,
    /// The network (tenant) it belongs to (0 unless given).
    pub network: u32,
    /// Waiting for its VM to arrive (a live migration's destination):
    /// not routed to, not claimed, until the VM's first frame.
    pub standby: bool,
    /// The policy groups its MAC is in (`group G`).
    pub groups: Vec<String>,
    /// The IP addresses its VM owns (`addresses`).
    pub addresses: Vec<std::net::IpAddr>,
}

impl InterfaceDef {
    /// The interface `decl` (a [`Command::Interface`]) declares, as `id`.
    pub fn declared(id: u32, decl: &Command) -> Option<InterfaceDef> {
        let Command::Interface {
            name,
            kind,
            dev,
            mac,
            mtu,
            netns,
            mode,
            queues,
            offload,
            datapath,
            broadcast_limit,
            network,
            standby,
            groups,
            addresses,
        } = decl
        else {
            return None;
        };
        Some(InterfaceDef {
            id,
            name: name.clone(),
            kind: *kind,
            dev: dev.clone(),
            mac: *mac,
            mtu: *mtu,
            netns: netns.clone(),
            mode: *mode,
            queues: *queues,
            offload: *offload,
            datapath: *datapath,
            broadcast_limit: *broadcast_limit,
            network: *network,
            standby: *standby,
            groups: groups.clone(),
            addresses: addresses.clone(),
        })
    }
}

impl InterfaceDef {
    /// The line that declares it (as `show config` writes it).
    pub fn to_line(&self) -> String {
        iface_line(self)
    }
}

/// A link to another host, of one of the kinds of [`Transport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkDef {
    pub id: u32,
    pub name: String,
    pub transport: Transport,
    /// The underlay MTU on the way to the peer.
    pub mtu: u32,
}

impl LinkDef {
    /// The network (tenant) it carries: a `udp` link's `network` (its
    /// `vnet` header's id); 0 for every other kind.
    pub fn network(&self) -> u32 {
        match self.transport {
            Transport::Udp { network, .. } => network,
            _ => 0,
        }
    }

    /// The peer's underlay address (none for a `direct` link).
    pub fn remote(&self) -> Option<SocketAddr> {
        self.transport.remote()
    }

    /// Which receiving socket the peer is heard on, and how the link is
    /// told apart there ([`Transport::rx_key`]).
    pub fn rx_key(&self) -> RxKey {
        self.transport.rx_key()
    }

    /// The line that declares it.
    pub fn to_line(&self) -> String {
        format!("link {} {} mtu {}", self.name, self.transport.words(), self.mtu)
    }
}

/// A route, resolved to port ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteDef {
    pub id: u32,
    pub src: MacSpec,
    pub dst: MacSpec,
    pub to: Port,
    pub from: SourceFilter,
}

/// Everything one vnetd is told to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The UDP address links are received on.
    pub listen: SocketAddr,
    /// How the link worker waits for datagrams.
    pub listen_mode: Mode,
    /// Where VXLAN datagrams are received (`listen vxlan`); when unset and a
    /// `vxlan` link exists, the `listen` address's IP and port 4789.
    pub listen_vxlan: Option<SocketAddr>,
    /// Where TCP and TLS links are accepted (`listen tcp`); when unset and a
    /// `tcp` link exists, the `listen` address (TCP port 9000 by default).
    pub listen_tcp: Option<SocketAddr>,
    /// The host's TLS identity and trust (`tls cert ... key ... ca ...`).
    pub tls: Option<TlsFiles>,
    /// Cluster mode's settings (a `cluster` line), taken at start.
    pub cluster: Option<crate::ClusterLine>,
    pub interfaces: BTreeMap<u32, InterfaceDef>,
    pub links: BTreeMap<u32, LinkDef>,
    pub routes: imbl::OrdMap<u32, RouteDef>,
    /// Addresses whose resolution is answered at the edge (`neigh`).
    pub neighbors: crate::neigh::Neighbors,
    /// Who may talk to whom inside each network (`policy`, `rule`, `group`).
    pub policies: crate::policy::Policies,
    next_interface: u32,
    next_link: u32,
    next_route: u32,
}

impl Default for State {
    fn default() -> Self {
        State {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT),
            listen_mode: Mode::default(),
            listen_vxlan: None,
            listen_tcp: None,
            tls: None,
            cluster: None,
            interfaces: BTreeMap::new(),
            links: BTreeMap::new(),
            routes: imbl::OrdMap::new(),
            neighbors: Default::default(),
            policies: Default::default(),
            next_interface: 0,
            next_link: 0,
            next_route: 0,
        }
    }
}

impl State {
    /// Applies `cmds` to a copy of `self` and returns it, or the first error
    /// (with `self` untouched). Commands that change nothing (`show`, ...)
    /// are errors here: a config file or transaction only declares.
    /// The id the next route added gets (ids only grow: the routes of ids
    /// from here on in a later state are the ones added since).
    pub fn next_route_id(&self) -> u32 {
        self.next_route
    }

    pub fn apply_all(&self, cmds: &[Located<Command>]) -> Result<State> {
        let mut next = self.clone();
        for c in cmds {
            next.apply(c)?;
        }
        next.check_relays(cmds)?;
        Ok(next)
    }

    /// Every link's `relay KEY` names the peer of another secured link of
    /// this host (the relay host, which the link reaches through that
    /// link's session): a key no link has would leave the link with no way
    /// through. Checked once a transaction is whole (the relay's link may
    /// come after), at the line that declared the relayed link, or at the
    /// transaction's last line when the relay's link was deleted.
    fn check_relays(&self, cmds: &[Located<Command>]) -> Result<()> {
        for l in self.links.values() {
            let Transport::Udp { relay: Some(k), .. } = l.transport else { continue };
            let key_of = |t: &Transport| match t {
                Transport::Udp { security, .. } => security.peer_key(),
                _ => None,
            };
            let has = self.links.values().any(|o| o.id != l.id && key_of(&o.transport) == Some(k));
            if has {
                continue;
            }
            let declared =
                cmds.iter().find(|c| matches!(&c.item, Command::Link { name: Some(n), .. } if *n == l.name));
            let pos = declared.or(cmds.last()).map_or_else(crate::Pos::default, |c| c.pos);
            return Err(Error::new(
                pos,
                "a `relay` key that another link of this host has as its `peer-key` (the relay host's link)",
                format!("`{k}` on link `{}`, which no other link has", l.name),
            ));
        }
        Ok(())
    }

    /// Applies one command in place. On error `self` is unchanged.
    pub fn apply(&mut self, c: &Located<Command>) -> Result<()> {
        let pos = c.pos;
        match &c.item {
            Command::Listen { addr, mode } => {
                self.listen = *addr;
                if let Some(m) = mode {
                    self.listen_mode = *m;
                }
            }
            Command::Interface { name, dev, mac, netns, network, .. } => {
                self.check_new_interface(pos, name, dev, netns, mac, *network)?;
                let id = self.next_interface;
                if let Some(def) = InterfaceDef::declared(id, &c.item) {
                    self.next_interface += 1;
                    self.interfaces.insert(id, def);
                }
            }
            Command::Link { name, transport, mtu } => self.add_link(pos, name, transport, *mtu)?,
            Command::ListenVxlan(addr) => self.listen_vxlan = Some(*addr),
            Command::ListenTcp(addr) => self.listen_tcp = Some(*addr),
            Command::Tls(files) => self.tls = Some(files.clone()),
            Command::Cluster(c) => self.cluster = Some((**c).clone()),
            Command::Route { src, dst, to, from } => self.add_route(pos, *src, *dst, to, from)?,
            Command::Neigh(n) => self.neighbors.add(pos, n)?,
            Command::DeleteNeigh(r) => self.neighbors.remove(r.pos, r.by.0, r.by.1)?,
            Command::Policy { network, verb } => self.policies.set_default(*network, *verb),
            Command::DeletePolicy(r) => self.policies.remove_default(r.pos, r.by)?,
            Command::Rule(r) => self.policies.add_rule(pos, r)?,
            Command::DeleteRule(r) => self.policies.remove_rule(r.pos, &r.by)?,
            Command::Group { name, mac } => self.policies.add_member(name, *mac),
            Command::DeleteGroup(r) => self.policies.remove_member(r.pos, &r.by.0, r.by.1)?,
            Command::DeleteRoute(r) => {
                if self.routes.remove(&r.by).is_none() {
                    return Err(Error::new(r.pos, "the id of an existing route", format!("`{}`", r.by)));
                }
            }
            Command::DeleteLink(r) => {
                let id = self.resolve_link(r)?;
                self.unused(Port::Link(id), r.pos)?;
                self.links.remove(&id);
            }
            Command::DeleteInterface(r) => {
                let id = self.resolve_iface(&Ref { pos: r.pos, by: IfaceRef::Name(r.by.clone()) })?;
                self.unused(Port::Interface(id), r.pos)?;
                self.interfaces.remove(&id);
            }
            Command::Activate(name) => {
                let id = self.resolve_iface(&Ref { pos, by: IfaceRef::Name(name.clone()) })?;
                if let Some(i) = self.interfaces.get_mut(&id) {
                    i.standby = false;
                }
            }
            // The rest: no declaration (`Command::class` is not `Change`; an
            // `activate`, a query on the control endpoint, is taken above
            // as the change it makes).
            _ => {
                return Err(Error::new(
                    pos,
                    "a declaration (interface, link, route, add, del, listen)",
                    "a control command",
                ));
            }
        }
        Ok(())
    }

    /// Checks that interface `name` on `dev` (in `netns`) with `mac` in
    /// `network` clashes with no declared one.
    fn check_new_interface(
        &self,
        pos: crate::Pos,
        name: &str,
        dev: &str,
        netns: &Option<String>,
        mac: &Option<MacAddr>,
        network: u32,
    ) -> Result<()> {
        if self.iface_by_name(name).is_some() {
            return Err(Error::new(pos, "a new interface name", format!("`{name}`, already declared")));
        }
        if self.interfaces.values().any(|i| i.dev == dev && &i.netns == netns) {
            return Err(Error::new(pos, "a device no other interface uses", format!("`{dev}`, in use")));
        }
        if let Some(m) = mac {
            if self.interfaces.values().any(|i| i.mac == Some(*m) && i.network == network) {
                return Err(Error::new(
                    pos,
                    "a MAC no other interface of its network has",
                    format!("`{m}`, in use in network {network}"),
                ));
            }
        }
        Ok(())
    }

    /// `link`: a new link, refused when its name is taken or a link
    /// already reaches its peer.
    fn add_link(
        &mut self,
        pos: crate::Pos,
        name: &Option<String>,
        transport: &Transport,
        mtu: u32,
    ) -> Result<()> {
        let id = self.next_link;
        let name = name.clone().unwrap_or_else(|| format!("link{id}"));
        if self.links.values().any(|l| l.name == name) {
            return Err(Error::new(pos, "a new link name", format!("`{name}`, already declared")));
        }
        let def = LinkDef { id, name, transport: *transport, mtu };
        // Two links that arriving datagrams cannot tell apart would
        // make the receiver guess (and the kernel path guess otherwise).
        if let Some(other) = self.links.values().find(|l| l.rx_key() == def.rx_key()) {
            return Err(Error::new(
                pos,
                "a peer no other link of this kind reaches (one `udp` link per peer address, \
                 one `vxlan` link per peer address and VNI)",
                format!("`{}`, already reached by link `{}`", def.transport.peer(), other.name),
            ));
        }
        self.next_link += 1;
        self.links.insert(id, def);
        Ok(())
    }

    /// `route`: its target and `from` resolved, both in one network.
    fn add_route(
        &mut self,
        pos: crate::Pos,
        src: MacSpec,
        dst: MacSpec,
        to: &Target,
        from: &From,
    ) -> Result<()> {
        let to = match to {
            Target::Link(r) => Port::Link(self.resolve_link(r)?),
            Target::Interface(r) => Port::Interface(self.resolve_iface(r)?),
        };
        let from = match from {
            From::Any => SourceFilter::Any,
            From::Link(r) => SourceFilter::Port(Port::Link(self.resolve_link(r)?)),
            From::Interface(r) => SourceFilter::Port(Port::Interface(self.resolve_iface(r)?)),
        };
        if let SourceFilter::Port(p) = from {
            let (a, b) = (self.port_network(p), self.port_network(to));
            if a != b {
                return Err(Error::new(
                    pos,
                    "a `from` port of the target's network (frames never cross networks)",
                    format!("`from` in network {a}, the target in network {b}"),
                ));
            }
        }
        let id = self.next_route;
        self.next_route += 1;
        self.routes.insert(id, RouteDef { id, src, dst, to, from });
        Ok(())
    }

    fn unused(&self, port: Port, pos: crate::Pos) -> Result<()> {
        let users: Vec<String> = self
            .routes
            .values()
            .filter(|r| r.to == port || r.from == SourceFilter::Port(port))
            .map(|r| r.id.to_string())
            .collect();
        if users.is_empty() {
            Ok(())
        } else {
            Err(Error::new(
                pos,
                "something no route uses (delete its routes first)",
                format!("one used by route(s) {}", users.join(", ")),
            ))
        }
    }

    pub fn iface_by_name(&self, name: &str) -> Option<&InterfaceDef> {
        self.interfaces.values().find(|i| i.name == name)
    }

    pub fn link_by_name(&self, name: &str) -> Option<&LinkDef> {
        self.links.values().find(|l| l.name == name)
    }

    fn resolve_link(&self, r: &Ref<LinkRef>) -> Result<u32> {
        let hit = match &r.by {
            LinkRef::Name(n) => self.link_by_name(n),
            LinkRef::Ip(ip) => self.links.values().find(|l| l.remote().is_some_and(|r| r.ip() == *ip)),
            LinkRef::Id(id) => self.links.get(id),
        };
        hit.map(|l| l.id).ok_or_else(|| {
            let what = match &r.by {
                LinkRef::Name(n) => format!("`{n}`"),
                LinkRef::Ip(ip) => format!("`{ip}`"),
                LinkRef::Id(id) => format!("`{id}`"),
            };
            Error::new(
                r.pos,
                "a declared link (name, remote IP or index)",
                format!("{what}, which is not one"),
            )
        })
    }

    /// The network (tenant) of a port.
    pub fn port_network(&self, p: Port) -> u32 {
        match p {
            Port::Interface(id) => self.interfaces.get(&id).map_or(0, |i| i.network),
            Port::Link(id) => self.links.get(&id).map_or(0, LinkDef::network),
        }
    }

    fn resolve_iface(&self, r: &Ref<IfaceRef>) -> Result<u32> {
        let hit = match &r.by {
            IfaceRef::Name(n) => self.iface_by_name(n),
            IfaceRef::Mac(m) => {
                let mut with = self.interfaces.values().filter(|i| i.mac == Some(*m));
                let first = with.next();
                if first.is_some() && with.next().is_some() {
                    return Err(Error::new(
                        r.pos,
                        "an interface by name (interfaces of two networks have this MAC)",
                        format!("`{m}`"),
                    ));
                }
                first
            }
        };
        hit.map(|i| i.id).ok_or_else(|| {
            let what = match &r.by {
                IfaceRef::Name(n) => format!("`{n}`"),
                IfaceRef::Mac(m) => format!("`{m}`"),
            };
            Error::new(
                r.pos,
                "a declared interface (name, or the MAC given in its `mac` option)",
                format!("{what}, which is not one"),
            )
        })
    }

    /// The name of a port, for display.
    pub fn port_name(&self, p: Port) -> String {
        match p {
            Port::Interface(i) => {
                self.interfaces.get(&i).map_or(format!("interface#{i}"), |d| d.name.clone())
            }
            Port::Link(i) => self.links.get(&i).map_or(format!("link#{i}"), |d| d.name.clone()),
        }
    }

    /// The state as superset lines that rebuild it (ids may differ).
    pub fn to_config(&self) -> String {
        self.to_config_without(&|_| false)
    }

    /// [`State::to_config`] without the links `skip` names and the routes
    /// that use them (what cluster mode derives from the store, say).
    pub fn to_config_without(&self, skip: &dyn Fn(&str) -> bool) -> String {
        let mut s = self.header();
        for i in self.interfaces.values() {
            let _ = writeln!(s, "{}", iface_line(i));
        }
        for l in self.links.values().filter(|l| !skip(&l.name)) {
            let _ = writeln!(s, "{}", l.to_line());
        }
        for r in self.routes.values().filter(|r| !self.uses_link(r, skip)) {
            let _ = writeln!(s, "{}", self.route_line(r));
        }
        for n in self.neighbors.lines() {
            let _ = writeln!(s, "{n}");
        }
        for p in self.policies.lines() {
            let _ = writeln!(s, "{p}");
        }
        s
    }

    /// Whether route `r` goes to or comes from a link `pick` names.
    fn uses_link(&self, r: &RouteDef, pick: &dyn Fn(&str) -> bool) -> bool {
        let from = match r.from {
            SourceFilter::Port(p) => Some(p),
            SourceFilter::Any => None,
        };
        [Some(r.to), from].into_iter().flatten().any(|p| match p {
            Port::Link(id) => self.links.get(&id).is_some_and(|l| pick(&l.name)),
            Port::Interface(_) => false,
        })
    }

    /// A route as a line, its ports by name.
    pub fn route_line(&self, r: &RouteDef) -> String {
        let kind = |p: Port| if p.is_link() { "link" } else { "interface" };
        let mut s = format!("route {} {} -> {} {}", r.src, r.dst, kind(r.to), self.port_name(r.to));
        if let SourceFilter::Port(p) = r.from {
            let _ = write!(s, " from {} {}", kind(p), self.port_name(p));
        }
        s
    }

    /// The transaction that turns this state into `to` and changes nothing
    /// else: objects are matched by name (routes by their line), so what
    /// both have keeps its id and its resources; what differs is deleted
    /// and declared again (with the routes that use it); what only `to`
    /// has is declared. Links `keep` names are left alone when `to` does
    /// not declare them (what cluster mode derives from the store), and so
    /// are the routes that use them. Lines: route deletions, link and
    /// interface deletions, `listen`/`tls` lines if they differ, then
    /// interfaces, links and routes to add. Empty when nothing differs.
    pub fn diff(&self, to: &State, keep: &dyn Fn(&str) -> bool) -> String {
        use std::collections::{BTreeMap, BTreeSet};
        let want_if: BTreeMap<&str, String> =
            to.interfaces.values().map(|i| (i.name.as_str(), iface_line(i))).collect();
        let want_link: BTreeMap<&str, String> =
            to.links.values().map(|l| (l.name.as_str(), l.to_line())).collect();
        // Interfaces and links to delete (gone, or declared otherwise).
        let mut del_if = BTreeSet::new();
        for i in self.interfaces.values() {
            if want_if.get(i.name.as_str()) != Some(&iface_line(i)) {
                del_if.insert(i.id);
            }
        }
        let mut del_link = BTreeSet::new();
        for l in self.links.values() {
            match want_link.get(l.name.as_str()) {
                Some(line) if *line == l.to_line() => {}
                None if keep(&l.name) => {}
                _ => {
                    del_link.insert(l.id);
                }
            }
        }
        let doomed = |p: Port| match p {
            Port::Interface(id) => del_if.contains(&id),
            Port::Link(id) => del_link.contains(&id),
        };
        // Routes: kept when `to` has the same line (counted, for duplicates)
        // and neither port goes; kept as the cluster's when they use a kept link.
        let mut wanted: BTreeMap<String, usize> = BTreeMap::new();
        for r in to.routes.values() {
            *wanted.entry(to.route_line(r)).or_default() += 1;
        }
        let mut t = String::new();
        for r in self.routes.values() {
            let from = match r.from {
                SourceFilter::Port(p) => doomed(p),
                SourceFilter::Any => false,
            };
            let line = self.route_line(r);
            let stays = !doomed(r.to) && !from;
            let cluster = self.uses_link(r, &|n| keep(n) && !want_link.contains_key(n));
            match wanted.get_mut(&line) {
                Some(n) if *n > 0 && stays => *n -= 1,
                _ if stays && cluster => {}
                _ => {
                    let _ = writeln!(t, "delete route {}", r.id);
                }
            }
        }
        for id in &del_link {
            let _ = writeln!(t, "delete link {}", self.links[id].name);
        }
        for id in &del_if {
            let _ = writeln!(t, "delete interface {}", self.interfaces[id].name);
        }
        if self.header() != to.header() {
            t.push_str(&to.header());
        }
        for i in to.interfaces.values() {
            let have = self.iface_by_name(&i.name).is_some_and(|h| !del_if.contains(&h.id));
            if !have {
                let _ = writeln!(t, "{}", iface_line(i));
            }
        }
        for l in to.links.values() {
            let have = self.link_by_name(&l.name).is_some_and(|h| !del_link.contains(&h.id));
            if !have {
                let _ = writeln!(t, "{}", l.to_line());
            }
        }
        for r in to.routes.values() {
            let line = to.route_line(r);
            if let Some(n) = wanted.get_mut(&line) {
                if *n > 0 {
                    *n -= 1;
                    let _ = writeln!(t, "{line}");
                }
            }
        }
        t.push_str(&self.neighbors.diff(&to.neighbors));
        t.push_str(&self.policies.diff(&to.policies));
        t
    }

    /// The `listen`, `tls` and `cluster` lines.
    fn header(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "listen udp {} mode {}", self.listen, self.listen_mode.word());
        if let Some(v) = self.listen_vxlan {
            let _ = writeln!(s, "listen vxlan {v}");
        }
        if let Some(v) = self.listen_tcp {
            let _ = writeln!(s, "listen tcp {v}");
        }
        if let Some(t) = &self.tls {
            let _ = writeln!(s, "tls cert {} key {} ca {}", t.cert, t.key, t.ca);
        }
        if let Some(c) = &self.cluster {
            let _ = writeln!(s, "{}", c.to_line());
        }
        s
    }
}

/// An interface declaration as a line.
fn iface_line(i: &InterfaceDef) -> String {
    let mut s = format!("interface {} {} {}", i.name, i.kind.word(), i.dev);
    if let Some(m) = i.mac {
        let _ = write!(s, " mac {m}");
    }
    if let Some(m) = i.mtu {
        let _ = write!(s, " mtu {m}");
    }
    if let Some(n) = &i.netns {
        let _ = write!(s, " netns {n}");
    }
    let _ = write!(s, " mode {} queues {}", i.mode.word(), i.queues);
    if !i.offload {
        s.push_str(" offload off");
    }
    if i.datapath != Datapath::Auto {
        let _ = write!(s, " datapath {}", i.datapath.word());
    }
    if i.broadcast_limit != crate::DEFAULT_BROADCAST_LIMIT {
        let _ = write!(s, " broadcast-limit {}", i.broadcast_limit);
    }
    if i.network != 0 {
        let _ = write!(s, " network {}", i.network);
    }
    for g in &i.groups {
        s.push_str(" group ");
        s.push_str(g);
    }
    for (k, a) in i.addresses.iter().enumerate() {
        let _ = write!(s, "{}{a}", if k == 0 { " addresses " } else { "," });
    }
    if i.standby {
        s.push_str(" standby");
    }

    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;

    fn load(text: &str) -> Result<State> {
        State::default().apply_all(&parse(text)?)
    }

    const BASE: &str = "\
interface vm0 tap vt0 mac 52:54:00:00:00:01
link hostb udp 10.0.0.2 format vnet
route any ff:ff:ff:ff:ff:ff -> link hostb
route any 52:54:00:00:00:02 -> link 10.0.0.2
route any 52:54:00:00:00:01 -> interface vm0
";

    /// `state` after `diff`'s transaction, and that transaction.
    fn via_diff(state: &State, to: &State, keep: &dyn Fn(&str) -> bool) -> (State, String) {
        let t = state.diff(to, keep);
        let next = state
            .apply_all(&parse(&t).unwrap_or_else(|e| panic!("{e}\n{t}")))
            .unwrap_or_else(|e| panic!("{e}\n{t}"));
        (next, t)
    }

    fn lines(s: &str) -> Vec<String> {
        let mut v: Vec<String> = s.lines().map(str::to_string).collect();
        v.sort();
        v
    }

    #[test]
    fn a_reload_changes_only_what_differs_and_keeps_the_rest_with_its_ids() {
        let base = format!("listen udp 127.0.0.1:0\n{BASE}");
        let cur = load(&base).unwrap();
        assert_eq!(cur.diff(&cur, &|_| false), "", "nothing differs");
        // One route gone from the file: one deletion.
        let fewer = load(&base.replace("route any 52:54:00:00:00:02 -> link 10.0.0.2\n", "")).unwrap();
        let (next, t) = via_diff(&cur, &fewer, &|_| false);
        assert_eq!(t, "delete route 1\n");
        assert_eq!(next.interfaces[&0], cur.interfaces[&0], "the interface keeps its id");
        // An interface declared otherwise: it and its route are made anew, nothing else.
        let mtu = load(&base.replace("mac 52:54:00:00:00:01", "mac 52:54:00:00:00:01 mtu 9000")).unwrap();
        let (next, t) = via_diff(&cur, &mtu, &|_| false);
        assert_eq!(t.lines().count(), 4, "{t}");
        assert!(t.starts_with("delete route 2\ndelete interface vm0\n"), "{t}");
        assert_eq!(lines(&next.to_config()), lines(&mtu.to_config()));
        assert_eq!(next.links, cur.links, "the link is untouched");
        // A link the file does not have, kept (cluster mode's), with its route.
        let extra =
            load(&format!("{base}link h9 udp 10.0.0.9\nroute any 52:54:00:00:00:09 -> link h9\n")).unwrap();
        let (next, t) = via_diff(&extra, &cur, &|n| n == "h9");
        assert_eq!(t, "", "{t}");
        assert_eq!(next.to_config_without(&|n| n == "h9"), cur.to_config());
        let (next, _) = via_diff(&extra, &cur, &|_| false);
        assert_eq!(lines(&next.to_config()), lines(&cur.to_config()), "not kept: gone");
        // Anything to anything: the result reads as the target.
        let other =
            load("listen udp 127.0.0.1:7\ninterface vm1 tap vt1\nroute any any -> interface vm1\n").unwrap();
        let (next, _) = via_diff(&cur, &other, &|_| false);
        assert_eq!(lines(&next.to_config()), lines(&other.to_config()));
        let (back, _) = via_diff(&next, &cur, &|_| false);
        assert_eq!(lines(&back.to_config()), lines(&cur.to_config()));
    }

    /// A config of a small vocabulary: the listen line, interfaces vm0-2,
    /// links h1-3 (each maybe declared otherwise), routes between them
    /// (repeats included).
    fn config() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let iface = (any::<bool>(), any::<bool>());
        let link = (any::<bool>(), any::<bool>());
        // Few kinds of route, so that a config often repeats one.
        let route = (0usize..2, 0usize..2, 0usize..2);
        (
            any::<bool>(),
            proptest::collection::vec(iface, 3),
            proptest::collection::vec(link, 3),
            proptest::collection::vec(route, 0..8),
        )
            .prop_map(|(port, ifaces, links, routes)| {
                let mut t = format!("listen udp 127.0.0.1:{}\n", if port { 9000 } else { 9001 });
                let mut ports = Vec::new();
                for (n, &(on, mtu)) in ifaces.iter().enumerate() {
                    if on {
                        let mtu = if mtu { " mtu 9000" } else { "" };
                        t += &format!("interface vm{n} tap vt{n} mac 52:54:00:00:00:0{n}{mtu}\n");
                        ports.push(format!("interface vm{n}"));
                    }
                }
                for (n, &(on, vnet)) in links.iter().enumerate() {
                    if on {
                        let f = if vnet { " format vnet" } else { "" };
                        t += &format!("link h{n} udp 10.0.0.{}{f}\n", n + 2);
                        ports.push(format!("link h{n}"));
                    }
                }
                for (src, dst, to) in routes {
                    if ports.is_empty() {
                        break;
                    }
                    let src = ["any", "52:54:00:00:00:09"][src];
                    let dst = ["any", "ff:ff:ff:ff:ff:ff"][dst];
                    t += &format!("route {src} {dst} -> {}\n", ports[to % ports.len()]);
                }
                t
            })
    }

    proptest::proptest! {
        /// `diff` takes any state to any other: the result reads as the
        /// target, nothing differs after, and between two states that
        /// differ only in routes it deletes and adds exactly the routes
        /// that differ (as many of each line as differ).
        #[test]
        fn a_diff_takes_any_state_to_any_other_and_only_what_differs(a in config(), b in config()) {
            let (sa, sb) = (load(&a).unwrap(), load(&b).unwrap());
            let (next, t) = via_diff(&sa, &sb, &|_| false);
            proptest::prop_assert_eq!(lines(&next.to_config()), lines(&sb.to_config()), "{}", t);
            proptest::prop_assert_eq!(next.diff(&sb, &|_| false), "");
            proptest::prop_assert_eq!(next.listen, sb.listen, "{}", t);
            // Same interfaces, links and listen line; b's routes.
            let body = |c: &str| c.lines().filter(|l| !l.starts_with("route ")).collect::<Vec<_>>().join("\n");
            let routes = |c: &str| c.lines().filter(|l| l.starts_with("route ")).map(str::to_string).collect::<Vec<_>>();
            // b's routes to the ports a has.
            let declared = |r: &String| {
                r.split_once("-> ").is_some_and(|(_, to)| body(&a).lines().any(|l| l.starts_with(&format!("{to} "))))
            };
            let b_routes: Vec<String> = routes(&b).into_iter().filter(declared).collect();
            let b2 = format!("{}\n{}\n", body(&a), b_routes.join("\n"));
            let sb2 = load(&b2).unwrap();
            let (_, t) = via_diff(&sa, &sb2, &|_| false);
            let mut left = b_routes;
            let mut deleted = 0;
            for r in routes(&a) {
                match left.iter().position(|l| *l == r) {
                    Some(i) => { left.remove(i); }
                    None => deleted += 1,
                }
            }
            proptest::prop_assert_eq!(t.lines().filter(|l| l.starts_with("delete route ")).count(), deleted, "{}", t);
            proptest::prop_assert_eq!(t.lines().filter(|l| l.starts_with("route ")).count(), left.len(), "{}", t);
            proptest::prop_assert_eq!(t.lines().count(), deleted + left.len(), "{}", t);
        }
    }

    #[test]
    fn a_route_declared_twice_is_kept_once_when_the_target_has_it_once() {
        let two =
            load("interface vm0 tap vt0\nroute any any -> interface vm0\nroute any any -> interface vm0\n")
                .unwrap();
        let one = load("interface vm0 tap vt0\nroute any any -> interface vm0\n").unwrap();
        let (next, t) = via_diff(&two, &one, &|_| false);
        assert_eq!(t, "delete route 1\n");
        assert_eq!(next.routes.len(), 1);
        let (next, t) = via_diff(&one, &two, &|_| false);
        assert_eq!(t, "route any any -> interface vm0\n");
        assert_eq!(next.routes.len(), 2);
        // A link the file declares is the file's, even under a name cluster
        // mode keeps: a route to it the file lacks goes.
        let with = load("link h1 udp 10.0.0.2\nroute any any -> link h1\n").unwrap();
        let without = load("link h1 udp 10.0.0.2\n").unwrap();
        let (next, t) = via_diff(&with, &without, &|n| n == "h1");
        assert_eq!((t.as_str(), next.routes.len()), ("delete route 0\n", 0));
    }

    #[test]
    fn a_states_small_answers_are_its_own() {
        let s = load("interface vm0 tap vt0 mac 52:54:00:00:00:01 network 7\nlink a udp 10.0.0.2 format vnet network 3\nlink x vxlan 10.0.0.4 vni 42\nroute any any -> link a\n").unwrap();
        let (vm0, a, x) =
            (s.iface_by_name("vm0").unwrap(), s.link_by_name("a").unwrap(), s.link_by_name("x").unwrap());
        assert_eq!(
            vm0.to_line(),
            "interface vm0 tap vt0 mac 52:54:00:00:00:01 mode adaptive queues 1 network 7"
        );
        assert_eq!((a.network(), x.network()), (3, 0));
        assert_eq!((s.port_network(Port::Interface(vm0.id)), s.port_network(Port::Link(a.id))), (7, 3));
        assert_eq!(s.port_network(Port::Link(x.id)), 0);
        assert_eq!(s.next_route_id(), 1);
        let s = s
            .apply_all(&parse("route any ff:ff:ff:ff:ff:ff -> interface vm0\ndelete route 0").unwrap())
            .unwrap();
        assert_eq!(s.next_route_id(), 2, "ids only grow");
        // A device is in use in its own namespace only; a MAC in its own network only.
        let t = |extra: &str| s.apply_all(&parse(extra).unwrap());
        assert!(t("interface vm1 tap vt0").is_err());
        assert!(t("interface vm1 tap vt0 netns other").is_ok());
        assert!(t("interface vm1 tap vt1 mac 52:54:00:00:00:01 network 7").is_err());
        assert!(t("interface vm1 tap vt1 mac 52:54:00:00:00:01").is_ok());
    }

    #[test]
    fn builds_state() {
        let s = load(BASE).unwrap();
        assert_eq!(s.interfaces.len(), 1);
        assert_eq!(s.links[&0].remote(), Some("10.0.0.2:9000".parse().unwrap()));
        assert_eq!(s.routes[&1].to, Port::Link(0));
        assert_eq!(s.routes[&2].to, Port::Interface(0));
    }

    #[test]
    fn palacios_lines_resolve_by_ip_and_mac() {
        let s = load(
            "interface vm0 tap vt0 mac 52:54:00:00:00:01\n\
             add 10.0.0.2 9000 udp\n\
             add any ff:ff:ff:ff:ff:ff edge 10.0.0.2 any\n\
             add any 52:54:00:00:00:01 interface 52:54:00:00:00:01 edge 10.0.0.2\n",
        )
        .unwrap();
        assert_eq!(s.links[&0].name, "link0");
        assert_eq!(s.routes[&1].from, SourceFilter::Port(Port::Link(0)));
        assert_eq!(s.routes[&1].to, Port::Interface(0));
    }

    #[test]
    fn errors_point_at_the_reference() {
        let e = load("route any any -> link nowhere").unwrap_err();
        assert_eq!((e.pos.line, e.pos.column), (1, 23));
        let e = load("add any any edge 10.9.9.9 any").unwrap_err();
        assert_eq!(e.pos.column, 18);
        let e = load("interface a tap t0\ninterface a tap t1").unwrap_err();
        assert_eq!(e.pos.line, 2);
        let e = load(&format!("{BASE}delete link hostb")).unwrap_err();
        assert!(e.found.contains("route(s) 0, 1"), "{e}");
        let e = load(&format!("{BASE}delete route 9")).unwrap_err();
        assert_eq!((e.pos.line, e.pos.column), (6, 14));
    }

    #[test]
    fn apply_all_is_atomic() {
        let s = load(BASE).unwrap();
        let bad = parse("route any 52:54:00:00:00:09 -> link hostb\nroute any any -> link ghost").unwrap();
        // Line 1 alone applies; with line 2 the batch fails at line 2 and
        // says why. (That nothing of line 1 survives is the signature's:
        // `apply_all` takes `&self` and returns no state on error.)
        assert_eq!(s.apply_all(&bad[..1]).unwrap().routes.len(), 4);
        let e = s.apply_all(&bad).unwrap_err();
        assert_eq!((e.pos.line, e.pos.column), (2, 23), "{e}");
        assert!(e.to_string().contains("ghost"), "{e}");
        // A batch's commands see the ones before them, in order: a link
        // and a route to it apply together, the other way round they fail
        // at the route.
        let ok = parse("link c udp 10.0.0.3\nroute any any -> link c").unwrap();
        let t = s.apply_all(&ok).unwrap();
        assert_eq!((t.links.len(), t.routes.len()), (2, 4));
        let reversed: Vec<_> = ok.iter().rev().cloned().collect();
        assert_eq!(s.apply_all(&reversed).unwrap_err().pos.line, 2);
        // In place, a failing command leaves the state as it was, even when
        // it fails after resolving part of itself (here: its target).
        let mut t = s.clone();
        t.apply(&bad[0]).unwrap();
        let before = t.clone();
        for line in ["route any any -> link ghost", "delete interface vm0", "link x udp 10.0.0.2"] {
            let c = &parse(line).unwrap()[0];
            assert!(t.apply(c).is_err(), "{line}");
            assert_eq!(t, before, "{line} left a trace");
        }
    }

    #[test]
    fn delete_then_readd() {
        let s = load(BASE).unwrap();
        let s = s.apply_all(&parse("[routes]\ndel 0\ndel 1\n").unwrap()).unwrap();
        let s = s.apply_all(&parse("delete link hostb").unwrap()).unwrap();
        assert!(s.links.is_empty());
        // Ids are never reused.
        let s = s.apply_all(&parse("link c udp 10.0.0.3\nroute any any -> link c").unwrap()).unwrap();
        assert_eq!(s.links.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.routes.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn links_a_receiver_could_not_tell_apart_are_refused() {
        let e = load("link a udp 10.0.0.2\nlink b udp 10.0.0.2:9001 format vnet").unwrap_err();
        assert_eq!(e.pos.line, 2);
        assert!(e.found.contains("already reached by link `a`"), "{e}");
        // VXLAN links to one VTEP differ by VNI; a udp link beside them is another socket.
        let s =
            load("link a vxlan 10.0.0.2 vni 1\nlink b vxlan 10.0.0.2 vni 2\nlink c udp 10.0.0.2").unwrap();
        assert_eq!(s.links.len(), 3);
        assert!(load("link a vxlan 10.0.0.2 vni 1\nlink b vxlan 10.0.0.2:8472 vni 1").is_err());
    }

    #[test]
    fn a_relay_key_must_be_another_secured_links_peer() {
        // Issue 45: `relay KEY` naming no peer was taken silently.
        // Config text as a person writes it (what the parser reads): keys
        // of 32 bytes of 1 and of 2.
        const RELAYED: &str = "link far udp 10.0.0.2 peer-key AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE= \
                               nat relay AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";
        const RELAY: &str = "link r udp 10.0.0.3 peer-key AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";
        let e = load(&["listen udp 10.0.0.1:9000", RELAYED].join("\n")).unwrap_err();
        assert_eq!(e.pos.line, 2, "{e}");
        assert!(e.found.contains("no other link has"), "{e}");
        // Another link, secured with another key, is not the relay either.
        let other = "link o udp 10.0.0.4 peer-key AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM=";
        let e = load(&[RELAYED, other].join("\n")).unwrap_err();
        assert!(e.found.contains("no other link has"), "{e}");
        // The relay's link after it, in the same transaction: taken.
        let s = load(&[RELAYED, RELAY].join("\n")).unwrap();
        // Deleting the relay's link alone leaves the relayed link stranded: refused.
        assert!(s.apply_all(&parse("delete link r").unwrap()).is_err());
        assert!(s.apply_all(&parse("delete link far\ndelete link r").unwrap()).is_ok());
    }

    #[test]
    fn config_roundtrip() {
        let s =
            load(&format!("{BASE}listen vxlan 0.0.0.0:8472\nlink v vxlan 10.0.0.3:8472 vni 42 mtu 9000\n"))
                .unwrap();
        let again = load(&s.to_config()).unwrap();
        assert_eq!(again.to_config(), s.to_config());
    }
}
