//! What the control language says, parsed but not yet checked against state.

pub use crate::transport::{Cipher, Format, IfName, PeerKey, Security, Transport};
use crate::Pos;
use std::net::{IpAddr, SocketAddr};
use vnet_model::MacSpec;
use vnet_wire::MacAddr;

/// Broadcast and multicast frames a second an interface's VM may send
/// unless its `broadcast-limit` says otherwise: far above what ARP,
/// neighbour discovery and DHCP need, far below a storm (a VM in a
/// forwarding loop sends hundreds of thousands a second).
pub const DEFAULT_BROADCAST_LIMIT: u32 = 1000;

/// The most policy groups an interface may be in (`group G`, repeated).
pub const MAX_IFACE_GROUPS: usize = 16;

/// The most addresses an interface's `addresses` names.
pub const MAX_IFACE_ADDRESSES: usize = 64;

/// A command and where it started.
#[derive(Debug, Clone, PartialEq)]
pub struct Located<T> {
    pub pos: Pos,
    pub item: T,
}

/// A name or address that refers to something, with its position so a
/// failed lookup can point at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref<T> {
    pub pos: Pos,
    pub by: T,
}

/// How a route or command names a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkRef {
    Name(String),
    /// Palacios style: the remote host's IP.
    Ip(IpAddr),
    /// `del <link-idx>`.
    Id(u32),
}

/// How a route or command names an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfaceRef {
    Name(String),
    /// Palacios style: the interface's MAC.
    Mac(MacAddr),
}

/// Where a route sends frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Link(Ref<LinkRef>),
    Interface(Ref<IfaceRef>),
}

/// Which arrivals a route considers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    Any,
    Link(Ref<LinkRef>),
    Interface(Ref<IfaceRef>),
}

/// The files of a host's TLS identity and trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

/// A `cluster` line: cluster mode's settings in the config file (the same
/// as vnetd's `--cluster`, `--network`, `--etcd-*` ... flags; see
/// `docs/CLUSTER.md`). Taken at start only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterLine {
    /// `etcd:URL[,URL...]`, as `--cluster` takes it.
    pub store: String,
    pub network: String,
    pub host: Option<String>,
    pub advertise: Option<SocketAddr>,
    pub ttl: Option<u64>,
    pub etcd_ca: Option<String>,
    pub etcd_cert: Option<String>,
    pub etcd_key: Option<String>,
    pub etcd_user: Option<String>,
    pub etcd_password_file: Option<String>,
    /// A file holding the network's public key.
    pub network_key: Option<String>,
    pub host_cert: Option<String>,
    /// This host's private key file (as `vnetd --key`): its links' identity
    /// and its claim key, so a secured cluster needs nothing on the
    /// command line.
    pub key: Option<String>,
    /// What follows `link`: the words of `--cluster-link-options`.
    pub link: Vec<String>,
}

impl ClusterLine {
    /// The line, as the parser reads it.
    pub fn to_line(&self) -> String {
        use std::fmt::Write;
        let mut s = format!("cluster {} network {}", self.store, self.network);
        let words: [(&str, Option<String>); 11] = [
            ("host", self.host.clone()),
            ("advertise", self.advertise.map(|a| a.to_string())),
            ("ttl", self.ttl.map(|t| t.to_string())),
            ("etcd-ca", self.etcd_ca.clone()),
            ("etcd-cert", self.etcd_cert.clone()),
            ("etcd-key", self.etcd_key.clone()),
            ("etcd-user", self.etcd_user.clone()),
            ("etcd-password-file", self.etcd_password_file.clone()),
            ("network-key", self.network_key.clone()),
            ("host-cert", self.host_cert.clone()),
            ("key", self.key.clone()),
        ];
        for (k, v) in words {
            if let Some(v) = v {
                let _ = write!(s, " {k} {v}");
            }
        }
        if !self.link.is_empty() {
            let _ = write!(s, " link {}", self.link.join(" "));
        }
        s
    }
}

/// How vnetd reaches an interface's VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IfaceKind {
    /// vnetd holds the TAP's file descriptor; the TAP netdev is the VM's NIC
    /// (a container that owns it).
    #[default]
    Tap,
    /// vnetd attaches to an existing netdev with a packet socket: a TAP that
    /// QEMU holds, or the host end of a container's veth.
    Netdev,
    /// vnetd serves a vhost-user socket (QEMU `-netdev vhost-user`) and
    /// reads and writes the guest's virtio rings; `dev` is the socket path.
    VhostUser,
}

