//! Cluster mode (`vnetd --cluster etcd:URL[,URL...] --network NAME`): the
//! host programs itself from etcd, as flannel's and Calico's agents do.
//!
//! One task, on the control plane's runtime, holds a session with etcd:
//!
//! 1. a lease with the configured TTL, kept alive every third of it (a
//!    host that dies stops keeping it, and etcd deletes its keys);
//! 2. a full listing of the network's prefix, taken into the sans-IO
//!    [`Member`] view; the host's record and the MACs of its interfaces
//!    (each declared `mac`) are put under the lease;
//! 3. a watch of the prefix from the listed revision: each response's
//!    events go through the view (every record checked, a bad one
//!    quarantined and counted), and what changes becomes one transaction
//!    of typed commands ([`vnet_cluster::apply`]), applied like any other,
//!    so both data paths follow atomically. A transaction the daemon
//!    refuses is retried as the whole view, with a backoff, and each
//!    distinct error is logged once;
//! 4. every [`LOCAL_POLL`], the daemon's state is checked for interfaces
//!    declared or deleted since (a relocated VM's new interface): a new
//!    one's MAC is claimed at once, a deleted one's released if the key is
//!    still this host's. A `standby` interface (a live migration's
//!    destination) is claimed only once its VM arrived and it became
//!    active, at the epoch above the held one (a migration: announced with
//!    a RARP); a MAC another live host holds is otherwise not claimed (a
//!    conflict, shown, tried again as the view changes);
//! 5. with `nat` link options, the address its peers reflect (behind a NAT
//!    that keeps the port) goes into its record.
//!
//! Any failure of the session (etcd unreachable, the watch closed, the
//! lease lost) leaves the data path as it is; the task says so in
//! [`membership`](crate::membership) and starts a new session after a
//! backoff. While the task waits (on etcd, or between sessions), local
//! interfaces declared meanwhile are routed within [`LOCAL_POLL`], and
//! published when the store is back: a host's own VMs never wait for it. A compaction that overtakes the watch is answered by listing
//! again, inside the session. A new session lists again, so a change
//! made while the host was away converges when it is back.

use crate::daemon::Daemon;
use crate::membership::{self, Convergence, Health};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use vnet_cluster::apply::{local, plan, LinkOptions};
use vnet_cluster::layout::{host_key, mac_key, parse_key, valid_name, Key};
use vnet_cluster::trust::{ClaimKey, NetworkPublic};
use vnet_cluster::{Change, Event, HostRecord, MacRecord, Member, Policy};
use vnet_wire::MacAddr;

/// How often the daemon's interfaces are compared with what was published.
pub const LOCAL_POLL: Duration = Duration::from_millis(20);
/// The longest wait between two sessions.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The first and the longest wait before a refused transaction is retried.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// What cluster mode needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// How to reach etcd.
    pub store: Store,
    pub network: String,
    /// This host's name in the network.
    pub host: String,
    /// The address and port other hosts' links send to (by default the
    /// `listen udp` address, when it names one).
    pub advertise: Option<SocketAddr>,
    /// A host that stops is gone from the others within this (its lease
    /// is [`lease_ttl`]).
    pub ttl: Duration,
    /// How this host's links to others are made.
    pub link_options: LinkOptions,
    /// The network's key: records need its certificate, claims a signature.
    pub network_key: Option<NetworkPublic>,
    /// This host's certificate (`vnetctl sign`), published in its record.
    pub cert: Option<String>,
    /// This host's claim key (from its `--key`): signs its MAC claims.
    pub claim_key: Option<Arc<ClaimKey>>,
    /// This host relays between its secured peers (`vnetd --relay`): its
    /// record says so, for the others' `relay auto`.
    pub relay: bool,
}

/// `etcd:URL[,URL...]` to the URLs (an `http://` is assumed where a URL
/// names no scheme); all of them `http://` or all `https://`.
pub fn parse_endpoints(s: &str) -> Result<Vec<String>, String> {
    let rest = s.strip_prefix("etcd:").ok_or_else(|| format!("expected etcd:URL[,URL...], found `{s}`"))?;
    let urls: Vec<String> = rest
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| if u.contains("://") { u.to_string() } else { format!("http://{u}") })
        .collect();
    if urls.is_empty() {
        return Err(format!("expected at least one URL after `etcd:`, found `{s}`"));
    }
    if let Some(bad) = urls.iter().find(|u| !u.starts_with("http://") && !u.starts_with("https://")) {
        return Err(format!("`{bad}`: expected an http:// or https:// URL"));
    }
    if urls.iter().any(|u| u.starts_with("https://")) && urls.iter().any(|u| u.starts_with("http://")) {
        return Err("all URLs https:// or all http://, not both".into());
    }
    Ok(urls)
}

/// The files and names of `--etcd-*`: how vnetd proves who it is to etcd
/// and checks that etcd is etcd.
#[derive(Debug, Clone, Default)]
pub struct StoreAuth {
    /// The CA that signed etcd's server certificate (needed for https://).
    pub ca: Option<std::path::PathBuf>,
    /// This host's client certificate and key (etcd's
    /// `--client-cert-auth`; with auth enabled and no user, its common
    /// name is the etcd user).
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    /// An etcd user and the file of its password (owner only).
    pub user: Option<String>,
    pub password_file: Option<std::path::PathBuf>,
}

