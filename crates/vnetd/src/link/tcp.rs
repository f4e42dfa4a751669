//! TCP transport, for `tcp` links (VNET/U's TCP and SSL links): where UDP
//! cannot pass between two sites, frames travel as records on a TCP
//! connection (`vnet_engine::codec::stream`), optionally inside TLS 1.3
//! with mutual certificate authentication (rustls).
//!
//! Each direction of a link has its own connection: a host connects to its
//! peer's `listen tcp` address and sends its frames on that connection; it
//! receives the peer's frames on the connection the peer made to it,
//! attributed to the link by the peer's address (as UDP datagrams are).
//! Either side may restart: the sender reconnects with exponential backoff
//! (100 ms doubling to 1 s, with jitter). The receiver takes a new inbound
//! connection of a peer only when the one it has ended or fell silent (no
//! record, not even a heartbeat, for [`INBOUND_SILENT`]): a flood of
//! connections from the peer's address never displaces the live one.
//!
//! - **Before authentication, nothing per connection.** The acceptor hands
//!   each accepted connection to a fixed pool of [`PREAUTH_WORKERS`]
//!   threads through a queue of [`PREAUTH_QUEUE`]; a connection that finds
//!   the queue full is closed at once (counted in `refused`, the cause
//!   logged once). A worker gives the whole handshake (the first byte, the
//!   TLS handshake, the certificate check) [`HANDSHAKE_DEADLINE`], however
//!   slowly the bytes come; only an authenticated connection gets a thread
//!   and a receive buffer, and a link has at most one.
//!
//! - **Bounded memory.** Frames wait in a fixed 4 MB ring per link; a frame
//!   that does not fit, or that comes while the link is down, is dropped and
//!   counted, never queued without bound. The connection's thread copies a
//!   batch out of the ring and writes it with no lock held, so a slow peer
//!   never stalls the data path.
//! - **Liveness.** `TCP_NODELAY`; TCP keepalive (2 s idle, 1 s interval,
//!   3 probes) and `TCP_USER_TIMEOUT` (5 s) so unacknowledged data fails
//!   the connection; an idle sender writes a heartbeat record every second,
//!   and a receiver that hears nothing for 5 s closes the connection.
//! - **TLS.** Both sides present a certificate chaining to the configured
//!   CA, and each side's certificate must name that side's underlay address
//!   (an IP subject alternative name): the server's is checked by the
//!   client as its server name, the client's by the server after the
//!   handshake. A peer that fails is refused, counted (`refused`), logged
//!   once per cause, and never forwards a frame. A link with `tls` refuses
//!   plain connections and a plain link refuses TLS ones.

use crate::shared::Shared;
use rustc_hash::FxHashMap;
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection, StreamOwned};
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vnet_control::{canonical, RxKey, Via};
use vnet_engine::codec::stream::{self, Deframer, Record};
use vnet_engine::DatagramTx;

/// Bytes of frames a link holds while its connection catches up.
pub const QUEUE_BYTES: usize = 4 << 20;
/// The most a connection's thread copies out of the ring per write.
const WRITE_BATCH: usize = 256 << 10;
/// Reconnect backoff: first wait and cap.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// An idle sender's heartbeat period, and how long a receiver waits for
/// anything before it declares the peer dead.
const HEARTBEAT: Duration = Duration::from_secs(1);
const RX_DEAD: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Threads that take accepted connections through their handshake.
pub const PREAUTH_WORKERS: usize = 4;
/// Accepted connections waiting for a worker, at most.
pub const PREAUTH_QUEUE: usize = 64;
/// The whole handshake of an inbound connection, at most.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// An inbound connection with nothing heard for this long may be replaced.
pub const INBOUND_SILENT: Duration = Duration::from_secs(3);

/// A link's connection state, as `show links` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Connecting = 0,
    Up = 1,
    Down = 2,
}

impl State {
    pub fn word(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Up => "up",
            State::Down => "down",
        }
    }
}

/// What a TCP link reports.
#[derive(Debug, Default)]
pub struct Status {
    state: AtomicU8,
    /// An inbound connection from the peer is open.
    pub inbound: AtomicBool,
    pub reconnects: AtomicU64,
    /// Frames dropped because the link was down or its ring full.
    pub queue_drops: AtomicU64,
    /// Connections refused: TLS failures, a peer certificate that does not
    /// name the peer, plain/TLS mismatches.
    pub refused: AtomicU64,
    /// Streams closed because they broke the record format.
    pub stream_errors: AtomicU64,
    pub last_error: Mutex<String>,
    /// Causes of refusal already logged (each is logged once).
    logged: Mutex<Vec<String>>,
}

