//! Serving the endpoint: its listeners, each connection's slot or place in
//! the pending pool, authentication (`auth TOKEN`, a TLS client
//! certificate), and a session's lines read and answered
//! ([`super::answer`]) until it closes, goes idle or stops reading.

use super::{
    answer, Access, Endpoint, Limits, Session, AUTH_DEADLINE, AUTH_REQUIRED, MAX_CONNECTIONS, MAX_LINE,
    PENDING_MAX, TOO_MANY, WRITE_TIMEOUT,
};
use crate::daemon::Daemon;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use vnet_control::Reply;

impl Access {
    /// Whether a unix-socket peer with these credentials may connect.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        uid == 0 || uid == crate::sys::euid() || self.group == Some(gid)
    }

    /// Whether `line` is the `auth TOKEN` line for this endpoint's token
    /// (compared in constant time).
    fn authenticates(&self, line: &str) -> bool {
        let (Some(token), Some(given)) = (&self.token, line.strip_prefix("auth ")) else { return false };
        let (a, b) = (token.as_bytes(), given.trim().as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// Serves one connection until it closes, goes idle, or stops reading
/// (a `tcp:` endpoint's client first sends `auth TOKEN`).
pub async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(
    daemon: Arc<Mutex<Daemon>>,
    stream: S,
    limits: Limits,
) {
    let locked = limits.access.token.is_some();
    serve_session(daemon, stream, limits, locked).await
}

/// [`serve_conn`], the client's `auth` line already taken unless `locked`.
async fn serve_session<S: AsyncRead + AsyncWrite + Unpin>(
    daemon: Arc<Mutex<Daemon>>,
    stream: S,
    limits: Limits,
    mut locked: bool,
) {
    let (r, mut w) = tokio::io::split(stream);
    let mut r = BufReader::new(r);
    let idle = limits.idle;
    let access = limits.access.clone();
    let mut s = Session::new(limits);
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        let mut limited = (&mut r).take(MAX_LINE as u64 + 1);
        let n = match tokio::time::timeout(idle, limited.read_until(b'\n', &mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => return,
            Err(_) => {
                let bye = Reply::error(format!("idle for {} s: closing", idle.as_secs())).encode();
                let _ = tokio::time::timeout(WRITE_TIMEOUT, w.write_all(bye.as_bytes())).await;
                return;
            }
        };
        if n == 0 {
            return;
        }
        if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
            let _ = w
                .write_all(Reply::error(format!("line longer than {MAX_LINE} bytes")).encode().as_bytes())
                .await;
            return;
        }
        let reply = match std::str::from_utf8(&buf) {
            Ok(line) if locked => {
                if !access.authenticates(line.trim_end_matches(['\n', '\r'])) {
                    let bye = Reply::error(AUTH_REQUIRED).encode();
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, w.write_all(bye.as_bytes())).await;
                    return;
                }
                locked = false;
                Reply::ok().encode()
            }
            Ok(line) => {
                let line = line.trim_end_matches(['\n', '\r']);
                answer(&daemon, &mut s, line).await.encode()
            }
            Err(_) => Reply::error("expected UTF-8 text").encode(),
        };
        if !matches!(tokio::time::timeout(WRITE_TIMEOUT, w.write_all(reply.as_bytes())).await, Ok(Ok(()))) {
            return;
        }
    }
}

/// The hand-over name of endpoint `ep`'s listener ([`crate::handover`]).
fn listener_name(ep: &Endpoint) -> Option<String> {
    match ep {
        Endpoint::Unix(path) => crate::handover::name(&["control", "unix", &path.display().to_string()]),
        Endpoint::Tcp(addr) => crate::handover::name(&["control", "tcp", &addr.to_string()]),
        Endpoint::Tls(addr) => crate::handover::name(&["control", "tls", &addr.to_string()]),
    }
}

/// The TCP listener of `addr`: the previous vnetd's, handed over under
/// `name`, else bound anew.
async fn tcp_listener(
    name: Option<&str>,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpListener> {
    match name.and_then(crate::handover::take_control) {
        Some(fd) => {
            let l = std::net::TcpListener::from(fd);
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)
        }
        None => tokio::net::TcpListener::bind(addr).await,
    }
}

