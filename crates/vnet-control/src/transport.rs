//! Link kinds: everything the control language knows of each kind in one
//! place. The [`Transport`] variant (one per kind), its words (how a link
//! of it is written and read: [`Transport::words`] and the grammar below),
//! and where its peer is heard ([`Transport::rx_key`]). Every `match` on a
//! kind here is exhaustive, so a new kind is a variant and the compiler
//! lists the arms to add; outside this file, a kind appears in four more
//! places (`docs/ARCHITECTURE.md`, "Adding a link kind", checked by
//! `scripts/shape.py`).

use crate::cursor::Parser;
use crate::lex::found;
use crate::{Error, Pos, Result};
use std::net::{IpAddr, SocketAddr};

/// The UDP port of Palacios VNET/P links, and vnet's default.
pub const DEFAULT_PORT: u16 = 9000;
/// The underlay MTU a link assumes unless told.
pub const DEFAULT_LINK_MTU: u32 = 1500;

/// The link formats of the `vnet` UDP links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// The UDP payload is the Ethernet frame (Palacios VNET/P compatible).
    #[default]
    Raw,
    /// vnet's own header: network id, fragments (see docs/wire.md).
    Vnet,
}

/// What protects a `udp` link's datagrams (`security auth|encrypt`, with
/// the peer's `peer-key`): see `docs/SECURITY.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Security {
    /// Nothing: any datagram from the peer's address is taken.
    #[default]
    None,
    /// Every datagram authenticated (a 16-byte tag), not encrypted.
    Auth(PeerKey),
    /// Every datagram authenticated and encrypted.
    Encrypt(PeerKey),
}

impl Security {
    pub fn peer_key(&self) -> Option<PeerKey> {
        match self {
            Security::None => None,
            Security::Auth(k) | Security::Encrypt(k) => Some(*k),
        }
    }

    /// The `security` word.
    pub fn word(&self) -> &'static str {
        match self {
            Security::None => "none",
            Security::Auth(_) => "auth",
            Security::Encrypt(_) => "encrypt",
        }
    }
}

/// The AEAD a secured link's sessions use (`cipher auto|aes-256-gcm|
/// chacha20-poly1305`). `Auto` takes AES-256-GCM when both ends' CPUs
/// have AES and carry-less multiply instructions, ChaCha20-Poly1305
/// otherwise; a named cipher is the only one the link accepts. The
/// handshake binds the choice (`docs/SECURITY.md`, "Ciphers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cipher {
    #[default]
    Auto,
    Aes256Gcm,
    ChaCha20Poly1305,
}

impl Cipher {
    /// The words the `cipher` option takes, in [`Cipher::word`]'s order.
    pub const WORDS: [&'static str; 3] = ["auto", "aes-256-gcm", "chacha20-poly1305"];

    /// The `cipher` word.
    pub fn word(self) -> &'static str {
        match self {
            Cipher::Auto => Self::WORDS[0],
            Cipher::Aes256Gcm => Self::WORDS[1],
            Cipher::ChaCha20Poly1305 => Self::WORDS[2],
        }
    }

    pub fn from_word(w: &str) -> Option<Cipher> {
        [Cipher::Auto, Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305].into_iter().find(|c| c.word() == w)
    }
}

/// A host's X25519 public key: 32 bytes, written in standard base64 (as
/// WireGuard's keys are).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey(pub [u8; 32]);

impl PeerKey {
    /// Decodes a base64 key; `None` unless it is exactly 32 bytes.
    pub fn from_base64(s: &str) -> Option<PeerKey> {
        use base64::Engine;
        let mut out = [0u8; 33];
        let n = base64::engine::general_purpose::STANDARD.decode_slice(s, &mut out).ok()?;
        (n == 32 && s.len() == 44).then(|| {
            let mut k = [0u8; 32];
            k.copy_from_slice(&out[..32]);
            PeerKey(k)
        })
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use base64::Engine;
        f.write_str(&base64::engine::general_purpose::STANDARD.encode(self.0))
    }
}

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerKey({self})")
    }
}