impl Status {
    pub fn state(&self) -> State {
        match self.state.load(Relaxed) {
            1 => State::Up,
            2 => State::Down,
            _ => State::Connecting,
        }
    }

    fn set(&self, s: State) {
        self.state.store(s as u8, Relaxed);
    }

    fn error(&self, e: impl std::fmt::Display) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = e.to_string();
    }

    /// Counts a refused connection and logs its cause the first time.
    fn refuse(&self, link: &str, peer: IpAddr, cause: String) {
        self.refused.fetch_add(1, Relaxed);
        self.error(&cause);
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if !logged.contains(&cause) && logged.len() < 32 {
            tracing::warn!(link, %peer, "refused: {cause} (logged once per cause)");
            logged.push(cause);
        }
    }
}

/// A fixed-size byte ring of whole records.
struct Ring {
    buf: Vec<u8>,
    head: usize,
    len: usize,
}

impl Ring {
    fn push(&mut self, iov: &[IoSlice<'_>]) -> bool {
        let total: usize = iov.iter().map(|s| s.len()).sum();
        if total > self.buf.len() - self.len {
            return false;
        }
        let cap = self.buf.len();
        let mut at = (self.head + self.len) % cap;
        for s in iov {
            let mut rest: &[u8] = s;
            while !rest.is_empty() {
                let n = rest.len().min(cap - at);
                self.buf[at..at + n].copy_from_slice(&rest[..n]);
                at = (at + n) % cap;
                rest = &rest[n..];
            }
        }
        self.len += total;
        true
    }

    /// Moves up to `out.len()` bytes out.
    fn take(&mut self, out: &mut [u8]) -> usize {
        let cap = self.buf.len();
        let n = self.len.min(out.len());
        let first = n.min(cap - self.head);
        out[..first].copy_from_slice(&self.buf[self.head..self.head + first]);
        out[first..n].copy_from_slice(&self.buf[..n - first]);
        self.head = (self.head + n) % cap;
        self.len -= n;
        n
    }
}

pub use vnet_client::tls::Tls;

/// One TCP link: its queue, status and threads.
pub struct TcpLink {
    name: String,
    id: u32,
    remote: SocketAddr,
    tls: Option<Arc<Tls>>,
    pub status: Status,
    ring: Mutex<Ring>,
    ready: Condvar,
    stop: AtomicBool,
    shared: Arc<Shared>,
    /// The current inbound connection and its number (closed when it fell
    /// silent and a new one authenticated).
    inbound: Mutex<Option<(u64, TcpStream)>>,
    /// Numbers inbound connections; when the current one was last heard.
    inbound_seq: AtomicU64,
    inbound_heard_ns: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl TcpLink {
    /// Starts the link: its connector runs until [`TcpLink::stop`].
    pub fn start(
        name: &str,
        id: u32,
        remote: SocketAddr,
        tls: Option<Arc<Tls>>,
        shared: Arc<Shared>,
    ) -> io::Result<Arc<TcpLink>> {
        let link = Arc::new(TcpLink {
            name: name.to_string(),
            id,
            remote,
            tls,
            status: Status::default(),
            ring: Mutex::new(Ring { buf: vec![0u8; QUEUE_BYTES], head: 0, len: 0 }),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            shared,
            inbound: Mutex::new(None),
            inbound_seq: AtomicU64::new(0),
            inbound_heard_ns: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
        });
        let l = link.clone();
        let t = std::thread::Builder::new().name(format!("tcp-{name}")).spawn(move || l.connector())?;
        link.threads.lock().unwrap_or_else(|p| p.into_inner()).push(t);
        Ok(link)
    }

    /// Stops the link's threads and closes its connections.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        self.ready.notify_all();
        if let Some((_, s)) = self.inbound.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }

