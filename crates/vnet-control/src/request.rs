//! Typed requests: what a program sends to vnetd, built from values, never
//! formatted from text.
//!
//! A CNI plugin, a libvirt hook, `vnetctl move` and the lab act on values
//! that someone else chose: a CNI network config, a domain XML, another
//! host's answer. Formatted into a control line, such a value could end the
//! line (a newline), start a word (a space), start a comment (`#`, cutting
//! off a `network N` that follows) or carry an escape sequence. Here every
//! value is a type that refuses, at construction, what the control language
//! cannot carry as one word of its kind ([`Name`], [`DevName`],
//! [`SocketPath`], [`Subnet`], [`Owner`]; MACs, numbers and addresses are
//! typed already), and a [`Request`] is written out only from such values.
//! The parser refuses control characters wherever they appear
//! ([`crate::lex`]), so even a raw line typed at `vnetctl` cannot hold two
//! commands.
//!
//! [`Request::command`] is the [`Command`] the daemon's parser makes of
//! [`Request::line`]: the tests check, for any field values, that either a
//! type refuses them or the line parses to exactly that command, once.

use crate::ast::{Command, IfaceKind, IpamOp, ShowWhat};
use crate::{Datapath, Mode};
use std::fmt;
use std::net::IpAddr;
use vnet_wire::MacAddr;

/// A value a request cannot carry: which kind of value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{}`: expected {expected}", .value.escape_debug())]
pub struct Invalid {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

fn invalid(what: &'static str, value: &str, expected: &'static str) -> Invalid {
    // A refused value is quoted in messages: keep what is shown short.
    let value: String = value.chars().take(120).collect();
    Invalid { what, value, expected }
}

/// Words the parser takes as keywords where a name may stand.
const RESERVED: [&str; 5] = ["any", "none", "from", "link", "interface"];

macro_rules! text_type {
    ($(#[$doc:meta])* $t:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $t(String);

        impl $t {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $t {
            type Err = Invalid;
            fn from_str(s: &str) -> Result<Self, Invalid> {
                $t::new(s)
            }
        }
    };
}

text_type!(
    /// An interface's, a link's or a namespace's name: a letter, then at
    /// most 63 letters, digits, `_`, `-` or `.`; not a keyword.
    Name
);

impl Name {
    pub const EXPECTED: &'static str =
        "a letter, then at most 63 letters, digits, `_`, `-` or `.` (not any, none, from, link, interface)";

    pub fn new(s: &str) -> Result<Name, Invalid> {
        let ok = s.len() <= 64
            && s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            && !RESERVED.contains(&s);
        if ok {
            Ok(Name(s.to_string()))
        } else {
            Err(invalid("name", s, Name::EXPECTED))
        }
    }
}

text_type!(
    /// A network device's name for a `tap` or `netdev` interface: 1-15
    /// letters, digits, `_`, `-` or `.`.
    DevName
);

impl DevName {
    pub const EXPECTED: &'static str = "1-15 letters, digits, `_`, `-` or `.`";

    pub fn new(s: &str) -> Result<DevName, Invalid> {
        let ok =
            (1..=15).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if ok {
            Ok(DevName(s.to_string()))
        } else {
            Err(invalid("device name", s, DevName::EXPECTED))
        }
    }
}

text_type!(
    /// A vhost-user socket's path: absolute, at most 107 bytes (a Unix
    /// socket's `sun_path`), no white space, `#` or control character, no
    /// `.` or `..` component, no empty component.
    SocketPath
);

impl SocketPath {
    pub const EXPECTED: &'static str =
        "an absolute path of at most 107 bytes without white space, `#`, control characters, `.` or `..` components";

    pub fn new(s: &str) -> Result<SocketPath, Invalid> {
        let plain = |c: char| !c.is_whitespace() && c != '#' && crate::lex::allowed(c);
        let parts_ok = s.split('/').skip(1).all(|p| !p.is_empty() && p != "." && p != "..");
        if s.starts_with('/') && s.len() > 1 && s.len() <= 107 && s.chars().all(plain) && parts_ok {
            Ok(SocketPath(s.to_string()))
        } else {
            Err(invalid("socket path", s, SocketPath::EXPECTED))
        }
    }

    /// The socket `file` (a [`DevName`]-like file name) in directory `dir`.
    pub fn in_dir(dir: &str, file: &str) -> Result<SocketPath, Invalid> {
        SocketPath::new(&format!("{}/{file}", dir.trim_end_matches('/')))
    }
}

text_type!(
    /// A Kubernetes pod as `NAMESPACE/NAME`, each a Kubernetes name (an
    /// RFC 1123 subdomain: 1-253 of `a-z0-9.-`, alphanumeric at both ends).
    PodRef
);

impl PodRef {
    pub const EXPECTED: &'static str = crate::ast::POD_EXPECTED;

    pub fn new(s: &str) -> Result<PodRef, Invalid> {
        if crate::ast::is_pod_ref(s) {
            Ok(PodRef(s.to_string()))
        } else {
            Err(invalid("pod", s, PodRef::EXPECTED))
        }
    }

    /// The namespace and the pod's name.
    pub fn parts(&self) -> (&str, &str) {
        self.0.split_once('/').unwrap_or(("", ""))
    }
}

text_type!(
    /// Who holds an IPAM address (a CNI network, container and interface):
    /// 1-300 of `A-Za-z0-9._-/`.
    Owner
);

impl Owner {
    pub const EXPECTED: &'static str = "1-300 of A-Za-z0-9._-/";

    pub fn new(s: &str) -> Result<Owner, Invalid> {
        let ok = (1..=300).contains(&s.len())
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
        if ok {
            Ok(Owner(s.to_string()))
        } else {
            Err(invalid("IPAM owner", s, Owner::EXPECTED))
        }
    }
}

/// An IP subnet: an address and a prefix length that fits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subnet {
    pub addr: IpAddr,
    pub len: u8,
}

impl Subnet {
    pub const EXPECTED: &'static str = "ADDRESS/PREFIX, like 10.88.0.0/24 or fd00::/64";

    pub fn new(addr: IpAddr, len: u8) -> Result<Subnet, Invalid> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len <= max {
            Ok(Subnet { addr, len })
        } else {
            Err(invalid("subnet", &format!("{addr}/{len}"), Subnet::EXPECTED))
        }
    }
}

impl std::str::FromStr for Subnet {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Subnet, Invalid> {
        let bad = || invalid("subnet", s, Subnet::EXPECTED);
        let (a, l) = s.split_once('/').ok_or_else(bad)?;
        // Digits only: `u8::from_str` would take a `+`.
        if l.is_empty() || l.len() > 3 || !l.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Subnet::new(a.parse().map_err(|_| bad())?, l.parse().map_err(|_| bad())?)
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// What an interface is attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dev {
    /// A TAP vnetd opens (`tap DEV`).
    Tap(DevName),
    /// A netdev vnetd attaches to: a TAP QEMU holds, a veth's host end.
    Netdev(DevName),
    /// A vhost-user socket vnetd serves.
    VhostUser(SocketPath),
}

/// An interface's declaration: the words of an `interface` or `attach`
/// line, each typed. Options left at their defaults are not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: Name,
    pub dev: Dev,
    pub mac: Option<MacAddr>,
    pub mtu: Option<u32>,
    pub netns: Option<Name>,
    pub mode: Mode,
    pub queues: u32,
    pub offload: bool,
    pub datapath: Datapath,
    pub broadcast_limit: u32,
    pub network: u32,
    pub standby: bool,
    /// The policy groups its MAC is in (`group G`).
    pub groups: Vec<Name>,
    /// The IP addresses its VM owns (`addresses`: the IP source guard's).
    pub addresses: Vec<std::net::IpAddr>,
}

impl Interface {
    /// An interface with every option at its default.
    pub fn new(name: Name, dev: Dev) -> Interface {
        Interface {
            name,
            dev,
            mac: None,
            mtu: None,
            netns: None,
            mode: Mode::default(),
            queues: 1,
            offload: true,
            datapath: Datapath::default(),
            broadcast_limit: crate::DEFAULT_BROADCAST_LIMIT,
            network: 0,
            standby: false,
            groups: Vec::new(),
            addresses: Vec::new(),
        }
    }

