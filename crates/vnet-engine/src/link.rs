//! A link as the engine sees it: its definition, counters, and the I/O that
//! carries its datagrams ([`DatagramTx`], implemented by the daemon's link
//! modules and by the simulator's wire). How a frame becomes datagrams is
//! the kind's codec ([`crate::codec`]); [`Link::send`] picks it with an
//! exhaustive `match` on the transport.

use crate::codec;
use crate::port::{Payload, Port, Scratch};
use crate::secure::{self, SecureLink};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use vnet_control::{LinkDef, LinkFormat, Security, Transport};
use vnet_core::Counters;
use vnet_wire::frag::FrameIds;

/// Carries a link's datagrams to its peer.
pub trait DatagramTx: Send + Sync {
    /// Sends the datagrams laid out in `iov`: one datagram when `seg` is at
    /// least their total length, else datagrams of `seg` bytes each (the
    /// last may be shorter), as one GSO send where the transport can. `flow`
    /// is the inner flow's hash (it picks the outer source port).
    fn send(&self, iov: &[IoSlice<'_>], seg: usize, flow: u64) -> bool;
}

/// A link.
pub struct Link {
    pub def: LinkDef,
    /// Frames received from the peer.
    pub rx: Counters,
    /// Frames sent to the peer.
    pub tx: Counters,
    pub io: Arc<dyn DatagramTx>,
    /// Ids of the frames this link fragments (unpredictable, see [`FrameIds`]).
    pub(crate) frame_ids: FrameIds,
    /// Frames dropped because the kind cannot fragment them (VXLAN).
    pub too_big: AtomicU64,
    /// Whether "frame too big" was logged for this link (once is enough).
    pub(crate) too_big_logged: AtomicBool,
    /// Sessions and keys, for a link with `security auth|encrypt`.
    pub secure: Option<SecureLink>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("def", &self.def).finish()
    }
}

impl Link {
    pub fn new(def: LinkDef, io: Arc<dyn DatagramTx>) -> Self {
        Link {
            def,
            rx: Counters::default(),
            tx: Counters::default(),
            io,
            frame_ids: FrameIds::new(random_seed()),
            too_big: AtomicU64::new(0),
            too_big_logged: AtomicBool::new(false),
            secure: None,
        }
    }

    /// The link with its security (for a link whose definition asks for it).
    pub fn secured(mut self, sec: Option<SecureLink>) -> Self {
        self.secure = sec;
        self
    }

    /// The link's timers: sends a handshake initiation when its security
    /// needs one. Called every few hundred milliseconds, and by the simulator.
    pub fn tick(&self, now_ns: u64) {
        if let Some(sec) = &self.secure {
            let mut out = [0u8; secure::INIT_LEN];
            if let Some(n) = sec.tick(now_ns, &mut out) {
                self.io.send(&[IoSlice::new(&out[..n])], n, 0);
            }
        }
    }

    /// The largest UDP payload that crosses the underlay unfragmented.
    pub fn max_datagram(&self) -> usize {
        let ip = match self.def.remote() {
            Some(r) if r.is_ipv6() => 40,
            Some(_) => 20,
            // A LAN frame has no outer headers: the frame is what goes out.
            None => return self.def.mtu as usize + 14,
        };
        (self.def.mtu as usize).saturating_sub(ip + 8)
    }

    /// The largest frame (Ethernet header included) the link carries
    /// without fragmenting it, given its kind's encapsulation.
    pub fn max_whole_frame(&self) -> usize {
        self.max_datagram().saturating_sub(match self.def.transport {
            Transport::Udp { format: LinkFormat::Raw, .. } => codec::raw::OVERHEAD,
            Transport::Udp { format: LinkFormat::Vnet, security: Security::None, .. } => {
                codec::vnet::OVERHEAD
            }
            Transport::Udp { format: LinkFormat::Vnet, .. } => codec::vnet::OVERHEAD + secure::OVERHEAD,
            Transport::Vxlan { .. } => codec::vxlan::OVERHEAD,
            // A stream carries any frame whole, whatever the underlay MTU.
            Transport::Tcp { .. } => return crate::MAX_FRAME,
            Transport::Direct { .. } => codec::direct::OVERHEAD,
        })
    }
}

/// A seed from the system's random source, by way of the standard
/// library's hasher keys (read from the OS once per thread, never reused).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Port for Link {
    fn takes_offloads(&self) -> bool {
        match self.def.transport {
            // A `vnet` datagram or stream record carries the offload header
            // to the peer's VM.
            // A `direct` link's packet socket takes them too.
            Transport::Udp { format: LinkFormat::Vnet, .. }
            | Transport::Tcp { .. }
            | Transport::Direct { .. } => true,
            // A Palacios host and a VTEP take finished Ethernet frames.
            Transport::Udp { format: LinkFormat::Raw, .. } | Transport::Vxlan { .. } => false,
        }
    }

    fn send(&self, scratch: &mut Scratch, payload: Payload<'_>) -> bool {
        // The inner flow's hash picks the outer source port; only the kinds
        // that send from a pool of ports need it (a `raw` link sends from
        // the listening socket, a stream and a LAN have no such port).
        let flow = || crate::flow::flow_hash(payload.frame_start());
        match self.def.transport {
            Transport::Udp { format: LinkFormat::Raw, .. } => codec::raw::send(self, payload, 0),
            Transport::Udp { format: LinkFormat::Vnet, network, .. } => {
                codec::vnet::send(self, scratch, payload, network, flow())
            }
            Transport::Vxlan { vni, .. } => codec::vxlan::send(self, payload, vni, flow()),
            Transport::Tcp { .. } => codec::stream::send(self, payload, 0),
            Transport::Direct { .. } => codec::direct::send(self, payload, 0),
        }
    }
}