/// How long a stopping vnetd lets the connections it accepted finish
/// (a request read and not answered yet, or not yet read): a client that
/// asked just before a stop or a hand-over gets its answer.
const DRAIN: std::time::Duration = std::time::Duration::from_millis(200);

/// Waits until no connection holds a slot, or [`DRAIN`].
async fn drain(slots: &tokio::sync::Semaphore) {
    let idle = async {
        while slots.available_permits() < MAX_CONNECTIONS {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    };
    let _ = tokio::time::timeout(DRAIN, idle).await;
}

/// What [`serve`] leaves when it stops: its listener, by hand-over name, for
/// the next vnetd (a hand-over keeps it open, so that clients wait in its
/// queue and nobody else can take the address or the socket's path
/// meanwhile); dropping it closes it.
pub type Listener = Option<(String, std::os::fd::OwnedFd)>;

/// Accepts connections on `ep` until `shutdown` completes; returns the
/// listener ([`Listener`]). A listener the previous vnetd handed over is
/// used as it is: nothing is bound, no socket file touched.
pub async fn serve(
    ep: &Endpoint,
    daemon: Arc<Mutex<Daemon>>,
    limits: Limits,
    tls: Option<Arc<crate::link::tcp::Tls>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<Listener> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let pending = Arc::new(Pending::default());
    let name = listener_name(ep);
    tokio::pin!(shutdown);
    match ep {
        Endpoint::Unix(path) => {
            // A handed-over listener whose path someone removed meanwhile
            // reaches no client: bound anew then.
            let inherited = name.as_deref().and_then(crate::handover::take_control);
            let l = match inherited.filter(|_| path.exists()) {
                Some(fd) => {
                    let l = std::os::unix::net::UnixListener::from(fd);
                    l.set_nonblocking(true)?;
                    tokio::net::UnixListener::from_std(l)?
                }
                None => {
                    crate::paths::claim_socket_path(path)?;
                    // Made 0600 (vnetd's umask), not chmod'ed after the fact.
                    tokio::net::UnixListener::bind(path)?
                }
            };
            loop {
                tokio::select! {
                    _ = &mut shutdown => break,
                    a = l.accept() => if let Ok((c, _)) = a {
                        match c.peer_cred() {
                            Ok(cred) if limits.access.allows(cred.uid(), cred.gid()) => spawn_conn(&slots, &daemon, &limits, c),
                            cred => refuse(c, &format!(
                                "permission denied: uid {} is not root, vnetd's user or in the control group",
                                cred.map_or(u32::MAX, |c| c.uid())
                            )),
                        }
                    },
                }
            }
            drain(&slots).await;
            let fd: std::os::fd::OwnedFd = l.into_std()?.into();
            Ok(name.map(|n| (n, fd)))
        }
        Endpoint::Tcp(addr) => {
            check_tcp_endpoint(*addr)?;
            if limits.access.token.is_none() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a tcp: control endpoint needs a token (--control-token FILE)",
                ));
            }
            let l = tcp_listener(name.as_deref(), *addr).await?;
            loop {
                tokio::select! {
                    _ = &mut shutdown => break,
                    a = l.accept() => if let Ok((c, _)) = a { spawn_tcp_conn(&pending, &slots, &daemon, &limits, c) },
                }
            }
            drain(&slots).await;
            let fd: std::os::fd::OwnedFd = l.into_std()?.into();
            Ok(name.map(|n| (n, fd)))
        }
        Endpoint::Tls(addr) => {
            let Some(tls) = tls else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a tls: control endpoint needs --control-tls CERT,KEY,CA",
                ));
            };
            let l = tcp_listener(name.as_deref(), *addr).await?;
            loop {
                tokio::select! {
                    _ = &mut shutdown => break,
                    a = l.accept() => if let Ok((c, _)) = a {
                        // The identity as now (`reload` renews it in place).
                        let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
                        spawn_tls_conn(&pending, &slots, &daemon, &limits, &acceptor, c)
                    },
                }
            }
            drain(&slots).await;
            let fd: std::os::fd::OwnedFd = l.into_std()?.into();
            Ok(name.map(|n| (n, fd)))
        }
    }
}