    /// The typed declaration of a parsed `interface` (or `attach`) command:
    /// what a person typed, checked as any other value.
    pub fn from_command(c: &Command) -> Result<Interface, Invalid> {
        let c = match c {
            Command::Attach(inner) => inner.as_ref(),
            c => c,
        };
        let d = crate::InterfaceDef::declared(0, c)
            .ok_or_else(|| invalid("declaration", "", "an `interface` declaration"))?;
        let dev = match d.kind {
            IfaceKind::Tap => Dev::Tap(DevName::new(&d.dev)?),
            IfaceKind::Netdev => Dev::Netdev(DevName::new(&d.dev)?),
            IfaceKind::VhostUser => Dev::VhostUser(SocketPath::new(&d.dev)?),
        };
        let i = Interface {
            name: Name::new(&d.name)?,
            dev,
            mac: d.mac,
            mtu: d.mtu,
            netns: d.netns.as_deref().map(Name::new).transpose()?,
            mode: d.mode,
            queues: d.queues,
            offload: d.offload,
            datapath: d.datapath,
            broadcast_limit: d.broadcast_limit,
            network: d.network,
            standby: d.standby,
            groups: d.groups.iter().map(|g| Name::new(g)).collect::<Result<_, _>>()?,
            addresses: d.addresses.clone(),
        };
        i.check()?;
        Ok(i)
    }

