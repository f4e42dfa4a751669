//! UDP transport, for `raw`, `vnet` and VXLAN links: datagrams go out in
//! one `sendmsg` per batch with `UDP_SEGMENT` (GSO), or one by one where
//! the kernel refuses GSO; the socket is picked from the link's pool by the
//! inner flow's hash. Also the binding of the receiving sockets and pools.

use crate::sys;
use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use vnet_engine::{DatagramTx, Global};

/// Socket buffer size asked for on the link sockets.
pub const SOCKET_BUFFER: usize = 8 << 20;
/// Sockets in the pool that gives `vnet` and VXLAN links a source port per flow.
pub const TX_POOL: usize = 4;

/// Sends one link's datagrams.
pub struct UdpTx {
    name: String,
    /// The peer's address: the configured remote, or where a secured
    /// link's peer roamed to ([`DatagramTx::retarget`]).
    remote: arc_swap::ArcSwap<SocketAddr>,
    socks: Vec<Arc<UdpSocket>>,
    /// Twins of `socks` (same ports) that send single datagrams with a zero
    /// UDP checksum (VXLAN over IPv4); empty: `socks` send everything.
    nocheck: Vec<Arc<UdpSocket>>,
    /// Set when the kernel refused UDP GSO: send datagram by datagram.
    gso_off: AtomicBool,
    global: Arc<Global>,
}

impl UdpTx {
    pub fn new(name: &str, remote: SocketAddr, socks: Vec<Arc<UdpSocket>>, global: Arc<Global>) -> Self {
        UdpTx {
            name: name.to_string(),
            remote: arc_swap::ArcSwap::from_pointee(remote),
            socks,
            nocheck: Vec::new(),
            gso_off: AtomicBool::new(false),
            global,
        }
    }

    /// Sends single datagrams from `nocheck` (same length and ports as the
    /// sending sockets).
    pub fn with_nocheck(mut self, nocheck: Vec<Arc<UdpSocket>>) -> Self {
        if nocheck.len() == self.socks.len() {
            self.nocheck = nocheck;
        }
        self
    }
}

impl DatagramTx for UdpTx {
    fn retarget(&self, to: SocketAddr) -> bool {
        // A socket sends to its own family only (or an IPv4 peer from a
        // dual-stack socket): a peer that moved across families is refused.
        let from = self.socks.first().and_then(|s| s.local_addr().ok());
        if from.is_some_and(|f| f.is_ipv4() && to.is_ipv6()) {
            return false;
        }
        self.remote.store(Arc::new(to));
        true
    }

    fn send(&self, iov: &[IoSlice<'_>], seg: usize, flow: u64) -> bool {
        let remote = **self.remote.load();
        let k = (flow % self.socks.len().max(1) as u64) as usize;
        let total: usize = iov.iter().map(|s| s.len()).sum();
        if total <= seg {
            if let Some(s) = self.nocheck.get(k) {
                return sys::send_segments(s, &remote, iov, 0).is_ok();
            }
        }
        let Some(sock) = self.socks.get(k) else { return false };
        if total <= seg || !self.gso_off.load(Relaxed) {
            let segment = if total > seg { seg as u16 } else { 0 };
            match sys::send_segments(sock, &remote, iov, segment) {
                Ok(_) => return true,
                Err(e)
                    if segment > 0
                        && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)) =>
                {
                    self.gso_off.store(true, Relaxed);
                    self.global.gso_fallbacks.fetch_add(1, Relaxed);
                    tracing::warn!(link = %self.name, "UDP GSO refused ({e}); sending datagram by datagram");
                }
                Err(_) => return false,
            }
        }
        // One datagram at a time: regroup the slices into datagrams of `seg` bytes.
        let mut one = [IoSlice::new(&[]); 8];
        let (mut k, mut have) = (0, 0);
        for s in iov {
            let mut rest: &[u8] = s;
            while !rest.is_empty() {
                let take = rest.len().min(seg - have);
                if k == one.len() {
                    return false;
                }
                one[k] = IoSlice::new(&rest[..take]);
                k += 1;
                have += take;
                rest = &rest[take..];
                if have == seg {
                    if sys::send_segments(sock, &remote, &one[..k], 0).is_err() {
                        return false;
                    }
                    (k, have) = (0, 0);
                }
            }
        }
        k == 0 || sys::send_segments(sock, &remote, &one[..k], 0).is_ok()
    }
}

/// A receiving socket for `kind` (`udp` or `vxlan`): large buffers both
/// ways; over IPv6, datagrams with a zero UDP checksum taken (peers' kernel
/// paths send them, as RFC 6935/6936 allow tunnels). The previous vnetd's,
/// if it handed it over ([`crate::handover`]).
fn bind(kind: &str, addr: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    let name = crate::handover::name(&[kind, &addr.to_string()]).unwrap_or_default();
    let handed =
        crate::handover::take(&name).map(UdpSocket::from).filter(|s| s.local_addr().ok() == Some(addr));
    let s = match handed {
        Some(s) => s,
        None => UdpSocket::bind(addr)?,
    };
    if addr.is_ipv6() {
        if let Err(e) = sys::udp_accept_zero_checksum6(&s) {
            tracing::warn!("datagrams with a zero UDP checksum over IPv6 will be dropped: {e}");
        }
    }
    ready(s, SOCKET_BUFFER)
}