/// How vnetd reaches etcd: its URLs, TLS, and the user it is.
#[derive(Clone, Default)]
pub struct Store {
    pub endpoints: Vec<String>,
    tls: Option<etcd_client::TlsOptions>,
    user: Option<(String, String)>,
    /// The files and the user, as given: named in what a failure says.
    auth: StoreAuth,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls.is_some())
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl Store {
    /// Checks `--cluster` and `--etcd-*` together and reads their files.
    /// Also returns a warning to log when the store is reached in clear
    /// over a network.
    pub fn load(spec: &str, auth: &StoreAuth) -> Result<(Store, Option<String>), String> {
        let endpoints = parse_endpoints(spec).map_err(|e| format!("--cluster: {e}"))?;
        let tls = endpoints[0].starts_with("https://");
        let loopback = endpoints.iter().all(|u| on_loopback(u));
        let mut warning = None;
        let tls = if tls {
            let ca = auth
                .ca
                .as_ref()
                .ok_or("--cluster https://: give --etcd-ca FILE, the CA of etcd's certificate")?;
            let pem =
                crate::keys::read_trusted(ca, "etcd's CA", 1 << 20).map_err(|e| format!("--etcd-ca {e}"))?;
            let mut opts =
                etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem));
            match (&auth.cert, &auth.key) {
                (Some(c), Some(k)) => {
                    let cert = std::fs::read(c).map_err(|e| format!("--etcd-cert {}: {e}", c.display()))?;
                    let key = crate::keys::read_secret(k, "the private key", 64 * 1024)
                        .map_err(|e| format!("--etcd-key {e}"))?;
                    opts = opts.identity(etcd_client::Identity::from_pem(cert, key));
                }
                (None, None) => {}
                _ => return Err("--etcd-cert and --etcd-key go together".into()),
            }
            Some(opts)
        } else {
            if auth.ca.is_some() || auth.cert.is_some() || auth.key.is_some() {
                return Err("--etcd-ca, --etcd-cert and --etcd-key need https:// URLs in --cluster".into());
            }
            if auth.user.is_some() && !loopback {
                return Err(
                    "--etcd-user over http:// would send its password in clear: use https:// URLs".into()
                );
            }
            if !loopback {
                warning = Some(format!(
                    "cluster: etcd is reached over plain http ({}): anyone on that path reads and writes \
                     the network's records; use https:// with --etcd-ca and a client certificate",
                    endpoints.join(",")
                ));
            }
            None
        };
        let user = match (&auth.user, &auth.password_file) {
            (Some(u), Some(f)) => {
                let pw = crate::keys::read_secret(f, "the password", 4096)
                    .map_err(|e| format!("--etcd-password-file {e}"))?;
                let pw = pw.trim_end_matches(['\r', '\n']);
                if pw.is_empty() {
                    return Err(format!("--etcd-password-file {}:1:1: expected a password", f.display()));
                }
                Some((u.clone(), pw.to_string()))
            }
            (None, None) => None,
            _ => return Err("--etcd-user and --etcd-password-file go together".into()),
        };
        Ok((Store { endpoints, tls, user, auth: auth.clone() }, warning))
    }

    /// Options for a connection: TLS and the user when configured.
    fn connect_options(&self) -> ConnectOptions {
        let mut opts = ConnectOptions::new();
        if let Some(tls) = &self.tls {
            opts = opts.with_tls(tls.clone());
        }
        if let Some((u, p)) = &self.user {
            opts = opts.with_user(u.clone(), p.clone()).with_auto_token_refresh(true);
        }
        opts
    }
}

/// Whether a URL's host is a loopback address (or `localhost`).
fn on_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split('/').next().unwrap_or("");
    let host = match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The address other hosts' links send to: `advertise`, else the host's
/// `listen udp` address when it names one.
pub fn advertised(advertise: Option<SocketAddr>, listen: SocketAddr) -> Result<SocketAddr, String> {
    match advertise {
        Some(a) => Ok(a),
        None if !listen.ip().is_unspecified() && listen.port() != 0 => Ok(listen),
        None => Err(format!(
            "other hosts must know where to send: this host listens on {listen}; \
             give --advertise ADDR:PORT or a `listen udp ADDR:PORT` line"
        )),
    }
}

/// The network key (base64, or a file holding it) and this host's
/// certificate, checked against each other and against this host: its
/// name, network, static key and advertised address.
pub fn load_trust(
    key: &str,
    cert: Option<&std::path::Path>,
    network: &str,
    host: &str,
    addr: SocketAddr,
    daemon: &Daemon,
) -> Result<(NetworkPublic, String), String> {
    let text = if std::path::Path::new(key).is_file() {
        let bytes = crate::keys::read_trusted(std::path::Path::new(key), "the network's public key", 4096)
            .map_err(|e| format!("--network-key {e}"))?;
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        key.to_string()
    };
    let nk = NetworkPublic::from_base64(&text).map_err(|e| format!("--network-key: {e}"))?;
    let path =
        cert.ok_or("--network-key needs this host's certificate (--host-cert FILE, from `vnetctl sign`)")?;
    let shown = path.display();
    let cert =
        std::fs::read_to_string(path).map_err(|e| format!("--host-cert {shown}: {e}"))?.trim().to_string();
    let c = nk.verify(&cert).map_err(|e| format!("--host-cert {shown}: {e}"))?;
    let own = daemon.public_key().ok_or("--network-key: links are secured, so this host needs --key FILE")?;
    if c.network != network || c.host != host {
        return Err(format!(
            "--host-cert {shown}: it is host `{}` of network `{}`, not `{host}` of `{network}`",
            c.host, c.network
        ));
    }
    if c.public_key.to_string() != own {
        return Err(format!("--host-cert {shown}: it names another public key than --key's"));
    }
    if !c.allows(addr.ip()) {
        return Err(format!("--host-cert {shown}: it does not allow the advertised address {}", addr.ip()));
    }
    let now_s = membership::now_ms() / 1000;
    if let Some(t) = c.not_after {
        if c.expired(now_s) {
            return Err(format!("--host-cert {shown}: it expired {} s ago; sign a new one", now_s - t));
        }
        if t - now_s < 7 * 86400 {
            tracing::warn!("--host-cert {shown}: it expires in {} h; sign a new one", (t - now_s) / 3600);
        }
    }
    Ok((nk, cert))
}

/// Checks a network or host name (the store's key segments).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(format!("{what} `{name}`: expected 1 to 63 letters, digits, `-`, `_` or `.`"))
    }
}