    /// Checks what no single type can: the options' ranges and how they
    /// go together (the parser's rules).
    pub fn check(&self) -> Result<(), Invalid> {
        let n = self.name.as_str();
        if let Some(m) = self.mtu.filter(|m| !(68..=65535).contains(m)) {
            return Err(invalid("mtu", &m.to_string(), "an MTU of 68-65535"));
        }
        if !(1..=16).contains(&self.queues) {
            return Err(invalid("queues", &self.queues.to_string(), "1-16 queues"));
        }
        if self.broadcast_limit > 10_000_000 {
            let l = self.broadcast_limit.to_string();
            return Err(invalid("broadcast-limit", &l, "at most 10000000 broadcast frames a second"));
        }
        if self.mac.is_some_and(|m| m.is_group()) {
            return Err(invalid("mac", n, "a unicast MAC"));
        }
        if self.standby && self.mac.is_none() {
            return Err(invalid("standby", n, "a `mac` with `standby`"));
        }
        if !self.groups.is_empty() && self.mac.is_none() {
            return Err(invalid("group", n, "a `mac` with `group`"));
        }
        let pos = crate::Pos::default();
        for (i, a) in self.addresses.iter().enumerate() {
            let again = self.addresses[..i].contains(a);
            if crate::neigh::check_ip(pos, *a).is_err() || again || i >= crate::ast::MAX_IFACE_ADDRESSES {
                return Err(invalid("addresses", &a.to_string(), "at most 64 unicast addresses, each once"));
            }
        }
        let distinct: std::collections::BTreeSet<&str> = self.groups.iter().map(Name::as_str).collect();
        if self.groups.len() > crate::ast::MAX_IFACE_GROUPS || distinct.len() != self.groups.len() {
            return Err(invalid("group", n, "at most 16 groups, each once"));
        }
        if let Dev::VhostUser(_) = self.dev {
            if self.mtu.is_some() || self.netns.is_some() {
                return Err(invalid(
                    "vhost-user interface",
                    n,
                    "no `mtu` or `netns` on a vhost-user interface",
                ));
            }
            if self.datapath == Datapath::Kernel {
                return Err(invalid(
                    "vhost-user interface",
                    n,
                    "`datapath user` or `auto` on a vhost-user interface",
                ));
            }
        }
        Ok(())
    }

    fn write_words(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, dev) = match &self.dev {
            Dev::Tap(d) => ("tap", d.as_str()),
            Dev::Netdev(d) => ("netdev", d.as_str()),
            Dev::VhostUser(p) => ("vhost-user", p.as_str()),
        };
        write!(f, "{} {kind} {dev}", self.name)?;
        if let Some(m) = self.mac {
            write!(f, " mac {m}")?;
        }
        if let Some(m) = self.mtu {
            write!(f, " mtu {m}")?;
        }
        if let Some(ns) = &self.netns {
            write!(f, " netns {ns}")?;
        }
        if self.mode != Mode::default() {
            write!(f, " mode {}", self.mode.word())?;
        }
        if self.queues != 1 {
            write!(f, " queues {}", self.queues)?;
        }
        if !self.offload {
            f.write_str(" offload off")?;
        }
        write!(f, " datapath {}", self.datapath.word())?;
        if self.broadcast_limit != crate::DEFAULT_BROADCAST_LIMIT {
            write!(f, " broadcast-limit {}", self.broadcast_limit)?;
        }
        if self.network != 0 {
            write!(f, " network {}", self.network)?;
        }
        for g in &self.groups {
            write!(f, " group {g}")?;
        }
        write_addresses(f, &self.addresses)?;
        if self.standby {
            f.write_str(" standby")?;
        }
        Ok(())
    }

    /// The [`Command::Interface`] this declares.
    pub fn command(&self) -> Command {
        let (kind, dev) = match &self.dev {
            Dev::Tap(d) => (IfaceKind::Tap, d.to_string()),
            Dev::Netdev(d) => (IfaceKind::Netdev, d.to_string()),
            Dev::VhostUser(p) => (IfaceKind::VhostUser, p.to_string()),
        };
        Command::Interface {
            name: self.name.to_string(),
            kind,
            dev,
            mac: self.mac,
            mtu: self.mtu,
            netns: self.netns.as_ref().map(Name::to_string),
            mode: self.mode,
            queues: self.queues,
            offload: self.offload,
            datapath: self.datapath,
            broadcast_limit: self.broadcast_limit,
            network: self.network,
            standby: self.standby,
            groups: self.groups.iter().map(Name::to_string).collect(),
            addresses: self.addresses.clone(),
        }
    }
}

/// Where a `route any MAC` request sends the MAC's frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum To {
    Interface(Name),
    Link(Name),
}