/// How a link reaches its peer: one variant per link kind. Every `match` on
/// it is exhaustive, so a new kind is one variant here and the compiler names
/// every place that must learn it (parser, state, engine, daemon, kernel path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// UDP to a peer vnetd (`vnet` format, optionally authenticated or
    /// encrypted) or a Palacios host (`raw`). `nat`: the path may cross NAT
    /// (a secured link only): datagrams go from the listening socket (one
    /// NAT mapping) and the link follows its peer's authenticated address
    /// and port (`docs/MULTISITE.md`). `relay`: the public key of a host
    /// (one of this host's secured links' peers, running `vnetd --relay`)
    /// that carries the link's datagrams, still sealed end to end, while
    /// the peer is not heard from directly. `cipher`: a secured link's
    /// AEAD (always `Auto` on a link without a key).
    Udp {
        remote: SocketAddr,
        format: Format,
        network: u32,
        security: Security,
        cipher: Cipher,
        nat: bool,
        relay: Option<PeerKey>,
    },
    /// VXLAN (RFC 7348) to a VTEP: a Linux vxlan device, Open vSwitch, a
    /// switch, or another vnetd. One frame per datagram, never fragmented.
    Vxlan { remote: SocketAddr, vni: u32 },
    /// A TCP connection to a peer vnetd (where UDP cannot pass), optionally
    /// in TLS 1.3 with mutual certificate authentication (`tls`).
    Tcp { remote: SocketAddr, tls: bool },
    /// Raw Ethernet on a local device (VNET/P's direct send and receive):
    /// the overlay and the physical LAN on `dev` become one broadcast
    /// domain. An edge of the overlay, not a link to another host.
    Direct { dev: IfName },
}

/// A network device's name as Linux allows it (1-15 bytes, no `/`, no
/// white space, not `.` or `..`), held inline so a [`Transport`] is a
/// plain value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IfName {
    len: u8,
    bytes: [u8; 15],
}

impl IfName {
    pub fn new(s: &str) -> Option<IfName> {
        let ok = (1..=15).contains(&s.len())
            && s != "."
            && s != ".."
            && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
        if !ok {
            return None;
        }
        let mut bytes = [0u8; 15];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Some(IfName { len: s.len() as u8, bytes })
    }

    pub fn as_str(&self) -> &str {
        // Built from a `&str` of ASCII bytes only.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Display for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl Transport {
    /// The peer's underlay address (a `direct` link has none).
    pub fn remote(&self) -> Option<SocketAddr> {
        match self {
            Transport::Udp { remote, .. }
            | Transport::Vxlan { remote, .. }
            | Transport::Tcp { remote, .. } => Some(*remote),
            Transport::Direct { .. } => None,
        }
    }

    /// What the link reaches, for messages: the peer's address, or the device.
    pub fn peer(&self) -> String {
        match self {
            Transport::Direct { dev } => dev.to_string(),
            t => t.remote().map_or_else(String::new, |r| r.ip().to_string()),
        }
    }

    /// The kind's word in the control language.
    pub fn word(&self) -> &'static str {
        match self {
            Transport::Udp { .. } => "udp",
            Transport::Vxlan { .. } => "vxlan",
            Transport::Tcp { .. } => "tcp",
            Transport::Direct { .. } => "direct",
        }
    }

    /// What a frame travels in, as `show links` names it (`raw`, `vnet`,
    /// `vxlan`, `stream`, `tls`, `ethernet`), and the number that names its
    /// network there (a `vnet` link's network id, a VXLAN link's VNI; 0).
    pub fn encapsulation(&self) -> (&'static str, u32) {
        match *self {
            Transport::Udp { format: Format::Raw, network, .. } => ("raw", network),
            Transport::Udp { format: Format::Vnet, network, .. } => ("vnet", network),
            Transport::Vxlan { vni, .. } => ("vxlan", vni),
            Transport::Tcp { tls, .. } => (if tls { "tls" } else { "stream" }, 0),
            Transport::Direct { .. } => ("ethernet", 0),
        }
    }

    /// Which of a host's receiving sockets the peer's datagrams arrive on,
    /// and what tells two links to one peer apart there: a peer has one
    /// `udp` link, and one `vxlan` link per VNI.
    pub fn rx_key(&self) -> RxKey {
        match *self {
            Transport::Udp { remote, .. } => RxKey::Addr(Via::Udp, canonical(remote.ip()), 0),
            Transport::Vxlan { remote, vni } => RxKey::Addr(Via::Vxlan, canonical(remote.ip()), vni),
            Transport::Tcp { remote, .. } => RxKey::Addr(Via::Tcp, canonical(remote.ip()), 0),
            Transport::Direct { dev } => RxKey::Device(dev),
        }
    }

    /// The kind's words in the line that declares a link of it: all but
    /// `link NAME` before and `mtu N` after.
    pub fn words(&self) -> String {
        match *self {
            Transport::Udp { remote, format, network, security, cipher, nat, relay } => {
                let f = match format {
                    Format::Raw => "raw",
                    Format::Vnet => "vnet",
                };
                let sec = match security.peer_key() {
                    Some(k) => format!(" peer-key {k} security {}", security.word()),
                    None => String::new(),
                };
                let cipher = match cipher {
                    Cipher::Auto => String::new(),
                    c => format!(" cipher {}", c.word()),
                };
                let nat = if nat { " nat" } else { "" };
                let relay = relay.map_or_else(String::new, |k| format!(" relay {k}"));
                format!("udp {remote} format {f} network {network}{sec}{cipher}{nat}{relay}")
            }
            Transport::Vxlan { remote, vni } => format!("vxlan {remote} vni {vni}"),
            Transport::Tcp { remote, tls } => {
                let t = if tls { " tls" } else { "" };
                format!("tcp {remote}{t}")
            }
            Transport::Direct { dev } => format!("direct {dev}"),
        }
    }
}

