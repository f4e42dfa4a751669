//! Links' I/O: the sockets a host receives and sends its links' datagrams
//! on, and the engine's `DatagramTx` for each link. How frames become
//! datagrams is the engine's (`vnet_engine::codec`, one module per kind);
//! how datagrams reach the peer is here, one module per transport. [`open`]
//! matches on the transport exhaustively, so a new kind is a variant of
//! `Transport` and a module here (and one in the engine's codecs).

pub mod udp;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use vnet_control::{LinkFormat, Transport};
use vnet_engine::DatagramTx;

/// A bound receiving socket and the pool of sockets its links send from
/// (one chosen per inner flow, so each flow has its own source port).
#[derive(Clone)]
pub struct Bound {
    pub addr: SocketAddr,
    pub sock: Arc<UdpSocket>,
    pub pool: Vec<Arc<UdpSocket>>,
}

/// The host's link sockets.
#[derive(Clone, Default)]
pub struct Sockets {
    /// `listen udp`: `raw` and `vnet` links.
    pub udp: Option<Bound>,
    /// `listen vxlan`: VXLAN links.
    pub vxlan: Option<Bound>,
}

/// The I/O of a link, over the host's sockets: a `raw` link sends from the
/// listening socket (a Palacios peer sees port 9000 as the source), a
/// `vnet` link from the pool, a VXLAN link from the VXLAN pool (source
/// ports in the RFC's dynamic range).
pub fn open(
    name: &str,
    transport: &Transport,
    socks: &Sockets,
    global: &Arc<vnet_engine::Global>,
) -> Result<Arc<dyn DatagramTx>, String> {
    let (bound, listen_only, what) = match transport {
        Transport::Udp { format: LinkFormat::Raw, .. } => (&socks.udp, true, "`listen udp`"),
        Transport::Udp { format: LinkFormat::Vnet, .. } => (&socks.udp, false, "`listen udp`"),
        Transport::Vxlan { .. } => (&socks.vxlan, false, "`listen vxlan`"),
    };
    let b = bound.as_ref().ok_or_else(|| format!("no {what} socket is bound"))?;
    let socks = if listen_only || b.pool.is_empty() { vec![b.sock.clone()] } else { b.pool.clone() };
    Ok(Arc::new(udp::UdpTx::new(name, transport.remote(), socks, global.clone())))
}