/// A request to vnetd, of typed values only. Write it with
/// [`Request::line`] (or `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `attach ...`: the interface made to hold, with its routes.
    Attach(Interface),
    /// `interface ...`: a declaration (in a transaction).
    Declare(Interface),
    /// `detach NAME`.
    Detach(Name),
    /// `activate NAME`.
    Activate(Name),
    /// `delete interface NAME`.
    DeleteInterface(Name),
    /// `delete route ID`.
    DeleteRoute(u32),
    /// `route any MAC -> interface|link NAME`.
    RouteMac {
        dst: MacAddr,
        to: To,
    },
    /// `ipam add SUBNET OWNER [range FIRST LAST]`.
    IpamAdd {
        subnet: Subnet,
        owner: Owner,
        range: Option<(IpAddr, IpAddr)>,
    },
    /// `ipam del OWNER`.
    IpamDel(Owner),
    /// `pod-labels NAMESPACE/NAME`: the pod's labels, which vnetd asks the
    /// Kubernetes API for as its pod's service account.
    PodLabels(PodRef),
    /// `announce MAC`.
    Announce(MacAddr),
    /// `neigh IP MAC [network N]` ([`Request::neigh`]: checked).
    Neigh(crate::neigh::Neigh),
    /// `delete neigh IP [network N]`.
    DeleteNeigh {
        ip: IpAddr,
        network: u32,
    },
    /// `rule NAME ...` ([`Request::rule`]: checked).
    Rule(Box<crate::policy::RuleDef>),
    /// `delete rule NAME`.
    DeleteRule(Name),
    /// `policy default allow|deny [network N]`.
    Policy {
        network: u32,
        verb: crate::policy::Verb,
    },
    /// `delete policy [network N]`.
    DeletePolicy(u32),
    /// `group NAME MAC`.
    Group(Name, MacAddr),
    /// `delete group NAME MAC`.
    DeleteGroup(Name, MacAddr),
    /// `show WHAT [json]`.
    Show {
        what: ShowWhat,
        json: bool,
    },
    /// `show drops [N] [since SEQ] [json]`.
    Drops(crate::drops::DropsQuery),
    /// `trace from ...` ([`Request::trace`]: checked).
    Trace(Box<crate::trace::TraceQuery>),
    /// `trace hex ...` ([`Request::trace_hex`]: checked).
    TraceHex(Box<crate::trace::TraceHex>),
    /// `show flows [N] [since SEQ] [json]`.
    Flows(crate::flows::FlowsQuery),
    Begin,
    Commit,
    Abort,
    Save,
}

impl Request {
    /// An `attach` of `i`, checked.
    pub fn attach(i: Interface) -> Result<Request, Invalid> {
        i.check()?;
        Ok(Request::Attach(i))
    }

    /// `neigh IP MAC [network N]`: a unicast address and MAC, or refused.
    pub fn neigh(ip: IpAddr, mac: MacAddr, network: u32) -> Result<Request, Invalid> {
        let pos = crate::Pos::default();
        crate::neigh::check_ip(pos, ip)
            .map_err(|_| invalid("address", &ip.to_string(), "a unicast IP address"))?;
        crate::neigh::check_mac(pos, mac).map_err(|_| invalid("mac", &mac.to_string(), "a unicast MAC"))?;
        Ok(Request::Neigh(crate::neigh::Neigh { ip, mac, network }))
    }

    /// A `rule` line of `r`, checked as the parser checks it (its name a
    /// [`Name`], ports only for TCP and UDP, a prefix without host bits).
    pub fn rule(r: crate::policy::RuleDef) -> Result<Request, Invalid> {
        Name::new(&r.name)?;
        for s in [&r.from, &r.to] {
            if let crate::policy::Sel::Group(g) = s {
                Name::new(g)?;
            }
        }
        r.check(crate::Pos::default()).map_err(|_| {
            invalid(
                "rule",
                &r.to_line(),
                "ports only with proto tcp or udp, low to high; prefixes without host bits",
            )
        })?;
        Ok(Request::Rule(Box::new(r)))
    }

    /// A `trace` of `q`, checked: an interface it names is a [`Name`].
    pub fn trace(q: crate::trace::TraceQuery) -> Result<Request, Invalid> {
        if let crate::trace::Source::Interface(n) = &q.from {
            Name::new(n)?;
        }
        Ok(Request::Trace(Box::new(q)))
    }

    /// A `trace hex` of `q`, checked as the parser checks it: an interface
    /// it names is a [`Name`], the frame at most
    /// [`crate::trace::MAX_HEX_FRAME`] bytes with its headers whole.
    pub fn trace_hex(q: crate::trace::TraceHex) -> Result<Request, Invalid> {
        match &q.via {
            Some(crate::trace::Source::Interface(n)) => {
                Name::new(n)?;
            }
            Some(crate::trace::Source::Ip(a)) => {
                return Err(invalid("in", &a.to_string(), "an interface's name or a MAC"));
            }
            _ => {}
        }
        if q.frame.len() > crate::trace::MAX_HEX_FRAME {
            let n = format!("{} bytes", q.frame.len());
            return Err(invalid("hex", &n, "a frame of at most 16384 bytes"));
        }
        if let Some((byte, what, _)) = crate::trace::truncation(&q.frame) {
            let cut = format!("{} bytes: {what} at byte {byte} cut short", q.frame.len());
            return Err(invalid("hex", &cut, "a frame with its headers whole"));
        }
        Ok(Request::TraceHex(Box::new(q)))
    }

    /// A declaration of `i`, checked.
    pub fn declare(i: Interface) -> Result<Request, Invalid> {
        i.check()?;
        Ok(Request::Declare(i))
    }

    /// The control line (no newline).
    pub fn line(&self) -> String {
        self.to_string()
    }

