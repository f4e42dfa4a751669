//! From text to [`Command`]s.

use crate::ast::IpamOp;
use crate::ast::{
    Cipher, Command, Datapath, Format, From, IfaceKind, IfaceRef, LinkRef, Located, Mode, Ref, Security,
    ShowWhat, Target, TlsFiles, Transport,
};
use crate::cursor::Parser;
use crate::lex::{found, words};
use crate::transport::check_remote;
use crate::{Error, Pos, Result};
use std::net::{IpAddr, SocketAddr};
use vnet_wire::MacAddr;

mod policy;
mod trace;

pub use crate::ast::{DEFAULT_BROADCAST_LIMIT, MAX_IFACE_ADDRESSES, MAX_IFACE_GROUPS};

pub use crate::transport::{DEFAULT_LINK_MTU, DEFAULT_PORT};

/// Which Palacios `/proc/vnet` file bare `del N` lines refer to: set by a
/// `[routes]` or `[links]` header line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Section {
    #[default]
    None,
    Routes,
    Links,
}

/// Parses a whole text (a config file or a transaction). Stops at the first
/// error.
pub fn parse(text: &str) -> Result<Vec<Located<Command>>> {
    let mut section = Section::None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(c) = parse_line(line, i as u32 + 1, &mut section)? {
            out.push(c);
        }
    }
    Ok(out)
}

/// Parses one line. `Ok(None)` for blank lines, comments and section headers.
pub fn parse_line(line: &str, line_no: u32, section: &mut Section) -> Result<Option<Located<Command>>> {
    let toks = words(line, line_no)?;
    let Some(first) = toks.first() else {
        return Ok(None);
    };
    match first.text {
        "[routes]" | "[links]" => {
            if let Some(t) = toks.get(1) {
                return Err(Error::new(t.pos, "end of line after a section header", found(Some(t))));
            }
            *section = if first.text == "[routes]" { Section::Routes } else { Section::Links };
            return Ok(None);
        }
        _ => {}
    }
    let mut p = Parser::new(&toks, Pos { line: line_no, column: line.chars().count() as u32 + 1 });
    let cmd = p.command(*section)?;
    p.end()?;
    Ok(Some(Located { pos: first.pos, item: cmd }))
}

const COMMANDS: &str =
    "a command (`add`, `del`, `interface`, `link`, `route`, `neigh`, `policy`, `rule`, `group`, `delete`, `listen`, `tls`, `cluster`, `show`, `trace`, `announce`, `save`, `reload`, `attach`, `detach`, `activate`, `ipam`, `pod-labels`, `begin`, `commit`, `abort`)";