/// A socket of a sending pool: nobody reads it, so its receive buffer is
/// the kernel's minimum (what anyone sends to its port costs a few KB,
/// not 8 MB a socket).
fn bind_sending(addr: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    ready(UdpSocket::bind(addr)?, 0)
}

/// A bound socket made ready for a worker: non-blocking, a large send
/// buffer, a receive buffer of `receive` bytes (0: the minimum).
fn ready(s: UdpSocket, receive: usize) -> std::io::Result<Arc<UdpSocket>> {
    s.set_nonblocking(true)?;
    if let Err(e) = sys::set_socket_buffers(&s, SOCKET_BUFFER, receive) {
        tracing::warn!("socket buffers left at the default: {e}");
    }
    Ok(Arc::new(s))
}

/// Binds a receiving socket (with UDP GRO) and its sending pool: for `vnet`
/// links, ephemeral ports on the same address.
pub fn bind_udp(addr: SocketAddr) -> std::io::Result<super::Bound> {
    let sock = bind("udp", addr)?;
    if let Err(e) = sys::udp_enable_gro(&*sock) {
        tracing::warn!("UDP GRO refused ({e}): receiving datagram by datagram");
    }
    let pool = (0..TX_POOL)
        .map(|_| bind_sending(SocketAddr::new(addr.ip(), 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    // `vnet` links (which send from the pool; `raw` links send from the
    // listening socket, as before) find their path MTU by probing
    // (vnet_engine::pmtu): what they send must not be fragmented on the way
    // (a probe would pass where frames then break), nor held to an
    // ICMP-learnt size.
    for s in &pool {
        if let Err(e) = sys::set_pmtu_probe(&**s, addr.is_ipv4()) {
            tracing::warn!("UDP link socket may fragment: {e}");
        }
        // A dual-stack socket's IPv4 datagrams follow the IPv4 option.
        if addr.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) {
            let _ = sys::set_pmtu_probe(&**s, true);
        }
    }
    Ok(super::Bound { addr, sock, pool, nocheck: Vec::new() })
}

/// The VXLAN source-port range (RFC 7348: the dynamic range).
pub const VXLAN_SOURCE_PORTS: (u16, u16) = (49152, 65535);

/// Binds the VXLAN receiving socket and a pool of sending sockets whose
/// ports lie in [`VXLAN_SOURCE_PORTS`], so the outer source port of a flow
/// is in the RFC's range and fixed by the inner flow's hash. Sending
/// sockets never fragment (`IP_PMTUDISC_DO`: VTEPs must not). Over IPv4,
/// single datagrams carry a zero UDP checksum as Linux VTEPs send by
/// default; the kernel refuses UDP GSO on such a socket (`EINVAL`), so each
/// port has a checksummed twin (`SO_REUSEPORT`, same port) for GSO batches.
pub fn bind_vxlan(addr: SocketAddr) -> std::io::Result<super::Bound> {
    let sock = bind("vxlan", addr)?;
    if let Err(e) = sys::udp_enable_gro(&*sock) {
        tracing::warn!("UDP GRO refused on the VXLAN socket ({e})");
    }
    let (mut pool, mut nocheck) = (Vec::new(), Vec::new());
    let mut seed = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    for _ in 0..64 {
        if pool.len() == TX_POOL {
            break;
        }
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let port = SocketAddr::new(addr.ip(), vnet_wire::vxlan::source_port(seed, VXLAN_SOURCE_PORTS));
        let Ok(s) = bind_reuse(port) else { continue };
        let twin = if addr.is_ipv4() {
            match bind_reuse(port) {
                Ok(t) if sys::udp_no_checksum(&*t).is_ok() => Some(t),
                _ => continue,
            }
        } else {
            None
        };
        for x in std::iter::once(&s).chain(twin.as_ref()) {
            if let Err(e) = sys::set_dont_fragment(&**x, addr.is_ipv4()) {
                tracing::warn!("VXLAN socket may fragment: {e}");
            }
        }
        pool.push(s);
        nocheck.extend(twin);
    }
    if pool.is_empty() {
        return Err(std::io::Error::other("no free port in 49152-65535 for VXLAN's sending sockets"));
    }
    Ok(super::Bound { addr, sock, pool, nocheck })
}

/// A sending socket another may share the port of (`SO_REUSEPORT`).
fn bind_reuse(addr: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    ready(sys::udp_bind_reuseport(addr)?, 0)
}