/// Runs cluster mode for ever (the caller's runtime ends it).
pub async fn run(
    cfg: Config,
    daemon: Arc<Mutex<Daemon>>,
    status: membership::Shared,
    mut ipam: Option<crate::ipam::Receiver>,
) {
    {
        let mut s = lock(&status);
        s.network = cfg.network.clone();
        s.host = cfg.host.clone();
        s.endpoints = cfg.store.endpoints.clone();
        s.ttl_s = lease_ttl(cfg.ttl);
    }
    let policy = Policy {
        network_key: cfg.network_key,
        require_key: cfg.link_options.require_key(),
        tenant: cfg.link_options.network,
        have_key: lock(&daemon).public_key().is_some(),
        ..Policy::default()
    };
    let mut host = Host {
        member: Member::with_policy(&cfg.network, &cfg.host, policy),
        cfg,
        daemon,
        status,
        published: BTreeMap::new(),
        unclaimed: BTreeMap::new(),
        unclaimed_rev: 0,
        reflected: None,
        unnamed: None,
        relay_key: None,
        lease: None,
        retry: None,
        logged: None,
        refused: BTreeMap::new(),
        seen: u64::MAX,
        own: Vec::new(),
    };
    let mut backoff = Duration::from_millis(100);
    let mut said = None;
    loop {
        let started = Instant::now();
        let e = host.session(&mut ipam).await;
        let mut fix = e.permanent(&host.cfg.store, &host.cfg.network);
        let e = e.said();
        if fix.is_none() && e.contains("connection closed") {
            fix = refused_client_certificate(&host.cfg.store).await;
        }
        {
            let mut s = lock(&host.status);
            s.counters.store_errors += 1;
            match &fix {
                // Said once, in one sentence: retrying will not mend it.
                Some(fix) => {
                    if said.as_ref() != Some(fix) {
                        tracing::error!(network = %host.cfg.network, "cluster: {fix}");
                        crate::handover::notify(&format!("STATUS=cluster: {fix}"));
                    }
                    s.set_health(Health::Failed, Some(fix.clone()));
                }
                None => {
                    tracing::warn!(network = %host.cfg.network, "cluster: {e}; the data path keeps its last state");
                    s.set_health(Health::Down, Some(e));
                }
            }
        }
        said = fix.clone();
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        if fix.is_some() {
            // Someone must fix it; a fixed setting is tried every 10 s.
            backoff = Duration::from_secs(10);
        }
        // Meanwhile, interfaces declared or deleted get their local routes
        // (the store hears of them when it is back).
        host.wait(tokio::time::sleep(backoff)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The next `ipam` request, or never (static mode has none).
async fn next_request(rx: &mut Option<crate::ipam::Receiver>) -> Option<crate::ipam::Request> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A MAC this host put in the store: the interface it put it for, and the
/// value it put (released only while the store still holds that value).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    iface: u32,
    name: String,
    value: Vec<u8>,
    /// The store's revision of this host's last put of it: a watch event
    /// after it with another value is another writer's.
    rev: u64,
}

/// A refused transaction: when the whole view is tried again, and the wait after that.
#[derive(Debug, Clone, Copy)]
struct Retry {
    at: Instant,
    backoff: Duration,
}

/// Why a session with etcd ended (logged, and shown by `show cluster`).
#[derive(Debug, thiserror::Error)]
enum SessionError {
    /// An etcd request failed; `what` names it (connect, lease grant, list,
    /// watch, keepalive, put, release).
    #[error("{what}: {source}")]
    Etcd {
        what: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("watch: closed by etcd")]
    WatchClosed,
    #[error("watch canceled: {0}")]
    WatchCanceled(String),
    #[error("the lease expired (etcd was out of reach for longer than the TTL?)")]
    LeaseExpired,
    /// This host has no address to advertise (its `listen` changed since
    /// vnetd started).
    #[error("{0}")]
    NoAddress(String),
}

/// An error and its sources, each said once: `transport error: tcp
/// connect error: Connection refused (os error 111)`, where the error's
/// own text says only `transport error`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        next = s.source();
    }
    out
}

impl SessionError {
    /// What it says, with what the etcd client keeps under its own words
    /// (a transport error's cause).
    fn said(&self) -> String {
        match self {
            SessionError::Etcd { what, source: etcd_client::Error::TransportError(t) } => {
                format!("{what}: {}", chain(t))
            }
            // The status's own words and its cause, not its debug form.
            SessionError::Etcd { what, source: etcd_client::Error::GRpcStatus(st) } => {
                let cause = std::error::Error::source(st).map(chain).unwrap_or_default();
                match cause.is_empty() || st.message().contains(&cause) {
                    true => format!("{what}: {}", st.message()),
                    false => format!("{what}: {} ({cause})", st.message()),
                }
            }
            e => chain(e),
        }
    }

    /// What to fix, in one sentence, when the error is one that retrying
    /// will not mend (a password, a CA, a client certificate, a
    /// permission); `None` for an outage or anything else.
    fn permanent(&self, store: &Store, network: &str) -> Option<String> {
        let SessionError::Etcd { source, .. } = self else { return None };
        let a = &store.auth;
        let file =
            |f: &Option<std::path::PathBuf>| f.as_ref().map_or("(none)".into(), |p| p.display().to_string());
        let user = a.user.clone().unwrap_or_else(|| "(the client certificate's common name)".into());
        if let etcd_client::Error::GRpcStatus(st) = source {
            match st.code() {
                tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                    if st.message().contains("authentication failed") || st.message().contains("invalid auth token") =>
                {
                    return Some(format!(
                        "etcd refused the password of user {user} (etcd-password-file {}): put that user's \
                         password in the file, or set a new one with `etcdctl user passwd {user}`",
                        file(&a.password_file)
                    ))
                }
                tonic::Code::PermissionDenied => {
                    return Some(format!(
                        "etcd user {user} may not read or write /vnet/{network}/: grant its role readwrite on \
                         that prefix (`etcdctl role grant-permission ROLE --prefix=true readwrite /vnet/{network}/`, \
                         `etcdctl user grant-role {user} ROLE`)"
                    ))
                }
                _ => {}
            }
        }
        // TLS failures come as an unavailable service or a transport
        // error; their words are rustls'.
        let text = format!("{source:?} {}", self.said());
        let has = |w: &str| text.contains(w);
        if has("UnknownIssuer")
            || has("invalid peer certificate")
            || has("BadSignature")
            || has("NotValidForName")
        {
            return Some(format!(
                "etcd's server certificate is not one the CA in etcd-ca {} signed (or does not name the \
                 address vnetd dials): give the CA that signed etcd's --cert-file",
                file(&a.ca)
            ));
        }
        if has("CertificateRequired") || (has("BadCertificate") && a.cert.is_none()) {
            return Some(
                "etcd requires a client certificate (its --client-cert-auth) and this host gives none: add \
                 etcd-cert and etcd-key (a certificate signed by etcd's --trusted-ca-file)"
                    .to_string(),
            );
        }
        if has("BadCertificate")
            || has("UnknownCA")
            || has("bad certificate")
            || has("unknown certificate authority")
        {
            return Some(format!(
                "etcd refused this host's client certificate (etcd-cert {}): give one signed by the CA etcd \
                 trusts (its --trusted-ca-file)",
                file(&a.cert)
            ));
        }
        None
    }
}