impl<'a> Parser<'_, 'a> {
    fn link_ref(&mut self) -> Result<Ref<LinkRef>> {
        let pos = self.pos();
        if let Some(ip) = self.peek().and_then(|t| t.text.parse::<IpAddr>().ok()) {
            self.at += 1;
            return Ok(Ref { pos, by: LinkRef::Ip(ip) });
        }
        let name = self.name("a link name or IP address")?;
        Ok(Ref { pos, by: LinkRef::Name(name) })
    }

    fn iface_ref(&mut self) -> Result<Ref<IfaceRef>> {
        let pos = self.pos();
        if let Some(mac) = self.peek().and_then(|t| t.text.parse::<MacAddr>().ok()) {
            self.at += 1;
            return Ok(Ref { pos, by: IfaceRef::Mac(mac) });
        }
        let name = self.name("an interface name or MAC address")?;
        Ok(Ref { pos, by: IfaceRef::Name(name) })
    }

    fn command(&mut self, section: Section) -> Result<Command> {
        let kw = self.keyword(
            &[
                "add",
                "del",
                "interface",
                "link",
                "route",
                "neigh",
                "policy",
                "rule",
                "group",
                "delete",
                "listen",
                "tls",
                "cluster",
                "show",
                "trace",
                "announce",
                "save",
                "reload",
                "attach",
                "detach",
                "activate",
                "ipam",
                "pod-labels",
                "begin",
                "commit",
                "abort",
            ],
            COMMANDS,
        )?;
        match kw {
            "add" => self.palacios_add(),
            "del" | "delete" => self.delete(section, kw == "del"),
            "interface" => self.interface(),
            "link" => self.link(),
            "route" => self.route(),
            "neigh" => {
                let pos = self.pos();
                let ip = crate::neigh::check_ip(pos, self.parsed("an IP address")?)?;
                let pos = self.pos();
                let mac = crate::neigh::check_mac(pos, self.mac("a MAC address")?)?;
                let network = self.trailing_network()?;
                Ok(Command::Neigh(crate::neigh::Neigh { ip, mac, network }))
            }
            "policy" | "rule" | "group" => self.policy_line(kw),
            "listen" => match self.keyword(&["udp", "vxlan", "tcp"], "`udp`, `vxlan` or `tcp`")? {
                "udp" => {
                    let addr: SocketAddr =
                        self.parsed("an address and port like 0.0.0.0:9000 or [::]:9000")?;
                    let mode = if self.eat("mode") { Some(self.mode()?) } else { None };
                    Ok(Command::Listen { addr, mode })
                }
                "vxlan" => Ok(Command::ListenVxlan(
                    self.parsed("an address and port like 0.0.0.0:4789 or [::]:4789")?,
                )),
                _ => {
                    Ok(Command::ListenTcp(self.parsed("an address and port like 0.0.0.0:9000 or [::]:9000")?))
                }
            },
            "tls" => self.tls(),
            "cluster" => self.cluster(),
            "show" => self.show(),
            "trace" => self.trace(),
            "announce" => Ok(Command::Announce(self.mac("a MAC address to announce")?)),
            "save" => Ok(Command::Save),
            "reload" => Ok(Command::Reload),
            "attach" => Ok(Command::Attach(Box::new(self.interface()?))),
            "detach" => Ok(Command::Detach(self.name("an interface name")?)),
            "activate" => Ok(Command::Activate(self.name("an interface name")?)),
            "ipam" => self.ipam(),
            "pod-labels" => {
                let pos = self.pos();
                let t = self.next("a pod as NAMESPACE/NAME")?;
                if crate::ast::is_pod_ref(t.text) {
                    Ok(Command::PodLabels(t.text.to_string()))
                } else {
                    Err(Error::new(pos, crate::ast::POD_EXPECTED, found(Some(&t))))
                }
            }
            "begin" => Ok(Command::Begin),
            "commit" => Ok(Command::Commit),
            _ => Ok(Command::Abort),
        }
    }

    /// `show WHAT [json]` after its keyword.
    fn show(&mut self) -> Result<Command> {
        if self.eat("drops") {
            return self.drops();
        }
        if self.eat("flows") {
            return self.flows();
        }
        let what = match self.keyword(
            &[
                "routes",
                "links",
                "interfaces",
                "stats",
                "global",
                "config",
                "metrics",
                "cluster",
                "matrix",
                "policy",
            ],
            "`routes`, `links`, `interfaces`, `stats`, `global`, `config`, `metrics`, `cluster`, `matrix`, `policy`, `drops` or `flows`",
        )? {
            "policy" => ShowWhat::Policy,
            "matrix" => ShowWhat::Matrix,
            "global" => ShowWhat::Global,
            "routes" => ShowWhat::Routes,
            "links" => ShowWhat::Links,
            "interfaces" => ShowWhat::Interfaces,
            "config" => ShowWhat::Config,
            "metrics" => ShowWhat::Metrics,
            "cluster" => ShowWhat::Cluster,
            _ => ShowWhat::Stats,
        };
        let json = self.eat("json") || self.eat("--json");
        Ok(Command::Show { what, json })
    }

    /// `drops [N] [since SEQ] [json]` after `show`.
    fn drops(&mut self) -> Result<Command> {
        Ok(Command::Drops(self.recent(("a number of drops (1-4096)", "a drop number"))?))
    }

    /// `flows [N] [since SEQ] [json]` after `show`.
    fn flows(&mut self) -> Result<Command> {
        Ok(Command::Flows(self.recent(("a number of flow records (1-4096)", "a flow record number"))?))
    }

    /// `[N] [since SEQ] [json]` of `show drops|flows` ([`crate::recent`]);
    /// `(count, seq)`: what each number is called in an error.
    fn recent(&mut self, (count, seq): (&str, &str)) -> Result<crate::recent::RecentQuery> {
        use crate::recent::{RecentQuery, DEFAULT_LAST, MAX_LAST};
        let last = match self.peek().is_some_and(|t| t.text.starts_with(|c: char| c.is_ascii_digit())) {
            true => self.number(count, 1..=MAX_LAST)?,
            false => DEFAULT_LAST,
        };
        let since = match self.eat("since") {
            true => {
                let pos = self.pos();
                let t = self.next(seq)?;
                Some(t.text.parse::<u64>().map_err(|_| Error::new(pos, seq, found(Some(&t))))?)
            }
            false => None,
        };
        let json = self.eat("json") || self.eat("--json");
        Ok(RecentQuery { last, since, json })
    }

    /// Palacios `add`: a link if the first word is an IP, else a route.
    fn palacios_add(&mut self) -> Result<Command> {
        if let Some(ip) = self.peek().and_then(|t| t.text.parse::<IpAddr>().ok()) {
            self.at += 1;
            let pos = self.pos();
            let port = self.number("a port (1-65535)", 1..=65535)? as u16;
            let remote = SocketAddr::new(ip, port);
            check_remote(pos, remote)?;
            let tcp = self.peek().is_some() && self.keyword(&["udp", "tcp"], "`udp` or `tcp`")? == "tcp";
            let transport = if tcp {
                Transport::Tcp { remote, tls: false }
            } else {
                Transport::Udp {
                    remote,
                    format: Format::Raw,
                    network: 0,
                    security: Security::None,
                    cipher: Cipher::Auto,
                    nat: false,
                    relay: None,
                }
            };
            return Ok(Command::Link { name: None, transport, mtu: DEFAULT_LINK_MTU });
        }
        if self.peek().is_none() {
            return self.err("a source MAC (route) or a destination IP (link)");
        }
        let src = self.mac_spec("a source")?;
        let dst = self.mac_spec("a destination")?;
        let to = match self.keyword(&["edge", "interface"], "a destination type: `edge` or `interface`")? {
            "edge" => Target::Link(self.palacios_edge()?),
            _ => Target::Interface(self.palacios_iface()?),
        };
        let from = match self
            .keyword(&["any", "edge", "interface"], "a source type: `any`, `edge` or `interface`")?
        {
            "any" => From::Any,
            "edge" => From::Link(self.palacios_edge()?),
            _ => From::Interface(self.palacios_iface()?),
        };
        Ok(Command::Route { src, dst, to, from })
    }

    fn palacios_edge(&mut self) -> Result<Ref<LinkRef>> {
        let pos = self.pos();
        let ip: IpAddr = self.parsed("the link's IP address")?;
        Ok(Ref { pos, by: LinkRef::Ip(ip) })
    }

    fn palacios_iface(&mut self) -> Result<Ref<IfaceRef>> {
        let pos = self.pos();
        let mac = self.mac("the interface's MAC address")?;
        Ok(Ref { pos, by: IfaceRef::Mac(mac) })
    }

    fn delete(&mut self, section: Section, palacios: bool) -> Result<Command> {
        // Palacios `del N` takes its meaning from the section.
        if palacios && self.peek().is_some_and(|t| t.text.parse::<u32>().is_ok()) {
            let pos = self.pos();
            let n = self.number("an index", 0..=u32::MAX)?;
            return match section {
                Section::Routes => Ok(Command::DeleteRoute(Ref { pos, by: n })),
                Section::Links => Ok(Command::DeleteLink(Ref { pos, by: LinkRef::Id(n) })),
                Section::None => Err(Error::new(
                    pos,
                    "`route N` or `link N` (a bare index needs a `[routes]` or `[links]` header line before it)",
                    format!("`{n}`"),
                )),
            };
        }
        let kinds = ["route", "link", "interface", "neigh", "policy", "rule", "group"];
        let kind_at = self.pos();
        match self.keyword(&kinds, "`route`, `link`, `interface`, `neigh`, `policy`, `rule` or `group`")? {
            "policy" => Ok(Command::DeletePolicy(Ref { pos: kind_at, by: self.trailing_network()? })),
            "rule" => {
                let pos = self.pos();
                Ok(Command::DeleteRule(Ref { pos, by: self.name("a rule name")? }))
            }
            "group" => {
                let pos = self.pos();
                let name = self.name("a group name")?;
                Ok(Command::DeleteGroup(Ref { pos, by: (name, self.mac("a MAC address")?) }))
            }
            "neigh" => {
                let pos = self.pos();
                let ip = self.parsed("an IP address")?;
                Ok(Command::DeleteNeigh(Ref { pos, by: (ip, self.trailing_network()?) }))
            }
            "route" => {
                let pos = self.pos();
                let n = self.number("a route id", 0..=u32::MAX)?;
                Ok(Command::DeleteRoute(Ref { pos, by: n }))
            }
            "link" => {
                let pos = self.pos();
                if let Some(n) = self.peek().and_then(|t| t.text.parse::<u32>().ok()) {
                    self.at += 1;
                    return Ok(Command::DeleteLink(Ref { pos, by: LinkRef::Id(n) }));
                }
                Ok(Command::DeleteLink(self.link_ref()?))
            }
            _ => {
                let pos = self.pos();
                let name = self.name("an interface name")?;
                Ok(Command::DeleteInterface(Ref { pos, by: name }))
            }
        }
    }

    /// `ipam add SUBNET OWNER [range FIRST LAST]` or `ipam del OWNER`.
    fn ipam(&mut self) -> Result<Command> {
        let add = self.keyword(&["add", "del"], "`add` or `del`")? == "add";
        let subnet = if add {
            let pos = self.pos();
            let t = self.next("a subnet like 10.88.0.0/24")?;
            let ok = t
                .text
                .split_once('/')
                .is_some_and(|(a, l)| a.parse::<IpAddr>().is_ok() && l.parse::<u8>().is_ok_and(|l| l <= 128));
            if !ok {
                return Err(Error::new(pos, "a subnet like 10.88.0.0/24", found(Some(&t))));
            }
            t.text.to_string()
        } else {
            String::new()
        };
        let pos = self.pos();
        let o = self.next("an owner (CNI network/container/interface)")?;
        let owner_ok = (1..=300).contains(&o.text.len())
            && o.text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
        if !owner_ok {
            return Err(Error::new(pos, "an owner of 1-300 of A-Za-z0-9._-/", found(Some(&o))));
        }
        let owner = o.text.to_string();
        if !add {
            return Ok(Command::Ipam(IpamOp::Del { owner }));
        }
        let range = if self.eat("range") {
            Some((self.parsed("the range's first address")?, self.parsed("the range's last address")?))
        } else {
            None
        };
        Ok(Command::Ipam(IpamOp::Add { subnet, owner, range }))
    }

    fn interface(&mut self) -> Result<Command> {
        let name = self.name("an interface name")?;
        let kind = match self
            .keyword(&["tap", "netdev", "vhost-user"], "an interface kind: `tap`, `netdev` or `vhost-user`")?
        {
            "tap" => IfaceKind::Tap,
            "netdev" => IfaceKind::Netdev,
            _ => IfaceKind::VhostUser,
        };
        let pos = self.pos();
        if kind == IfaceKind::VhostUser {
            let path = self.next("a socket path")?;
            // A Unix socket path: absolute, and short enough for sun_path.
            if !path.text.starts_with('/') || path.text.len() > 107 || path.text.contains(char::is_control) {
                return Err(Error::new(
                    pos,
                    "an absolute socket path of at most 107 bytes",
                    found(Some(&path)),
                ));
            }
            return self.interface_options(name, kind, path.text.to_string(), pos);
        }
        let dev = self.next("a device name")?;
        if dev.text.is_empty()
            || dev.text.len() > 15
            || !dev.text.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(Error::new(
                pos,
                "a device name of 1-15 letters, digits, `_`, `-` or `.`",
                found(Some(&dev)),
            ));
        }
        self.interface_options(name, kind, dev.text.to_string(), pos)
    }

    /// The options after `interface NAME KIND DEV`.
    fn interface_options(&mut self, name: String, kind: IfaceKind, dev: String, pos: Pos) -> Result<Command> {
        let (mut mac, mut mtu, mut netns, mut mode, mut queues, mut offload, mut datapath) =
            (None, None, None, None, None, None, None);
        let (mut broadcast_limit, mut network, mut standby) = (None, None, false);
        let mut groups: Vec<String> = Vec::new();
        let mut addresses: Option<Vec<std::net::IpAddr>> = None;
        while self.peek().is_some() {
            let opt_pos = self.pos();
            let o = self.keyword(
                &[
                    "mac",
                    "mtu",
                    "netns",
                    "mode",
                    "queues",
                    "offload",
                    "datapath",
                    "broadcast-limit",
                    "network",
                    "standby",
                    "group",
                    "addresses",
                ],
                "an option: `mac`, `mtu`, `netns`, `mode`, `queues`, `offload`, `datapath`, `broadcast-limit`, `network`, `standby`, `group` or `addresses`",
            )?;
            let dup = match o {
                "standby" => std::mem::replace(&mut standby, true),
                "group" => {
                    // Repeatable: one group a word, each once, at most MAX_IFACE_GROUPS.
                    let g = self.name("a group name")?;
                    if groups.len() == MAX_IFACE_GROUPS {
                        return Err(Error::new(
                            opt_pos,
                            format!("at most {MAX_IFACE_GROUPS} groups"),
                            "one more",
                        ));
                    }
                    let again = groups.contains(&g);
                    groups.push(g);
                    again
                }
                "addresses" => addresses.replace(self.addresses()?).is_some(),
                "mac" => mac.replace(self.mac("a MAC address")?).is_some(),
                "mtu" => mtu.replace(self.number("an MTU (68-65535)", 68..=65535)?).is_some(),
                "mode" => mode.replace(self.mode()?).is_some(),
                "queues" => queues.replace(self.number("a queue count (1-16)", 1..=16)?).is_some(),
                "offload" => {
                    offload.replace(self.keyword(&["on", "off"], "`on` or `off`")? == "on").is_some()
                }
                "datapath" => datapath.replace(self.datapath()?).is_some(),
                "broadcast-limit" => broadcast_limit
                    .replace(self.number(
                        "broadcast frames a second (0: no limit, at most 10000000)",
                        0..=10_000_000,
                    )?)
                    .is_some(),
                "network" => {
                    network.replace(self.number("a network id (0-4294967295)", 0..=u32::MAX)?).is_some()
                }
                _ => netns.replace(self.name("a network namespace name")?).is_some(),
            };
            if dup {
                return Err(Error::new(opt_pos, "each option once", format!("a second `{o}`")));
            }
            check_vhost_option(kind, o, datapath, opt_pos)?;
        }
        check_interface(pos, mac, standby, &groups)?;
        Ok(Command::Interface {
            name,
            kind,
            dev,
            mac,
            mtu,
            netns,
            mode: mode.unwrap_or_default(),
            queues: queues.unwrap_or(1),
            offload: offload.unwrap_or(true),
            datapath: datapath.unwrap_or_default(),
            broadcast_limit: broadcast_limit.unwrap_or(DEFAULT_BROADCAST_LIMIT),
            network: network.unwrap_or(0),
            standby,
            groups,
            addresses: addresses.unwrap_or_default(),
        })
    }

    /// `addresses A[,B...]`: the interface's own IP addresses (the IP
    /// source guard's), unicast, each once, at most [`MAX_IFACE_ADDRESSES`];
    /// a bad one refused at its own column.
    fn addresses(&mut self) -> Result<Vec<std::net::IpAddr>> {
        let expected = "IP addresses separated by commas, like 10.0.0.5,fd00::5";
        let t = self.next(expected)?;
        let mut out = Vec::new();
        let mut col = t.pos.column;
        for item in t.text.split(',') {
            let pos = Pos { column: col, ..t.pos };
            col += item.chars().count() as u32 + 1;
            let ip: std::net::IpAddr =
                item.parse().map_err(|_| Error::new(pos, expected, format!("`{}`", item.escape_debug())))?;
            crate::neigh::check_ip(pos, ip)?;
            if out.contains(&ip) {
                return Err(Error::new(pos, "each address once", format!("a second `{ip}`")));
            }
            if out.len() == MAX_IFACE_ADDRESSES {
                return Err(Error::new(pos, format!("at most {MAX_IFACE_ADDRESSES} addresses"), "one more"));
            }
            out.push(ip);
        }
        Ok(out)
    }

    fn datapath(&mut self) -> Result<Datapath> {
        Ok(match self.keyword(&["user", "kernel", "auto"], "a data path: `user`, `kernel` or `auto`")? {
            "user" => Datapath::User,
            "kernel" => Datapath::Kernel,
            _ => Datapath::Auto,
        })
    }

    fn mode(&mut self) -> Result<Mode> {
        Ok(match self.keyword(&["notify", "poll", "adaptive"], "a mode: `notify`, `poll` or `adaptive`")? {
            "notify" => Mode::Notify,
            "poll" => Mode::Poll,
            _ => Mode::Adaptive,
        })
    }

    fn link(&mut self) -> Result<Command> {
        let name = self.name("a link name")?;
        let (transport, mtu) = self.transport()?;
        Ok(Command::Link { name: Some(name), transport, mtu })
    }

    /// `tls cert FILE key FILE ca FILE`, in any order, each once.
    fn tls(&mut self) -> Result<Command> {
        let (mut cert, mut key, mut ca) = (None, None, None);
        while self.peek().is_some() {
            let opt_pos = self.pos();
            let o = self.keyword(&["cert", "key", "ca"], "`cert`, `key` or `ca`")?;
            let f = self.path("an absolute file path")?;
            let slot = match o {
                "cert" => &mut cert,
                "key" => &mut key,
                _ => &mut ca,
            };
            if slot.replace(f).is_some() {
                return Err(Error::new(opt_pos, "each option once", format!("a second `{o}`")));
            }
        }
        match (cert, key, ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(Command::Tls(TlsFiles { cert, key, ca })),
            _ => self.err("`cert FILE key FILE ca FILE` (all three)"),
        }
    }

    fn cluster(&mut self) -> Result<Command> {
        use crate::ast::ClusterLine;
        let pos = self.pos();
        let store = self.next("etcd:URL[,URL...]")?;
        if !store.text.starts_with("etcd:") || store.text.len() <= 5 {
            return Err(Error::new(pos, "etcd:URL[,URL...]", found(Some(&store))));
        }
        let mut c = ClusterLine { store: store.text.to_string(), ..ClusterLine::default() };
        let mut network = None;
        const OPTS: &[&str] = &[
            "network",
            "host",
            "advertise",
            "ttl",
            "etcd-ca",
            "etcd-cert",
            "etcd-key",
            "etcd-user",
            "etcd-password-file",
            "network-key",
            "host-cert",
            "key",
            "link",
        ];
        let mut seen = Vec::new();
        while self.peek().is_some() {
            let opt_pos = self.pos();
            let o = self.keyword(OPTS, "`network`, `host`, `advertise`, `ttl`, `etcd-ca`, `etcd-cert`, `etcd-key`, `etcd-user`, `etcd-password-file`, `network-key`, `host-cert`, `key` or `link`")?;
            if seen.contains(&o) {
                return Err(Error::new(opt_pos, "each option once", format!("a second `{o}`")));
            }
            seen.push(o);
            match o {
                "network" => network = Some(self.name("a network name")?),
                "host" => c.host = Some(self.name("a host name")?),
                "advertise" => c.advertise = Some(self.parsed("an address and port like 10.0.0.1:9000")?),
                "ttl" => c.ttl = Some(self.number("a number of seconds (3-3600)", 3..=3600)?.into()),
                "etcd-ca" => c.etcd_ca = Some(self.path("an absolute file path")?),
                "etcd-cert" => c.etcd_cert = Some(self.path("an absolute file path")?),
                "etcd-key" => c.etcd_key = Some(self.path("an absolute file path")?),
                "etcd-user" => c.etcd_user = Some(self.etcd_user()?),
                "etcd-password-file" => c.etcd_password_file = Some(self.path("an absolute file path")?),
                "network-key" => c.network_key = Some(self.path("an absolute file path")?),
                "host-cert" => c.host_cert = Some(self.path("an absolute file path")?),
                "key" => c.key = Some(self.path("an absolute file path")?),
                _ => {
                    // The rest of the line: the links' options.
                    while let Some(t) = self.peek() {
                        c.link.push(t.text.to_string());
                        self.at += 1;
                    }
                    if c.link.is_empty() {
                        return self.err("link options, e.g. `link security encrypt mtu 9000`");
                    }
                }
            }
        }
        c.network = match network {
            Some(n) => n,
            None => return self.err("`network NAME` (the network this host joins)"),
        };
        Ok(Command::Cluster(Box::new(c)))
    }

    /// An absolute path.
    fn path(&mut self, expected: &str) -> Result<String> {
        let pos = self.pos();
        let t = self.next(expected)?;
        if !t.text.starts_with('/') {
            return Err(Error::new(pos, expected, found(Some(&t))));
        }
        Ok(t.text.to_string())
    }

    fn route(&mut self) -> Result<Command> {
        let src = self.mac_spec("a source")?;
        let dst = self.mac_spec("a destination")?;
        // `to` spares shell users from quoting `->`.
        self.keyword(&["->", "to"], "`->` (or `to`)")?;
        let to = match self.keyword(&["link", "interface"], "`link` or `interface`")? {
            "link" => Target::Link(self.link_ref()?),
            _ => Target::Interface(self.iface_ref()?),
        };
        let from = if self.eat("from") {
            match self.keyword(&["any", "link", "interface"], "`any`, `link` or `interface`")? {
                "any" => From::Any,
                "link" => From::Link(self.link_ref()?),
                _ => From::Interface(self.iface_ref()?),
            }
        } else {
            From::Any
        };
        Ok(Command::Route { src, dst, to, from })
    }
}