    /// The command vnetd's parser makes of [`Request::line`].
    pub fn command(&self) -> Command {
        match self {
            Request::Attach(i) => Command::Attach(Box::new(i.command())),
            Request::Declare(i) => i.command(),
            Request::Detach(n) => Command::Detach(n.to_string()),
            Request::Activate(n) => Command::Activate(n.to_string()),
            Request::DeleteInterface(n) => Command::DeleteInterface(crate::ast::Ref {
                pos: crate::Pos { line: 1, column: 18 },
                by: n.to_string(),
            }),
            Request::DeleteRoute(id) => {
                Command::DeleteRoute(crate::ast::Ref { pos: crate::Pos { line: 1, column: 14 }, by: *id })
            }
            Request::IpamAdd { subnet, owner, range } => Command::Ipam(IpamOp::Add {
                subnet: subnet.to_string(),
                owner: owner.to_string(),
                range: *range,
            }),
            Request::IpamDel(o) => Command::Ipam(IpamOp::Del { owner: o.to_string() }),
            Request::PodLabels(p) => Command::PodLabels(p.to_string()),
            Request::RouteMac { dst, to } => {
                use crate::ast::{From, IfaceRef, LinkRef, Ref, Target};
                // The name's column: after `route any MAC -> interface ` or `... link `.
                let at = |column| crate::Pos { line: 1, column };
                let to = match to {
                    To::Interface(n) => {
                        Target::Interface(Ref { pos: at(42), by: IfaceRef::Name(n.to_string()) })
                    }
                    To::Link(n) => Target::Link(Ref { pos: at(37), by: LinkRef::Name(n.to_string()) }),
                };
                Command::Route {
                    src: vnet_model::MacSpec::Any,
                    dst: vnet_model::MacSpec::Addr(*dst),
                    to,
                    from: From::Any,
                }
            }
            Request::Announce(m) => Command::Announce(*m),
            Request::Neigh(n) => Command::Neigh(*n),
            Request::DeleteNeigh { ip, network } => Command::DeleteNeigh(crate::ast::Ref {
                pos: crate::Pos { line: 1, column: 14 },
                by: (*ip, *network),
            }),
            Request::Rule(r) => Command::Rule(r.clone()),
            Request::DeleteRule(n) => Command::DeleteRule(crate::ast::Ref {
                pos: crate::Pos { line: 1, column: 13 },
                by: n.to_string(),
            }),
            Request::Policy { network, verb } => Command::Policy { network: *network, verb: *verb },
            Request::DeletePolicy(n) => {
                Command::DeletePolicy(crate::ast::Ref { pos: crate::Pos { line: 1, column: 8 }, by: *n })
            }
            Request::Group(n, mac) => Command::Group { name: n.to_string(), mac: *mac },
            Request::DeleteGroup(n, mac) => Command::DeleteGroup(crate::ast::Ref {
                pos: crate::Pos { line: 1, column: 14 },
                by: (n.to_string(), *mac),
            }),
            Request::Show { what, json } => Command::Show { what: *what, json: *json },
            Request::Drops(q) => Command::Drops(*q),
            Request::Trace(q) => Command::Trace(q.clone()),
            Request::TraceHex(q) => Command::TraceHex(q.clone()),
            Request::Flows(q) => Command::Flows(*q),
            Request::Begin => Command::Begin,
            Request::Commit => Command::Commit,
            Request::Abort => Command::Abort,
            Request::Save => Command::Save,
        }
    }
}

/// ` addresses A,B...` when there are any.
fn write_addresses(f: &mut fmt::Formatter<'_>, addresses: &[IpAddr]) -> fmt::Result {
    for (k, a) in addresses.iter().enumerate() {
        write!(f, "{}{a}", if k == 0 { " addresses " } else { "," })?;
    }
    Ok(())
}

