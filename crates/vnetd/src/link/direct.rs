//! `direct` links: raw Ethernet on a LAN device (VNET/P's direct send and
//! receive). A packet socket on the device, promiscuous, with a
//! `virtio_net_hdr` on every frame (`PACKET_VNET_HDR`: the LAN's TCP
//! super-frames arrive whole, and offloaded frames leave as they are) and a
//! receive ring; it ignores what the host itself sends on the device
//! (`PACKET_IGNORE_OUTGOING`), so the host's own traffic is neither
//! disturbed nor forwarded, and vnetd never hears its own frames back.

use crate::iface::Reader;
use crate::sys;
use std::fs::File;
use std::io::{IoSlice, Write};
use std::sync::Arc;
use vnet_engine::DatagramTx;

/// A direct link's socket, as the engine's I/O.
pub struct DirectTx {
    sock: Arc<File>,
}

impl DatagramTx for DirectTx {
    /// Writes one `[virtio_net_hdr] frame` to the device.
    fn send(&self, iov: &[IoSlice<'_>], _seg: usize, _flow: u64) -> bool {
        let want: usize = iov.iter().map(|s| s.len()).sum();
        matches!((&*self.sock).write_vectored(iov), Ok(n) if n == want)
    }
}

/// A direct link's I/O: its socket, and the reader a worker takes the
/// LAN's frames from.
pub struct DirectIo {
    tx: Arc<DirectTx>,
    reader: Reader,
}

impl super::LinkIo for DirectIo {
    fn tx(&self) -> Arc<dyn DatagramTx> {
        self.tx.clone()
    }

    fn reader(&self) -> Option<Reader> {
        Some(self.reader.clone())
    }
}

/// Opens `dev` for a direct link: the engine's I/O and what a worker reads.
pub fn open(dev: &str) -> Result<DirectIo, super::OpenError> {
    let failed = |what| move |source| super::OpenError::Device { dev: dev.to_string(), what, source };
    let f = sys::open_packet(dev).map_err(failed("no packet socket"))?;
    sys::packet_enable_vnet_hdr(&f).map_err(failed("offload headers refused"))?;
    let ring = crate::iface::netdev::rx_ring(&f, true, dev);
    sys::set_up(dev).map_err(failed("cannot set it up"))?;
    let sock = Arc::new(f);
    let reader = match ring {
        Some(r) => Reader::Ring(sock.clone(), r),
        None => Reader::Packet(sock.clone()),
    };
    Ok(DirectIo { tx: Arc::new(DirectTx { sock }), reader })
}