/// An option a vhost-user interface cannot have: `mtu`, `netns` (the
/// guest sets its own MTU; the socket has no namespace), `datapath kernel`.
fn check_vhost_option(kind: IfaceKind, o: &str, datapath: Option<Datapath>, opt_pos: Pos) -> Result<()> {
    if kind == IfaceKind::VhostUser && matches!(o, "mtu" | "netns") {
        return Err(Error::new(
            opt_pos,
            "an option a vhost-user interface has (the guest sets its own MTU; the socket has no namespace)",
            format!("`{o}`"),
        ));
    }
    if kind == IfaceKind::VhostUser && datapath == Some(Datapath::Kernel) {
        return Err(Error::new(
            opt_pos,
            "`datapath user` or `auto` (vnetd itself reads a vhost-user guest's rings)",
            "`datapath kernel`",
        ));
    }
    Ok(())
}

/// What an interface's options must hold together: a unicast MAC; a MAC
/// with `standby`; a MAC with `group` (a group holds MACs).
fn check_interface(pos: Pos, mac: Option<MacAddr>, standby: bool, groups: &[String]) -> Result<()> {
    if mac.is_some_and(|m: MacAddr| m.is_group()) {
        return Err(Error::new(pos, "a unicast MAC for the interface", "a group address"));
    }
    if standby && mac.is_none() {
        return Err(Error::new(
            pos,
            "a `mac` with `standby` (the VM's first frame from that MAC makes it active)",
            "`standby` without `mac`",
        ));
    }
    if !groups.is_empty() && mac.is_none() {
        return Err(Error::new(
            pos,
            "a `mac` with `group` (a policy's groups hold MACs)",
            "`group` without `mac`",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::PeerKey;
    use vnet_model::MacSpec;

    fn one(s: &str) -> Command {
        parse(s).unwrap().remove(0).item
    }

    fn err(s: &str) -> Error {
        parse(s).unwrap_err()
    }

    fn m(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    /// What mutation testing found no test of: each command word's own
    /// command, the options' edges, the references that advance.
    #[test]
    fn every_word_makes_its_own_command_and_each_bound_is_where_it_says() {
        for (line, want) in [
            ("save", Command::Save),
            ("reload", Command::Reload),
            ("begin", Command::Begin),
            ("commit", Command::Commit),
            ("abort", Command::Abort),
            ("show matrix json", Command::Show { what: ShowWhat::Matrix, json: true }),
        ] {
            assert_eq!(one(line), want, "{line}");
        }
        // An interface by MAC with `from` after it; a link deleted by id.
        let Command::Route { to: Target::Interface(to), from, .. } =
            one("route any any -> interface 52:54:00:00:00:01 from link b")
        else {
            panic!("not a route")
        };
        assert_eq!(to.by, IfaceRef::Mac(m(1)));
        assert!(matches!(&from, From::Link(Ref { by: LinkRef::Name(n), .. }) if n == "b"), "{from:?}");
        let Command::Route { from, .. } = one("route any any -> link b from any") else { panic!() };
        assert_eq!(from, From::Any);
        assert!(matches!(one("delete link 7"), Command::DeleteLink(Ref { by: LinkRef::Id(7), .. })));
        assert!(parse("delete link 7 8").is_err(), "one id");
        // Subnets: a prefix of at most 128 on an address.
        assert!(parse("ipam add 10.88.0.0/128 o").is_ok());
        assert!(parse("ipam add 10.88.0.0/129 o").is_err());
        assert!(parse("ipam add x/24 o").is_err());
        // A vhost-user socket path of at most 107 bytes, absolute.
        let path = |n: usize| format!("/{}", "p".repeat(n - 1));
        assert!(parse(&format!("interface g vhost-user {}", path(107))).is_ok());
        assert!(parse(&format!("interface g vhost-user {}", path(108))).is_err());
        assert!(parse("interface g vhost-user relative.sock").is_err());
        // A device name of at most 15.
        assert!(parse(&format!("interface g tap {}", "d".repeat(15))).is_ok());
        assert!(parse(&format!("interface g tap {}", "d".repeat(16))).is_err());
        // `cluster ... key FILE`.
        let Command::Cluster(c) = one("cluster etcd:x network a key /etc/vnet/host.key") else { panic!() };
        assert_eq!(c.key.as_deref(), Some("/etc/vnet/host.key"));
        // A plain udp link speaks Palacios's raw format; a secured one vnet.
        let Command::Link { transport: Transport::Udp { format, .. }, .. } = one("link a udp 10.0.0.2")
        else {
            panic!()
        };
        assert_eq!(format, Format::Raw);
    }

    #[test]
    fn cluster_lines_parse_print_back_and_say_what_they_miss() {
        let line = "cluster etcd:https://10.0.0.1:2379,https://10.0.0.2:2379 network prod host h1 \
                    advertise 10.0.0.5:9000 ttl 10 etcd-ca /etc/vnet/ca.pem etcd-cert /etc/vnet/h1.pem \
                    etcd-key /etc/vnet/h1.key etcd-user vnet-h1 etcd-password-file /etc/vnet/h1.pw \
                    network-key /etc/vnet/net.pub host-cert /etc/vnet/h1.cert link security encrypt mtu 9000";
        let Command::Cluster(c) = one(line) else { panic!("not a cluster line") };
        assert_eq!(c.store, "etcd:https://10.0.0.1:2379,https://10.0.0.2:2379");
        assert_eq!((c.network.as_str(), c.host.as_deref(), c.ttl), ("prod", Some("h1"), Some(10)));
        assert_eq!(c.link, ["security", "encrypt", "mtu", "9000"]);
        assert_eq!(one(&c.to_line()), Command::Cluster(c.clone()));
        // The user `vnetctl network approve` makes: `vnet/NETWORK/HOST`.
        let Command::Cluster(d) = one("cluster etcd:x network a-b etcd-user vnet/a-b/c") else { panic!() };
        assert_eq!(d.etcd_user.as_deref(), Some("vnet/a-b/c"));
        assert_eq!(one(&d.to_line()), Command::Cluster(d.clone()));
        for (bad, want) in [
            ("cluster http://x network a", "etcd:URL"),
            ("cluster etcd:x host a", "`network NAME`"),
            ("cluster etcd:x network a network b", "each option once"),
            ("cluster etcd:x network a etcd-ca relative.pem", "absolute"),
            ("cluster etcd:x network a ttl 1", "3-3600"),
            ("cluster etcd:x network a link", "link options"),
            ("cluster etcd:x network a etcd-user vnet//h1", "an etcd user name"),
            ("cluster etcd:x network a etcd-user /vnet/a/h1", "an etcd user name"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn palacios_link_lines() {
        for (s, port) in [("add 10.0.0.2 9000 udp", 9000), ("add 10.0.0.2 7000", 7000)] {
            assert_eq!(
                one(s),
                Command::Link {
                    name: None,
                    transport: Transport::Udp {
                        remote: format!("10.0.0.2:{port}").parse().unwrap(),
                        format: Format::Raw,
                        network: 0,
                        security: Security::None,
                        cipher: Cipher::Auto,
                        nat: false,
                        relay: None
                    },
                    mtu: 1500
                }
            );
        }
        // VNET/U's TCP links, Palacios syntax.
        assert_eq!(
            one("add 10.0.0.2 9000 tcp"),
            Command::Link {
                name: None,
                transport: Transport::Tcp { remote: "10.0.0.2:9000".parse().unwrap(), tls: false },
                mtu: 1500
            }
        );
        let e = err("add 10.0.0.2 9000 sctp");
        assert_eq!((e.pos.line, e.pos.column), (1, 19));
        assert!(e.expected.contains("`udp` or `tcp`"), "{e}");
    }

    #[test]
    fn palacios_route_lines() {
        let c = one("add any ff:ff:ff:ff:ff:ff edge 10.0.0.2 any");
        let Command::Route { src, dst, to, from } = c else { panic!() };
        assert_eq!((src, dst), (MacSpec::Any, MacSpec::Addr(MacAddr::BROADCAST)));
        assert!(matches!(to, Target::Link(Ref { by: LinkRef::Ip(_), pos: Pos { column: 32, .. } })));
        assert_eq!(from, From::Any);

        let c = one("add not-52:54:00:00:00:01 52:54:00:00:00:02 interface 52:54:00:00:00:02 edge 10.0.0.3");
        let Command::Route { src, to, from, .. } = c else { panic!() };
        assert_eq!(src, MacSpec::Not(m(1)));
        assert!(matches!(to, Target::Interface(Ref { by: IfaceRef::Mac(x), .. }) if x == m(2)));
        assert!(matches!(from, From::Link(_)));

        let c = one("add none any interface 52:54:00:00:00:02 interface 52:54:00:00:00:03");
        assert!(matches!(c, Command::Route { src: MacSpec::None, from: From::Interface(_), .. }));
    }

    #[test]
    fn palacios_del_needs_section() {
        let cmds = parse("[routes]\ndel 3\n[links]\ndel 1\n").unwrap();
        assert_eq!(cmds[0].item, Command::DeleteRoute(Ref { pos: Pos { line: 2, column: 5 }, by: 3 }));
        assert!(matches!(cmds[1].item, Command::DeleteLink(Ref { by: LinkRef::Id(1), .. })));
        let e = err("del 3");
        assert_eq!((e.pos.line, e.pos.column), (1, 5));
        assert!(e.expected.contains("[routes]"));
    }

    #[test]
    fn superset_lines() {
        assert_eq!(
            one("interface vm0 tap vt0 mac 52:54:00:00:00:01 mtu 9000 netns vmA"),
            Command::Interface {
                name: "vm0".into(),
                kind: IfaceKind::Tap,
                dev: "vt0".into(),
                mac: Some(m(1)),
                mtu: Some(9000),
                netns: Some("vmA".into()),
                mode: Mode::Adaptive,
                queues: 1,
                offload: true,
                datapath: Datapath::Auto,
                broadcast_limit: DEFAULT_BROADCAST_LIMIT,
                network: 0,
                standby: false,
                groups: Vec::new(),
                addresses: Vec::new(),
            }
        );
        assert!(matches!(one("interface vm1 tap vt1 network 8"), Command::Interface { network: 8, .. }));
        assert_eq!(
            one("interface g0 vhost-user /run/vnet/g0.sock mac 52:54:00:00:00:01 mode poll queues 2 network 7"),
            Command::Interface {
                name: "g0".into(),
                kind: IfaceKind::VhostUser,
                dev: "/run/vnet/g0.sock".into(),
                mac: Some(m(1)),
                mtu: None,
                netns: None,
                mode: Mode::Poll,
                queues: 2,
                offload: true,
                datapath: Datapath::Auto,
                broadcast_limit: DEFAULT_BROADCAST_LIMIT,
                network: 7,
                standby: false,
                groups: Vec::new(),
                addresses: Vec::new(),
            }
        );
        assert_eq!(
            one("link hostb udp 10.0.0.2 format vnet network 7"),
            Command::Link {
                name: Some("hostb".into()),
                transport: Transport::Udp {
                    remote: "10.0.0.2:9000".parse().unwrap(),
                    format: Format::Vnet,
                    network: 7,
                    security: Security::None,
                    cipher: Cipher::Auto,
                    nat: false,
                    relay: None
                },
                mtu: 1500
            }
        );
        // A secured link: a peer key alone means `encrypt`.
        let k = PeerKey([0; 32]);
        let key = k.to_string();
        assert_eq!(key.len(), 44);
        assert_eq!(PeerKey::from_base64(&key), Some(k));
        for (line, want) in [
            (format!("link s udp 10.0.0.2 peer-key {key}"), Security::Encrypt(k)),
            (format!("link s udp 10.0.0.2 peer-key {key} security auth"), Security::Auth(k)),
            (format!("link s udp 10.0.0.2 security encrypt peer-key {key}"), Security::Encrypt(k)),
            (format!("link s udp [fd00::2]:9000 peer-key {key} nat"), Security::Encrypt(k)),
        ] {
            let Command::Link { transport: Transport::Udp { security, .. }, .. } = one(&line) else {
                panic!()
            };
            assert_eq!(security, want, "{line}");
        }
        // The cipher: auto unless named, only on a secured link, and it round-trips.
        for (opt, want) in [
            ("", Cipher::Auto),
            (" cipher auto", Cipher::Auto),
            (" cipher aes-256-gcm", Cipher::Aes256Gcm),
            (" cipher chacha20-poly1305", Cipher::ChaCha20Poly1305),
        ] {
            let line = format!("link s udp 10.0.0.2 peer-key {key}{opt}");
            let Command::Link { transport: t @ Transport::Udp { cipher, .. }, .. } = one(&line) else {
                panic!()
            };
            assert_eq!(cipher, want, "{line}");
            let def = crate::LinkDef { id: 1, name: "s".into(), transport: t, mtu: 1500 };
            assert_eq!(
                one(&def.to_line()),
                Command::Link { name: Some("s".into()), transport: t, mtu: 1500 }
            );
        }
        for (line, at, want) in [
            (
                "link s udp 10.0.0.2 cipher aes-256-gcm".to_string(),
                "1:21",
                "`cipher` on a link without a peer key",
            ),
            (format!("link s udp 10.0.0.2 peer-key {key} cipher aes"), "1:82", "`auto`, `aes-256-gcm` or"),
            (
                format!("link s udp 10.0.0.2 peer-key {key} cipher auto cipher auto"),
                "1:87",
                "a second `cipher`",
            ),
        ] {
            let e = parse(&line).unwrap_err().to_string();
            assert!(e.contains(at) && e.contains(want), "{line}: {e}");
        }
        // VXLAN: IANA's port unless told (8472 is what a Linux device without `dstport` uses).
        assert_eq!(
            one("link fab vxlan 10.0.0.4 vni 42"),
            Command::Link {
                name: Some("fab".into()),
                transport: Transport::Vxlan { remote: "10.0.0.4:4789".parse().unwrap(), vni: 42 },
                mtu: 1500
            }
        );
        assert!(matches!(
            one("link fab vxlan 10.0.0.4:8472 vni 16777215 mtu 9000"),
            Command::Link { transport: Transport::Vxlan { vni: 16_777_215, .. }, mtu: 9000, .. }
        ));
        assert_eq!(one("listen vxlan 0.0.0.0:8472"), Command::ListenVxlan("0.0.0.0:8472".parse().unwrap()));
        assert_eq!(one("listen tcp 10.0.0.1:9000"), Command::ListenTcp("10.0.0.1:9000".parse().unwrap()));
        assert_eq!(
            one("link lan direct eth1 mtu 9000"),
            Command::Link {
                name: Some("lan".into()),
                transport: Transport::Direct { dev: crate::ast::IfName::new("eth1").unwrap() },
                mtu: 9000
            }
        );
        assert_eq!(
            one("link far tcp 192.0.2.9:9443 tls mtu 9000"),
            Command::Link {
                name: Some("far".into()),
                transport: Transport::Tcp { remote: "192.0.2.9:9443".parse().unwrap(), tls: true },
                mtu: 9000
            }
        );
        assert_eq!(
            one("tls ca /c.pem cert /h.pem key /h.key"),
            Command::Tls(TlsFiles { cert: "/h.pem".into(), key: "/h.key".into(), ca: "/c.pem".into() })
        );
        assert!(matches!(one("link x udp [::1]:9001 mtu 9000"), Command::Link { mtu: 9000, .. }));
        assert_eq!(
            one("route any any to link hostb"),
            one("route any any -> link hostb"),
            "`to` is `->` without the shell's `>`"
        );
        let c = one("route any 52:54:00:00:00:02 -> link hostb from interface vm0");
        assert!(matches!(c, Command::Route { to: Target::Link(_), from: From::Interface(_), .. }));
        assert_eq!(
            one("listen udp 0.0.0.0:9000"),
            Command::Listen { addr: "0.0.0.0:9000".parse().unwrap(), mode: None }
        );
        assert!(matches!(
            one("listen udp 0.0.0.0:9000 mode poll"),
            Command::Listen { mode: Some(Mode::Poll), .. }
        ));
        assert!(matches!(
            one("interface a tap t mode notify queues 2 offload off datapath user broadcast-limit 0"),
            Command::Interface {
                mode: Mode::Notify,
                queues: 2,
                offload: false,
                datapath: Datapath::User,
                broadcast_limit: 0,
                ..
            }
        ));
        assert!(matches!(
            one("interface m netdev q0 mac 52:54:00:00:00:01 standby"),
            Command::Interface { standby: true, .. }
        ));
        assert_eq!(one("activate m"), Command::Activate("m".into()));
        assert_eq!(one("show routes json"), Command::Show { what: ShowWhat::Routes, json: true });
        assert_eq!(
            one("announce 52:54:00:00:00:01"),
            Command::Announce("52:54:00:00:00:01".parse().unwrap())
        );
        assert_eq!(one("show metrics"), Command::Show { what: ShowWhat::Metrics, json: false });
        assert_eq!(one("show cluster json"), Command::Show { what: ShowWhat::Cluster, json: true });
        assert!(matches!(one("delete link hostb"), Command::DeleteLink(_)));
        assert!(matches!(one("delete route 4"), Command::DeleteRoute(Ref { by: 4, .. })));
        assert!(matches!(one("del interface vm0"), Command::DeleteInterface(_)));
        assert!(parse("\n# nothing\n   \n").unwrap().is_empty());
    }

    #[test]
    fn an_interfaces_addresses_are_unicast_each_once_and_refused_at_their_own_column() {
        let ips = |s: &str| s.split(',').map(|a| a.parse().unwrap()).collect::<Vec<std::net::IpAddr>>();
        let c = one("interface a tap t mac 52:54:00:00:00:01 addresses 10.0.0.5,fd00::5");
        assert!(matches!(&c, Command::Interface { addresses, .. } if *addresses == ips("10.0.0.5,fd00::5")));
        let s = crate::State::default()
            .apply_all(&parse("interface a tap t addresses 10.0.0.5,fd00::5").unwrap());
        let line = s.unwrap().to_config();
        assert!(line.contains(" addresses 10.0.0.5,fd00::5"), "{line}");
        assert!(parse(&line).is_ok(), "show config's lines parse again");
        let at = |s: &str| parse(s).unwrap_err();
        for (text, col, what) in [
            ("interface a tap t addresses 10.0.0.5,10.0.0.x", 38, "IP addresses"),
            ("interface a tap t addresses 10.0.0.5,224.0.0.1", 38, "unicast"),
            ("interface a tap t addresses ::", 29, "unicast"),
            ("interface vm0 tap t addresses 10.0.0.5,224.0.0.1", 40, "unicast"), // docs/control.md
            ("interface a tap t addresses 10.0.0.5,10.0.0.5", 38, "each address once"),
            ("interface a tap t addresses 10.0.0.5 addresses 10.0.0.6", 38, "each option once"),
            ("interface a tap t addresses", 28, "IP addresses"),
            ("interface a tap t addresses 10.0.0.5,", 38, "IP addresses"),
        ] {
            let e = at(text);
            assert_eq!((e.pos.column, e.expected.contains(what)), (col, true), "{text}: {e}");
        }
        let many: Vec<String> = (0..=MAX_IFACE_ADDRESSES).map(|i| format!("10.0.1.{i}")).collect();
        assert!(at(&format!("interface a tap t addresses {}", many.join(",")))
            .expected
            .contains("at most 64"));
    }

    #[test]
    fn error_positions() {
        let cases: &[(&str, u32, u32, &str)] = &[
            ("bogus", 1, 1, "a command"),
            ("\n\nroute any 52:54:00:00:00:0g -> link x", 3, 11, "destination MAC"),
            ("route any any => link x", 1, 15, "`->`"),
            ("route any any -> link", 1, 22, "link name"),
            ("interface vm0 tap vt0 mtu 70000", 1, 27, "MTU"),
            ("interface vm0 tap vt0 mtu 1500 mtu 1500", 1, 32, "each option once"),
            ("interface vm0 tap averyveryverylongname", 1, 19, "device name"),
            ("interface 0vm tap x", 1, 11, "interface name"),
            ("interface vm tun x", 1, 14, "`tap`, `netdev` or `vhost-user`"),
            ("interface vm vhost-user rel.sock", 1, 25, "an absolute socket path"),
            ("interface vm vhost-user /run/vm.sock mtu 9000", 1, 38, "an option a vhost-user interface has"),
            ("interface vm vhost-user /run/vm.sock datapath kernel", 1, 38, "`datapath user` or `auto`"),
            ("interface vm tap x mode fast", 1, 25, "a mode"),
            ("interface vm tap x queues 17", 1, 27, "queue count"),
            ("link a udp 10.0.0.300", 1, 12, "address"),
            ("link a udp 10.0.0.3 format gre", 1, 28, "`raw` or `vnet`"),
            ("link a gre 10.0.0.3", 1, 8, "`udp`, `vxlan`, `tcp` or `direct`"),
            ("link a direct", 1, 14, "a device name"),
            ("link a direct this-name-is-too-long", 1, 15, "a device name"),
            ("link a direct eth0 vni 3", 1, 20, "end of line"),
            ("link a vxlan 10.0.0.3", 1, 22, "`vni N`"),
            ("link a vxlan 10.0.0.3 vni 16777216", 1, 27, "VXLAN network identifier"),
            ("link a vxlan 10.0.0.3 format vnet", 1, 23, "`vni` or `mtu`"),
            ("link a vxlan 10.0.0.3 vni 1 vni 2", 1, 29, "each option once"),
            ("link a udp 10.0.0.3:0", 1, 12, "a port from 1 to 65535"),
            ("link a udp 10.0.0.3 peer-key abc", 1, 30, "a peer's public key"),
            ("link a udp 10.0.0.3 security auth", 1, 30, "`peer-key KEY`"),
            ("link a udp 10.0.0.3 security magic", 1, 30, "`none`, `auth` or `encrypt`"),
            ("link a udp 10.0.0.3 format raw peer-key AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", 1, 12, "format `vnet`"),
            ("link a udp 10.0.0.3 peer-key AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= security none", 1, 84, "`auth` or `encrypt`"),
            ("link a udp 10.0.0.3 peer-key AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= peer-key AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", 1, 75, "each option once"),
            ("link a udp 255.255.255.255:9000", 1, 12, "unicast address"),
            ("link a udp 10.0.0.3 nat", 1, 21, "`peer-key KEY` for a `nat` link"),
            ("link a udp 10.0.0.3 nat nat", 1, 25, "each option once"),
            ("link a udp [fd00::1:9000", 1, 12, "address"),
            ("link a udp [fd00::zz]:9000", 1, 12, "address"),
            ("link a udp [ff02::1]:9000", 1, 12, "unicast address"),
            ("link a udp [::]:9000", 1, 12, "unicast address"),
            ("link a vxlan [fd00::2]:0 vni 1", 1, 14, "a port from 1 to 65535"),
            ("listen udp [fd00::1]", 1, 12, "[::]:9000"),
            ("link a vxlan 224.0.0.1 vni 3", 1, 14, "unicast address"),
            ("listen vxlan 0.0.0.0", 1, 14, "0.0.0.0:4789"),
            ("listen sctp 0.0.0.0:1", 1, 8, "`udp`, `vxlan` or `tcp`"),
            ("link a tcp 10.0.0.3 vni 4", 1, 21, "`tls` or `mtu`"),
            ("link a tcp 10.0.0.3 tls tls", 1, 25, "each option once"),
            ("tls cert /a key /b", 1, 19, "all three"),
            ("tls cert a.pem key /b ca /c", 1, 10, "absolute file path"),
            ("tls cert /a cert /b", 1, 13, "each option once"),
            ("add 10.0.0.2 0 tcp", 1, 14, "a port (1-65535)"),
            ("show routes extra", 1, 13, "end of line"),
            ("[routes] x", 1, 10, "end of line"),
            ("add any ff:ff:ff:ff:ff:ff edge any", 1, 32, "IP"),
            ("add", 1, 4, "source MAC"),
        ];
        for &(text, line, col, expect) in cases {
            let e = err(text);
            assert_eq!((e.pos.line, e.pos.column), (line, col), "{text}: {e}");
            assert!(e.expected.contains(expect), "{text}: {e}");
        }
        let e = err("add any any edge").in_file("/etc/vnet.conf");
        assert_eq!(e.to_string(), "/etc/vnet.conf:1:17: expected the link's IP address, found end of line");
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_random_text(s in "\\PC{0,200}") {
            let _ = parse(&s);
        }

        #[test]
        fn never_panics_on_mutated_lines(i in 0usize..9, cut in 0usize..80, junk in "[ -~]{0,12}") {
            let lines = [
                "add any ff:ff:ff:ff:ff:ff edge 10.0.0.2 any",
                "add 10.0.0.2 9000 udp",
                "interface vm0 tap vt0 mac 52:54:00:00:00:01 mtu 9000 netns vmA",
                "interface g0 vhost-user /run/vnet/g0.sock mac 52:54:00:00:00:01 queues 2",
                "link hostb udp 10.0.0.2:9000 format vnet network 1 mtu 1500",
                "route not-52:54:00:00:00:01 any -> interface vm0 from link hostb",
                "[routes]\ndel 3",
                "listen udp [::1]:9000",
                "show stats json",
            ];
            let l = lines[i];
            let mut s: String = l.chars().take(cut).collect();
            s.push_str(&junk);
            s.push_str(&l.chars().skip(cut).collect::<String>());
            let _ = parse(&s);
        }
    }
}