impl IfaceKind {
    pub fn word(self) -> &'static str {
        match self {
            IfaceKind::Tap => "tap",
            IfaceKind::Netdev => "netdev",
            IfaceKind::VhostUser => "vhost-user",
        }
    }
}

/// How a worker waits for frames (the paper's dispatch modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Sleep until the kernel says a frame is there: lowest CPU, a wake-up
    /// per burst (the paper's guest-driven mode).
    Notify,
    /// Keep polling for a while after the last frame before sleeping:
    /// no wake-ups under load (the paper's VMM-driven mode).
    Poll,
    /// Switch between the two by frame rate, with hysteresis.
    #[default]
    Adaptive,
}

impl Mode {
    pub fn word(self) -> &'static str {
        match self {
            Mode::Notify => "notify",
            Mode::Poll => "poll",
            Mode::Adaptive => "adaptive",
        }
    }
}

/// Which path moves an interface's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Datapath {
    /// vnetd's workers (every interface kind).
    User,
    /// The in-kernel eBPF fast path for unicast, the user path for the
    /// rest; the interface fails to attach if the programs cannot load.
    Kernel,
    /// The kernel path when it can be used (a netdev in vnetd's namespace,
    /// programs loaded), else the user path, with the reason logged.
    #[default]
    Auto,
}