/// A host's receiving sockets: the `listen` kinds (`listen udp`, `listen
/// vxlan`, `listen tcp`). A link kind's peer is heard on one of them, or on
/// a device of the link's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Via {
    Udp,
    Vxlan,
    Tcp,
}

/// What attributes an arriving datagram (or connection, or frame) to a
/// link: the socket it came in on, its source address and what tells two
/// links of one peer apart there (a VXLAN link's VNI; 0 for the others);
/// or the link's own device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RxKey {
    Addr(Via, IpAddr, u32),
    Device(IfName),
}

/// An IPv4-mapped IPv6 address as its IPv4 form (what a dual-stack socket
/// reports), anything else as it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A link's remote must be one host that can answer: a unicast address and
/// a port other than 0 (`255.255.255.255:9000` or `IP:0` would be accepted
/// by a socket and lead nowhere, or everywhere).
pub(crate) fn check_remote(pos: Pos, remote: SocketAddr) -> Result<()> {
    let ip = remote.ip();
    let bad = match ip {
        IpAddr::V4(a) => a.is_unspecified() || a.is_broadcast() || a.is_multicast(),
        IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
    };
    if bad {
        return Err(Error::new(pos, "a unicast address for the link's peer", format!("`{ip}`")));
    }
    if remote.port() == 0 {
        return Err(Error::new(pos, "a port from 1 to 65535", "port 0"));
    }
    Ok(())
}

impl Parser<'_, '_> {
    /// What follows a link's name: its kind, the kind's words, and `mtu`.
    pub(crate) fn transport(&mut self) -> Result<(Transport, u32)> {
        let kind = self
            .keyword(&["udp", "vxlan", "tcp", "direct"], "a link kind: `udp`, `vxlan`, `tcp` or `direct`")?;
        if kind == "direct" {
            let pos = self.pos();
            let t = self.next("a device name (1-15 characters)")?;
            let Some(dev) = IfName::new(t.text) else {
                return Err(Error::new(pos, "a device name (1-15 characters)", found(Some(&t))));
            };
            let mtu = if self.eat("mtu") {
                self.number("the LAN's MTU (576-65535)", 576..=65535)?
            } else {
                DEFAULT_LINK_MTU
            };
            return Ok((Transport::Direct { dev }, mtu));
        }
        // `vxlan IP` means IANA's port, `udp IP` vnet's (and Palacios').
        let default_port = if kind == "vxlan" { vnet_wire::vxlan::IANA_PORT } else { DEFAULT_PORT };
        let (remote_pos, remote) = (self.pos(), self.endpoint(default_port)?);
        let (mut format, mut network, mut mtu, mut vni, mut tls) = (None, None, None, None, None);
        let mut peer_key: Option<(Pos, PeerKey)> = None;
        let mut security: Option<(Pos, &str)> = None;
        let mut nat: Option<Pos> = None;
        let mut relay: Option<(Pos, PeerKey)> = None;
        let mut cipher: Option<(Pos, Cipher)> = None;
        let (opts, expected): (&[&str], _) = match kind {
            "udp" => (
                &["format", "network", "mtu", "peer-key", "security", "cipher", "nat", "relay"],
                "an option: `format`, `network`, `mtu`, `peer-key`, `security`, `cipher`, `nat` or `relay`",
            ),
            "tcp" => (&["tls", "mtu"], "an option: `tls` or `mtu`"),
            _ => (&["vni", "mtu"], "an option: `vni` or `mtu`"),
        };
        while self.peek().is_some() {
            let opt_pos = self.pos();
            let o = self.keyword(opts, expected)?;
            let dup = match o {
                "format" => {
                    let f = match self.keyword(&["raw", "vnet"], "a format: `raw` or `vnet`")? {
                        "raw" => Format::Raw,
                        _ => Format::Vnet,
                    };
                    format.replace(f).is_some()
                }
                "network" => {
                    network.replace(self.number("a network id (0-4294967295)", 0..=u32::MAX)?).is_some()
                }
                "tls" => tls.replace(true).is_some(),
                "nat" => nat.replace(opt_pos).is_some(),
                "cipher" => {
                    let w = self.keyword(&Cipher::WORDS, "`auto`, `aes-256-gcm` or `chacha20-poly1305`")?;
                    cipher.replace((opt_pos, Cipher::from_word(w).unwrap_or_default())).is_some()
                }
                "relay" => {
                    relay.replace(self.key("the relay's public key (44 characters of base64)")?).is_some()
                }
                "peer-key" => {
                    peer_key.replace(self.key("a peer's public key (44 characters of base64)")?).is_some()
                }
                "security" => {
                    let pos = self.pos();
                    let w = self.keyword(&["none", "auth", "encrypt"], "`none`, `auth` or `encrypt`")?;
                    security.replace((pos, w)).is_some()
                }
                "vni" => vni
                    .replace(
                        self.number(
                            "a VXLAN network identifier (0-16777215)",
                            0..=vnet_wire::vxlan::MAX_VNI,
                        )?,
                    )
                    .is_some(),
                _ => mtu.replace(self.number("an underlay MTU (576-65535)", 576..=65535)?).is_some(),
            };
            if dup {
                return Err(Error::new(opt_pos, "each option once", format!("a second `{o}`")));
            }
        }
        check_remote(remote_pos, remote)?;
        let transport = match kind {
            "udp" => {
                let o = UdpOptions { format, network, security, peer_key, cipher, nat, relay };
                udp_transport(remote, remote_pos, o)?
            }
            "tcp" => Transport::Tcp { remote, tls: tls.unwrap_or(false) },
            _ => match vni {
                Some(vni) => Transport::Vxlan { remote, vni },
                None => return self.err("`vni N` (a VXLAN link names its network identifier)"),
            },
        };
        Ok((transport, mtu.unwrap_or(DEFAULT_LINK_MTU)))
    }

