//! UDP transport, for `raw`, `vnet` and VXLAN links: datagrams go out in
//! one `sendmsg` per batch with `UDP_SEGMENT` (GSO), or one by one where
//! the kernel refuses GSO; the socket is picked from the link's pool by the
//! inner flow's hash. Also the binding of the receiving sockets (a group
//! per port, one per worker) and the sending pools.

use crate::sys;
use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use vnet_engine::{DatagramTx, Global};

/// Socket buffer size asked for on the link sockets.
pub const SOCKET_BUFFER: usize = 8 << 20;
/// Sockets in the pool that gives `vnet` and VXLAN links a source port per
/// flow: enough ports that a peer's flows spread over every socket of its
/// listening group ([`MAX_READERS`]), which the kernel picks by port.
pub const TX_POOL: usize = 16;

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

/// The most sockets a listening group has: one per CPU, up to this many.
pub const MAX_READERS: usize = 8;

/// How many sockets a listening group gets here: one per two CPUs vnetd may
/// run on (the other half left to the VMs, whose traffic each worker's
/// frames are; measured on 2 cores, a second reader per vnetd made the
/// bench slower: docs/BENCHMARKS.md), at least one, at most [`MAX_READERS`].
pub fn readers_wanted() -> usize {
    (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).clamp(1, MAX_READERS)
}

/// The hand-over name of socket `k` of the listening group of `kind` on
/// `addr` (socket 0 keeps the name a single socket had, so a vnetd from
/// before groups hands its socket to this one and back).
pub fn reader_name(kind: &str, addr: SocketAddr, k: usize) -> Option<String> {
    let a = addr.to_string();
    match k {
        0 => crate::handover::name(&[kind, &a]),
        k => crate::handover::name(&[kind, &a, &format!("reader{k}")]),
    }
}

/// The receiving sockets for `kind` (`udp` or `vxlan`) on `addr`: a group of
/// `want` sockets on one port (`SO_REUSEPORT`), among which the kernel
/// spreads datagrams by their addresses and ports. A peer sends each inner
/// flow from its own source port ([`UdpTx`]), so a flow, and every fragment
/// of its frames, stays with one socket, one worker and one reassembler,
/// and different flows are read by different workers. Large buffers both
/// ways; over IPv6, datagrams with a zero UDP checksum taken (peers' kernel
/// paths send them, as RFC 6935/6936 allow tunnels).
///
/// The previous vnetd's sockets, if it handed them over
/// ([`crate::handover`]); a lone socket handed over by a vnetd from before
/// groups cannot take members (`SO_REUSEPORT` is set before a bind or
/// never), so it stays the only reader until a restart without hand-over.
/// A new group is bound only where no one holds the port (a plain bind
/// first): members of a group share the port silently.
fn bind_group(kind: &str, addr: SocketAddr, want: usize) -> std::io::Result<Vec<Reader>> {
    let handed = |k: usize| {
        let name = reader_name(kind, addr, k)?;
        crate::handover::take(&name).map(UdpSocket::from).filter(|s| s.local_addr().ok() == Some(addr))
    };
    let mut group = Vec::new();
    match handed(0) {
        Some(s) => {
            let grouped = sys::reuses_port(&s).unwrap_or(false);
            group.push(s);
            if grouped {
                while let Some(s) = handed(group.len()) {
                    group.push(s);
                }
                while group.len() < want {
                    match sys::udp_bind_reuseport(addr) {
                        Ok(s) => group.push(s),
                        Err(e) => {
                            tracing::warn!("{kind} {addr}: {} link socket(s), not {want}: {e}", group.len());
                            break;
                        }
                    }
                }
            } else if want > 1 {
                tracing::info!(
                    "{kind} {addr}: the socket handed over has no SO_REUSEPORT (a vnetd from before \
                     reader groups): one worker reads it until vnetd restarts without a hand-over"
                );
            }
        }
        None if want > 1 && addr.port() != 0 => {
            drop(UdpSocket::bind(addr)?);
            for _ in 0..want {
                group.push(sys::udp_bind_reuseport(addr)?);
            }
        }
        None => group.push(UdpSocket::bind(addr)?),
    }
    group
        .into_iter()
        .map(|s| {
            if addr.is_ipv6() {
                if let Err(e) = sys::udp_accept_zero_checksum6(&s) {
                    tracing::warn!("datagrams with a zero UDP checksum over IPv6 will be dropped: {e}");
                }
            }
            if let Err(e) = sys::udp_enable_gro(&s) {
                tracing::warn!("{kind} {addr}: UDP GRO refused ({e}): receiving datagram by datagram");
            }
            Ok(Reader { sock: ready(s, SOCKET_BUFFER)?, messages: Arc::default() })
        })
        .collect()
}