/// The connections of one endpoint that have not authenticated yet
/// ([`PENDING_MAX`] at most; the module's doc says why the oldest goes).
#[derive(Default)]
struct Pending {
    /// The next id, and the waiting connections' tasks, oldest first.
    waiting: Mutex<(u64, std::collections::VecDeque<(u64, tokio::task::AbortHandle)>)>,
}

impl Pending {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, (u64, std::collections::VecDeque<(u64, tokio::task::AbortHandle)>)> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `task(id)` as a waiting connection: the oldest waiting one is
    /// dropped if the pool is full. The task calls [`Pending::done`] with
    /// its id once authenticated (it can no longer be dropped then).
    fn admit<F>(self: &Arc<Self>, task: impl FnOnce(u64) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        // Spawned under the lock, so `done` (which takes it) cannot run
        // before the task is listed.
        let mut w = self.lock();
        if w.1.len() >= PENDING_MAX {
            if let Some((_, oldest)) = w.1.pop_front() {
                oldest.abort();
            }
        }
        let id = w.0;
        w.0 += 1;
        let h = tokio::spawn(task(id));
        w.1.push_back((id, h.abort_handle()));
    }

    /// Connection `id` authenticated (or gave up): no longer waiting.
    fn done(&self, id: u64) {
        self.lock().1.retain(|(i, _)| *i != id);
    }
}

/// Reads a `tcp:` client's first line (at most 256 bytes, byte by byte so
/// nothing after it is taken from the stream) within [`AUTH_DEADLINE`]:
/// whether it is `auth TOKEN` with the endpoint's token.
async fn authenticated<S: AsyncRead + Unpin>(c: &mut S, access: &Access) -> bool {
    let read = async {
        let mut line = Vec::with_capacity(80);
        while line.len() < 256 {
            match c.read_u8().await {
                Ok(b'\n') => return Some(line),
                Ok(b) => line.push(b),
                Err(_) => return None,
            }
        }
        None
    };
    match tokio::time::timeout(AUTH_DEADLINE, read).await {
        Ok(Some(line)) => {
            std::str::from_utf8(&line).is_ok_and(|l| access.authenticates(l.trim_end_matches('\r')))
        }
        _ => false,
    }
}

/// Serves an authenticated connection in one of the endpoint's
/// [`MAX_CONNECTIONS`] slots, or tells it there is none. `greeting` is
/// written first (a `tcp:` client's `auth` answer, read already); a
/// connection whose `auth` line is still to come (a `tls:` endpoint given
/// a token too) gets it in [`serve_conn`].
async fn serve_authenticated<S: AsyncRead + AsyncWrite + Unpin>(
    slots: &Arc<tokio::sync::Semaphore>,
    daemon: Arc<Mutex<Daemon>>,
    mut c: S,
    limits: Limits,
    greeting: &[u8],
) {
    let Ok(permit) = slots.clone().try_acquire_owned() else {
        let bye = Reply::error(TOO_MANY).encode();
        let _ = tokio::time::timeout(WRITE_TIMEOUT, c.write_all(bye.as_bytes())).await;
        return;
    };
    if !greeting.is_empty()
        && !matches!(tokio::time::timeout(WRITE_TIMEOUT, c.write_all(greeting)).await, Ok(Ok(())))
    {
        return;
    }
    if greeting.is_empty() {
        serve_conn(daemon, c, limits).await;
    } else {
        serve_session(daemon, c, limits, false).await;
    }
    drop(permit);
}

/// A `tcp:` connection: its `auth` line while waiting in the pending pool,
/// then the protocol in a connection slot.
fn spawn_tcp_conn(
    pending: &Arc<Pending>,
    slots: &Arc<tokio::sync::Semaphore>,
    daemon: &Arc<Mutex<Daemon>>,
    limits: &Limits,
    c: tokio::net::TcpStream,
) {
    let (p, slots, d, limits) = (pending.clone(), slots.clone(), daemon.clone(), limits.clone());
    pending.admit(move |id| async move {
        let mut c = c;
        let ok = authenticated(&mut c, &limits.access).await;
        p.done(id);
        if !ok {
            let bye = Reply::error(AUTH_REQUIRED).encode();
            let _ = tokio::time::timeout(WRITE_TIMEOUT, c.write_all(bye.as_bytes())).await;
            return;
        }
        serve_authenticated(&slots, d, c, limits, Reply::ok().encode().as_bytes()).await;
    });
}

