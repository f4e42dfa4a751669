//! What each kind states of itself ([`Facts`]), read by the link, the
//! path MTU search and the receive side.

/// How a link's peer is known to be alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keepalive {
    /// The link sends an empty datagram when idle, and its peer (a vnetd)
    /// does the same.
    Datagrams,
    /// The stream has heartbeats of its own.
    Stream,
    /// The peer sends none (a Palacios host, a kernel VTEP, a LAN): quiet
    /// is not down.
    None,
}

/// A link kind's facts, each stated in the kind's module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Bytes the kind adds to each datagram inside the UDP payload.
    pub overhead: usize,
    /// Whether a frame's offload header crosses the link (else the engine
    /// gives it finished frames only).
    pub offloads: bool,
    /// Whether any frame goes whole, whatever the underlay MTU (a stream).
    pub any_size: bool,
    /// Whether the link searches its path MTU with probes (its peer answers).
    pub probes: bool,
    pub keepalive: Keepalive,
    /// What the way in does with what arrives for the link.
    pub inbound: Inbound,
}

/// The ways in the receive side has (`crate::rx`), one per what a kind's
/// peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// A finished frame per datagram, after the kind's header.
    Frame,
    /// A frame per datagram that may be a TCP super-frame a VTEP left
    /// unsegmented (its offload inferred).
    Inferred,
    /// `vnet` datagrams: opened, checked, reassembled (`crate::rx::vnet`).
    Vnet,
    /// Records on a stream, never datagrams (`crate::rx::stream_record`).
    Stream,
    /// Frames on a device of the link's own, never datagrams.
    Device,
}