/// Why etcd closed a TLS connection just after its handshake, if it said
/// so: with TLS 1.3 a server checks the client's certificate after the
/// client has finished, and its alert (`bad certificate`, `certificate
/// required`) races the client's first request, which mostly sees the
/// connection closed. One handshake of our own, then a read of what the
/// server says, tells the two apart. `None`: nothing refused (an outage).
async fn refused_client_certificate(store: &Store) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let a = &store.auth;
    let url = store.endpoints.first()?.strip_prefix("https://")?;
    let hostport = url.split('/').next()?;
    let (host, _) = hostport.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let ca = std::fs::read(a.ca.as_ref()?).ok()?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca).flatten() {
        roots.add(c).ok()?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let cfg = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(c).ok()?.flatten().collect();
            let key = PrivateKeyDer::from_pem_file(k).ok()?;
            b.with_client_auth_cert(chain, key).ok()?
        }
        _ => b.with_no_client_auth(),
    };
    let name = ServerName::try_from(host).ok()?;
    let tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(hostport))
        .await
        .ok()?
        .ok()?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let said = match tokio::time::timeout(Duration::from_secs(2), connector.connect(name, tcp)).await.ok()? {
        Err(e) => e.to_string(),
        Ok(mut tls) => {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 64];
            match tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf)).await {
                Ok(Err(e)) => e.to_string(),
                _ => return None,
            }
        }
    };
    let file =
        |f: &Option<std::path::PathBuf>| f.as_ref().map_or("(none)".into(), |p| p.display().to_string());
    if said.contains("CertificateRequired") || (said.contains("BadCertificate") && a.cert.is_none()) {
        return Some(
            "etcd requires a client certificate (its --client-cert-auth) and this host gives none: add \
             etcd-cert and etcd-key (a certificate signed by etcd's --trusted-ca-file)"
                .to_string(),
        );
    }
    if ["BadCertificate", "UnknownCA", "UnsupportedCertificate", "CertificateUnknown", "AccessDenied"]
        .iter()
        .any(|w| said.contains(w))
    {
        return Some(format!(
            "etcd refused this host's client certificate (etcd-cert {}): give one signed by the CA etcd \
             trusts (its --trusted-ca-file)",
            file(&a.cert)
        ));
    }
    None
}