impl Datapath {
    pub fn word(self) -> &'static str {
        match self {
            Datapath::User => "user",
            Datapath::Kernel => "kernel",
            Datapath::Auto => "auto",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShowWhat {
    Routes,
    Links,
    Interfaces,
    Stats,
    Config,
    /// Every counter in the Prometheus text format.
    Metrics,
    /// The traffic matrix: frames and bytes per MAC pair, top pairs first.
    Matrix,
    /// Cluster mode: membership, the watch revision, the store's health.
    Cluster,
    /// The daemon-wide counters alone (`stats` less its per-port and
    /// per-route rows: what a script polls at 100000 routes).
    Global,
    /// Each network's policy: its rules in order, with the packets each
    /// decided and dropped, and its flows.
    Policy,
}

/// One parsed command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `listen udp ADDR:PORT [mode M]`.
    Listen {
        addr: SocketAddr,
        mode: Option<Mode>,
    },
    /// `interface NAME tap|netdev DEV [mac M] [mtu N] [netns NS] [mode M] [queues N] [offload on|off]
    /// [datapath user|kernel|auto] [broadcast-limit N] [network N] [standby]`.
    Interface {
        name: String,
        kind: IfaceKind,
        dev: String,
        mac: Option<MacAddr>,
        mtu: Option<u32>,
        netns: Option<String>,
        mode: Mode,
        queues: u32,
        offload: bool,
        datapath: Datapath,
        /// Broadcast and multicast frames a second the VM may send (0: no limit).
        broadcast_limit: u32,
        /// The network (tenant) it belongs to: its frames go only to ports
        /// of the same network (0 unless given).
        network: u32,
        /// A migrating VM's port at its destination: nothing is routed to
        /// it and its MAC is not claimed until the VM sends from it (its
        /// first frame after the migration, QEMU's announcement), or until
        /// `activate NAME` (`docs/INTEGRATION.md`, live migration).
        standby: bool,
        /// `group G` (repeatable): the policy groups its MAC is in
        /// (`docs/POLICY.md`).
        groups: Vec<String>,
        /// `addresses A[,B...]`: the IP addresses the VM owns (the IP
        /// source guard's, with its `neigh` lines'; `docs/control.md`).
        addresses: Vec<std::net::IpAddr>,
    },
    /// `link NAME udp ADDR[:PORT] [format raw|vnet] [network N] [mtu N]`,
    /// `link NAME vxlan ADDR[:PORT] vni N [mtu N]`, or the Palacios
    /// `add IP PORT [udp]` (then `name` is `None`).
    Link {
        name: Option<String>,
        transport: Transport,
        mtu: u32,
    },
    /// `listen vxlan ADDR:PORT`: where VXLAN datagrams are received.
    ListenVxlan(SocketAddr),
    /// `listen tcp ADDR:PORT`: where peers' TCP (and TLS) links connect.
    ListenTcp(SocketAddr),
    /// `tls cert FILE key FILE ca FILE`: this host's certificate chain and
    /// key (PEM) for TLS links, and the CA its peers' certificates must
    /// chain to.
    Tls(TlsFiles),
    /// `cluster etcd:URL[,URL...] network NAME [host NAME] [advertise ADDR:PORT]
    /// [ttl SECS] [etcd-ca FILE] [etcd-cert FILE etcd-key FILE] [etcd-user NAME
    /// etcd-password-file FILE] [network-key FILE] [host-cert FILE] [link WORDS...]`.
    Cluster(Box<ClusterLine>),
    /// `route SRC DST -> TARGET [from ...]`, or the Palacios route `add`.
    Route {
        src: MacSpec,
        dst: MacSpec,
        to: Target,
        from: From,
    },
    /// `neigh IP MAC [network N]`: address resolution for IP answered at
    /// the edge ([`crate::neigh`]).
    Neigh(crate::neigh::Neigh),
    /// `delete neigh IP [network N]`.
    DeleteNeigh(Ref<(std::net::IpAddr, u32)>),
    /// `policy default allow|deny [network N]` ([`crate::policy`]).
    Policy {
        network: u32,
        verb: crate::policy::Verb,
    },
    /// `delete policy [network N]`.
    DeletePolicy(Ref<u32>),
    /// `rule NAME allow|deny [...]` ([`crate::policy`]).
    Rule(Box<crate::policy::RuleDef>),
    /// `delete rule NAME`.
    DeleteRule(Ref<String>),
    /// `group NAME MAC`: MAC is in group NAME (rules' `group` selectors).
    Group {
        name: String,
        mac: MacAddr,
    },
    /// `delete group NAME MAC`.
    DeleteGroup(Ref<(String, MacAddr)>),
    DeleteRoute(Ref<u32>),
    DeleteLink(Ref<LinkRef>),
    DeleteInterface(Ref<String>),
    Show {
        what: ShowWhat,
        json: bool,
    },
    /// `show drops [N] [since SEQ] [json]` ([`crate::drops`]).
    Drops(crate::drops::DropsQuery),
    /// `trace from SRC to IP ...` ([`crate::trace`]): a frame's way, dry-run.
    Trace(Box<crate::trace::TraceQuery>),
    /// `trace hex HEX ...` ([`crate::trace::TraceHex`]): a frame's bytes, dry-run.
    TraceHex(Box<crate::trace::TraceHex>),
    /// `show flows [N] [since SEQ] [json]` ([`crate::flows`]).
    Flows(crate::flows::FlowsQuery),
    /// `announce MAC`: send a broadcast RARP from MAC over every link, as a
    /// relocated VM's new host does so that learning switches and caches
    /// on the way re-learn where MAC lives.
    Announce(MacAddr),
    /// `save`: write the running configuration back to vnetd's config file.
    Save,
    /// `reload`: apply the config file's difference from the running state
    /// as one transaction (what `SIGHUP` does).
    Reload,
    /// `attach NAME KIND DEV [options]`: an `interface` line (the same
    /// words after the keyword) made to hold, with its `route any MAC`
    /// and broadcast routes, as one transaction: nothing changes if it
    /// already runs as declared, it is replaced if it runs otherwise.
    /// Control endpoint only; what CNI plugins and hooks call
    /// ([`crate::attach::attach`]).
    Attach(Box<Command>),
    /// `detach NAME`: the interface and every route that uses it go, as
    /// one transaction; nothing happens (and no error) if there is no
    /// such interface ([`crate::attach::detach`]).
    Detach(String),
    /// `activate NAME`: a `standby` interface becomes active, as when its
    /// VM's first frame arrives: routed (`route any MAC` and broadcast,
    /// replacing what routed the MAC elsewhere), claimed in cluster mode,
    /// announced. Nothing happens if it is active already
    /// ([`crate::attach::activate`]).
    Activate(String),
    /// `ipam add SUBNET OWNER [range FIRST LAST]` / `ipam del OWNER`:
    /// an address of the network's subnet held across hosts (cluster
    /// mode; `docs/INTEGRATION.md`). Control endpoint only.
    Ipam(IpamOp),
    /// `pod-labels NAMESPACE/NAME` (a [`crate::request::PodRef`], checked):
    /// the labels of a Kubernetes pod, which vnetd asks the API for as its
    /// pod's service account. Control endpoint only.
    PodLabels(String),
    /// Starts a transaction on the control socket.
    Begin,
    /// Applies the transaction.
    Commit,
    /// Discards the transaction.
    Abort,
}

/// What a `pod-labels` pod must be ([`is_pod_ref`]).
pub const POD_EXPECTED: &str = "NAMESPACE/NAME, each 1-253 of a-z0-9.- (alphanumeric at both ends)";

/// True for a Kubernetes object name, which is what a namespace or a pod is
/// called: an RFC 1123 subdomain, 1-253 of `a-z0-9.-`, alphanumeric at both
/// ends.
pub fn is_kube_name(v: &str) -> bool {
    (1..=253).contains(&v.len())
        && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// True for a Kubernetes pod as `NAMESPACE/NAME`, each a Kubernetes object
/// name ([`is_kube_name`]).
pub fn is_pod_ref(s: &str) -> bool {
    s.split_once('/').is_some_and(|(ns, pod)| is_kube_name(ns) && is_kube_name(pod))
}

/// What `ipam` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpamOp {
    /// An address of `subnet` (`ADDR/LEN`, checked) for `owner`, from
    /// `range` if given; the one `owner` holds already if any.
    Add { subnet: String, owner: String, range: Option<(IpAddr, IpAddr)> },
    /// Releases what `owner` holds (on this host).
    Del { owner: String },
}

/// How the control protocol treats a command: written once here, and
/// asked by the parser's users (the state, the daemon's control endpoint,
/// the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Declares or deletes: a config file's line, a transaction's, what
    /// [`crate::State::apply`] takes.
    Change,
    /// Answered by the daemon at once (`show`, `announce`, `save`,
    /// `reload`, `attach`, `detach`, `activate`): never in a config file
    /// or a transaction.
    Query,
    /// Opens or ends a transaction (`begin`, `commit`, `abort`).
    Session,
    /// Answered away from the daemon's lock, by waiting on something else
    /// (`ipam`: etcd; `pod-labels`: the Kubernetes API).
    Waiting,
}