/// A TLS connection: the handshake while waiting in the pending pool
/// (within [`AUTH_DEADLINE`]), then the protocol in a connection slot. A
/// client without a certificate of the CA gets nothing but the TLS alert.
fn spawn_tls_conn(
    pending: &Arc<Pending>,
    slots: &Arc<tokio::sync::Semaphore>,
    daemon: &Arc<Mutex<Daemon>>,
    limits: &Limits,
    acceptor: &tokio_rustls::TlsAcceptor,
    c: tokio::net::TcpStream,
) {
    let (p, slots, d, limits, acceptor) =
        (pending.clone(), slots.clone(), daemon.clone(), limits.clone(), acceptor.clone());
    pending.admit(move |id| async move {
        let shaken = tokio::time::timeout(AUTH_DEADLINE, acceptor.accept(c)).await;
        p.done(id);
        match shaken {
            Ok(Ok(s)) => match client_named(&s, limits.access.client_name.as_deref()) {
                Ok(()) => serve_authenticated(&slots, d, s, limits, b"").await,
                Err(e) => {
                    tracing::info!("control: TLS client refused: {e}");
                    let mut s = s;
                    let bye = Reply::error(&e).encode();
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, s.write_all(bye.as_bytes())).await;
                }
            },
            Ok(Err(e)) => tracing::info!("control: TLS handshake refused: {e}"),
            Err(_) => tracing::info!("control: TLS handshake timed out"),
        }
    });
}

/// Why a TLS client's certificate is not the one `--control-client-name` asks for.
#[derive(Debug, thiserror::Error)]
enum ClientNameError {
    #[error("no client certificate")]
    NoCertificate,
    #[error("`{name}`: {source}")]
    BadName { name: String, source: rustls::pki_types::InvalidDnsNameError },
    #[error("the client certificate is not `{name}`'s")]
    NotNamed { name: String },
}

/// Whether the TLS client's certificate holds the DNS name `name` (any
/// certificate of the CA where no name is configured).
fn client_named<S>(
    s: &tokio_rustls::server::TlsStream<S>,
    name: Option<&str>,
) -> Result<(), ClientNameError> {
    let Some(name) = name else { return Ok(()) };
    let certs = s.get_ref().1.peer_certificates().unwrap_or_default();
    let cert = certs.first().ok_or(ClientNameError::NoCertificate)?;
    let server_name = rustls::pki_types::ServerName::try_from(name)
        .map_err(|source| ClientNameError::BadName { name: name.to_string(), source })?;
    webpki::EndEntityCert::try_from(cert)
        .and_then(|c| c.verify_is_valid_for_subject_name(&server_name))
        .map_err(|_| ClientNameError::NotNamed { name: name.to_string() })
}

/// Answers `why` and closes, without serving.
fn refuse<S: AsyncWrite + Unpin + Send + 'static>(mut c: S, why: &str) {
    let bye = Reply::error(why).encode();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(WRITE_TIMEOUT, c.write_all(bye.as_bytes())).await;
    });
}

/// A TCP control endpoint is served on loopback only, and only to clients
/// that present its token: whoever uses it has root's power over the host.
pub fn check_tcp_endpoint(addr: SocketAddr) -> std::io::Result<()> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "refusing a control endpoint on {addr}: off loopback anyone who reaches it would control vnetd \
             (use unix:PATH, or tcp: on a loopback address reached through ssh)"
        ),
    ))
}

fn spawn_conn<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    slots: &Arc<tokio::sync::Semaphore>,
    daemon: &Arc<Mutex<Daemon>>,
    limits: &Limits,
    c: S,
) {
    match slots.clone().try_acquire_owned() {
        Ok(permit) => {
            let (d, limits) = (daemon.clone(), limits.clone());
            tokio::spawn(async move {
                serve_conn(d, c, limits).await;
                drop(permit);
            });
        }
        Err(_) => {
            tokio::spawn(async move {
                let mut c = c;
                let bye = Reply::error(TOO_MANY).encode();
                let _ = tokio::time::timeout(WRITE_TIMEOUT, c.write_all(bye.as_bytes())).await;
            });
        }
    }
}
