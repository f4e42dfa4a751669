//! What cluster mode is configured with, and what it checks before it
//! starts: the store's endpoints and credentials ([`Store`]), the address
//! this host advertises, its network key and certificate, the names.

use crate::daemon::Daemon;
use crate::membership;
use etcd_client::ConnectOptions;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use vnet_cluster::apply::LinkOptions;
use vnet_cluster::layout::valid_name;
use vnet_cluster::trust::{ClaimKey, NetworkPublic, TrustError};

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
    /// Signed networks: where the network's trust state is kept
    /// ([`super::kept`]), and what was kept there by the last run.
    pub kept_file: Option<std::path::PathBuf>,
    pub kept: Option<vnet_cluster::member::Kept>,
    /// Kubernetes (`--kube`): the API's pods, which other hosts' claims
    /// are bound to ([`crate::kube_pods`]).
    pub kube_pods: Option<crate::kube_pods::Receiver>,
}

/// Why `--cluster`'s URLs are not a store's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    #[error("expected etcd:URL[,URL...], found `{0}`")]
    NotEtcd(String),
    #[error("expected at least one URL after `etcd:`, found `{0}`")]
    NoUrl(String),
    #[error("`{0}`: expected an http:// or https:// URL")]
    Scheme(String),
    #[error("all URLs https:// or all http://, not both")]
    Mixed,
}