/// A socket of a listening group and the datagrams its worker read from it.
#[derive(Clone)]
pub struct Reader {
    pub sock: Arc<UdpSocket>,
    pub messages: Arc<AtomicU64>,
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

/// A bound receiving socket and the pool of sockets its links send from
/// (one chosen per inner flow, so each flow has its own source port).
#[derive(Clone)]
pub struct Bound {
    pub addr: SocketAddr,
    /// Every socket of the listening group (never empty: the binders make
    /// at least one); the workers read them (socket `j` by worker `j mod
    /// workers`).
    pub readers: Vec<Reader>,
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

/// Binds a receiving socket (with UDP GRO) and its sending pool: for `vnet`
/// links, ephemeral ports on the same address.
pub fn bind_udp(addr: SocketAddr, readers: usize) -> std::io::Result<Bound> {
    let readers = bind_group("udp", addr, readers)?;
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
    Ok(Bound { addr, readers, pool, nocheck: Vec::new() })
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
pub fn bind_vxlan(addr: SocketAddr, readers: usize) -> std::io::Result<Bound> {
    let readers = bind_group("vxlan", addr, readers)?;
    let (mut pool, mut nocheck) = (Vec::new(), Vec::new());
    let mut seed = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    for _ in 0..16 * TX_POOL {
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
    Ok(Bound { addr, readers, pool, nocheck })
}

/// A sending socket another may share the port of (`SO_REUSEPORT`).
fn bind_reuse(addr: SocketAddr) -> std::io::Result<Arc<UdpSocket>> {
    ready(sys::udp_bind_reuseport(addr)?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A loopback address with a port free now.
    fn free_port() -> SocketAddr {
        UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    #[test]
    fn a_listening_group_shares_its_port_and_no_one_else_joins_it() {
        let addr = free_port();
        let b = bind_udp(addr, 2).unwrap();
        assert_eq!(b.readers.len(), 2);
        assert!(b.readers.iter().all(|r| r.sock.local_addr().unwrap() == addr));
        // A second vnetd on the same port fails as it did before groups.
        let again = bind_udp(addr, 2).err().map(|e| e.kind());
        assert_eq!(again, Some(std::io::ErrorKind::AddrInUse));
        // One reader: a plain socket, as before.
        let one = bind_udp(free_port(), 1).unwrap();
        assert_eq!(one.readers.len(), 1);
        assert!(!sys::reuses_port(&**one.sock()).unwrap());
    }

    #[test]
    fn a_peers_flows_from_different_source_ports_reach_different_readers() {
        let addr = free_port();
        let b = bind_udp(addr, 2).unwrap();
        // 16 source ports: that the kernel's hash puts them all on one of
        // two sockets has a chance of 2^-15.
        let senders: Vec<UdpSocket> = (0..16).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        for s in &senders {
            s.send_to(b"x", addr).unwrap();
        }
        let mut got = [0usize; 2];
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 16];
        while got.iter().sum::<usize>() < senders.len() && Instant::now() < deadline {
            for (k, r) in b.readers.iter().enumerate() {
                while r.sock.recv_from(&mut buf).is_ok() {
                    got[k] += 1;
                }
            }
        }
        assert_eq!(got.iter().sum::<usize>(), senders.len(), "{got:?}");
        assert!(got.iter().all(|&n| n > 0), "one socket took every flow: {got:?}");
    }
}