/// Names a failed etcd request.
fn etcd(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> SessionError {
    let what = what.into();
    move |source| SessionError::Etcd { what, source }
}

struct Host {
    cfg: Config,
    daemon: Arc<Mutex<Daemon>>,
    status: membership::Shared,
    member: Member,
    published: BTreeMap<MacAddr, Published>,
    /// Local interfaces whose MAC another live host holds (a conflict: not
    /// claimed, not routed here), with that host; tried again whenever the
    /// view has moved on ([`Host::unclaimed_rev`]).
    unclaimed: BTreeMap<MacAddr, (String, String)>,
    /// The view's revision when `unclaimed` was last made.
    unclaimed_rev: u64,
    /// `nat` links: this host's public address as its peers see it (behind
    /// a NAT), with its listening port; advertised in its record instead of
    /// the listening address, where its certificate allows it.
    reflected: Option<SocketAddr>,
    /// The reflected address the certificate was found not to name.
    unnamed: Option<std::net::IpAddr>,
    /// `relay auto`: the relay its links go through now (a host whose record
    /// says it relays); when it changes, the whole view is planned again.
    relay_key: Option<vnet_control::PeerKey>,
    /// The lease of the last session, reused if still alive.
    lease: Option<i64>,
    /// The last transaction was refused: the next one brings the whole view.
    retry: Option<Retry>,
    /// The last error logged (the same one is not logged again).
    logged: Option<String>,
    /// Hosts whose records could not apply (a link of theirs would take a
    /// static link's name or address), with why.
    refused: BTreeMap<String, String>,
    /// The daemon's generation when local interfaces were last routed.
    seen: u64,
    /// The host record this host last put: another writer's change to it
    /// (or its deletion) is undone at once.
    own: Vec<u8>,
}

impl Host {
    /// One session with etcd; returns why it ended.
    async fn session(&mut self, ipam: &mut Option<crate::ipam::Receiver>) -> SessionError {
        match self.session_inner(ipam).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn session_inner(
        &mut self,
        ipam: &mut Option<crate::ipam::Receiver>,
    ) -> Result<std::convert::Infallible, SessionError> {
        let ttl = lease_ttl(self.cfg.ttl);
        let (mut c, lease) = self.connect(ttl).await?;
        let (mut keeper, mut kept) = self.wait(c.lease_keep_alive(lease)).await.map_err(etcd("keepalive"))?;

        let mut rev = self.announce(&mut c, lease).await?;
        let (network, me) = (self.cfg.network.clone(), self.cfg.host.clone());
        let kept_addresses = self
            .wait(crate::ipam::keep(&mut c, &network, &me, lease))
            .await
            .map_err(etcd("keep addresses"))?;
        if kept_addresses > 0 {
            tracing::info!(
                addresses = kept_addresses,
                "cluster: this host's addresses are under its new lease"
            );
        }
        let prefix = self.member.prefix().to_string();
        let own_key = host_key(&self.cfg.network, &self.cfg.host);
        let watch_opts = |rev: u64| WatchOptions::new().with_prefix().with_start_revision(rev as i64 + 1);
        let mut watch =
            self.wait(c.watch(prefix.clone(), Some(watch_opts(rev)))).await.map_err(etcd("watch"))?;
        let mut keep_every = tokio::time::interval(Duration::from_millis(ttl * 1000 / 3));
        let mut local_every = tokio::time::interval(LOCAL_POLL);
        local_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = u64::MAX;
        let mut expire_every = Instant::now();
        let activated = lock(&self.daemon).shared().activated.clone();
        loop {
            tokio::select! {
                _ = activated.notified() => {
                    // A migrated VM arrived here: its claim goes out now.
                    seen = lock(&self.daemon).generation();
                    self.publish(&mut c, lease).await?;
                }
                msg = watch.message() => {
                    let resp = msg.map_err(etcd("watch"))?.ok_or(SessionError::WatchClosed)?;
                    if resp.compact_revision() > 0 {
                        tracing::info!(compacted = resp.compact_revision(), "cluster: the watch fell behind compaction; listing again");
                        rev = self.relist(&mut c).await?;
                        watch = c.watch(prefix.clone(), Some(watch_opts(rev))).await.map_err(etcd("watch"))?;
                        continue;
                    }
                    if resp.canceled() {
                        return Err(SessionError::WatchCanceled(resp.cancel_reason().to_string()));
                    }
                    self.on_events(&mut c, lease, &resp, &own_key).await?;
                }
                Some(req) = next_request(ipam) => {
                    let r = crate::ipam::serve(&mut c, &network, &me, lease, &req.op).await;
                    // The client may have given up waiting.
                    let _ = req.reply.send(r);
                }
                _ = keep_every.tick() => {
                    keeper.keep_alive().await.map_err(etcd("keepalive"))?;
                }
                k = kept.message() => {
                    match k.map_err(etcd("keepalive"))? {
                        Some(r) if r.ttl() > 0 => {}
                        _ => {
                            self.lease = None;
                            return Err(SessionError::LeaseExpired);
                        }
                    }
                }
                _ = local_every.tick() => {
                    if expire_every.elapsed() >= Duration::from_secs(1) {
                        expire_every = Instant::now();
                        self.expire_certificates();
                    }
                    if self.reflect() {
                        self.put_host(&mut c, lease).await?;
                    }
                    let generation = lock(&self.daemon).generation();
                    let unsettled = !self.unclaimed.is_empty() && self.member.revision() != self.unclaimed_rev;
                    if generation != seen || unsettled {
                        seen = generation;
                        self.publish(&mut c, lease).await?;
                    }
                    if self.retry.is_some_and(|r| Instant::now() >= r.at) {
                        self.converge(&[], 0, Instant::now());
                    }
                }
            }
        }
    }

    /// Connects to etcd and takes the lease this host's records live under
    /// (the one it held, if etcd still has it; else a new one, counted).
    async fn connect(&mut self, ttl: u64) -> Result<(Client, i64), SessionError> {
        let opts = self
            .cfg
            .store
            .connect_options()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(ttl.clamp(2, 5)))
            .with_keep_alive(Duration::from_secs(ttl.div_ceil(3).max(1)), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        let endpoints = self.cfg.store.endpoints.clone();
        let mut c = self.wait(Client::connect(&endpoints, Some(opts))).await.map_err(etcd("connect"))?;
        let alive = match self.lease {
            Some(id) => self.wait(lease_alive(&mut c, id)).await,
            None => false,
        };
        let lease = match self.lease {
            Some(id) if alive => id,
            _ => {
                let id = self.wait(c.lease_grant(ttl as i64, None)).await.map_err(etcd("lease grant"))?.id();
                if self.lease.is_some() {
                    lock(&self.status).counters.leases_lost += 1;
                }
                id
            }
        };
        self.lease = Some(lease);
        lock(&self.status).lease = Some(lease);
        Ok((c, lease))
    }

    /// Puts this host's record and claims (back) under `lease` after a
    /// fresh list of the network; returns the revision listed.
    async fn announce(&mut self, c: &mut Client, lease: i64) -> Result<u64, SessionError> {
        self.expire_certificates();
        let rev = self.relist(c).await?;
        self.put_host(c, lease).await?;
        // Every MAC this host still holds goes (back) under the lease.
        let held: Vec<(MacAddr, String)> = self
            .published
            .iter()
            .filter(|(m, _)| self.ours(**m))
            .map(|(m, p)| (*m, p.name.clone()))
            .collect();
        for (mac, name) in held {
            let epoch = self.member.epoch(mac);
            self.put_mac(c, lease, mac, &name, epoch, false).await?;
        }
        self.publish(c, lease).await?;
        lock(&self.status).set_health(Health::Up, None);
        tracing::info!(network = %self.cfg.network, host = %self.cfg.host, revision = rev, "cluster: watching");
        Ok(rev)
    }

    /// One watch response: its events applied to the view and converged,
    /// and what another writer changed of this host's own (its claims, its
    /// record) put back.
    async fn on_events(
        &mut self,
        c: &mut Client,
        lease: i64,
        resp: &etcd_client::WatchResponse,
        own_key: &str,
    ) -> Result<(), SessionError> {
        let t0 = Instant::now();
        let mut changes = Vec::new();
        let mut n = 0;
        let mut own_changed = false;
        let mut restore = Vec::new();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let (Ok(key), rev) = (kv.key_str(), kv.mod_revision().max(0) as u64) else {
                lock(&self.status).counters.bad_records += 1;
                continue;
            };
            let e = match ev.event_type() {
                EventType::Put => Event::Put { key: key.to_string(), value: kv.value().to_vec(), rev },
                EventType::Delete => Event::Delete { key: key.to_string(), rev },
            };
            own_changed |=
                e.key() == own_key && !matches!(&e, Event::Put { value, .. } if *value == self.own);
            self.member.apply(&e, &mut changes);
            if let Some(mac) = self.foreign_change_to_a_claim(&e) {
                restore.push(mac);
            }
            n += 1;
        }
        self.converge(&changes, n, t0);
        for mac in restore {
            let Some(name) = self.published.get(&mac).map(|p| p.name.clone()) else { continue };
            tracing::warn!(%mac, "cluster: this host's claim was changed or deleted by another writer; putting it back");
            lock(&self.status).counters.records_restored += 1;
            let epoch = self.member.epoch(mac);
            let Some(put) = self.put_mac(c, lease, mac, &name, epoch, false).await? else { continue };
            let mut again = Vec::new();
            self.member.apply(&put, &mut again);
            self.converge(&again, 1, Instant::now());
        }
        if own_changed {
            tracing::warn!(key = %own_key, "cluster: this host's record was changed by another writer; putting it back");
            lock(&self.status).counters.records_restored += 1;
            self.put_host(c, lease).await?;
        }
        Ok(())
    }

    /// Drops hosts whose certificate has expired (signed networks).
    fn expire_certificates(&mut self) {
        let mut changes = Vec::new();
        self.member.expire(membership::now_ms() / 1000, &mut changes);
        if !changes.is_empty() {
            tracing::warn!(
                "cluster: a host's certificate expired; its links and routes are gone until it is renewed"
            );
            self.converge(&changes, 0, Instant::now());
        }
    }

    /// Awaits `fut` (a request to etcd, which may hang while the store is
    /// unreachable) and meanwhile routes interfaces declared or deleted
    /// locally, so that the host's own VMs never wait for the store.
    async fn wait<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        let mut every = tokio::time::interval(LOCAL_POLL);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                _ = every.tick() => self.route_local(),
            }
        }
    }

    /// Routes local interfaces if the daemon's state changed since the last look.
    fn route_local(&mut self) {
        let generation = lock(&self.daemon).generation();
        if generation != self.seen {
            self.converge(&[], 0, Instant::now());
            self.seen = lock(&self.daemon).generation();
        }
    }

    /// Lists the prefix into the view and converges; returns the revision.
    async fn relist(&mut self, c: &mut Client) -> Result<u64, SessionError> {
        let t0 = Instant::now();
        let prefix = self.member.prefix().to_string();
        let resp =
            self.wait(c.get(prefix, Some(GetOptions::new().with_prefix()))).await.map_err(etcd("list"))?;
        let rev = resp.header().map_or(0, |h| h.revision().max(0) as u64);
        let kvs: Vec<(String, Vec<u8>)> = resp
            .kvs()
            .iter()
            .filter_map(|kv| Some((kv.key_str().ok()?.to_string(), kv.value().to_vec())))
            .collect();
        let mut changes = Vec::new();
        self.member.relist(&kvs, rev, &mut changes);
        lock(&self.status).counters.relists += 1;
        self.converge(&changes, kvs.len() as u64, t0);
        Ok(rev)
    }

    /// `nat` links: whether this host's public address, as a peer reflects
    /// it (a relay's reflection first: a public host sees the NAT's address
    /// as it is), is news to advertise; its certificate must allow it, and
    /// the NAT must keep the listening port.
    fn reflect(&mut self) -> bool {
        if !self.cfg.link_options.nat || self.cfg.advertise.is_some() {
            return false;
        }
        let (seen, listen) = {
            let d = lock(&self.daemon);
            (d.reflections(), d.state().listen)
        };
        let relays: Vec<&str> = self.member.links().filter(|(_, p)| p.relay).map(|(n, _)| n).collect();
        let pick = seen.iter().find(|(n, _)| relays.contains(&n.as_str())).or(seen.first());
        // Only a NAT that keeps the port (one that forwards it, or
        // preserves it) gives an address others can send to first; behind
        // one that picks a port per destination (symmetric), the record
        // keeps the host's own address: its peers learn its mapping from
        // its own datagrams, and two such hosts go through a relay.
        let Some(seen) = pick.map(|(_, a)| *a).filter(|a| a.port() == listen.port()) else { return false };
        let ip = vnet_control::canonical(seen.ip());
        let addr = SocketAddr::new(ip, listen.port());
        let news = self.reflected != Some(addr) && !(ip == listen.ip() && self.reflected.is_none());
        // An address the certificate was found not to name is not checked
        // again each tick (an Ed25519 verification every 20 ms).
        if !news || self.unnamed == Some(ip) {
            return false;
        }
        let allowed = match (&self.cfg.network_key, &self.cfg.cert) {
            (Some(nk), Some(cert)) => nk.verify(cert).is_ok_and(|c| c.allows(ip)),
            _ => true,
        };
        if !allowed {
            if self.unnamed.is_none() {
                tracing::warn!(%ip, "cluster: peers see this host at {ip} (behind a NAT), which its certificate does not name: \
                    its record keeps its own address (sign its certificate with addr {ip}/32 too)");
            }
            self.unnamed = Some(ip);
            return false;
        }
        tracing::info!(%addr, "cluster: peers see this host at {addr} (behind a NAT): its record says so");
        self.reflected = Some(addr);
        true
    }

    /// The MAC whose claim by this host `e` (already applied) changed or
    /// deleted while the view still gives it to this host: another
    /// writer's doing (a forged claim in a signed network, a deletion),
    /// not a move (a move's claim is taken, and the MAC is no longer ours)
    /// nor the echo of this host's own put (an older revision).
    fn foreign_change_to_a_claim(&self, e: &Event) -> Option<MacAddr> {
        let Some(Key::Mac(mac)) = parse_key(self.member.prefix(), e.key()) else { return None };
        let p = self.published.get(&mac)?;
        let changed = match e {
            Event::Put { value, rev, .. } => *rev > p.rev && *value != p.value,
            Event::Delete { rev, .. } => *rev > p.rev,
        };
        (changed && self.ours(mac)).then_some(mac)
    }

    /// Whether the store gives `mac` to this host (or to no host).
    fn ours(&self, mac: MacAddr) -> bool {
        self.member.owner(mac).is_none_or(|o| o == self.member.me())
    }

    async fn put_host(&mut self, c: &mut Client, lease: i64) -> Result<(), SessionError> {
        let record = {
            let d = lock(&self.daemon);
            let addr = match self.reflected {
                Some(a) => a,
                None => advertised(self.cfg.advertise, d.state().listen).map_err(SessionError::NoAddress)?,
            };
            HostRecord {
                addr,
                kinds: vec!["udp".into()],
                public_key: d.public_key(),
                cert: self.cfg.cert.clone(),
                relay: self.cfg.relay,
            }
        };
        let (key, value) = (host_key(&self.cfg.network, &self.cfg.host), record.to_json());
        let r = self
            .wait(c.put(key.clone(), value.clone(), Some(PutOptions::new().with_lease(lease))))
            .await
            .map_err(etcd("put host"))?;
        self.own = value.clone();
        // Taken at once (its claims are checked against it), not when the watch brings it.
        let rev = r.header().map_or(0, |h| h.revision().max(0) as u64);
        let mut changes = Vec::new();
        self.member.apply(&Event::Put { key, value, rev }, &mut changes);
        self.converge(&changes, 1, Instant::now());
        Ok(())
    }

    /// Puts this host's claim of `mac` for `iface` at `epoch` (the epoch
    /// the view holds, or above it for a migration). `fresh`: only if no
    /// one holds the key (an etcd transaction), so that of two hosts
    /// claiming one MAC at once the store keeps the first and every host
    /// sees the second as the conflict; `None` when another was first.
    async fn put_mac(
        &mut self,
        c: &mut Client,
        lease: i64,
        mac: MacAddr,
        iface: &str,
        epoch: u64,
        fresh: bool,
    ) -> Result<Option<Event>, SessionError> {
        let (key, value) = (mac_key(&self.cfg.network, mac), self.mac_value(mac, iface, epoch));
        let put = PutOptions::new().with_lease(lease);
        let rev = if fresh {
            let txn = Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), value.clone(), Some(put))]);
            let r = self.wait(c.txn(txn)).await.map_err(etcd(format!("claim {mac}")))?;
            if !r.succeeded() {
                return Ok(None);
            }
            r.header().map_or(0, |h| h.revision().max(0) as u64)
        } else {
            let r = self
                .wait(c.put(key.clone(), value.clone(), Some(put)))
                .await
                .map_err(etcd(format!("put {mac}")))?;
            r.header().map_or(0, |h| h.revision().max(0) as u64)
        };
        if let Some(p) = self.published.get_mut(&mac) {
            p.value = value.clone();
            p.rev = rev;
        }
        Ok(Some(Event::Put { key, value, rev }))
    }

    /// The value of a MAC's key naming this host and interface `iface`:
    /// the cluster's vnet network, `epoch`, stamped with the time and, with
    /// a claim key, signed.
    fn mac_value(&self, mac: MacAddr, iface: &str, epoch: u64) -> Vec<u8> {
        let mut r = MacRecord {
            host: self.cfg.host.clone(),
            iface: iface.to_string(),
            at_ms: membership::now_ms(),
            network: self.member.tenant(),
            epoch,
            sig: None,
        };
        r.sig = self.cfg.claim_key.as_ref().map(|k| k.sign(&self.cfg.network, mac, &r));
        r.to_json()
    }

    /// Claims the MACs of interfaces (of the cluster's network) declared
    /// since the last look and releases those of interfaces deleted since.
    /// A MAC another live host holds is claimed only by a migration (an
    /// interface activated from standby: its VM arrived, or `activate`),
    /// at the epoch above the held one; otherwise it is a conflict, shown
    /// in `show cluster` and tried again as the view changes (the holder
    /// may release it), never taken for being newer.
    async fn publish(&mut self, c: &mut Client, lease: i64) -> Result<(), SessionError> {
        let tenant = self.member.tenant();
        let now: BTreeMap<MacAddr, (u32, String, bool)> = {
            let d = lock(&self.daemon);
            // A standby interface's MAC is claimed when its VM arrives.
            let active = d.state().interfaces.values().filter(|i| !i.standby && i.network == tenant);
            active.filter_map(|i| Some((i.mac?, (i.id, i.name.clone(), d.moved_in(i.id))))).collect()
        };
        let gone: Vec<MacAddr> = self
            .published
            .iter()
            .filter(|(m, p)| now.get(m).is_none_or(|(id, ..)| *id != p.iface))
            .map(|(m, _)| *m)
            .collect();
        for mac in gone {
            let Some(p) = self.published.remove(&mac) else { continue };
            // Deleted only while it still names this host: a VM that moved
            // away belongs to its new host.
            let key = mac_key(&self.cfg.network, mac);
            let txn = Txn::new()
                .when([Compare::value(key.clone(), CompareOp::Equal, p.value)])
                .and_then([TxnOp::delete(key, None)]);
            self.wait(c.txn(txn)).await.map_err(etcd(format!("release {mac}")))?;
            lock(&self.status).counters.macs_released += 1;
        }
        let mut unclaimed = BTreeMap::new();
        let me = self.cfg.host.clone();
        for (mac, (id, name, migration)) in now {
            if self.published.get(&mac).is_some_and(|p| p.iface == id) {
                continue;
            }
            let owner = self.member.owner(mac).map(str::to_string);
            let held_elsewhere = owner.as_deref().is_some_and(|o| o != me && self.member.live(o));
            if held_elsewhere && !migration {
                let holder = owner.unwrap_or_default();
                if !self.unclaimed.contains_key(&mac) {
                    tracing::warn!(%mac, interface = %name, %holder, "cluster: conflict: host {holder} holds this MAC; \
                        interface {name} is not claimed nor routed here until it releases it (a migration here, \
                        `vnetctl move`, takes it; delete one of the two interfaces to settle it)");
                    lock(&self.status).counters.conflicts += 1;
                }
                unclaimed.insert(mac, (holder, name));
                continue;
            }
            let epoch = self.member.epoch(mac) + u64::from(migration);
            let t0 = Instant::now();
            let fresh = owner.is_none() && !migration;
            let Some(put) = self.put_mac(c, lease, mac, &name, epoch, fresh).await? else {
                // Another host's claim came first: the watch brings it.
                unclaimed.insert(mac, (String::new(), name));
                continue;
            };
            let value = match &put {
                Event::Put { value, .. } => value.clone(),
                Event::Delete { .. } => Vec::new(),
            };
            self.published.insert(mac, Published { iface: id, name, value, rev: put.rev() });
            lock(&self.daemon).claimed(id);
            lock(&self.status).counters.macs_claimed += 1;
            // The host takes its own claim at once rather than when the
            // watch brings it back, and, if the VM moved here, says so.
            let mut changes = Vec::new();
            self.member.apply(&put, &mut changes);
            self.converge(&changes, 1, t0);
            if held_elsewhere || (migration && owner.is_some_and(|o| o != me)) {
                let said = lock(&self.daemon).announce(mac);
                lock(&self.status).counters.announces += 1;
                tracing::info!(%mac, "cluster: a migration brought this MAC here (epoch {epoch}); {}", said.trim_end());
            }
        }
        self.unclaimed = unclaimed;
        self.unclaimed_rev = self.member.revision();
        let mut s = lock(&self.status);
        s.owned = self.published.keys().filter(|&&m| self.ours(m)).count();
        s.unclaimed = self.unclaimed.iter().map(|(m, (h, i))| (*m, h.clone(), i.clone())).collect();
        Ok(())
    }

    /// Brings the daemon to the view: `changes` (or, after a refused
    /// transaction, the whole view) and the local interfaces' routes, as
    /// one transaction.
    fn converge(&mut self, changes: &[Change], events: u64, t0: Instant) {
        let mut all = Vec::new();
        // `relay auto`: the first host by name whose record says it relays
        // (none when this host is one: its links are its own way through).
        let relay = match self.cfg.link_options.relay_auto && !self.cfg.relay {
            true => self.member.links().filter(|(_, p)| p.relay).find_map(|(_, p)| p.key),
            false => None,
        };
        let relay_changed = relay != self.relay_key;
        if relay_changed {
            tracing::info!(relay = ?relay.map(|k| k.to_string()), "cluster: links behind NATs now go through this relay");
            self.relay_key = relay;
        }
        // After a refused transaction, or while a host is refused (what
        // stood in its way may have gone), or when the relay changed, the
        // whole view.
        let changes = if self.retry.is_some() || !self.refused.is_empty() || relay_changed {
            self.member.full(&mut all);
            &all[..]
        } else {
            changes
        };
        let mut d = lock(&self.daemon);
        let mut s = lock(&self.status);
        let ours = s.links.clone();
        let opts = vnet_cluster::apply::LinkOptions { relay, ..self.cfg.link_options };
        let planned = plan(d.state(), changes, &opts, &|h| ours.contains(h));
        let mut cmds = planned.cmds;
        cmds.extend(local(d.state(), &self.member));
        s.counters.events += events;
        s.counters.bad_records = self.member.stats.bad_records;
        s.quarantined = self.member.quarantined().map(|(k, e)| (k.to_string(), e.to_string())).collect();
        // The hosts refused as of this batch: a host whose record the batch
        // carries is judged anew.
        let before = self.refused.clone();
        for c in changes {
            if let vnet_cluster::member::Change::Link { host, .. } = c {
                self.refused.remove(host.as_str());
            }
        }
        for (host, why) in planned.refused {
            if before.get(&host) != Some(&why) {
                tracing::warn!(%host, "cluster: not linked: {why}");
            }
            self.refused.insert(host, why);
        }
        s.quarantined.extend(self.refused.iter().map(|(h, why)| (format!("host {h}"), why.clone())));
        s.revision = self.member.revision();
        if !cmds.is_empty() {
            s.counters.transactions += 1;
            match d.apply(&cmds) {
                Ok(()) => {
                    self.retry = None;
                    self.logged = None;
                    note_links(&mut s.links, &cmds);
                }
                Err(e) => {
                    s.counters.transaction_errors += 1;
                    let e = format!("transaction: {e}");
                    if self.logged.as_deref() != Some(&e) {
                        tracing::error!(
                            commands = cmds.len(),
                            "cluster: {e}; retrying the whole view with a backoff"
                        );
                    }
                    self.logged = Some(e.clone());
                    s.last_error = Some(e);
                    let backoff = self.retry.map_or(RETRY_FIRST, |r| (r.backoff * 2).min(RETRY_MAX));
                    self.retry = Some(Retry { at: Instant::now() + backoff, backoff });
                }
            }
            s.last = Some(Convergence {
                at_ms: membership::now_ms(),
                revision: self.member.revision(),
                events,
                lines: cmds.len(),
                took_us: t0.elapsed().as_micros() as u64,
            });
        }
        s.hosts = self.member.hosts().map(str::to_string).collect();
        s.hosts.sort();
        s.expiries = self.member.expiries().map(|(h, t)| (h.to_string(), t)).collect();
        s.cert_ids = self.member.cert_ids().map(|(h, id)| (h.to_string(), id.to_string())).collect();
        s.conflicts = self.member.conflicts().map(|(m, h, c)| (m, h.to_string(), c.to_string())).collect();
        s.revoked = self.member.revoked();
        s.macs = self.member.macs();
        s.routes = self.member.routes();
    }
}

