//! The vnet control language.
//!
//! One language serves the config file, the control socket and `vnetctl`.
//! It accepts the Palacios VNET/P `/proc/vnet` lines verbatim and adds a
//! readable superset with named interfaces and links:
//!
//! ```text
//! listen udp 0.0.0.0:9000
//! interface vm0 tap vt0 mac 52:54:00:00:00:01 mtu 9000 netns vmA network 1
//! interface vm1 netdev tap-qemu1 mac 52:54:00:00:00:03  # a TAP QEMU holds
//! link hostb udp 10.0.0.2:9000 format vnet network 1 mtu 1500
//! link fabric vxlan 10.0.0.4 vni 42 mtu 1500      # a Linux or OVS VTEP
//! link far tcp 192.0.2.9:9000 tls                 # where UDP cannot pass
//! link lan direct eth1                            # the physical LAN on eth1
//! tls cert /etc/vnet/host.pem key /etc/vnet/host.key ca /etc/vnet/ca.pem
//! route any ff:ff:ff:ff:ff:ff -> link hostb
//! route any 52:54:00:00:00:02 -> link hostb
//! route any 52:54:00:00:00:01 -> interface vm0 from link hostb
//! neigh 10.0.0.2 52:54:00:00:00:02                # ARP for 10.0.0.2 answered here
//! add 10.0.0.3 9000 udp                          # Palacios link line
//! add any 52:54:00:00:00:03 edge 10.0.0.3 any     # Palacios route line
//! [routes]
//! del 4                                           # Palacios: delete route 4
//! ```
//!
//! Parsing ([`parse`]) turns text into [`Command`]s, each with the position
//! it came from; applying ([`State::apply`]) checks them against the state
//! (names exist, ids are free) and changes it. A whole file or `begin` ...
//! `commit` block is applied to a copy of the state and kept only if every
//! line succeeds, so a bad line changes nothing. Every error names the line,
//! the column and what was expected.

pub mod ast;
pub mod attach;
mod cursor;
pub mod drops;
pub mod flows;
pub mod lex;
pub mod neigh;
pub mod parse;
pub mod policy;
pub mod recent;
pub mod reply;
pub mod request;
pub mod state;
pub mod trace;
pub mod transport;

pub use ast::{
    Cipher, Class, ClusterLine, Command, Datapath, IfName, IpamOp, Located, Mode, PeerKey, Security,
    ShowWhat, TlsFiles, Transport,
};
pub use parse::{parse, parse_line, Section, DEFAULT_BROADCAST_LIMIT};
pub use reply::{Refused, Reply};
pub use state::{IfaceKind, InterfaceDef, LinkDef, LinkFormat, RouteDef, State};
pub use transport::DEFAULT_PORT;
pub use transport::{canonical, RxKey, Via};

use core::fmt;

/// A position in control text: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

/// A control-language error: where, what was expected, what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    /// The file (or `<control>`) the text came from, if known.
    pub file: Option<String>,
    pub pos: Pos,
    pub expected: String,
    pub found: String,
}

impl Error {
    pub fn new(pos: Pos, expected: impl Into<String>, found: impl Into<String>) -> Self {
        Error { file: None, pos, expected: expected.into(), found: found.into() }
    }

    /// Names the file the text came from.
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        self.file = Some(file.into());
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}:")?;
        }
        write!(f, "{}:{}: expected {}, found {}", self.pos.line, self.pos.column, self.expected, self.found)
    }
}

pub type Result<T> = core::result::Result<T, Error>;
