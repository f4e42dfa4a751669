//! Links' I/O: the sockets a host receives and sends its links' datagrams
//! on, and the engine's `DatagramTx` for each link. How frames become
//! datagrams is the engine's (`vnet_engine::codec`, one module per kind);
//! how datagrams reach the peer is here, one module per transport. [`open`]
//! matches on the transport exhaustively, so a new kind is a variant of
//! `Transport` and a module here (and one in the engine's codecs).

pub mod direct;
pub mod tcp;
pub mod udp;

use crate::shared::Shared;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use vnet_control::{LinkDef, LinkFormat, Transport};
use vnet_engine::DatagramTx;

/// A bound receiving socket and the pool of sockets its links send from
/// (one chosen per inner flow, so each flow has its own source port).
#[derive(Clone)]
pub struct Bound {
    pub addr: SocketAddr,
    /// Every socket of the listening group (never empty: the binders make
    /// at least one); the workers read them (socket `j` by worker `j mod
    /// workers`).
    pub readers: Vec<udp::Reader>,
    pub pool: Vec<Arc<UdpSocket>>,
    /// Zero-checksum twins of `pool` (VXLAN over IPv4), or empty.
    pub nocheck: Vec<Arc<UdpSocket>>,
}

impl Bound {
    /// The group's first socket: the one `raw` and NAT-traversing links
    /// send from (their peers see the listening port).
    pub fn sock(&self) -> &Arc<UdpSocket> {
        &self.readers[0].sock
    }
}

/// The host's link sockets.
#[derive(Clone, Default)]
pub struct Sockets {
    /// `listen udp`: `raw` and `vnet` links.
    pub udp: Option<Bound>,
    /// `listen vxlan`: VXLAN links.
    pub vxlan: Option<Bound>,
    /// `listen tcp`: peers' TCP and TLS links.
    pub tcp: Option<Arc<tcp::Acceptor>>,
    /// The host's TLS identity, when a link uses TLS.
    pub tls: Option<Arc<tcp::Tls>>,
}

/// A link's I/O as opened, whatever its kind: what the engine sends
/// through, what a worker reads (a link that receives outside the link
/// sockets), the stream the TCP acceptor hands a peer's connections to,
/// its own part of `show links`, and its threads to stop. The daemon keeps
/// one per link and no field per kind.
pub trait LinkIo: Send + Sync {
    /// What the engine sends the link's datagrams (or records) through.
    fn tx(&self) -> Arc<dyn DatagramTx>;
    /// What a worker reads the link's frames from (`direct` links).
    fn reader(&self) -> Option<crate::iface::Reader> {
        None
    }
    /// The link's stream, which takes inbound connections (TCP links).
    fn stream(&self) -> Option<Arc<tcp::TcpLink>> {
        None
    }
    /// Adds the kind's own fields to the link's `show links` object.
    fn status(&self, _out: &mut serde_json::Map<String, serde_json::Value>) {}
    /// Stops the link's threads (it was removed or replaced).
    fn stop(&self) {}
}

/// UDP-borne links (`raw`, `vnet`, VXLAN): datagrams from the host's
/// sockets, read by the link-socket worker.
struct UdpIo(Arc<udp::UdpTx>);

impl LinkIo for UdpIo {
    fn tx(&self) -> Arc<dyn DatagramTx> {
        self.0.clone()
    }
}

/// Why a link's I/O could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("a `tls cert FILE key FILE ca FILE` line for a `tls` link")]
    NoTls,
    #[error("cannot start the link: {0}")]
    Start(#[source] std::io::Error),
    #[error("no {0} socket is bound")]
    NotBound(&'static str),
    #[error("a link without a peer address")]
    NoPeer,
    /// A `direct` link's LAN device: what failed on it.
    #[error("{dev}: {what}: {source}")]
    Device {
        dev: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The I/O of a link, over the host's sockets: a `raw` link sends from the
/// listening socket (a Palacios peer sees port 9000 as the source), a
/// `vnet` link from the pool, a VXLAN link from the VXLAN pool (source
/// ports in the RFC's dynamic range), a TCP link on its own connection.
pub fn open(def: &LinkDef, socks: &Sockets, shared: &Arc<Shared>) -> Result<Arc<dyn LinkIo>, OpenError> {
    let (bound, listen_only, what) = match def.transport {
        Transport::Udp { format: LinkFormat::Raw, .. } => (&socks.udp, true, "`listen udp`"),
        // Through NAT, one mapping: the listening socket's.
        Transport::Udp { format: LinkFormat::Vnet, nat, .. } => (&socks.udp, nat, "`listen udp`"),
        Transport::Vxlan { .. } => (&socks.vxlan, false, "`listen vxlan`"),
        Transport::Tcp { remote, tls } => {
            let tls = match (tls, &socks.tls) {
                (false, _) => None,
                (true, Some(t)) => Some(t.clone()),
                (true, None) => return Err(OpenError::NoTls),
            };
            let l = tcp::TcpLink::start(&def.name, def.id, remote, tls, shared.clone())
                .map_err(OpenError::Start)?;
            return Ok(Arc::new(tcp::TcpIo(l)));
        }
        Transport::Direct { dev } => {
            return Ok(Arc::new(direct::open(dev.as_str())?));
        }
    };
    let b = bound.as_ref().ok_or(OpenError::NotBound(what))?;
    let (socks, nocheck) = if listen_only || b.pool.is_empty() {
        (vec![b.sock().clone()], Vec::new())
    } else {
        (b.pool.clone(), b.nocheck.clone())
    };
    let remote = def.remote().ok_or(OpenError::NoPeer)?;
    let tx = udp::UdpTx::new(&def.name, remote, socks, shared.global.clone()).with_nocheck(nocheck);
    Ok(Arc::new(UdpIo(Arc::new(tx))))
}