    /// Connects, sends, and reconnects when the connection fails.
    fn connector(self: Arc<Self>) {
        let mut backoff = BACKOFF_MIN;
        let mut seed = u64::from(self.id) ^ (self.shared.now_ns() | 1);
        let mut buf = vec![0u8; WRITE_BATCH];
        while !self.stopped() {
            self.status.set(State::Connecting);
            let started = Instant::now();
            match self.connect() {
                Ok(mut conn) => {
                    self.status.set(State::Up);
                    tracing::info!(link = %self.name, remote = %self.remote, "tcp link up");
                    let e = self.send_loop(&mut *conn, &mut buf);
                    if self.stopped() {
                        break;
                    }
                    tracing::info!(link = %self.name, "tcp link down: {e}");
                    self.status.error(&e);
                }
                Err(e) => self.status.error(&e),
            }
            self.status.set(State::Down);
            self.status.reconnects.fetch_add(1, Relaxed);
            // Frames queued for the lost connection go with it.
            self.ring.lock().unwrap_or_else(|p| p.into_inner()).len = 0;
            if started.elapsed() > Duration::from_secs(5) {
                backoff = BACKOFF_MIN;
            }
            // Jitter: 75-125 % of the backoff.
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let wait = backoff.mul_f64(0.75 + (seed >> 11) as f64 / (1u64 << 53) as f64 / 2.0);
            self.sleep(wait);
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        self.status.set(State::Down);
    }

    fn sleep(&self, d: Duration) {
        let g = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.ready.wait_timeout_while(g, d, |_| !self.stopped());
    }

    /// One outgoing connection, TLS handshake done where asked.
    fn connect(&self) -> io::Result<Box<dyn Write + Send>> {
        let sock = TcpStream::connect_timeout(&self.remote, CONNECT_TIMEOUT)?;
        tune(&sock)?;
        let Some(tls) = &self.tls else { return Ok(Box::new(sock)) };
        let name = ServerName::IpAddress(self.remote.ip().into());
        let conn = ClientConnection::new(tls.client_config(), name).map_err(io::Error::other)?;
        let mut s = StreamOwned::new(conn, sock);
        while s.conn.is_handshaking() {
            if let Err(e) = s.conn.complete_io(&mut s.sock) {
                // A TLS failure (a certificate, an alert) is a refusal; an
                // EOF or reset is the peer going away or not ready yet.
                if e.kind() == io::ErrorKind::InvalidData {
                    self.status.refuse(
                        &self.name,
                        self.remote.ip(),
                        format!("TLS handshake with the peer: {e}"),
                    );
                }
                return Err(e);
            }
        }
        Ok(Box::new(s))
    }

    /// Writes queued records (a heartbeat when idle) until the connection fails.
    fn send_loop(&self, conn: &mut dyn Write, buf: &mut [u8]) -> io::Error {
        loop {
            let n = {
                let g = self.ring.lock().unwrap_or_else(|p| p.into_inner());
                let (mut g, _) = self
                    .ready
                    .wait_timeout_while(g, HEARTBEAT, |r| r.len == 0 && !self.stopped())
                    .unwrap_or_else(|p| p.into_inner());
                if self.stopped() {
                    return io::Error::other("stopped");
                }
                g.take(buf)
            };
            let out: &[u8] = if n == 0 { &stream::heartbeat() } else { &buf[..n] };
            if let Err(e) = conn.write_all(out).and_then(|()| conn.flush()) {
                return e;
            }
        }
    }

    /// A pre-authentication worker's part: the first byte, TLS (if the
    /// link wants it) and its certificate's name, all within
    /// [`HANDSHAKE_DEADLINE`]; then the connection is installed (if the
    /// link has no live one) and read on a thread of its own.
    fn authenticate(self: &Arc<Self>, sock: TcpStream, peer: IpAddr) {
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        let _ = tune(&sock);
        let _ = sock.set_read_timeout(Some(HANDSHAKE_DEADLINE));
        let _ = sock.set_write_timeout(Some(HANDSHAKE_DEADLINE));
        // Plain or TLS: the first byte tells (a TLS record starts 0x16, a
        // `vnet` record with its version, 1).
        let mut first = [0u8; 1];
        let is_tls = match sock.peek(&mut first) {
            Ok(1) => first[0] == 0x16,
            _ => return,
        };
        let Ok(keep) = sock.try_clone() else { return };
        let reader: Box<dyn Read + Send> = match (&self.tls, is_tls) {
            (None, false) => Box::new(sock),
            (Some(tls), true) => match self.accept_tls(tls, sock, peer, deadline) {
                Some(r) => r,
                None => return,
            },
            (Some(_), false) => {
                return self.status.refuse(&self.name, peer, "a plain connection on a `tls` link".into())
            }
            (None, true) => {
                return self.status.refuse(&self.name, peer, "a TLS connection on a plain link".into())
            }
        };
        let _ = keep.set_read_timeout(Some(RX_DEAD));
        let _ = keep.set_write_timeout(None);
        let seq = {
            let mut inbound = self.inbound.lock().unwrap_or_else(|p| p.into_inner());
            if self.stopped() {
                return;
            }
            let now = self.shared.now_ns();
            let heard = now.saturating_sub(self.inbound_heard_ns.load(Relaxed));
            if inbound.is_some() && heard < INBOUND_SILENT.as_nanos() as u64 {
                drop(inbound);
                return self.status.refuse(
                    &self.name,
                    peer,
                    "another connection while the peer's is alive".into(),
                );
            }
            if let Some((_, old)) = inbound.take() {
                let _ = old.shutdown(std::net::Shutdown::Both);
            }
            let seq = self.inbound_seq.fetch_add(1, Relaxed) + 1;
            self.inbound_heard_ns.store(now, Relaxed);
            *inbound = Some((seq, keep));
            seq
        };
        let l = self.clone();
        let t = std::thread::Builder::new().name(format!("tcp-in-{}", self.name)).spawn(move || {
            l.status.inbound.store(true, Relaxed);
            l.read_loop(reader);
            let mut inbound = l.inbound.lock().unwrap_or_else(|p| p.into_inner());
            if inbound.as_ref().is_some_and(|(n, _)| *n == seq) {
                *inbound = None;
                l.status.inbound.store(false, Relaxed);
            }
        });
        match t {
            Ok(t) => {
                let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
                threads.retain(|t| !t.is_finished());
                threads.push(t);
            }
            Err(e) => {
                tracing::warn!(link = %self.name, "cannot serve the connection from {peer}: {e}");
                if let Some((_, s)) = self.inbound.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }

    fn accept_tls(
        &self,
        tls: &Tls,
        sock: TcpStream,
        peer: IpAddr,
        deadline: Instant,
    ) -> Option<Box<dyn Read + Send>> {
        let conn = ServerConnection::new(tls.server_config()).ok()?;
        let mut s = StreamOwned::new(conn, sock);
        while s.conn.is_handshaking() {
            // What is left of the deadline bounds every read and write, so
            // a peer sending a byte at a time gets no more than the whole.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.status
                    .error(format!("TLS handshake from {peer} not done within {HANDSHAKE_DEADLINE:?}"));
                return None;
            }
            let _ = s.sock.set_read_timeout(Some(left));
            let _ = s.sock.set_write_timeout(Some(left));
            if let Err(e) = s.conn.complete_io(&mut s.sock) {
                if e.kind() == io::ErrorKind::InvalidData {
                    self.status.refuse(&self.name, peer, format!("TLS handshake: {e}"));
                } else {
                    self.status.error(format!("TLS handshake: {e}"));
                }
                return None;
            }
        }
        // The chain was verified against the CA; it must also be the peer's.
        let named = s.conn.peer_certificates().and_then(|c| c.first()).is_some_and(|c| {
            rustls::server::ParsedCertificate::try_from(c)
                .and_then(|p| rustls::client::verify_server_name(&p, &ServerName::IpAddress(peer.into())))
                .is_ok()
        });
        if !named {
            self.status.refuse(&self.name, peer, format!("the peer's certificate does not name {peer}"));
            return None;
        }
        Some(Box::new(s))
    }

    fn read_loop(&self, mut r: Box<dyn Read + Send>) {
        let mut d = Deframer::default();
        let mut fw = self.shared.forwarder();
        loop {
            let n = match r.read(d.spare()) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // reset, or nothing for RX_DEAD
            };
            if self.stopped() {
                return;
            }
            d.filled(n);
            let plane = self.shared.plane.load();
            let Some(link) = plane.links.get(&self.id) else { return };
            let now = self.shared.now_ns();
            link.alive.heard(now);
            self.inbound_heard_ns.store(now, Relaxed);
            let cx = &mut vnet_engine::rx::Cx { fw: &mut fw, plane: &plane, now_ns: now };
            loop {
                match d.next_record() {
                    Ok(Some(Record::Frame { with_vh, payload })) => {
                        vnet_engine::rx::stream_record(cx, link, with_vh, payload)
                    }
                    Ok(Some(Record::Heartbeat)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        self.status.stream_errors.fetch_add(1, Relaxed);
                        self.status.error(format!("inbound stream: {e}"));
                        return;
                    }
                }
            }
            fw.report();
        }
    }
}

impl DatagramTx for TcpLink {
    /// Queues one record for the connection's thread; drops it (false)
    /// when the link is down or the ring is full.
    fn send(&self, iov: &[IoSlice<'_>], _seg: usize, _flow: u64) -> bool {
        if self.status.state() != State::Up {
            self.status.queue_drops.fetch_add(1, Relaxed);
            return false;
        }
        let ok = self.ring.lock().unwrap_or_else(|p| p.into_inner()).push(iov);
        if ok {
            self.ready.notify_one();
        } else {
            self.status.queue_drops.fetch_add(1, Relaxed);
        }
        ok
    }
}

/// Socket options of every link connection.
fn tune(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    crate::sys::tcp_liveness(s, 2, 1, 3, 5000)
}

/// Accepts peers' connections on `listen tcp` and hands each to its link.
pub struct Acceptor {
    pub addr: SocketAddr,
    links: Arc<Mutex<FxHashMap<IpAddr, Arc<TcpLink>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    listener: TcpListener,
}

impl Acceptor {
    /// Binds `addr` and starts accepting, with the pre-authentication pool.
    pub fn bind(addr: SocketAddr, global: Arc<vnet_engine::Global>) -> io::Result<Acceptor> {
        let name = crate::handover::name(&["tcp", &addr.to_string()]).unwrap_or_default();
        let handed =
            crate::handover::take(&name).map(TcpListener::from).filter(|l| l.local_addr().ok() == Some(addr));
        let l = match handed {
            Some(l) => l,
            None => TcpListener::bind(addr)?,
        };
        let addr = l.local_addr()?;
        let listener = l.try_clone()?;
        let links: Arc<Mutex<FxHashMap<IpAddr, Arc<TcpLink>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        type Job = (TcpStream, IpAddr, Arc<TcpLink>);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(PREAUTH_QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..PREAUTH_WORKERS {
            let rx = rx.clone();
            // Not joined: a worker ends when the acceptor's queue is gone
            // and its handshake (bounded by the deadline) is over.
            std::thread::Builder::new().name(format!("tcp-auth-{i}")).spawn(move || loop {
                let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((sock, peer, link)) = job else { return };
                if !link.stopped() {
                    link.authenticate(sock, peer);
                }
            })?;
        }
        let (links2, stop2, g2) = (links.clone(), stop.clone(), global);
        let thread = std::thread::Builder::new().name("tcp-accept".into()).spawn(move || {
            for conn in l.incoming() {
                if stop2.load(Relaxed) {
                    break;
                }
                let Ok(sock) = conn else { continue };
                let Ok(peer) = sock.peer_addr() else { continue };
                let peer = canonical(peer.ip());
                let link = links2.lock().unwrap_or_else(|p| p.into_inner()).get(&peer).cloned();
                let Some(link) = link else {
                    g2.unknown_source.fetch_add(1, Relaxed);
                    continue; // dropped: closed
                };
                match tx.try_send((sock, peer, link)) {
                    Ok(()) => {}
                    Err(std::sync::mpsc::TrySendError::Full((_, peer, link))) => {
                        let cause =
                            format!("more than {PREAUTH_QUEUE} connections waiting for their handshake");
                        link.status.refuse(&link.name, peer, cause);
                    }
                    Err(std::sync::mpsc::TrySendError::Disconnected(_)) => break,
                }
            }
        })?;
        Ok(Acceptor { addr, links, stop, thread: Some(thread), listener })
    }

    /// The listening socket, for a hand-over.
    pub fn listener(&self) -> io::Result<std::os::fd::OwnedFd> {
        Ok(self.listener.try_clone()?.into())
    }

    /// Makes the accepted connections of `peers` go to those links (and
    /// nobody else's be accepted).
    pub fn set_links(&self, links: impl IntoIterator<Item = (RxKey, Arc<TcpLink>)>) {
        let m = links
            .into_iter()
            .filter_map(|(k, l)| match k {
                RxKey::Addr(Via::Tcp, ip, _) => Some((ip, l)),
                _ => None,
            })
            .collect();
        *self.links.lock().unwrap_or_else(|p| p.into_inner()) = m;
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&wake_addr(self.addr), Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An address that reaches a listener bound to `addr` (a wildcard address
/// is reached on loopback).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(a) if a.is_unspecified() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(a) if a.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_records_whole_across_the_wrap() {
        let mut r = Ring { buf: vec![0u8; 10], head: 0, len: 0 };
        assert!(r.push(&[IoSlice::new(b"abc"), IoSlice::new(b"def")]));
        let mut out = [0u8; 4];
        assert_eq!(r.take(&mut out), 4);
        assert_eq!(&out, b"abcd");
        assert!(r.push(&[IoSlice::new(b"ghijkl")]));
        assert!(!r.push(&[IoSlice::new(b"xyz")]), "a record that does not fit is refused whole");
        let mut all = [0u8; 10];
        let n = r.take(&mut all);
        assert_eq!(&all[..n], b"efghijkl");
    }
}