/// Why cluster mode's settings were refused at the start (each names the
/// flag, the file and the fix; vnetd exits with 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--cluster: {0}")]
    Cluster(#[source] EndpointsError),
    #[error("--cluster https://: give --etcd-ca FILE, the CA of etcd's certificate")]
    NoCa,
    /// A secret or trusted file refused (`flag` names it).
    #[error("{flag} {source}")]
    File { flag: &'static str, source: crate::keys::FileError },
    #[error("{flag} {path}: {source}")]
    Read { flag: &'static str, path: String, source: std::io::Error },
    /// Two flags given one without the other.
    #[error("{0} go together")]
    Pair(&'static str),
    #[error("--etcd-ca, --etcd-cert and --etcd-key need https:// URLs in --cluster")]
    TlsOverHttp,
    #[error("--etcd-user over http:// would send its password in clear: use https:// URLs")]
    PasswordInClear,
    #[error("--etcd-password-file {0}:1:1: expected a password")]
    NoPassword(String),
    #[error(
        "other hosts must know where to send: this host listens on {0}; \
         give --advertise ADDR:PORT or a `listen udp ADDR:PORT` line"
    )]
    NoAddress(SocketAddr),
    #[error("--network-key: {0}")]
    NetworkKey(#[source] TrustError),
    #[error("--network-key needs this host's certificate (--host-cert FILE, from `vnetctl sign`)")]
    NoHostCert,
    #[error("--network-key: links are secured, so this host needs --key FILE")]
    NoKey,
    #[error("--host-cert {path}: {source}")]
    HostCert { path: String, source: TrustError },
    #[error("--host-cert {path}: it is host `{host}` of network `{network}`, not `{want_host}` of `{want_network}`")]
    OtherHost { path: String, host: String, network: String, want_host: String, want_network: String },
    #[error("--host-cert {0}: it names another public key than --key's")]
    OtherKey(String),
    #[error("--host-cert {path}: it does not allow the advertised address {ip}")]
    Address { path: String, ip: std::net::IpAddr },
    #[error("--host-cert {path}: it expired {ago} s ago; sign a new one")]
    Expired { path: String, ago: u64 },
    #[error("{what} `{name}`: expected 1 to 63 letters, digits, `-`, `_` or `.`")]
    Name { what: &'static str, name: String },
}

/// `etcd:URL[,URL...]` to the URLs (an `http://` is assumed where a URL
/// names no scheme); all of them `http://` or all `https://`.
pub fn parse_endpoints(s: &str) -> Result<Vec<String>, EndpointsError> {
    let rest = s.strip_prefix("etcd:").ok_or_else(|| EndpointsError::NotEtcd(s.into()))?;
    let urls: Vec<String> = rest
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| if u.contains("://") { u.to_string() } else { format!("http://{u}") })
        .collect();
    if urls.is_empty() {
        return Err(EndpointsError::NoUrl(s.into()));
    }
    if let Some(bad) = urls.iter().find(|u| !u.starts_with("http://") && !u.starts_with("https://")) {
        return Err(EndpointsError::Scheme(bad.clone()));
    }
    if urls.iter().any(|u| u.starts_with("https://")) && urls.iter().any(|u| u.starts_with("http://")) {
        return Err(EndpointsError::Mixed);
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
    pub(super) auth: StoreAuth,
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
    pub fn load(spec: &str, auth: &StoreAuth) -> Result<(Store, Option<String>), ConfigError> {
        let endpoints = parse_endpoints(spec).map_err(ConfigError::Cluster)?;
        let tls = endpoints[0].starts_with("https://");
        let loopback = endpoints.iter().all(|u| on_loopback(u));
        let mut warning = None;
        let tls = if tls {
            let ca = auth.ca.as_ref().ok_or(ConfigError::NoCa)?;
            let pem = crate::keys::read_trusted(ca, "etcd's CA", 1 << 20).map_err(file("--etcd-ca"))?;
            let mut opts =
                etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem));
            match (&auth.cert, &auth.key) {
                (Some(c), Some(k)) => {
                    let cert = std::fs::read(c).map_err(|source| ConfigError::Read {
                        flag: "--etcd-cert",
                        path: c.display().to_string(),
                        source,
                    })?;
                    let key = crate::keys::read_secret(k, "the private key", 64 * 1024)
                        .map_err(file("--etcd-key"))?;
                    opts = opts.identity(etcd_client::Identity::from_pem(cert, key));
                }
                (None, None) => {}
                _ => return Err(ConfigError::Pair("--etcd-cert and --etcd-key")),
            }
            Some(opts)
        } else {
            if auth.ca.is_some() || auth.cert.is_some() || auth.key.is_some() {
                return Err(ConfigError::TlsOverHttp);
            }
            if auth.user.is_some() && !loopback {
                return Err(ConfigError::PasswordInClear);
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
                    .map_err(file("--etcd-password-file"))?;
                let pw = pw.trim_end_matches(['\r', '\n']);
                if pw.is_empty() {
                    return Err(ConfigError::NoPassword(f.display().to_string()));
                }
                Some((u.clone(), pw.to_string()))
            }
            (None, None) => None,
            _ => return Err(ConfigError::Pair("--etcd-user and --etcd-password-file")),
        };
        Ok((Store { endpoints, tls, user, auth: auth.clone() }, warning))
    }

    /// Options for a connection: TLS and the user when configured.
    pub(super) fn connect_options(&self) -> ConnectOptions {
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
pub fn advertised(advertise: Option<SocketAddr>, listen: SocketAddr) -> Result<SocketAddr, ConfigError> {
    match advertise {
        Some(a) => Ok(a),
        None if !listen.ip().is_unspecified() && listen.port() != 0 => Ok(listen),
        None => Err(ConfigError::NoAddress(listen)),
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
) -> Result<(NetworkPublic, String), ConfigError> {
    let text = if std::path::Path::new(key).is_file() {
        let bytes = crate::keys::read_trusted(std::path::Path::new(key), "the network's public key", 4096)
            .map_err(file("--network-key"))?;
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        key.to_string()
    };
    let nk = NetworkPublic::from_base64(&text).map_err(ConfigError::NetworkKey)?;
    let path = cert.ok_or(ConfigError::NoHostCert)?;
    let shown = path.display().to_string();
    let cert = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { flag: "--host-cert", path: shown.clone(), source })?
        .trim()
        .to_string();
    let c = nk.verify(&cert).map_err(|source| ConfigError::HostCert { path: shown.clone(), source })?;
    let own = daemon.public_key().ok_or(ConfigError::NoKey)?;
    if c.network != network || c.host != host {
        return Err(ConfigError::OtherHost {
            path: shown,
            host: c.host,
            network: c.network,
            want_host: host.into(),
            want_network: network.into(),
        });
    }
    if c.public_key.to_string() != own {
        return Err(ConfigError::OtherKey(shown));
    }
    if !c.allows(addr.ip()) {
        return Err(ConfigError::Address { path: shown, ip: addr.ip() });
    }
    let now_s = membership::now_ms() / 1000;
    if let Some(t) = c.not_after {
        if c.expired(now_s) {
            return Err(ConfigError::Expired { path: shown, ago: now_s - t });
        }
        if t - now_s < 7 * 86400 {
            tracing::warn!("--host-cert {shown}: it expires in {} h; sign a new one", (t - now_s) / 3600);
        }
    }
    Ok((nk, cert))
}

/// Checks a network or host name (the store's key segments).
pub fn check_name(what: &'static str, name: &str) -> Result<(), ConfigError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ConfigError::Name { what, name: name.into() })
    }
}

/// A file `flag` names, refused.
fn file(flag: &'static str) -> impl FnOnce(crate::keys::FileError) -> ConfigError {
    move |source| ConfigError::File { flag, source }
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
        let e = Store::load("etcd:https://10.0.0.1:2379", &none).unwrap_err().to_string();
        assert!(e.contains("--etcd-ca"), "{e}");
        let user =
            StoreAuth { user: Some("u".into()), password_file: Some("/nonexistent".into()), ..none.clone() };
        let e = Store::load("etcd:10.0.0.1:2379", &user).unwrap_err().to_string();
        assert!(e.contains("in clear"), "{e}");
        let ca = StoreAuth { ca: Some("/nonexistent".into()), ..none.clone() };
        assert!(Store::load("etcd:10.0.0.1:2379", &ca).unwrap_err().to_string().contains("https://"));
        let half = StoreAuth { user: Some("u".into()), ..none };
        assert!(Store::load("etcd:[::1]:2379", &half).unwrap_err().to_string().contains("go together"));
        assert!(
            on_loopback("http://localhost:2379")
                && on_loopback("http://[::1]:1")
                && !on_loopback("http://a:1")
        );
    }
}
