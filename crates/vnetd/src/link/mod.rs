//! Links' I/O: the sockets a host receives and sends its links' datagrams
//! on, and the engine's `DatagramTx` for each link. How frames become
//! datagrams is the engine's (`vnet_engine::codec`, one module per kind);
//! how datagrams reach the peer is here, one module per transport. [`open`]
//! matches on the transport exhaustively, so a new kind is a variant of
//! `Transport` and a module here (and one in the engine's codecs).

pub mod direct;
mod io;
pub mod tcp;
pub mod udp;

pub use io::{LinkIo, OpenError};
pub use udp::Bound;

use crate::shared::Shared;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_control::{LinkDef, LinkFormat, Transport};
use vnet_engine::DatagramTx;

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

/// UDP-borne links (`raw`, `vnet`, VXLAN): datagrams from the host's
/// sockets, read by the link-socket worker.
struct UdpIo(Arc<udp::UdpTx>);

impl LinkIo for UdpIo {
    fn tx(&self) -> Arc<dyn DatagramTx> {
        self.0.clone()
    }
}

/// A TCP (or TLS) link's I/O: its stream, which is also what the engine
/// sends through.
pub struct TcpIo(pub Arc<tcp::TcpLink>);

impl LinkIo for TcpIo {
    fn tx(&self) -> Arc<dyn DatagramTx> {
        self.0.clone()
    }

    fn stream(&self) -> Option<Arc<tcp::TcpLink>> {
        Some(self.0.clone())
    }

    /// The connection's state and its counters.
    fn status(&self, m: &mut serde_json::Map<String, serde_json::Value>) {
        let st = &self.0.status;
        m.insert("state".into(), st.state().word().into());
        m.insert("inbound".into(), st.inbound.load(Relaxed).into());
        m.insert("reconnects".into(), st.reconnects.load(Relaxed).into());
        m.insert("queue_drops".into(), st.queue_drops.load(Relaxed).into());
        m.insert("refused".into(), st.refused.load(Relaxed).into());
        m.insert("stream_errors".into(), st.stream_errors.load(Relaxed).into());
        let e = st.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        m.insert("last_error".into(), e.into());
    }

    fn stop(&self) {
        self.0.stop();
    }
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
            return Ok(Arc::new(TcpIo(l)));
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
