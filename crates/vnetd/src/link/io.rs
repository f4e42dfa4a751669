//! What the daemon holds of each link, whatever its kind ([`LinkIo`]), and
//! why a link's I/O could not be opened ([`OpenError`]).

use std::sync::Arc;
use vnet_engine::DatagramTx;

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
    fn stream(&self) -> Option<Arc<super::tcp::TcpLink>> {
        None
    }
    /// Adds the kind's own fields to the link's `show links` object.
    fn status(&self, _out: &mut serde_json::Map<String, serde_json::Value>) {}
    /// Stops the link's threads (it was removed or replaced).
    fn stop(&self) {}
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
