//! Where a frame enters or leaves this host ([`Port`]), and which frames a
//! route considers by where they came from ([`SourceFilter`]).

use core::fmt;

/// Where a frame enters or leaves this host: a local interface or a link to
/// another host, by control-plane id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Port {
    Interface(u32),
    Link(u32),
}

impl Port {
    pub fn is_link(&self) -> bool {
        matches!(self, Port::Link(_))
    }
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Interface(i) => write!(f, "interface#{i}"),
            Port::Link(i) => write!(f, "link#{i}"),
        }
    }
}

/// Which frames a route considers, by where they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceFilter {
    Any,
    Port(Port),
}