/// The `show` word of `what`.
pub fn show_word(what: ShowWhat) -> &'static str {
    match what {
        ShowWhat::Routes => "routes",
        ShowWhat::Links => "links",
        ShowWhat::Interfaces => "interfaces",
        ShowWhat::Stats => "stats",
        ShowWhat::Config => "config",
        ShowWhat::Metrics => "metrics",
        ShowWhat::Matrix => "matrix",
        ShowWhat::Policy => "policy",
        ShowWhat::Cluster => "cluster",
        ShowWhat::Global => "global",
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Attach(i) => {
                f.write_str("attach ")?;
                i.write_words(f)
            }
            Request::Declare(i) => {
                f.write_str("interface ")?;
                i.write_words(f)
            }
            Request::Detach(n) => write!(f, "detach {n}"),
            Request::Activate(n) => write!(f, "activate {n}"),
            Request::DeleteInterface(n) => write!(f, "delete interface {n}"),
            Request::DeleteRoute(id) => write!(f, "delete route {id}"),
            Request::RouteMac { dst, to: To::Interface(n) } => write!(f, "route any {dst} -> interface {n}"),
            Request::RouteMac { dst, to: To::Link(n) } => write!(f, "route any {dst} -> link {n}"),
            Request::IpamAdd { subnet, owner, range } => {
                write!(f, "ipam add {subnet} {owner}")?;
                match range {
                    Some((a, b)) => write!(f, " range {a} {b}"),
                    None => Ok(()),
                }
            }
            Request::IpamDel(o) => write!(f, "ipam del {o}"),
            Request::PodLabels(p) => write!(f, "pod-labels {p}"),
            Request::Announce(m) => write!(f, "announce {m}"),
            Request::Neigh(n) => f.write_str(&n.to_line()),
            Request::DeleteNeigh { ip, network: 0 } => write!(f, "delete neigh {ip}"),
            Request::DeleteNeigh { ip, network } => write!(f, "delete neigh {ip} network {network}"),
            Request::Rule(r) => f.write_str(&r.to_line()),
            Request::DeleteRule(n) => write!(f, "delete rule {n}"),
            Request::Policy { network, verb } => f.write_str(&crate::policy::default_line(*network, *verb)),
            Request::DeletePolicy(0) => f.write_str("delete policy"),
            Request::DeletePolicy(n) => write!(f, "delete policy network {n}"),
            Request::Group(n, mac) => write!(f, "group {n} {mac}"),
            Request::DeleteGroup(n, mac) => write!(f, "delete group {n} {mac}"),
            Request::Show { what, json } => {
                write!(f, "show {}{}", show_word(*what), if *json { " json" } else { "" })
            }
            Request::Drops(q) => f.write_str(&q.line("drops")),
            Request::Trace(q) => write!(f, "{q}"),
            Request::TraceHex(q) => write!(f, "{q}"),
            Request::Flows(q) => f.write_str(&q.line("flows")),
            Request::Begin => f.write_str("begin"),
            Request::Commit => f.write_str("commit"),
            Request::Abort => f.write_str("abort"),
            Request::Save => f.write_str("save"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, parse_line, Section};
    use proptest::prelude::*;

    /// The one command `line` parses to; fails if it is not exactly one.
    fn parsed(line: &str) -> Command {
        let all = parse(line).unwrap_or_else(|e| panic!("`{line}`: {e}"));
        assert_eq!(all.len(), 1, "`{line}` is one command");
        assert!(!line.contains(['\n', '\r']), "`{line}`");
        parse_line(line, 1, &mut Section::None).unwrap().unwrap().item
    }

    /// The bounds of `Interface::check` and `Subnet`, each at its edge
    /// (mutation testing found them unchecked).
    #[test]
    fn an_interfaces_options_and_a_subnet_are_refused_just_past_their_bounds() {
        let tap = || Interface::new(Name::new("vm0").unwrap(), Dev::Tap(DevName::new("vt0").unwrap()));
        let with = |f: &dyn Fn(&mut Interface)| {
            let mut i = tap();
            f(&mut i);
            i.check()
        };
        assert!(with(&|i| i.mtu = Some(68)).is_ok() && with(&|i| i.mtu = Some(65535)).is_ok());
        assert!(with(&|i| i.mtu = Some(67)).is_err() && with(&|i| i.mtu = Some(65536)).is_err());
        assert!(with(&|i| i.broadcast_limit = 10_000_000).is_ok());
        assert!(with(&|i| i.broadcast_limit = 10_000_001).is_err());
        // Addresses: unicast, each once, at most 64; an attach carries them
        // as `addresses A,B`, which parses back to the same.
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let two = vec![ip("10.0.0.5"), ip("fd00::5")];
        assert!(with(&|i| i.addresses = two.clone()).is_ok());
        assert!(with(&|i| i.addresses = vec![ip("10.0.0.5"), ip("10.0.0.5")]).is_err());
        assert!(with(&|i| i.addresses = vec![ip("ff02::1")]).is_err());
        let most: Vec<IpAddr> = (0..64u8).map(|k| IpAddr::from([10, 0, 1, k])).collect();
        assert!(with(&|i| i.addresses = most.clone()).is_ok());
        assert!(with(&|i| i.addresses = [most.clone(), vec![ip("10.0.2.1")]].concat()).is_err());
        let mut i = tap();
        i.addresses = two.clone();
        let line = Request::attach(i.clone()).unwrap().line();
        assert!(line.ends_with(" addresses 10.0.0.5,fd00::5"), "{line}");
        let parsed = crate::parse(&line).unwrap().remove(0).item;
        assert_eq!(Interface::from_command(&parsed).unwrap(), i);
        let vhost = |f: &dyn Fn(&mut Interface)| {
            let mut i = Interface::new(
                Name::new("g").unwrap(),
                Dev::VhostUser(SocketPath::new("/run/g.sock").unwrap()),
            );
            f(&mut i);
            i.check()
        };
        assert!(vhost(&|_| {}).is_ok());
        assert!(vhost(&|i| i.mtu = Some(9000)).is_err(), "a vhost-user interface has no MTU of its own");
        assert!(vhost(&|i| i.netns = Some(Name::new("ns").unwrap())).is_err(), "nor a namespace");
        for (text, ok) in [
            ("10.0.0.0/24", true),
            ("10.0.0.0/024", true),
            ("10.0.0.0/", false),
            ("10.0.0.0/0024", false),
            ("10.0.0.0/+24", false),
            ("10.0.0.0/33", false),
        ] {
            assert_eq!(text.parse::<Subnet>().is_ok(), ok, "{text}");
        }
    }

    #[test]
    fn values_that_would_end_a_line_start_a_word_or_a_comment_are_refused() {
        for bad in [
            "/tmp/x\nlink evil udp 10.0.0.9:9000",
            "/tmp/a b",
            "/tmp/a#b",
            "tmp/x",
            "/tmp/../x",
            "/",
            "/a//b",
            "/a\u{1b}b",
        ] {
            assert!(SocketPath::new(bad).is_err(), "{bad:?}");
        }
        for bad in ["", "1a", "a b", "a\n", "any", "a#", &"a".repeat(65)] {
            assert!(Name::new(bad).is_err(), "{bad:?}");
        }
        for bad in ["", "eth0 mac", "0123456789abcdef", "a/b"] {
            assert!(DevName::new(bad).is_err(), "{bad:?}");
        }
        for bad in ["10.0.0.0/24\nlink x", "10.0.0.0/33", "10.0.0.0", "10.0.0.0/+8", "::/129", "x/8"] {
            assert!(bad.parse::<Subnet>().is_err(), "{bad:?}");
        }
        assert!(Owner::new("net/c1/eth0 range").is_err() && Owner::new("").is_err());
        for bad in
            ["web", "default/", "/web", "default/web/x", "default/../nodes", "Default/web", "a/web\nshow"]
        {
            assert!(PodRef::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(PodRef::new("shop/web-0.a").unwrap().parts(), ("shop", "web-0.a"));
        let e = SocketPath::new("/tmp/x\nlink evil").unwrap_err().to_string();
        assert!(e.contains("\\n") && !e.contains('\n'), "the refusal quotes the value escaped: {e}");
    }

    #[test]
    fn requests_are_the_lines_vnetd_reads() {
        let mut i = Interface::new(Name::new("c1").unwrap(), Dev::Netdev(DevName::new("vc1").unwrap()));
        i.mac = Some("52:54:00:00:00:07".parse().unwrap());
        i.network = 7;
        i.datapath = Datapath::Kernel;
        let r = Request::attach(i.clone()).unwrap();
        assert_eq!(r.line(), "attach c1 netdev vc1 mac 52:54:00:00:00:07 datapath kernel network 7");
        assert_eq!(parsed(&r.line()), r.command());
        let mut g = i.clone();
        g.groups = vec![Name::new("web").unwrap(), Name::new("tier-1").unwrap()];
        let r = Request::attach(g.clone()).unwrap();
        assert!(r.line().ends_with("network 7 group web group tier-1"), "{}", r.line());
        assert_eq!(parsed(&r.line()), r.command());
        g.groups.push(Name::new("web").unwrap());
        assert!(Request::attach(g).is_err(), "a group twice");
        let mut no_mac = i.clone();
        (no_mac.mac, no_mac.groups) = (None, vec![Name::new("web").unwrap()]);
        assert!(Request::attach(no_mac).is_err(), "a group holds MACs");
        let sub: Subnet = "10.88.0.0/24".parse().unwrap();
        let r = Request::IpamAdd { subnet: sub, owner: Owner::new("n/c/eth0").unwrap(), range: None };
        assert_eq!(r.line(), "ipam add 10.88.0.0/24 n/c/eth0");
        assert_eq!(parsed(&r.line()), r.command());
        let mut v = i;
        v.dev = Dev::VhostUser(SocketPath::new("/run/vnet/vhost/c1.sock").unwrap());
        assert!(Request::attach(v.clone()).is_err(), "vhost-user is never on the kernel path");
        v.datapath = Datapath::Auto;
        v.standby = true;
        let r = Request::attach(v).unwrap();
        assert_eq!(parsed(&r.line()), r.command());
        // A parsed declaration, typed again, is the same line's command.
        let i = Interface::from_command(&r.command()).unwrap();
        assert_eq!(Request::Attach(i).command(), r.command());
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z][a-z0-9_.-]{0,10}",
            "/[a-z0-9/._-]{0,20}",
            "[a-z][a-z0-9_.-]{0,10}",
            "/[a-z0-9/._-]{0,20}",
            "\\PC{0,20}",
            ".{0,20}",
            "[a-z/]{1,5}[ \n\r\t#\u{0}\u{7f}\u{85}\u{2028}][a-z ]{0,10}",
        ]
    }

    fn show() -> impl Strategy<Value = ShowWhat> {
        prop::sample::select(vec![
            ShowWhat::Routes,
            ShowWhat::Links,
            ShowWhat::Interfaces,
            ShowWhat::Stats,
            ShowWhat::Config,
            ShowWhat::Metrics,
            ShowWhat::Matrix,
            ShowWhat::Cluster,
            ShowWhat::Global,
            ShowWhat::Policy,
        ])
    }

    /// Builds a request of kind `k` from raw field values; `None` where a
    /// type refuses them.
    #[allow(clippy::too_many_arguments)]
    fn build(
        k: u8,
        a: &str,
        b: &str,
        mac: [u8; 6],
        n: u32,
        small: u32,
        ip: [u8; 4],
        flags: u8,
        what: ShowWhat,
    ) -> Option<Request> {
        let name = || Name::new(a).ok();
        Some(match k % 20 {
            0 | 1 => {
                let dev = match flags % 3 {
                    0 => Dev::Tap(DevName::new(b).ok()?),
                    1 => Dev::Netdev(DevName::new(b).ok()?),
                    _ => Dev::VhostUser(SocketPath::new(b).ok()?),
                };
                let mut i = Interface::new(name()?, dev);
                i.mac = (flags & 4 != 0).then_some(MacAddr(mac));
                i.mtu = (flags & 8 != 0).then_some(small);
                i.netns = if flags & 16 != 0 { Some(Name::new(b).ok()?) } else { None };
                // Mostly in range, sometimes not.
                i.queues = if flags & 128 != 0 { small % 20 } else { 1 + small % 16 };
                i.offload = flags & 32 == 0;
                i.datapath = [Datapath::User, Datapath::Kernel, Datapath::Auto][(n % 3) as usize];
                i.mode = [Mode::Notify, Mode::Poll, Mode::Adaptive][(small % 3) as usize];
                i.broadcast_limit = if flags & 2 != 0 { n % 20_000_000 } else { n % 10_000_001 };
                i.network = n;
                i.standby = flags & 64 != 0;
                // Sometimes in groups (a group's name from the name's own text).
                if n % 5 == 0 {
                    i.groups = vec![name()?];
                }
                if k % 13 == 0 {
                    Request::attach(i).ok()?
                } else {
                    Request::declare(i).ok()?
                }
            }
            2 => Request::Detach(name()?),
            3 => Request::Activate(name()?),
            4 => Request::DeleteInterface(name()?),
            5 => Request::DeleteRoute(n),
            6 => {
                let subnet = Subnet::new(IpAddr::from(ip), (small % 40) as u8).ok()?;
                let range = (flags & 1 != 0)
                    .then(|| (IpAddr::from(ip), IpAddr::from(mac[..4].try_into().unwrap_or(ip))));
                Request::IpamAdd { subnet, owner: Owner::new(a).ok()?, range }
            }
            7 => Request::IpamDel(Owner::new(b).ok()?),
            8 => Request::Announce(MacAddr(mac)),
            10 => Request::neigh(IpAddr::from(ip), MacAddr(mac), n % 3).ok()?,
            11 => Request::DeleteNeigh { ip: IpAddr::from(ip), network: n % 3 },
            12 => {
                use crate::policy::{RuleDef, Sel, Verb};
                let sel = |k: u8| match k % 4 {
                    0 => Some(Sel::Any),
                    1 => Some(Sel::Mac(MacAddr(mac))),
                    2 => Some(Sel::Group(b.to_string())),
                    _ => Some(Sel::Net(IpAddr::from(ip), (small % 40) as u8)),
                };
                let r = RuleDef {
                    name: a.to_string(),
                    verb: if flags & 1 != 0 { Verb::Allow } else { Verb::Deny },
                    network: n % 3,
                    priority: small,
                    from: sel(flags >> 1)?,
                    to: sel(flags >> 3)?,
                    ether: (flags & 32 != 0).then_some((small % 65536) as u16),
                    proto: (flags & 64 != 0).then_some(mac[0]),
                    ports: (flags & 128 != 0).then_some((mac[1].into(), (small % 65536) as u16)),
                };
                Request::rule(r).ok()?
            }
            13 => Request::DeleteRule(name()?),
            14 => Request::Policy { network: n % 3, verb: crate::policy::Verb::Deny },
            15 => Request::Group(name()?, MacAddr(mac)),
            16 => Request::DeleteGroup(name()?, MacAddr(mac)),
            17 => Request::DeletePolicy(n % 2),
            18 => Request::PodLabels(PodRef::new(&format!("{a}/{b}")).ok()?),
            9 => {
                let to = if flags & 1 != 0 { To::Link(name()?) } else { To::Interface(name()?) };
                Request::RouteMac { dst: MacAddr(mac), to }
            }
            _ => Request::Show { what, json: flags & 1 != 0 },
        })
    }

    proptest! {
        #[test]
        fn any_field_values_are_refused_or_parse_to_exactly_that_request_once(
            k in any::<u8>(), a in text(), b in text(), mac in any::<[u8; 6]>(), n in any::<u32>(),
            small in 0u32..70000, ip in any::<[u8; 4]>(), flags in any::<u8>(), what in show(),
        ) {
            if let Some(r) = build(k, &a, &b, mac, n, small, ip, flags, what) {
                let line = r.line();
                prop_assert!(!line.contains(|c: char| !crate::lex::allowed(c)), "{:?}", line);
                let all = parse(&line).map_err(|e| TestCaseError::fail(format!("`{line}`: {e}")))?;
                prop_assert_eq!(all.len(), 1);
                prop_assert_eq!(&all[0].item, &r.command(), "{}", line);
            }
        }
    }
}