/// Keeps `links` (the links the cluster made) as `cmds`, applied, leave them.
fn note_links(
    links: &mut std::collections::BTreeSet<String>,
    cmds: &[vnet_control::Located<vnet_control::Command>],
) {
    use vnet_control::ast::LinkRef;
    use vnet_control::Command;
    for c in cmds {
        match &c.item {
            Command::Link { name: Some(n), .. } => {
                links.insert(n.clone());
            }
            Command::DeleteLink(r) => {
                if let LinkRef::Name(n) = &r.by {
                    links.remove(n);
                }
            }
            _ => {}
        }
    }
}

/// The lease's TTL, in seconds, for a host that must be gone within `ttl`:
/// a second shorter, because etcd expires leases on a 500 ms tick and the
/// others still have to hear of it (at least 1 s).
pub fn lease_ttl(ttl: Duration) -> u64 {
    ttl.as_secs().saturating_sub(1).max(1)
}

/// Whether lease `id` is still alive in etcd.
async fn lease_alive(c: &mut Client, id: i64) -> bool {
    c.lease_time_to_live(id, None).await.is_ok_and(|r| r.ttl() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_strangers_are_refused() {
        assert_eq!(parse_endpoints("etcd:127.0.0.1:2379").unwrap(), ["http://127.0.0.1:2379"]);
        assert_eq!(
            parse_endpoints("etcd:http://10.0.0.1:2379,http://10.0.0.2:2379").unwrap(),
            ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(parse_endpoints("etcd:https://a:1").unwrap(), ["https://a:1"]);
        for bad in ["127.0.0.1:2379", "etcd:", "etcd:https://a:1,http://b:1", "etcd:ftp://a:1", "consul:x"] {
            assert!(parse_endpoints(bad).is_err(), "{bad}");
        }
        assert!(check_name("host", "h-1.lab").is_ok());
        assert!(check_name("host", "a/b").is_err());
    }

    #[test]
    fn the_store_wants_tls_for_a_password_or_a_network_and_a_ca_for_tls() {
        let none = StoreAuth::default();
        let (s, warn) = Store::load("etcd:127.0.0.1:2379", &none).unwrap();
        assert!(warn.is_none() && s.tls.is_none() && s.user.is_none());
        let (_, warn) = Store::load("etcd:10.0.0.1:2379", &none).unwrap();
        assert!(warn.unwrap().contains("plain http"));
        let e = Store::load("etcd:https://10.0.0.1:2379", &none).unwrap_err();
        assert!(e.contains("--etcd-ca"), "{e}");
        let user =
            StoreAuth { user: Some("u".into()), password_file: Some("/nonexistent".into()), ..none.clone() };
        let e = Store::load("etcd:10.0.0.1:2379", &user).unwrap_err();
        assert!(e.contains("in clear"), "{e}");
        let ca = StoreAuth { ca: Some("/nonexistent".into()), ..none.clone() };
        assert!(Store::load("etcd:10.0.0.1:2379", &ca).unwrap_err().contains("https://"));
        let half = StoreAuth { user: Some("u".into()), ..none };
        assert!(Store::load("etcd:[::1]:2379", &half).unwrap_err().contains("go together"));
        assert!(
            on_loopback("http://localhost:2379")
                && on_loopback("http://[::1]:1")
                && !on_loopback("http://a:1")
        );
    }
}