    /// A public key in base64 (`what` it is), and where it was.
    fn key(&mut self, what: &str) -> Result<(Pos, PeerKey)> {
        let pos = self.pos();
        let t = self.next(what)?;
        match PeerKey::from_base64(t.text) {
            Some(k) => Ok((pos, k)),
            None => Err(Error::new(pos, what, found(Some(&t)))),
        }
    }
}

/// A `udp` link's options as parsed, for [`udp_transport`].
struct UdpOptions<'a> {
    format: Option<Format>,
    network: Option<u32>,
    security: Option<(Pos, &'a str)>,
    peer_key: Option<(Pos, PeerKey)>,
    cipher: Option<(Pos, Cipher)>,
    nat: Option<Pos>,
    relay: Option<(Pos, PeerKey)>,
}

/// A `udp` link's transport from its options: the security its key and
/// `security` word say, the format (a secured link speaks `vnet`), and
/// `nat` and `relay` only with a key.
fn udp_transport(remote: SocketAddr, remote_pos: Pos, o: UdpOptions<'_>) -> Result<Transport> {
    let UdpOptions { format, network, security, peer_key, cipher, nat, relay } = o;
    let security = match (security, peer_key) {
        (None | Some((_, "none")), None) => Security::None,
        (Some((pos, "none")), Some(_)) => {
            return Err(Error::new(pos, "`auth` or `encrypt` for a link with a `peer-key`", "`none`"))
        }
        (Some((_, "auth")), Some((_, k))) => Security::Auth(k),
        // A peer key alone means the strongest.
        (_, Some((_, k))) => Security::Encrypt(k),
        (Some((pos, _)), None) => {
            return Err(Error::new(
                pos,
                "`peer-key KEY` before `security` (whose key signs the peer's datagrams)",
                "no peer key",
            ))
        }
    };
    // A secured link speaks `vnet` unless told otherwise (and raw cannot be).
    let format = match format {
        Some(f) => f,
        None if security != Security::None => Format::Vnet,
        None => Format::default(),
    };
    if format == Format::Raw && security != Security::None {
        return Err(Error::new(
            remote_pos,
            "format `vnet` for a link with a `peer-key` (the Palacios format has no room for a tag)",
            "format `raw`",
        ));
    }
    if let (Some((pos, _)), Security::None) = (relay, security) {
        return Err(Error::new(
            pos,
            "`peer-key KEY` for a relayed link (the relay carries only what is sealed end to end)",
            "`relay` on a link without a peer key",
        ));
    }
    if let (Some(pos), Security::None) = (nat, security) {
        return Err(Error::new(
            pos,
            "`peer-key KEY` for a `nat` link (it follows its peer only to where datagrams authenticate)",
            "`nat` on a link without a peer key",
        ));
    }
    if let (Some((pos, _)), Security::None) = (cipher, security) {
        return Err(Error::new(
            pos,
            "`peer-key KEY` for a link with a `cipher` (only a secured link seals)",
            "`cipher` on a link without a peer key",
        ));
    }
    let (nat, relay) = (nat.is_some(), relay.map(|(_, k)| k));
    let cipher = cipher.map_or(Cipher::Auto, |(_, c)| c);
    Ok(Transport::Udp { remote, format, network: network.unwrap_or(0), security, cipher, nat, relay })
}