impl Command {
    /// How the control protocol treats this command.
    pub fn class(&self) -> Class {
        match self {
            Command::Show { .. }
            | Command::Drops(_)
            | Command::Trace(_)
            | Command::TraceHex(_)
            | Command::Flows(_)
            | Command::Announce(_)
            | Command::Save
            | Command::Reload
            | Command::Attach(_)
            | Command::Detach(_)
            | Command::Activate(_) => Class::Query,
            Command::Begin | Command::Commit | Command::Abort => Class::Session,
            Command::Ipam(_) | Command::PodLabels(_) => Class::Waiting,
            _ => Class::Change,
        }
    }

    /// True for commands that change state (and so may appear in a config file
    /// or a transaction): [`Class::Change`].
    pub fn is_change(&self) -> bool {
        self.class() == Class::Change
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;

    #[test]
    fn a_peer_key_is_exactly_32_bytes_of_padded_base64_and_debug_shows_it() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let k = PeerKey::from_base64(&b64.encode([7u8; 32])).unwrap();
        assert_eq!(k.0, [7u8; 32]);
        assert_eq!(format!("{k:?}"), format!("PeerKey({})", b64.encode([7u8; 32])));
        // 44 characters that decode to 33 bytes, and 31 bytes: refused.
        let thirty_three = b64.encode([7u8; 33]);
        assert_eq!(thirty_three.len(), 44);
        assert_eq!(PeerKey::from_base64(&thirty_three), None);
        assert_eq!(PeerKey::from_base64(&b64.encode([7u8; 31])), None);
    }

    #[test]
    fn an_interface_name_reads_and_prints_as_given() {
        let n = IfName::new("vnet0").unwrap();
        assert_eq!(
            (n.as_str(), n.to_string(), format!("{n:?}")),
            ("vnet0", "vnet0".into(), "\"vnet0\"".into())
        );
    }

    #[test]
    fn each_link_kind_names_its_word_and_its_peer() {
        let s = State::default()
            .apply_all(
                &crate::parse(
                    "link u udp 10.0.0.2\nlink x vxlan 10.0.0.4 vni 42\nlink t tcp 192.0.2.9:9443\nlink l direct eth1\n",
                )
                .unwrap(),
            )
            .unwrap();
        let got: Vec<(&str, String)> =
            s.links.values().map(|l| (l.transport.word(), l.transport.peer())).collect();
        assert_eq!(
            got,
            [
                ("udp", "10.0.0.2".to_string()),
                ("vxlan", "10.0.0.4".into()),
                ("tcp", "192.0.2.9".into()),
                ("direct", "eth1".into())
            ]
        );
    }

    #[test]
    fn only_declarations_are_changes() {
        let c = |line: &str| crate::parse(line).unwrap().remove(0).item;
        for line in [
            "interface vm0 tap vt0",
            "link a udp 10.0.0.2",
            "route any any -> interface vm0",
            "delete route 3",
        ] {
            assert!(c(line).is_change(), "{line}");
        }
        for line in
            ["show routes", "save", "reload", "begin", "commit", "abort", "announce 52:54:00:00:00:01"]
        {
            assert!(!c(line).is_change(), "{line}");
        }
    }
}
